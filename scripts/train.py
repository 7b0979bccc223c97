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
import signal
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

from tfseq.formats import FORMATS  # noqa: E402
from tfseq.pipelines import tasks  # noqa: E402
from tfseq.pipelines.flag_config import (  # noqa: E402
    build_config, changed_run_message, run_settings, save_run_files)
from tfseq.pipelines.runner import Runner, SetupError  # noqa: E402
from tfseq.pipelines.runs import ChangedRun  # noqa: E402
from tfseq.scripts import COMMANDS, fail, run_command  # noqa: E402

COMMAND = COMMANDS["train"]

FLAGS = flags.FLAGS
_FLAGS_BEFORE = set(FLAGS)

flags.DEFINE_enum("task", "classify", [t for t in tasks.TASKS if t != "lm_tbptt"],
                  "Which task to train.")
flags.DEFINE_string("model_dir", "runs/default", "Checkpoints, logs, flags and the report.")
flags.DEFINE_list("files", [], "Files in the embedded corpus' format (default: the embedded "
                  "corpus).")
flags.DEFINE_list("train_files", [], "Your training files: comma-separated globs, .gz allowed. "
                  "Several corpora at set proportions: GLOB@WEIGHT entries, e.g. "
                  "'news/*.tsv@0.7,web/*.tsv.gz@0.3' (each entry a source, mixed exactly).")
flags.DEFINE_float("mix_temperature", None, "Each --train_files entry a source, weighted by its "
                   "records ** (1/T): 1 in proportion to size, higher evens them out.")
flags.DEFINE_list("eval_files", [], "Your eval files (default: hold out --eval_percent).")
flags.DEFINE_enum("format", None, list(FORMATS),
                  "File format (default: from the extension).")
flags.DEFINE_list("columns", [], "Field names in order, e.g. label,text ('_' skips a field).")
flags.DEFINE_boolean("header", False, "Skip the first line of every file.")
flags.DEFINE_integer("eval_percent", None, "Percent of training lines held out (hashed).")
flags.DEFINE_list("source_files", [], "translate: source side, plain text line-aligned.")
flags.DEFINE_list("target_files", [], "translate: target side, plain text line-aligned.")
flags.DEFINE_enum("tokenizer", None, ["whitespace", "unicode_script", "wordpiece",
                                      "sentencepiece"], "Tokenizer (task default: whitespace).")
flags.DEFINE_integer("vocab_size", None, "Learn a wordpiece/sentencepiece vocab of this size.")
flags.DEFINE_integer("vocab_max_lines", None, "Lines sampled (uniformly over the training "
                     "files) to learn a vocabulary (default 1M).")
flags.DEFINE_enum("long_examples", None, ["truncate", "drop"],
                  "Examples over --max_length: truncate (counted) or drop (counted).")
flags.DEFINE_string("vocab", None, "Vocabulary file (or SentencePiece .model) to load.")
flags.DEFINE_enum("batching", None, ["pad", "bucket", "pack"], "Batching mode (task default).")
flags.DEFINE_integer("batch_size", None, "Examples per batch per replica for --batching=pad.")
flags.DEFINE_integer("max_tokens", None, "Token budget per replica (rows x padded length) "
                     "for --batching=bucket or pack.")
flags.DEFINE_integer("max_length", None, "Tokens per example (see --long_examples).")
flags.DEFINE_list("block_length", None, "Row length for --batching=pack, or several (e.g. "
                  "32,64,128): each example goes into the shortest rows that hold it, and each "
                  "batch has rows of one length (task default: 32,64,128; translate: 64).")
flags.DEFINE_list("boundaries", None, "Bucket upper lengths for --batching=bucket, e.g. "
                  "16,32,64 (default: every length its own bucket).")
flags.register_validator(
    "block_length", lambda v: v is None or all(s.isdigit() and int(s) > 0 for s in v),
    "--block_length takes positive ints: one (128) or several (32,64,128)")
