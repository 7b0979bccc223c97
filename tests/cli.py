"""tfseq's commands run as a user runs them, for the tests: the installed console scripts
(``tfseq-train`` ...) in their own processes, in the user's environment (no
``TF_CPP_MIN_LOG_LEVEL``), optionally with a fault point (``faults/sitecustomize.py``)."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faults")
BIN = os.path.dirname(sys.executable)
# TensorFlow's own log lines: what a user cannot act on.
TF_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d|^WARNING: All log messages before absl")


def environment(fault: str | None = None, env: dict | None = None) -> dict:
    """The environment of a command: the user's, with ``TFSEQ_FAULT=fault`` and the fault
    points loaded when ``fault`` is given."""
    out = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    out.update(env or {})
    if fault:
        out["TFSEQ_FAULT"] = fault
        out["PYTHONPATH"] = FAULTS
    return out


def argv(name: str, *args) -> list[str]:
    """``tfseq-<name> args...`` (``name``: train, predict, export, profile, data-service)."""
    return [os.path.join(BIN, f"tfseq-{name}"), *[str(a) for a in args]]


def run(name: str, *args, fault: str | None = None, env: dict | None = None, cwd=None,
        input: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs ``tfseq-<name> args...`` to its end; stdout and stderr captured as text."""
    return subprocess.run(argv(name, *args), capture_output=True, text=True, input=input,
                          env=environment(fault, env), cwd=cwd or ROOT, timeout=timeout)


def start(name: str, *args, fault: str | None = None, env: dict | None = None, cwd=None,
          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) -> subprocess.Popen:
    """Starts ``tfseq-<name> args...`` and returns the process."""
    return subprocess.Popen(argv(name, *args), stdout=stdout, stderr=stderr, text=True,
                            env=environment(fault, env), cwd=cwd or ROOT)


def tf_log_lines(text: str) -> list[str]:
    """TensorFlow's log lines in a command's output (none should reach a user)."""
    return [line for line in text.splitlines() if TF_LOG.match(line)]


def first_line(text: str) -> str:
    """The first non-blank line of ``text``."""
    return next((line for line in text.splitlines() if line.strip()), "")


def error_line(out: subprocess.CompletedProcess, status: int = 2) -> str:
    """The one line a refused command prints; asserts the status, one line on stderr and
    nothing of TensorFlow's."""
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == status, out.stderr[-3000:]
    assert len(lines) == 1 and re.match(r"tfseq-[a-z-]+: (error|stopped)", lines[0]), \
        out.stderr[-3000:]
    return lines[0]


# --- the same commands' paths in this process (where a process adds nothing to what is tested)

def flag_config(*args):
    """``(task, flag values, config)`` of ``tfseq-train args...``, through the command's own
    flag table (raises what the command reports: a ``flags.Error`` or an ``app.UsageError``)."""
    from absl import flags

    from tfseq.pipelines import tasks
    from tfseq.scripts import flag_table

    values = flags.FlagValues()
    flag_table.define(flag_table.FLAGS_TABLE, flag_values=values)
    values(["tfseq-train", *args])
    task = tasks.load(flag_table.task_name(values))
    return task, values, flag_table.build_config(task, values)


def runner(*args, **settings):
    """The ``Runner`` ``tfseq-train args...`` makes, in this process: its flags through the flag
    table, its run settings with ``settings`` (e.g. ``verbose=0``) in place of theirs."""
    import dataclasses
    import time

    from tfseq.pipelines.runner import Runner
    from tfseq.scripts import flag_table

    task, values, config = flag_config(*args)
    started = time.perf_counter()  # as the command's start: its report's first-step seconds
    return Runner(task, config, dataclasses.replace(flag_table.run_settings(values, started),
                                                    **settings))


def train_in_process(*args):
    """Trains as ``tfseq-train args... --verbose=0 --export=false`` does, in this process (the
    command's filter of Keras' end-of-epoch warning included); the ``TrainResult``."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        return runner(*args, verbose=0, export=False).run()


def refused(*args) -> str:
    """The line ``tfseq-train args...`` refuses to start with, in this process: the command's
    own path from its flags (flag table -> config -> ``Runner``) to the line it prints
    (``tfseq.scripts.run_command``: a flag error, a ``UsageError``, ``InputError``,
    ``SetupError`` or ``ChangedRun``); fails the test if the run would start."""
    from absl import app, flags

    from tfseq.errors import InputError
    from tfseq.pipelines.runner import SetupError
    from tfseq.pipelines.runs import ChangedRun
    from tfseq.scripts import flag_table

    try:
        runner(*args, verbose=0, export=False).run()
    except flags.Error as e:
        return f"tfseq-train: error: {e} (see tfseq-train --help)"
    except ChangedRun as e:
        return f"tfseq-train: error: {flag_table.changed_run_message(e)}"
    except (app.UsageError, InputError, SetupError) as e:
        return f"tfseq-train: error: {e}"
    raise AssertionError(f"tfseq-train {args} would start")
