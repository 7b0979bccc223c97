r"""Train a tfseq task end to end: your files -> model -> report -> an export on raw text.

Usage:
  tfseq-train --task=classify --model_dir=runs/demo            # what `make demo` runs
  tfseq-train --flagfile=runs/demo/flags.txt                   # the same run again (resumes)
  tfseq-train --task=classify --batching=pad --batch_size=32 --epochs=1

Your own data (``scripts/make_user_data.py`` writes examples of each):
  tfseq-train --task=classify --train_files='data/*.tsv' --header --columns=label,text
  tfseq-train --task=classify --train_files=d.csv --columns=text,label \
      --tokenizer=wordpiece --vocab_size=8000
  tfseq-train --task=lm --train_files=corpus.txt.gz --tokenizer=sentencepiece --vocab_size=8000
  tfseq-train --task=translate --source_files=train.en --target_files=train.de
  tfseq-train --task=tag --train_files=train.conll --format=conll --columns=token,_,_,tag

(``python scripts/train.py`` is the same command from a checkout.)

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
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

from tfseq.formats import FORMATS  # noqa: E402
from tfseq.pipelines import tasks  # noqa: E402

FLAGS = flags.FLAGS
_FLAGS_BEFORE = set(FLAGS)

flags.DEFINE_enum("task", "classify", [t for t in tasks.TASKS if t != "lm_tbptt"],
                  "Which task to train.")
flags.DEFINE_string("model_dir", "runs/default", "Checkpoints, logs, flags and the report.")
flags.DEFINE_list("files", [], "Files in the embedded corpus' format (default: the embedded "
                  "corpus).")
flags.DEFINE_list("train_files", [], "Your training files: comma-separated globs, .gz allowed.")
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
flags.DEFINE_integer("num_replicas", 1, "Replicas (GPUs, or logical CPUs without a GPU).")
flags.DEFINE_enum("strategy", "mirrored", ["mirrored", "multi_worker"],
                  "mirrored: --num_replicas on this machine. multi_worker: "
                  "MultiWorkerMirroredStrategy over the workers in TF_CONFIG (one process per "
                  "worker; the chief, index 0, writes checkpoints, logs and the report).")
flags.DEFINE_string("data_service", None, "tf.data service address, e.g. grpc://localhost:5000.")
flags.DEFINE_integer("tbptt", None, "Truncated-BPTT chunk length (task lm).")
flags.DEFINE_integer("verbose", 1, "0: only the report; 1: also progress lines and bars; 2: "
                     "also INFO logs.")
flags.DEFINE_boolean("export", True, "At the end of a finished run, write <model_dir>/export "
                     "(a SavedModel over raw text; see tfseq-export).")
OWN_FLAGS = sorted(set(FLAGS) - _FLAGS_BEFORE)
STARTED = time.perf_counter()  # the process' start, for the time to the first step

# Flag -> task Config field. A flag given explicitly must exist in the task's Config.
_CONFIG_FLAGS = {
    "files": "files", "vocab": "vocab_path", "batching": "batching", "batch_size": "batch_size",
    "max_tokens": "max_tokens", "max_length": "max_length", "block_length": "block_length",
    "boundaries": "boundaries", "seed": "seed", "tbptt": "tbptt",
    "train_files": "train_files", "eval_files": "eval_files", "format": "format",
    "columns": "columns", "header": "header", "eval_percent": "eval_percent",
    "source_files": "source_files", "target_files": "target_files", "tokenizer": "tokenizer",
    "vocab_size": "vocab_size", "vocab_max_lines": "vocab_max_lines",
    "long_examples": "long_examples", "shuffle_shard_bytes": "shuffle_shard_bytes",
}
_FLAG_OF_FIELD = {field: flag for flag, field in _CONFIG_FLAGS.items()}
_LIST_FLAGS = ("files", "train_files", "eval_files", "columns", "source_files", "target_files")
_INT_LIST_FLAGS = ("block_length", "boundaries")


def build_config(task):
    """The task's Config with every explicitly given flag applied.

    Raises:
      app.UsageError: a flag the task does not use, or flags that conflict.
    """
    fields = {f.name for f in dataclasses.fields(task.Config)}
    values = {}
    for flag_name, field in _CONFIG_FLAGS.items():
        flag = FLAGS[flag_name]
        if not flag.present or flag.value == flag.default:  # a flagfile repeats the defaults
            continue
        if field not in fields:
            raise app.UsageError(f"--{flag_name} is not used by --task={FLAGS.task} "
                                 f"(its options: {sorted(fields)})")
        value = flag.value
        if flag_name in _LIST_FLAGS:
            value = tuple(value)
        if flag_name in _INT_LIST_FLAGS:
            value = tuple(sorted({int(v) for v in value}))
            if flag_name == "block_length" and len(value) == 1:
                value = value[0]
        values[field] = value
    config = dataclasses.replace(task.Config(), **values)
    batching = getattr(config, "batching", "pad")
    for name, mode in (("batch_size", "pad"), ("block_length", "pack"), ("boundaries", "bucket")):
        if FLAGS[name].present and FLAGS[name].value != FLAGS[name].default and batching != mode:
            hint = " (use --max_tokens for a token budget)" if name == "batch_size" else ""
            raise app.UsageError(f"--{name} applies to --batching={mode}, not "
                                 f"--batching={batching}{hint}")
    if FLAGS.max_tokens is not None and batching == "pad":
        raise app.UsageError("--max_tokens applies to --batching=bucket or pack, not "
                             "--batching=pad (use --batch_size)")
    if FLAGS.max_tokens is not None and FLAGS.max_tokens <= 0:
        raise app.UsageError(f"--max_tokens must be a positive number of tokens per batch; "
                             f"received {FLAGS.max_tokens}")
    check_no_effect(config)
    return config


def check_no_effect(config) -> None:
    """A flag that would be silently ignored with the other flags given is an error naming it."""
    user = bool(getattr(config, "train_files", ())) or bool(getattr(config, "source_files", ()))
    for name in ("eval_files", "format", "columns", "header"):
        if FLAGS[name].value and not getattr(config, "train_files", ()):
            raise app.UsageError(f"--{name} applies to --train_files, which is not given")
    if FLAGS.eval_percent is not None and getattr(config, "eval_files", ()):
        raise app.UsageError("--eval_percent has no effect with --eval_files (nothing is held out)")
    if FLAGS.files and user:
        raise app.UsageError("--files (embedded-corpus format) and --train_files/--source_files "
                             "exclude each other")
    learned = getattr(config, "tokenizer", None) in ("wordpiece", "sentencepiece")
    for name in ("vocab_size", "vocab_max_lines"):
        if FLAGS[name].value is not None and not learned:
            raise app.UsageError(f"--{name} applies to --tokenizer=wordpiece or sentencepiece, "
                                 f"not --tokenizer={getattr(config, 'tokenizer', 'whitespace')}")
    if FLAGS.vocab and FLAGS.vocab_size is not None:
        raise app.UsageError("--vocab loads a vocabulary; --vocab_size learns one: give one")


def save_run_files(model_dir: str, argv) -> None:
    os.makedirs(model_dir, exist_ok=True)
    # Only this binary's flags: a flagfile must parse before TensorFlow defines its own.
    serialized = [FLAGS[name].serialize() for name in OWN_FLAGS]
    with open(os.path.join(model_dir, "flags.txt"), "w") as f:
        f.write("\n".join(s for s in serialized if s) + "\n")
    with open(os.path.join(model_dir, "argv.json"), "w") as f:
        json.dump(list(argv), f)


def progress_writer():
    """Where setup progress lines go: stderr, unless ``--verbose=0``."""
    if not FLAGS.verbose:
        return None
    return lambda line: print(line, file=sys.stderr, flush=True)


def changed_run_message(error) -> str:
    """The message of a resume whose settings differ: each change, then the ways out."""
    lines = [f"{error.model_dir} holds a run started with other settings; this command "
             "changes:"]
    for change in error.changes:
        if change.setting == "input":
            lines.append(f"  training file {change.saved}: {change.new}")
            continue
        group, _, field = change.setting.partition(".")
        flag = {"global_budget": "--num_replicas x --" + field,
                "model": f"model {field}"}.get(group, f"--{_FLAG_OF_FIELD.get(field, field)}")
        if change.setting == "workers":
            flag = "the number of workers (TF_CONFIG)"
        lines.append(f"  {flag}: saved {change.saved!r}, now {change.new!r}")
    flagfile = os.path.join(error.model_dir, "flags.txt")
    lines.append(f"Resume with the saved flags: --flagfile={flagfile} "
                 "(--num_replicas may change if --max_tokens keeps their product); or start a "
                 "new run with another --model_dir.")
    if any(c.setting == "input" for c in error.changes):
        vocab = [n for n in os.listdir(error.model_dir) if n.startswith(("vocab.", "source_vocab"))]
        if vocab:
            lines.append("To train on the changed files with this run's vocabulary, start a new "
                         "run with --model_dir=NEW "
                         f"--vocab={os.path.join(error.model_dir, vocab[0])}")
    return "\n".join(lines)


def fail(message: str) -> None:
    """Exits with status 2 and ``message`` (no traceback; ``--verbose=2`` logs one)."""
    logging.info("input error", exc_info=True)
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    sys.exit(2)


# ----------------------------------------------------------------------------- report

def make_report(*, task_name, config, mode, replicas, workers, learning_rate, result, stats,
                counters, eval_results, baselines, setup, data_state_bytes,
                drop_examples, first_step_seconds=None, timings=None) -> dict:
    """``report.json``: the same keys and shapes in every mode (single, replicated,
    multi_worker, data_service)."""
    seconds = result.train_seconds
    real = int(stats.real_tokens.numpy())
    return {
        "task": task_name, "config": dataclasses.asdict(config), "mode": mode,
        "replicas": replicas, "workers": workers, "data_service": FLAGS.data_service,
        "learning_rate": learning_rate, "steps": result.steps_done,
        "epochs": result.epochs_done, "interrupted": result.interrupted,
        "train_seconds": seconds, "history": result.history,
        "real_tokens": real, "real_tokens_per_second": real / seconds if seconds else 0.0,
        "padding_efficiency": stats.padding_efficiency(),
        "eval": eval_results, "baselines": baselines,
        "counters": {k: {"seen": c.seen(), "drops": c.drops()} for k, c in counters.items()},
        "drop_examples": drop_examples,
        "setup": {"passes": setup.passes, "records": setup.records, "seconds": setup.seconds,
                  "first_step_seconds": first_step_seconds},
        "data_state_bytes": data_state_bytes,
        "checkpoints": checkpoint_timings(timings),
    }


def checkpoint_timings(timings) -> dict:
    """The trainer's checkpoint timings for the report (the same keys in every mode)."""
    timings = timings or {"save": [], "restore": None, "first_batch": None}
    saves = timings["save"]
    return {"saved": len(saves), "save_seconds": sum(saves) / len(saves) if saves else None,
            "restore_seconds": timings["restore"],
            "first_batch_after_restore_seconds": timings["first_batch"]}


