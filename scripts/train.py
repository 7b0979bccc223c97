r"""Train a tfseq task end to end: pipeline -> Keras model -> report.

Usage:
  python scripts/train.py --task=classify --model_dir=runs/demo
  python scripts/train.py --flagfile=runs/demo/flags.txt          # same config again
  python scripts/train.py --task=classify --batching=pad --batch_size=32 --epochs=1

Your own data (``scripts/make_user_data.py`` writes examples of each):
  python scripts/train.py --task=classify --train_files='data/*.tsv' --header --columns=label,text
  python scripts/train.py --task=classify --train_files=d.csv --columns=text,label \
      --tokenizer=wordpiece --vocab_size=8000
  python scripts/train.py --task=lm --train_files=corpus.txt.gz --tokenizer=sentencepiece \
      --vocab_size=8000
  python scripts/train.py --task=translate --source_files=train.en --target_files=train.de

Classify writes the classes to ``<model_dir>/labels.txt`` (label id = line number); every
malformed line is a counted drop, the first few named ``file:line`` in ``report.json``.

Runs are resumable: checkpoints (model, optimizer, the tf.data iterator and the drop counters)
go to ``--model_dir`` every ``--checkpoint_every`` steps, at each epoch end and on
SIGINT/SIGTERM; running the same command again continues mid-epoch with no example lost or
repeated. ``--model_dir`` also gets ``flags.txt`` (usable with ``--flagfile``), ``argv.json``,
TensorBoard logs under ``logs/`` and ``report.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402

from pipelines import tasks  # noqa: E402

FLAGS = flags.FLAGS
_FLAGS_BEFORE = set(FLAGS)

flags.DEFINE_enum("task", "classify", sorted(tasks.TASKS), "Which task to train.")
flags.DEFINE_string("model_dir", "runs/default", "Checkpoints, logs, flags and the report.")
flags.DEFINE_list("files", [], "Verse-format files or globs (default: the embedded corpus).")
flags.DEFINE_list("train_files", [], "Your training files: comma-separated globs, .gz allowed.")
flags.DEFINE_list("eval_files", [], "Your eval files (default: hold out --eval_percent).")
flags.DEFINE_enum("format", None, ["tsv", "csv", "text"], "File format (default: extension).")
flags.DEFINE_list("columns", [], "Field names in order, e.g. label,text ('_' skips a field).")
flags.DEFINE_boolean("header", False, "Skip the first line of every file.")
flags.DEFINE_integer("eval_percent", None, "Percent of training lines held out (hashed).")
flags.DEFINE_list("source_files", [], "translate: source side, plain text line-aligned.")
flags.DEFINE_list("target_files", [], "translate: target side, plain text line-aligned.")
flags.DEFINE_enum("tokenizer", None, ["whitespace", "unicode_script", "wordpiece",
                                      "sentencepiece"], "Tokenizer (task default: whitespace).")
flags.DEFINE_integer("vocab_size", None, "Learn a wordpiece/sentencepiece vocab of this size.")
flags.DEFINE_integer("vocab_max_lines", None, "Lines read to learn a vocabulary (1M default).")
flags.DEFINE_enum("long_examples", None, ["truncate", "drop"],
                  "Examples over --max_length: truncate (counted) or drop (counted).")
flags.DEFINE_string("vocab", None, "Vocabulary file (or SentencePiece .model) to load.")
flags.DEFINE_enum("batching", None, ["pad", "bucket", "pack"], "Batching mode (task default).")
flags.DEFINE_integer("batch_size", None, "Examples per batch for --batching=pad.")
flags.DEFINE_integer("max_tokens", None, "Token budget (rows x padded length) per batch.")
flags.DEFINE_integer("max_length", None, "Tokens per example (see --long_examples).")
flags.DEFINE_list("block_length", None, "Row length for --batching=pack, or several (e.g. "
                  "32,64,128): each example goes into the shortest rows that hold it, and each "
                  "batch has rows of one length (task default: 32,64,128; translate: 64).")
flags.DEFINE_list("boundaries", None, "Bucket boundaries for --batching=bucket.")
flags.register_validator(
    "block_length", lambda v: v is None or all(s.isdigit() and int(s) > 0 for s in v),
    "--block_length takes positive ints: one (128) or several (32,64,128)")
flags.DEFINE_float("learning_rate", None, "Adam learning rate (default: the model's, 0.003). "
                   "A bucket or pack step carries several times the tokens of a padded one: "
                   "scale the rate by the square root of that ratio (README: time to accuracy).")
flags.register_validator("learning_rate", lambda v: v is None or v > 0,
                         "--learning_rate must be > 0")
flags.DEFINE_integer("seed", 0, "Seed for shuffling.")
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
flags.DEFINE_integer("verbose", 1, "0: quiet; 1: progress bar and report; 2: also INFO logs.")
flags.DEFINE_boolean("export", True, "At the end of a finished run, write <model_dir>/export "
                     "(a SavedModel over raw text; see scripts/export.py).")
OWN_FLAGS = sorted(set(FLAGS) - _FLAGS_BEFORE)

# Flag -> task Config field. A flag given explicitly must exist in the task's Config.
_CONFIG_FLAGS = {
    "files": "files", "vocab": "vocab_path", "batching": "batching", "batch_size": "batch_size",
    "max_tokens": "max_tokens", "max_length": "max_length", "block_length": "block_length",
    "boundaries": "boundaries", "seed": "seed", "tbptt": "tbptt",
    "train_files": "train_files", "eval_files": "eval_files", "format": "format",
    "columns": "columns", "header": "header", "eval_percent": "eval_percent",
    "source_files": "source_files", "target_files": "target_files", "tokenizer": "tokenizer",
    "vocab_size": "vocab_size", "vocab_max_lines": "vocab_max_lines",
    "long_examples": "long_examples",
}
_LIST_FLAGS = ("files", "train_files", "eval_files", "columns", "source_files", "target_files")


def model_config(model_module):
    """The model module's ``ModelConfig``, with ``--learning_rate`` if given."""
    config = model_module.ModelConfig()
    if FLAGS.learning_rate is not None:
        config = dataclasses.replace(config, learning_rate=FLAGS.learning_rate)
    return config