flags.register_validator(
    "boundaries", lambda v: v is None or all(s.isdigit() and int(s) > 0 for s in v),
    "--boundaries takes positive ints, e.g. 16,32,64")
flags.DEFINE_float("learning_rate", None, "Adam learning rate (default: the model's, 0.003). "
                   "A bucket or pack step carries several times the tokens of a padded one: "
                   "scale the rate by the square root of that ratio (docs/benchmarks.md).")
flags.register_validator("learning_rate", lambda v: v is None or v > 0,
                         "--learning_rate must be > 0")
flags.DEFINE_integer("seed", 0, "Seed for shuffling.")
flags.DEFINE_integer("shuffle_shard_bytes", None, "Text per shard of the line shuffle (default "
                     "64 MiB): its memory bound; larger inputs are spilled into "
                     "<model_dir>/data/ in shards of this size.")
flags.DEFINE_integer("epochs", 2, "Epochs to train.")
flags.DEFINE_integer("max_steps", None, "Stop after this many steps in this run (resumable).")
flags.DEFINE_integer("checkpoint_every", 200, "Checkpoint every N steps (0: epoch ends only).")
flags.DEFINE_boolean("mixed_precision", False, "Train with the mixed_float16 policy.")
flags.DEFINE_integer("steps_per_execution", 1, "Training steps per Python call: the batches "
                     "are taken, trained on and counted inside one graph (progress, "
                     "checkpoints and signals between calls). One replica, no --data_service; "
                     "TensorBoard then has no per-batch row lengths.", lower_bound=1)
flags.DEFINE_boolean("jit_compile", False, "Compile each training step with XLA, one program "
                     "per batch shape; training batches are padded and filled to a few shapes "
                     "(the report's `jit` says how many). One replica, no --data_service.")
flags.DEFINE_integer("num_replicas", 1, "Replicas (GPUs, or logical CPUs without a GPU).")
flags.DEFINE_enum("strategy", "mirrored", ["mirrored", "multi_worker"],
                  "mirrored: --num_replicas on this machine. multi_worker: "
                  "MultiWorkerMirroredStrategy over the workers in TF_CONFIG (one process per "
                  "worker; the chief, index 0, writes checkpoints, logs and the report).")
flags.DEFINE_string("data_service", None, "tf.data service address, e.g. grpc://localhost:5000.")
flags.DEFINE_integer("tbptt", None, "Truncated-BPTT chunk length (task lm).")
flags.DEFINE_integer("verbose", 1, "0: only the report; 1: also progress lines and bars; 2: "
                     "also INFO logs.")
flags.DEFINE_boolean("export", True, "When the run finishes or stops at --max_steps, write "
                     "<model_dir>/export (a SavedModel over raw text; see tfseq-export).")
OWN_FLAGS = sorted(set(FLAGS) - _FLAGS_BEFORE)
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
    name = "lm_tbptt" if FLAGS.task == "lm" and FLAGS["tbptt"].present else FLAGS.task
    task = tasks.load(name)
    config = build_config(task, FLAGS)
    if FLAGS.mixed_precision:  # configuration only: no TensorFlow op runs here
        import keras
        keras.mixed_precision.set_global_policy("mixed_float16")
    runner = Runner(task, config, run_settings(FLAGS, STARTED), on_opened=lambda: save_run_files(
        FLAGS.model_dir, sys.argv, FLAGS, OWN_FLAGS))
    try:
        result = runner.run()
    except ChangedRun as e:
        fail(COMMAND, changed_run_message(e))
    except SetupError as e:
        logging.debug("setup failed", exc_info=True)  # shown with -v 1
        fail(COMMAND, str(e))
    if result is not None and result.signal:  # preempted: not a success (schedulers requeue)
        sys.exit(128 + signal.Signals[result.signal].value)


def run():
    """The ``tfseq-train`` command."""
    run_command(__name__, main)


if __name__ == "__main__":
    run()