def format_report(report: dict) -> str:
    lines = ["", "=" * 64, f"tfseq report: task={report['task']} ({report['mode']}, "
             f"{report['replicas']} replica(s) x {report['workers']} worker(s))"]
    for split, c in report["counters"].items():
        read = c["seen"].get("lines_read", 0)
        routed = c["drops"].get("other_split", 0)
        dropped = {k: v for k, v in c["drops"].items() if v and k != "other_split"}
        kept = read - routed - sum(dropped.values())
        lines.append(f"  {split:5s} records read {read:7d}: {kept:6d} examples, {routed:6d} in "
                     f"the other split, {sum(dropped.values()):4d} dropped "
                     f"{dropped if dropped else ''}")
    lines.append(f"  padding efficiency of training batches: {report['padding_efficiency']:.3f}")
    lines.append(f"  training: {report['steps']} steps, {report['train_seconds']:.1f} s, "
                 f"{report['real_tokens_per_second']:,.0f} real tokens/s")
    setup = report["setup"]
    if setup["passes"] or setup["first_step_seconds"]:
        phases = "; ".join([f"{setup['passes']} read of the training files "
                            f"({setup['records']:,} records)"] * bool(setup["passes"])
                           + [f"{k} {v:.1f} s" for k, v in setup["seconds"].items()])
        first = (f", first step after {setup['first_step_seconds']:.1f} s"
                 if setup["first_step_seconds"] else "")
        lines.append(f"  before the first step: {phases}{first}")
    for example in report.get("drop_examples", []):
        lines.append(f"  dropped: {example}")
    for key, value in report["eval"].items():
        lines.append(f"  held-out {key}: {value:.4f}")
    for key, value in report["baselines"].items():
        lines.append(f"  {key} baseline: {value:.4f}")
    if report["interrupted"]:
        lines.append("  (interrupted: run the same command again to resume)")
    lines.append("=" * 64)
    return "\n".join(lines)


