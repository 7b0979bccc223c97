"""TensorFlow's start-up lines kept off a command's terminal.

TensorFlow's C++ runtime prints lines at import and device discovery (``oneDNN custom
operations are on``, ``Could not find cuda drivers``, ``failed call to cuInit``, ``All log
messages before absl::InitializeLog()``) that ``TF_CPP_MIN_LOG_LEVEL`` does not silence: they
are written before its logging starts. A ``tfseq-*`` command imports TensorFlow and lists its
devices with file descriptor 2 pointed at a temporary file, and shows what was written there
only if that fails (or with ``TFSEQ_TF_LOGS=1``). Library users see TensorFlow as it is.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile


def is_command() -> bool:
    """Whether this process is a tfseq command or script: ``tfseq-*`` (a console script),
    ``python -m tfseq...`` (``argv[0]`` is ``-m`` while the package is imported) or a file in
    the checkout's ``scripts/``."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 == "-m" or os.path.basename(argv0).startswith("tfseq-"):
        return True
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return bool(argv0) and os.path.dirname(os.path.abspath(argv0)) == os.path.join(here, "scripts")


@contextlib.contextmanager
def native_stderr_kept():
    """Within the block, what is written to file descriptor 2 goes to a temporary file; it
    is written to stderr after all if the block raises."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real stderr: nothing to keep off
        yield
        return
    with tempfile.TemporaryFile() as kept:
        os.dup2(kept.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            kept.seek(0)
            os.write(2, kept.read())
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def import_tensorflow() -> None:
    """Imports TensorFlow and lists its devices; quietly for a command (see the module)."""
    if "tensorflow" in sys.modules or not is_command() or os.environ.get("TFSEQ_TF_LOGS"):
        return
    with native_stderr_kept():
        import tensorflow as tf

        tf.config.list_physical_devices()
