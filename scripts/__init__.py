"""The binaries (``tfseq-train``, ``tfseq-predict``, ``tfseq-export``, ``tfseq-profile``,
``tfseq-data-service``), installed as ``tfseq.scripts``; the benchmarks are in ``benchmarks/``
of the repository, not in the package.

Every binary runs through ``run_command``, so all of them fail the same way: one line
``tfseq-<command>: error: <what is wrong and the fix>`` on stderr and exit status 2, for a bad
flag, a flag conflict or bad input; ``--help`` exits 0.
"""

import os
import sys

COMMANDS = {"train": "tfseq-train", "predict": "tfseq-predict", "export": "tfseq-export",
            "profile": "tfseq-profile", "data_service": "tfseq-data-service"}
HELP_FLAGS = ("-h", "-?", "--help", "--helpshort", "--helpfull", "--helpxml")
USAGE_ERROR = 2  # the status of a command that cannot run as given (as argparse's)


def _launcher(module: str):
    """The console entry of ``tfseq-<module>``: imports the command (TensorFlow with it) with
    Ctrl-C and SIGTERM stopping it in one line, then runs it."""

    def launch():
        import importlib

        _stop_on_signals()
        try:
            command = importlib.import_module(f"tfseq.scripts.{module}")
        except KeyboardInterrupt:
            interrupted(COMMANDS[module], "SIGINT", "nothing was written")
        except Terminated:
            interrupted(COMMANDS[module], "SIGTERM", "nothing was written")
        command.run()

    launch.__doc__ = f"The ``{COMMANDS[module]}`` command."
    return launch


def command_name(module_name: str) -> str:
    """``tfseq.scripts.train`` -> ``tfseq-train`` (other scripts: their file name)."""
    short = module_name.rsplit(".", 1)[-1]
    return COMMANDS.get(short, short)


def fail(command: str, message: str) -> None:
    """Exits with status 2 after one line ``<command>: error: <message>`` on stderr."""
    print(f"{command}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(USAGE_ERROR)


class Terminated(BaseException):
    """SIGTERM outside training (a scheduler preempting the job): raised in the main thread,
    so a command stops as it does on Ctrl-C (``KeyboardInterrupt``)."""


def _raise_terminated(signum, frame):
    raise Terminated()


def _stop_on_signals() -> None:
    """SIGINT raises ``KeyboardInterrupt`` (also where the shell started the command with it
    ignored, as it does for a background job: a training loop handles it as well) and SIGTERM
    ``Terminated``."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_terminated)


def interrupted(command: str, signal_name: str, kept: str) -> None:
    """Exits with 128 + the signal (130 SIGINT, 143 SIGTERM) after one line
    ``<command>: stopped by <signal>: <what was kept>`` on stderr."""
    import signal

    print(f"{command}: stopped by {signal_name}: {kept}", file=sys.stderr, flush=True)
    sys.exit(128 + signal.Signals[signal_name].value)


def run_command(module_name: str, main, *, kept=None) -> None:
    """Runs ``main`` as an absl program whose ``--help`` shows the binary's docstring and flags,
    also when started through a console command (whose ``__main__`` is pip's small wrapper).

    A flag error, an ``app.UsageError`` or a ``tfseq.errors.InputError`` from ``main`` is one
    line and exit status 2 (``fail``), never the whole usage or a traceback (``-v 1`` logs
    the traceback). SIGINT or SIGTERM that ``main`` does not handle itself (a training loop
    does) stops the command with one line saying what was kept (``kept()``; default: nothing
    was written) and status 130 or 143."""
    from absl import app, flags, logging

    from tfseq.errors import InputError

    module = sys.modules[module_name]
    # Run as a file (python scripts/train.py) or a module (python -m ...), it is __main__.
    command = command_name(os.path.splitext(os.path.basename(module.__file__))[0])
    sys.modules["__main__"].__doc__ = module.__doc__
    for flag in flags.FLAGS.get_flags_for_module(module_name):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)

    def parse(argv):
        try:
            return flags.FLAGS(argv)
        except flags.Error as e:
            fail(command, f"{e} (see {command} --help)")
        except SystemExit:  # absl's --help exits 1 after printing it: asked for, so 0
            if any(arg.split("=")[0] in HELP_FLAGS for arg in argv[1:]):
                sys.exit(0)
            raise

    def guarded_main(argv):
        try:
            _stop_on_signals()
            return main(argv)
        except (app.UsageError, InputError) as e:
            logging.debug("%s failed", command, exc_info=True)  # shown with -v 1
            fail(command, str(e))
        except KeyboardInterrupt:
            interrupted(command, "SIGINT", kept() if kept else "nothing was written")
        except Terminated:
            interrupted(command, "SIGTERM", kept() if kept else "nothing was written")

    try:
        app.run(guarded_main, flags_parser=parse)
    except KeyboardInterrupt:  # before main: while the flags are parsed
        interrupted(command, "SIGINT", "nothing was written")


launch_train = _launcher("train")
launch_predict = _launcher("predict")
launch_export = _launcher("export")
launch_profile = _launcher("profile")
launch_data_service = _launcher("data_service")