def write_report(path: str, report: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, indent=2, default=str)
    os.replace(path + ".tmp", path)


def finished_run(trainer) -> bool:
    """A run that already did its ``--epochs``: say so and show the saved report."""
    if int(trainer.epoch.numpy()) < FLAGS.epochs:
        return False
    saved = os.path.join(FLAGS.model_dir, "report.json")
    print(f"{FLAGS.model_dir} holds a finished run ({int(trainer.epoch.numpy())} epochs, "
          f"--epochs={FLAGS.epochs}): nothing to train. Use another --model_dir (or delete "
          f"this one) to train again, or raise --epochs to continue.")
    if os.path.exists(saved):
        with open(saved) as f:
            print(format_report(json.load(f)))
    return True


# ----------------------------------------------------------------------------- training

class Summaries:
    """TensorBoard logs every 50 steps: losses, real tokens/s, padding efficiency, drop counts,
    real lengths per row."""

    def __init__(self, stats, counters):
        import tensorflow as tf

        self.writer = tf.summary.create_file_writer(os.path.join(FLAGS.model_dir, "logs"))
        self.stats, self.counters = stats, counters
        self.started = time.perf_counter()
        self.lengths = []

    def on_batch(self, batch):
        parts = batch if isinstance(batch[0], tuple) else (batch,)
        for x, _, weights in parts:
            first = next(iter(x.values()))
            if first.shape.rank == 2:
                self.lengths.extend(int(n) for n, w in zip(
                    (first.numpy() != 0).sum(axis=1), weights.numpy().reshape(
                        first.shape[0], -1).max(axis=1)) if w > 0)

    def on_step(self, step, logs):
        from tfseq import summaries

        if step % 50:
            return
        with self.writer.as_default():
            for k, v in logs.items():
                summaries.scalar(f"train/{k}", v, step)
            summaries.scalar("input/padding_efficiency", self.stats.padding_efficiency(), step)
            seconds = time.perf_counter() - self.started
            summaries.scalar("input/real_tokens_per_second",
                             int(self.stats.real_tokens.numpy()) / max(seconds, 1e-9), step)
            for split, counter in self.counters.items():
                for reason, n in counter.drops().items():
                    summaries.scalar(f"drops_{split}/{reason}", n, step)
            summaries.histogram("input/real_length_per_row", self.lengths, step)
        self.lengths.clear()

    def on_eval(self, epoch, results):
        from tfseq import summaries

        with self.writer.as_default():
            for k, v in results.items():
                summaries.scalar(f"eval/{k}", v, epoch)


