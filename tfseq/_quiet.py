"""TensorFlow's start-up and runtime log lines kept off the terminal.

TensorFlow's C++ runtime prints lines at import and device discovery (``oneDNN custom
operations are on``, ``Could not find cuda drivers``, ``failed call to cuInit``, ``All log
messages before absl::InitializeLog()``; twice, as its two libraries load) that
``TF_CPP_MIN_LOG_LEVEL`` does not silence: they are written before its logging starts.
``import tfseq`` imports TensorFlow and lists its devices with file descriptor 2 pointed at a
temporary file, and shows what was written there only if that fails, unless
``TF_CPP_MIN_LOG_LEVEL=0`` or ``TFSEQ_TF_LOGS=1`` asks for TensorFlow's lines.

A ``tfseq-*`` command also keeps TensorFlow's runtime lines at ERROR level off (e.g. ``Tensor
RefCount not reliable``, ``oneDNN supports DT_INT64 only on platforms with AVX-512``: nothing a
user can act on; real failures still stop the command with their message): it sets
``TF_CPP_MIN_LOG_LEVEL=3`` before TensorFlow starts, unless ``--verbose=2`` or
``TFSEQ_TF_LOGS=1``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile


def is_command() -> bool:
    """Whether this process is a tfseq command: ``tfseq-*`` (a console script), ``python -m
    tfseq.scripts...`` (``argv[0]`` is ``-m`` while the package is imported) or a file in the
    checkout's ``scripts/``."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 == "-m" or os.path.basename(argv0).startswith("tfseq-"):
        return True
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return bool(argv0) and os.path.dirname(os.path.abspath(argv0)) == os.path.join(here, "scripts")


def wants_tf_logs() -> bool:
    """``TFSEQ_TF_LOGS`` set, or a command run with ``--verbose=2`` (or more)."""
    if os.environ.get("TFSEQ_TF_LOGS"):
        return True
    if not is_command():
        return False
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        value = None
        if arg.startswith("--verbose="):
            value = arg.split("=", 1)[1]
        elif arg == "--verbose" and i + 1 < len(argv):
            value = argv[i + 1]
        if value is not None and value.lstrip("-").isdigit() and int(value) >= 2:
            return True
    return False


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
    """Imports TensorFlow and lists its devices, quietly (see the module docstring)."""
    if "tensorflow" in sys.modules:
        return
    logs = wants_tf_logs()
    if is_command() and not logs:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if logs or os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") == "0":
        return
    with native_stderr_kept():
        import tensorflow as tf

        tf.config.list_physical_devices()