def build_config(pipeline):
    """The task's Config with every explicitly given flag applied.

    Raises:
      app.UsageError: a flag the task does not use, or flags that conflict.
    """
    fields = {f.name for f in dataclasses.fields(pipeline.Config)}
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
        if flag_name == "boundaries":
            value = tuple(int(b) for b in value)
        if flag_name == "block_length":
            value = parse_block_length(value)
        values[field] = value
    config = dataclasses.replace(pipeline.Config(), **values)
    batching = getattr(config, "batching", "pad")
    if FLAGS["batch_size"].present and batching != "pad":
        raise app.UsageError(f"--batch_size applies to --batching=pad, not --batching={batching} "
                             "(use --max_tokens for a token budget)")
    if FLAGS["block_length"].present and batching != "pack":
        raise app.UsageError(f"--block_length applies to --batching=pack, not --batching={batching}")
    if FLAGS["boundaries"].present and batching != "bucket":
        raise app.UsageError(f"--boundaries applies to --batching=bucket, not --batching={batching}")
    if FLAGS.max_tokens is not None and batching == "pad":
        raise app.UsageError("--max_tokens applies to --batching=bucket or pack, not "
                             "--batching=pad (use --batch_size)")
    check_no_effect(config)
    return config


def parse_block_length(values):
    """``--block_length`` strings (validated) -> one int, or a tuple of ascending ints."""
    lengths = sorted({int(text) for text in values})
    return lengths[0] if len(lengths) == 1 else tuple(lengths)