def make_strategy():
    """``(strategy or None, mode, local replicas, workers, worker index)``; before any other
    TensorFlow op (logical CPU devices must be set up first)."""
    import tfseq

    if FLAGS.strategy == "multi_worker":
        strategy = tfseq.distribute.multi_worker_strategy()
        local = len(strategy.extended.worker_devices)
        workers = strategy.num_replicas_in_sync // local
        resolver = strategy.cluster_resolver
        return strategy, "multi_worker", local, workers, int(resolver.task_id or 0)
    if FLAGS.num_replicas > 1 or FLAGS.data_service:
        mode = "data_service" if FLAGS.data_service else "replicated"
        return tfseq.mirrored_strategy(FLAGS.num_replicas), mode, FLAGS.num_replicas, 1, 0
    return None, "single", 1, 1, 0


def train_text(task, config) -> None:
    """Trains a spine task: open the run, stream, train, evaluate, report, export."""
    import contextlib

    import keras

    import tfseq
    from tfseq.formats import InputError
    from tfseq.pipelines import exporting, runs
    from tfseq.training import ReplicaTrainer, Trainer, data_state_bytes

    strategy, mode, local, workers, worker = make_strategy()
    chief = worker == 0
    model_config = model_config_of(task)
    try:
        run = runs.open_run(FLAGS.model_dir, task, config, model_config=model_config,
                            replicas=local, workers=workers, worker=worker,
                            write=progress_writer() if chief else None)
    except runs.ChangedRun as e:
        print(changed_run_message(e), file=sys.stderr)
        sys.exit(2)
    except (InputError, FileNotFoundError, ValueError) as e:
        fail(str(e))
    if chief:
        save_run_files(FLAGS.model_dir, sys.argv)
    logging.info("config: %s", config)
    counters = {"train": tfseq.DropCounter("train"), "eval": tfseq.DropCounter("eval")}
    stats = tfseq.BatchStats()
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        model = task.build_model(config, run.state, model_config)
    if mode == "data_service":
        return train_on_service(task, config, run, model, strategy, counters, stats, local)
    stream = task.training_stream(config, run.state, counters["train"], run.shards,
                                  replicas=local, parts=strategy is not None)
    summaries = Summaries(stats, counters)
    first_step = {}

    def on_step(step, logs):
        first_step.setdefault("seconds", round(time.perf_counter() - STARTED, 3))
        if chief:
            summaries.on_step(step, logs)

    options = dict(model_dir=FLAGS.model_dir, checkpoint_every=FLAGS.checkpoint_every,
                   on_step=on_step,
                   on_batch=summaries.on_batch if chief else None,
                   on_epoch_start=lambda epoch: counters["train"].reset(), stats=stats)
    trainer = (ReplicaTrainer(model, strategy, stream, **options) if strategy is not None
               else Trainer(model, stream, **options))
    resumed = trainer.restore()
    if resumed and finished_run(trainer):
        return
    if resumed and FLAGS.verbose and chief:
        print(f"Resuming from {FLAGS.model_dir}: epoch {int(trainer.epoch.numpy()) + 1}, "
              f"step {int(trainer.step_in_epoch.numpy())} of that epoch")
    eval_ds = task.eval_dataset(config, run.state, counters["eval"])
    local_model = model if strategy is None else task.build_model(config, run.state, model_config)

    def evaluate():
        if local_model is not model:  # a single-device copy: no collective op
            local_model.set_weights(model.get_weights())
        counters["eval"].reset()
        return {k: float(v) for k, v in
                local_model.evaluate(eval_ds, verbose=0, return_dict=True).items()}

    def eval_fn(epoch):
        results = evaluate() if chief else {}
        if chief:
            summaries.on_eval(epoch, results)
        return {f"eval_{k}": v for k, v in results.items()}

    result = trainer.fit(FLAGS.epochs, verbose=FLAGS.verbose if chief else 0,
                         eval_fn=eval_fn if workers == 1 else None, max_steps=FLAGS.max_steps)
    finished = not result.interrupted
    baselines = task.baselines(eval_ds) if finished and chief else {}
    eval_results = evaluate() if finished and chief else {}  # the eval counts: one pass
    checkpoints = trainer.checkpoint_dir and tfseq.training.checkpoints_newest_first(
        trainer.checkpoint_dir)
    report = make_report(
        task_name=task.name, config=config, mode=mode, replicas=local, workers=workers,
        learning_rate=float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
        result=result, stats=stats, counters=counters, eval_results=eval_results,
        baselines=baselines, setup=run.setup, first_step_seconds=first_step.get("seconds"),
        timings=trainer.timings,
        data_state_bytes=data_state_bytes(checkpoints[0]) if checkpoints else 0,
        drop_examples=drop_examples_of(task, config, counters))
    if not chief:
        worker_dir = os.path.join(FLAGS.model_dir, "workers", str(worker))
        os.makedirs(worker_dir, exist_ok=True)
        write_report(os.path.join(worker_dir, "report.json"), report)
        return
    write_report(os.path.join(FLAGS.model_dir, "report.json"), report)
    print(format_report(report))
    if finished:
        for line in task.sample_lines(config, run.state, local_model, eval_ds):
            print(line)
        if FLAGS.export:
            path = exporting.export_run(FLAGS.model_dir, task, config, run.state, local_model)
            if path:
                print(f"Served model ({task.name}, input `{task.prediction_input}`): {path}")


