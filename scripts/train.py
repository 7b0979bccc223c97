r"""Train a tfseq task end to end: your files -> model -> report -> an export on raw text.

Usage:
  tfseq-train --task=classify --model_dir=runs/demo            # what `make demo` runs
  tfseq-train --flagfile=runs/demo/flags.txt                   # the same run again (resumes)
  tfseq-train --task=classify --batching=pad --batch_size=32 --epochs=1

Your own data (in a checkout, ``python tools/make_user_data.py`` writes examples of each):
  tfseq-train --task=classify --train_files='data/*.tsv' --header --columns=label,text
  tfseq-train --task=classify --train_files=d.csv --columns=text,label \
      --tokenizer=wordpiece --vocab_size=8000
  tfseq-train --task=lm --train_files=corpus.txt.gz --tokenizer=sentencepiece --vocab_size=8000
  tfseq-train --task=classify --train_files=d.tsv --columns=label,text \
      --keras_hub=bert_preset_dir              # a KerasHub model (docs/keras_hub.md)
  tfseq-train --task=translate --source_files=train.en --target_files=train.de
  tfseq-train --task=tag --train_files=train.conll --format=conll --columns=token,_,_,tag

(``python -m tfseq.scripts.train`` is the same command.)

Before the first step a run reads its training files once: the vocabulary (a uniform sample of
``--vocab_max_lines`` lines for wordpiece/sentencepiece), the labels or tags, and the line
shuffle's shards, all written into ``--model_dir`` (progress on stderr; ``--verbose=0`` hides
it). Runs are resumable: checkpoints (model, optimizer, the input's position: a few integers,
and the drop counters) go to ``--model_dir/ckpt`` every ``--checkpoint_every`` steps, at each
epoch end and on SIGINT/SIGTERM; the same command again continues mid-epoch with no example
lost or repeated, also on another ``--num_replicas`` at the same global budget
(``--num_replicas`` x ``--max_tokens``: 2 x 2048 resumes as 4 x 1024). A resume with any other
changed setting (files, format, columns, batching, budgets, lengths, vocabulary, seed, model
size, workers) stops before training, naming each change; exit status 2.

``--model_dir`` also gets ``flags.txt`` (usable with ``--flagfile``), ``argv.json``,
``run.json``, TensorBoard logs under ``logs/`` and ``report.json`` (one schema in every mode).

Exit status: 0 trained (or nothing left to train); 2 could not start (one line on stderr,
nothing written for a new run); 128 + the signal (143 SIGTERM, 130 SIGINT) when preempted:
the checkpoint is saved, run the same command again.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

from tfseq.pipelines import tasks  # noqa: E402
from tfseq.pipelines.runner import Runner, SetupError  # noqa: E402
from tfseq.pipelines.runs import ChangedRun  # noqa: E402
from tfseq.scripts import COMMANDS, fail, flag_table, interrupted, run_command  # noqa: E402
from tfseq.scripts.flag_table import (  # noqa: E402
    build_config, changed_run_message, run_settings, save_run_files)

COMMAND = COMMANDS["train"]

FLAGS = flags.FLAGS
_FLAGS_BEFORE = set(FLAGS)

flag_table.define(flag_table.FLAGS_TABLE)
OWN_FLAGS = sorted(set(FLAGS) - _FLAGS_BEFORE)
RUNNER = [None]  # this command's Runner, once made (what a signal leaves: Runner.kept)
STARTED = time.perf_counter()  # the process' start, for the time to the first step


def main(argv):
    # The first epoch's length is unknown to Keras (a tf.data pipeline of unknown cardinality),
    # so it warns at the end of it that the input "ran out of data": that is the epoch's end.
    warnings.filterwarnings("ignore", message="Your input ran out of data")
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if FLAGS.verbose < 2:  # keep the progress bar and the report readable
        logging.set_verbosity(logging.WARNING)
        import tensorflow as tf
        tf.get_logger().setLevel("WARNING")
    task = tasks.load(flag_table.task_name(FLAGS))
    config = build_config(task, FLAGS)
    if FLAGS.mixed_precision:  # configuration only: no TensorFlow op runs here
        import keras
        keras.mixed_precision.set_global_policy("mixed_float16")
    runner = Runner(task, config, run_settings(FLAGS, STARTED), on_opened=lambda: save_run_files(
        FLAGS.model_dir, sys.argv, FLAGS, OWN_FLAGS))
    RUNNER[0] = runner
    try:
        result = runner.run()
    except ChangedRun as e:
        fail(COMMAND, changed_run_message(e))
    except SetupError as e:
        logging.debug("setup failed", exc_info=True)  # shown with -v 1
        fail(COMMAND, str(e))
    if result is not None and result.signal:  # preempted: not a success (schedulers requeue)
        interrupted(COMMAND, result.signal, runner.kept())


def run():
    """The ``tfseq-train`` command."""
    run_command(__name__, main,
                kept=lambda: RUNNER[0].kept() if RUNNER[0] else "nothing was written")


if __name__ == "__main__":
    run()