def check_no_effect(config) -> None:
    """A flag that would be silently ignored with the other flags given is an error naming it."""
    user = bool(getattr(config, "train_files", ())) or bool(getattr(config, "source_files", ()))
    for name in ("eval_files", "format", "columns", "header"):
        if FLAGS[name].value and not getattr(config, "train_files", ()):
            raise app.UsageError(f"--{name} applies to --train_files, which is not given")
    if FLAGS.eval_percent is not None and getattr(config, "eval_files", ()):
        raise app.UsageError("--eval_percent has no effect with --eval_files (nothing is held out)")
    if FLAGS.files and user:
        raise app.UsageError("--files (verse-format files) and --train_files/--source_files "
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


def format_report(report: dict) -> str:
    lines = ["", "=" * 64, f"tfseq report: task={report['task']}"]
    for split, c in report["counters"].items():
        read = c["seen"].get("lines_read", 0)
        routed = c["drops"].get("other_split", 0)
        dropped = {k: v for k, v in c["drops"].items() if v and k != "other_split"}
        kept = read - routed - sum(dropped.values())
        lines.append(f"  {split:5s} lines read {read:7d}: {kept:6d} examples, {routed:6d} in the "
                     f"other split, {sum(dropped.values()):4d} dropped {dropped if dropped else ''}")
    if "padding_efficiency" in report:
        lines.append(f"  padding efficiency of training batches: {report['padding_efficiency']:.3f}")
    if "replicas" in report:
        lines.append(f"  training: {report['replicas']} replicas, {report['epochs']} epochs, "
                     f"{report['train_seconds']:.1f} s")
    else:
        lines.append(f"  training: {report['steps']} steps, {report['train_seconds']:.1f} s, "
                     f"{report['real_tokens_per_second']:,.0f} real tokens/s")
    for example in report.get("drop_examples", []):
        lines.append(f"  dropped: {example}")
    for key, value in report.get("eval", {}).items():
        lines.append(f"  held-out {key}: {value:.4f}")
    if "majority_baseline" in report:
        lines.append(f"  majority-class baseline: {report['majority_baseline']:.4f}")
    if report.get("interrupted"):
        lines.append("  (interrupted: run the same command again to resume)")
    lines.append("=" * 64)
    return "\n".join(lines)


def main(argv):
    # The first epoch's length is unknown to Keras (a tf.data pipeline of unknown cardinality),
    # so it warns at the end of it that the input "ran out of data": that is the epoch's end.
    warnings.filterwarnings("ignore", message="Your input ran out of data")
    import keras
    import tensorflow as tf

    from tfseq import summaries
    from tfseq.training import Trainer

    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if FLAGS.verbose < 2:  # keep the progress bar and the report readable
        logging.set_verbosity(logging.WARNING)
        tf.get_logger().setLevel("WARNING")
    task = "lm_tbptt" if FLAGS.task == "lm" and FLAGS["tbptt"].present else FLAGS.task
    pipeline, model_module = tasks.load(task)
    config = build_config(pipeline)
    if FLAGS.max_tokens is not None and FLAGS.max_tokens <= 0:
        raise app.UsageError(f"--max_tokens must be a positive number of tokens per batch; "
                             f"received {FLAGS.max_tokens}")
    multi_worker = FLAGS.strategy == "multi_worker"
    distributed = FLAGS.num_replicas > 1 or FLAGS.data_service or multi_worker
    if distributed and not hasattr(pipeline, "replica_dataset_fn"):
        raise app.UsageError(f"--num_replicas/--data_service are not supported by --task={FLAGS.task} "
                             "(supported: " + ", ".join(
                                 t for t in sorted(tasks.TASKS)
                                 if hasattr(tasks.load(t)[0], "replica_dataset_fn")) + ")")
    save_run_files(FLAGS.model_dir, sys.argv)
    if FLAGS.mixed_precision:  # configuration only: no TensorFlow op runs here
        keras.mixed_precision.set_global_policy("mixed_float16")
    if distributed:
        # Before any other TensorFlow op: logical CPU devices must be set up first.
        import tfseq

        if multi_worker:
            from tfseq.replicated import multi_worker_strategy
            strategy = multi_worker_strategy()
        else:
            strategy = tfseq.mirrored_strategy(FLAGS.num_replicas)
        return train_replicas(pipeline, model_module, config, strategy)
    logging.info("config: %s", config)

    train_ds, eval_ds, info = input_datasets(pipeline, config)
    model = model_module.build_model(config, info, model_config(model_module))
    counters = info.get("counters", {})
    stats = info.get("stats", {})
    writer = tf.summary.create_file_writer(os.path.join(FLAGS.model_dir, "logs"))
    train_stats = stats.get("train")
    started = [time.perf_counter()]
    recent_lengths = []  # real tokens per row since the last summary

    def on_batch(batch):
        ids = batch[0].get("ids") if isinstance(batch[0], dict) else None
        if isinstance(ids, tf.Tensor) and ids.shape.rank == 2:
            recent_lengths.extend(tf.math.count_nonzero(ids, axis=1).numpy().tolist())

    def on_step(step, logs):
        if step % 50:
            return
        with writer.as_default():
            for k, v in logs.items():
                summaries.scalar(f"train/{k}", v, step)
            if train_stats is not None:
                summaries.scalar("input/padding_efficiency", train_stats.padding_efficiency(), step)
                seconds = time.perf_counter() - started[0]
                summaries.scalar("input/real_tokens_per_second",
                                 int(train_stats.real_tokens.numpy()) / max(seconds, 1e-9), step)
            for split, counter in counters.items():
                for reason, n in counter.drops().items():
                    summaries.scalar(f"drops_{split}/{reason}", n, step)
            summaries.histogram("input/real_length_per_row", recent_lengths, step)
        recent_lengths.clear()

    def eval_fn(epoch):
        results = model.evaluate(eval_ds, verbose=0, return_dict=True)
        with writer.as_default():
            for k, v in results.items():
                summaries.scalar(f"eval/{k}", v, epoch)
        return {f"eval_{k}": float(v) for k, v in results.items()}

    trainer = Trainer(model, train_ds, model_dir=FLAGS.model_dir,
                      checkpoint_every=FLAGS.checkpoint_every,
                      trackables={f"counter_{k}": v for k, v in _counter_vars(counters).items()},
                      on_step=on_step, on_batch=on_batch,
                      on_epoch_start=(lambda epoch: counters["train"].reset())
                      if info.get("reread_each_epoch") and "train" in counters else None)
    resumed = trainer.restore()
    if resumed and int(trainer.epoch.numpy()) >= FLAGS.epochs:
        # A finished run: training again would report an empty epoch (0 tokens/s) over the
        # saved report. Say so and show the saved report instead.
        saved = os.path.join(FLAGS.model_dir, "report.json")
        print(f"{FLAGS.model_dir} holds a finished run ({int(trainer.epoch.numpy())} epochs, "
              f"--epochs={FLAGS.epochs}): nothing to train. Use another --model_dir (or delete "
              f"this one) to train again, or raise --epochs to continue.")
        if os.path.exists(saved):
            with open(saved) as f:
                print(format_report(json.load(f)))
        return
    if resumed and FLAGS.verbose:
        print(f"Resuming from {FLAGS.model_dir}: epoch {int(trainer.epoch.numpy()) + 1}, "
              f"step {int(trainer.step_in_epoch.numpy())} of that epoch")
    result = trainer.fit(FLAGS.epochs, verbose=FLAGS.verbose, eval_fn=eval_fn,
                         max_steps=FLAGS.max_steps)

    report = {"task": FLAGS.task, "config": dataclasses.asdict(config),
              "learning_rate": float(model.optimizer.learning_rate.numpy()),
              "steps": result.steps_done, "epochs": result.epochs_done,
              "interrupted": result.interrupted, "train_seconds": result.train_seconds,
              "history": result.history}
    if train_stats is not None:
        report["padding_efficiency"] = train_stats.padding_efficiency()
        report["real_tokens"] = int(train_stats.real_tokens.numpy())
    report["real_tokens_per_second"] = (report.get("real_tokens", 0) / result.train_seconds
                                        if result.train_seconds else 0.0)
    if not result.interrupted:
        report["eval"] = {k: float(v) for k, v in
                          model.evaluate(eval_ds, verbose=0, return_dict=True).items()}
        if hasattr(pipeline, "majority_baseline"):
            report["majority_baseline"] = pipeline.majority_baseline(eval_ds)
    report["counters"] = {k: {"seen": c.seen(), "drops": c.drops()} for k, c in counters.items()}
    add_drop_examples(report, info)
    with open(os.path.join(FLAGS.model_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    print(format_report(report))
    if not result.interrupted and hasattr(model_module, "decode_examples"):
        print("\n".join(model_module.decode_examples(model, eval_ds, info)))
    if not result.interrupted and FLAGS.export:
        from scripts.export import export_run
        export_run(FLAGS.model_dir, FLAGS.task, config, model, info)


def input_datasets(pipeline, config):
    """``pipeline.datasets(config)``; bad input (missing, empty or unparseable files, bad
    options) exits with the message and status 2, no traceback (``--verbose=2`` logs it).
    Writes ``<model_dir>/labels.txt`` (one class name per line, in label-id order)."""
    from tfseq.formats import InputError

    try:
        train_ds, eval_ds, info = pipeline.datasets(config)
    except (InputError, FileNotFoundError, ValueError) as e:
        logging.info("input error", exc_info=True)
        print(f"{os.path.basename(sys.argv[0])}: error: {e}", file=sys.stderr)
        sys.exit(2)
    if info.get("class_names") is not None:
        with open(os.path.join(FLAGS.model_dir, "labels.txt"), "w", encoding="utf-8") as f:
            f.write("".join(f"{name}\n" for name in info["class_names"]))
    return train_ds, eval_ds, info


def add_drop_examples(report: dict, info: dict, limit: int = 5) -> None:
    """``report["drop_examples"]``: the first ``file:line: reason`` of malformed lines."""
    dropped = any(n for c in report["counters"].values() for r, n in c["drops"].items()
                  if r in ("malformed", "invalid_utf8", "empty_text"))
    if dropped and callable(info.get("drop_examples")):
        report["drop_examples"] = info["drop_examples"]()[:limit]


def train_replicas(pipeline, model_module, config, strategy) -> None:
    """Trains on ``strategy`` with in-graph split batches (never an empty replica).

    Without ``--data_service``: ``tfseq.training.ReplicaTrainer`` (one checkpointed iterator,
    resumable mid-epoch exactly once, like single-replica runs). With it: ``model.fit`` on the
    service's dataset, which saves the weights at each epoch end
    (``model_dir/weights.weights.h5``) but resumes only at epoch boundaries.
    """
    import keras

    train_ds, eval_ds, info = input_datasets(pipeline, config)
    with strategy.scope():
        model = model_module.build_model(config, info, model_config(model_module))
    if not FLAGS.data_service:
        from tfseq.replicated import train_resumable
        report = train_resumable(
            FLAGS, pipeline, config, info, model, strategy, format_report, _counter_vars,
            eval_ds=eval_ds,
            local_model_fn=lambda: model_module.build_model(config, info,
                                                            model_config(model_module)))
        # The chief exports (a single-device copy of the weights: no collective op).
        if FLAGS.export and report["chief"] and not report["interrupted"]:
            from scripts.export import export_run
            export_run(FLAGS.model_dir, FLAGS.task, config, model, info)
        return None
    dist = strategy.distribute_datasets_from_function(
        pipeline.replica_dataset_fn(config, info, strategy.num_replicas_in_sync,
                                    data_service=FLAGS.data_service))
    weights_path = os.path.join(FLAGS.model_dir, "weights.weights.h5")
    start = time.perf_counter()
    history = model.fit(dist, epochs=FLAGS.epochs, verbose=FLAGS.verbose,
                        callbacks=[keras.callbacks.ModelCheckpoint(weights_path,
                                                                   save_weights_only=True)])
    seconds = time.perf_counter() - start
    eval_dist = strategy.distribute_datasets_from_function(
        pipeline.replica_dataset_fn(config, info, strategy.num_replicas_in_sync, split="eval"))
    results = model.evaluate(eval_dist, verbose=0, return_dict=True)
    counters = info.get("counters", {})
    report = {"task": FLAGS.task, "config": dataclasses.asdict(config),
              "learning_rate": float(model.optimizer.learning_rate.numpy()),
              "replicas": strategy.num_replicas_in_sync, "data_service": FLAGS.data_service,
              "epochs": len(history.history["loss"]),
              "train_seconds": seconds, "real_tokens_per_second": 0.0,
              "history": history.history, "eval": {k: float(v) for k, v in results.items()},
              "counters": {k: {"seen": c.seen(), "drops": c.drops()} for k, c in counters.items()}}
    with open(os.path.join(FLAGS.model_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    print(format_report(report))
    if FLAGS.export:
        from scripts.export import export_run
        export_run(FLAGS.model_dir, FLAGS.task, config, model, info)


def _counter_vars(counters):
    """The counters' variables as checkpointable objects."""
    return {f"{split}_{name}": var for split, counter in counters.items()
            for name, var in counter.variables().items()}


if __name__ == "__main__":
    app.run(main)