def train_on_service(task, config, run, model, strategy, counters, stats, local) -> None:
    """``--data_service``: ``model.fit`` on the service's split batches; the weights are
    saved at each epoch end (``weights.weights.h5``) and a run resumes at epoch boundaries."""
    import keras

    from tfseq.pipelines import exporting
    from tfseq.training import TrainResult

    dataset_fn = task.replica_dataset_fn(config, run.state, counters["train"], local,
                                         data_service=FLAGS.data_service, stats=stats)
    dist = strategy.distribute_datasets_from_function(dataset_fn)
    weights_path = os.path.join(FLAGS.model_dir, "weights.weights.h5")
    start = time.perf_counter()
    history = model.fit(dist, epochs=FLAGS.epochs, verbose=FLAGS.verbose,
                        callbacks=[keras.callbacks.ModelCheckpoint(weights_path,
                                                                   save_weights_only=True)])
    seconds = time.perf_counter() - start
    records = [{"epoch": i + 1, **{k: float(v[i]) for k, v in history.history.items()}}
               for i in range(len(history.history.get("loss", [])))]
    result = TrainResult(len(records), int(model.optimizer.iterations.numpy()), False, records,
                         seconds)
    local_model = task.build_model(config, run.state, model_config_of(task))
    local_model.set_weights(model.get_weights())
    eval_ds = task.eval_dataset(config, run.state, counters["eval"])
    eval_results = {k: float(v) for k, v in
                    local_model.evaluate(eval_ds, verbose=0, return_dict=True).items()}
    report = make_report(
        task_name=task.name, config=config, mode="data_service", replicas=local, workers=1,
        learning_rate=float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
        result=result, stats=stats, counters=counters, eval_results=eval_results,
        baselines=task.baselines(eval_ds), setup=run.setup, data_state_bytes=0,
        drop_examples=drop_examples_of(task, config, counters))
    write_report(os.path.join(FLAGS.model_dir, "report.json"), report)
    print(format_report(report))
    if FLAGS.export:
        exporting.export_run(FLAGS.model_dir, task, config, run.state, local_model)


