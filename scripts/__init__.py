"""The binaries (``tfseq-train``, ``tfseq-predict``, ``tfseq-export``, ``tfseq-profile``,
``tfseq-data-service``) and the benchmark scripts; installed as ``tfseq.scripts``."""

import sys


def run_command(module_name: str, main) -> None:
    """Runs ``main`` as an absl program whose ``--help`` shows the binary's docstring and flags,
    also when started through a console command (whose ``__main__`` is pip's small wrapper)."""
    from absl import app, flags

    module = sys.modules[module_name]
    sys.modules["__main__"].__doc__ = module.__doc__
    for flag in flags.FLAGS.get_flags_for_module(module_name):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    from tfseq._common import traced_as_written

    def traced_main(argv):
        with traced_as_written():  # the binaries' data functions need no AutoGraph
            return main(argv)

    app.run(traced_main)