def drop_examples_of(task, config, counters, limit: int = 5) -> list[str]:
    """The first ``file:line: reason`` of malformed records, when some were dropped."""
    dropped = any(n for c in counters.values() for r, n in c.drops().items()
                  if r in ("malformed", "invalid_utf8", "empty_text", "unequal_counts"))
    if not dropped or not hasattr(task, "source"):
        return []
    return task.source(config, "train").drop_examples(limit)[:limit]


def model_config_of(task):
    """The task model's ``ModelConfig``, with ``--learning_rate`` if given."""
    overrides = {}
    if FLAGS.learning_rate is not None:
        overrides["learning_rate"] = FLAGS.learning_rate
    return task.model_config(**overrides)


def train_own(task, config) -> None:
    """Trains a task with a pipeline of its own (documents, ctr, lm --tbptt): one device, its
    dataset's iterator checkpointed."""
    import keras

    import tfseq
    from tfseq.pipelines.state import PassReport
    from tfseq.training import Trainer, data_state_bytes

    if FLAGS.num_replicas > 1 or FLAGS.data_service or FLAGS.strategy == "multi_worker":
        raise app.UsageError(f"--num_replicas/--data_service/--strategy are not supported by "
                             f"--task={FLAGS.task} (supported: {sorted(tasks.SPINE)})")
    save_run_files(FLAGS.model_dir, sys.argv)
    try:
        train_ds, eval_ds, info = task.pipeline.datasets(config)
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    model = task.build_model(config, info, model_config_of(task))
    counters = info.get("counters", {})
    stats = info.get("stats", {}).get("train") or tfseq.BatchStats()
    summaries = Summaries(stats, counters)
    trainer = Trainer(model, train_ds, model_dir=FLAGS.model_dir,
                      checkpoint_every=FLAGS.checkpoint_every,
                      trackables={f"counter_{split}_{k}": v for split, c in counters.items()
                                  for k, v in c.variables().items()},
                      on_step=summaries.on_step,
                      on_epoch_start=(lambda epoch: counters["train"].reset())
                      if info.get("reread_each_epoch") and "train" in counters else None)
    if trainer.restore() and finished_run(trainer):
        return

    def eval_fn(epoch):
        return {f"eval_{k}": float(v) for k, v in
                model.evaluate(eval_ds, verbose=0, return_dict=True).items()}

    result = trainer.fit(FLAGS.epochs, verbose=FLAGS.verbose, eval_fn=eval_fn,
                         max_steps=FLAGS.max_steps)
    eval_results = {} if result.interrupted else {
        k: float(v) for k, v in model.evaluate(eval_ds, verbose=0, return_dict=True).items()}
    checkpoints = tfseq.training.checkpoints_newest_first(trainer.checkpoint_dir)
    report = make_report(
        task_name=FLAGS.task, config=config, mode="single", replicas=1, workers=1,
        learning_rate=float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
        result=result, stats=stats, counters=counters, eval_results=eval_results,
        baselines={}, setup=PassReport(), timings=trainer.timings,
        data_state_bytes=data_state_bytes(checkpoints[0]) if checkpoints else 0,
        drop_examples=[])
    write_report(os.path.join(FLAGS.model_dir, "report.json"), report)
    print(format_report(report))


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
    config = build_config(task)
    if FLAGS.mixed_precision:  # configuration only: no TensorFlow op runs here
        import keras
        keras.mixed_precision.set_global_policy("mixed_float16")
    if isinstance(task, tasks.OwnPipelineTask):
        return train_own(task, config)
    return train_text(task, config)


def run():
    """The ``tfseq-train`` command."""
    from tfseq.scripts import run_command
    run_command(__name__, main)


if __name__ == "__main__":
    run()
