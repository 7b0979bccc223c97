r"""Profile a tfseq input pipeline stage by stage (no model): where does the time go?

Usage:
  tfseq-profile                                   # the embedded corpus
  tfseq-profile --files='data/*.gz' --field=-1 --batching=pack --num_splits=4
  tfseq-profile --model_step_ms=120 --trace_dir=/tmp/trace   # + TensorBoard trace
  tfseq-profile --task=tag --train_files=train.conll --columns=token,_,tag

For each prefix of the pipeline (read, field, clean, tokenize, filter, shuffle, batch, split,
prefetch) it runs one pass over the data in the graph and prints examples/s and real tokens/s
after that stage, and the time the stage adds per 1,000 examples, so the slow stage stands
out. By default lines are read in batches of ``--read_batch`` and stay batched until the
batching stage (the fast path); ``--read_batch=0`` profiles the one-example-at-a-time
composition. ``--model_step_ms`` says whether the full pipeline keeps up with a model of that step
time. ``--trace_dir`` writes a profiler trace of the full pipeline (view it with TensorBoard's
profile plugin: ``pip install tfseq[profile]``).

With ``--task`` it profiles that task's own training input, as ``tfseq-train`` builds it from
the same flags (``--train_files``, ``--format``, ``--columns``, ``--header``, ``--batching``,
``--max_tokens``, ``--max_length``, ``--block_length``, ``--batch_size``; the task's defaults
for those not given): the records read from the shuffle shards, the task's encoding of them,
and the whole resumable training stream (encode, pools, batching, the model's features). The
vocabulary and shards are prepared in a temporary directory first, as a new run would.
"""

from __future__ import annotations

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from tfseq.formats import RECORD_FORMATS  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("task", None, ["classify", "lm", "translate", "tag", "documents", "ctr"],
                  "Profile this task's training input as tfseq-train builds it.")
flags.DEFINE_list("files", [], "Text files or globs (default: the embedded English corpus).")
flags.DEFINE_list("train_files", [], "Your files (as tfseq-train): their text column is "
                  "profiled ('text', or the first of source, target, tokens, token).")
flags.DEFINE_enum("format", None, list(RECORD_FORMATS),
                  "With --train_files (default: from the extension).")
flags.DEFINE_list("columns", [], "With --train_files: field names in order (e.g. label,text; "
                  "token,_,tag for CoNLL).")
flags.DEFINE_boolean("header", False, "With --train_files: skip each file's first line.")
flags.DEFINE_integer("field", 3, "0-based TSV field with the text; -1: the whole line.")
flags.DEFINE_enum("batching", "bucket", ["pad", "bucket", "pack"], "Batching stage.")
flags.DEFINE_integer("max_tokens", 8192, "Token budget per batch (bucket, pack).")
flags.DEFINE_integer("batch_size", 64, "Rows per batch for --batching=pad.")
flags.DEFINE_integer("max_length", 512, "Length cap (longer examples are dropped, counted).")
flags.DEFINE_integer("block_length", 512, "Row length for --batching=pack.")
flags.DEFINE_integer("shuffle_buffer", 32768, "Shuffle buffer, in examples (whole line "
                     "batches on the batched path).")
flags.DEFINE_integer("read_batch", 1024, "Lines per batch read and carried through the "
                     "vectorized stages into batching; 0: one example at a time.")
flags.DEFINE_integer("num_splits", 1, "Replicas for the split stage (1: no split stage).")
flags.DEFINE_integer("max_lines", 0, "Read only the first N lines (0: all).")
flags.DEFINE_integer("repeats", 2, "Passes per stage; the fastest is reported.")
flags.DEFINE_float("model_step_ms", None, "A model step time to check the pipeline against.")
flags.DEFINE_string("trace_dir", None, "Write a profiler trace of the full pipeline here.")
flags.DEFINE_boolean("autotune", True, "tf.data.Options.autotune.enabled.")
flags.DEFINE_integer("private_threadpool_size", 0, "tf.data threading (0: the default pool).")
flags.DEFINE_boolean("deterministic", True, "tf.data.Options.deterministic.")
flags.DEFINE_boolean("map_fusion", True, "tf.data map fusion (tfseq.pipeline_options()).")
flags.DEFINE_string("json_out", None, "Write the table here as JSON.")


def options():
    import tensorflow as tf

    import tfseq

    opts = tfseq.pipeline_options()
    opts.experimental_optimization.map_fusion = FLAGS.map_fusion
    opts.autotune.enabled = FLAGS.autotune
    opts.deterministic = FLAGS.deterministic
    if FLAGS.private_threadpool_size:
        opts.threading.private_threadpool_size = FLAGS.private_threadpool_size
    opts.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return opts


def stages(files, vocab, counter):
    """``[(name, transform)]``: applied in order, each prefix is one profiled pipeline."""
    import tensorflow as tf

    import tfseq

    batched = FLAGS.read_batch > 0

    def field_of(lines):  # tf.string [] or [n] -> the field, same shape
        parts = tf.strings.split(lines, "\t")
        if lines.shape.rank == 0:
            return parts[FLAGS.field]
        return parts.to_tensor(shape=[None, FLAGS.field + 1])[:, FLAGS.field]

    def field(ds):
        if FLAGS.field < 0 or FLAGS.train_files:
            return ds
        return ds.map(field_of, num_parallel_calls=tf.data.AUTOTUNE)

    def read(_):
        if FLAGS.train_files:  # rows of the user's files (parsed in graph), their text column
            from tfseq import formats

            fmt = user_format(files)
            ds = formats.read_rows(files, fmt, counter, batch_size=FLAGS.read_batch or 1024)
            ds = ds.map(lambda row: row[text_column()])
            if FLAGS.max_lines:
                ds = ds.unbatch().take(FLAGS.max_lines).batch(FLAGS.read_batch or 1024)
            return ds if batched else ds.unbatch()
        if not batched:
            return tfseq.text_lines(files).take(FLAGS.max_lines or -1)
        if FLAGS.max_lines:  # exact: the first max_lines lines, then batched
            return tfseq.text_lines(files).take(FLAGS.max_lines).batch(FLAGS.read_batch)
        return tfseq.text_lines(files, batch_size=FLAGS.read_batch)

    def shuffle(ds):
        if not batched:
            return ds.shuffle(FLAGS.shuffle_buffer, seed=0)
        return ds.shuffle(max(1, FLAGS.shuffle_buffer // FLAGS.read_batch), seed=0)

    if FLAGS.batching == "pad":
        batch = tfseq.pad_batch(FLAGS.batch_size, prefetch=False)
    elif FLAGS.batching == "bucket":
        batch = tfseq.bucket_by_length(max_tokens=FLAGS.max_tokens, max_length=FLAGS.max_length,
                                       seed=0)
    else:
        batch = tfseq.pack(FLAGS.block_length, max_tokens=FLAGS.max_tokens, seed=0)
    out = [
        ("read", read),
        ("field", field),
        ("clean lines", tfseq.filter_lines(counter=counter)),
        ("tokenize+lookup", tfseq.tokenize(vocab)),
        ("length filter", tfseq.filter_by_length(max_length=FLAGS.max_length, counter=counter)),
        ("shuffle", shuffle),
        (f"batch ({FLAGS.batching})", batch),
    ]
    if FLAGS.num_splits > 1:
        out.append((f"split x{FLAGS.num_splits}", tfseq.split_batch(FLAGS.num_splits)))
    out.append(("prefetch", lambda ds: ds.prefetch(tf.data.AUTOTUNE)))
    return out


def counts(element):
    """(examples, real tokens) in one element of any stage, as int64 scalars."""
    import tensorflow as tf

    if isinstance(element, tuple):  # split batches: add the parts
        parts = [counts(e) for e in element]
        return tf.add_n([p[0] for p in parts]), tf.add_n([p[1] for p in parts])
    if not isinstance(element, dict):  # a line, or a batch of lines
        return tf.size(element, out_type=tf.int64), tf.constant(0, tf.int64)
    ids = element["ids"]
    weight = element.get("weight")
    if isinstance(ids, tf.RaggedTensor):  # a ragged batch of examples
        return ids.nrows(), tf.size(ids.flat_values, out_type=tf.int64)
    if ids.shape.rank == 1:
        return tf.constant(1, tf.int64), tf.cast(tf.size(ids), tf.int64)
    real = tf.math.count_nonzero(ids, dtype=tf.int64)
    if "ids_segment_ids" in element:
        seg = element["ids_segment_ids"]
        rows = tf.reduce_sum(tf.cast(element["ids_resets"], tf.int64))
        return rows, tf.math.count_nonzero(seg, dtype=tf.int64)
    rows = tf.cast(tf.shape(ids)[0], tf.int64)
    if weight is not None:
        rows = tf.cast(tf.reduce_sum(weight), tf.int64)
    return rows, real


def run_pass(ds):
    import tensorflow as tf

    start = time.perf_counter()
    examples, tokens, elements = ds.reduce(
        (tf.constant(0, tf.int64), tf.constant(0, tf.int64), tf.constant(0, tf.int64)),
        lambda acc, el: tuple(a + b for a, b in zip(acc, (*counts(el), tf.constant(1, tf.int64)))))
    return time.perf_counter() - start, int(examples), int(tokens), int(elements)


def text_column() -> str:
    """The column profiled: the first text column of ``--columns`` (``text``, ``source``,
    ``target``, ``tokens``, ``token``: a CoNLL file's space-joined tokens), else ``text``."""
    from tfseq.formats import TEXT_COLUMNS

    return next((c for c in FLAGS.columns if c in TEXT_COLUMNS), "text")


def user_format(files):
    """The ``RowFormat`` of ``--train_files`` (any column names; one a text column)."""
    from tfseq import formats

    names = tuple(c for c in FLAGS.columns if c != "_") or ("text",)
    return formats.row_format(files, FLAGS.format, FLAGS.columns or None, FLAGS.header,
                              required=(text_column(),), allowed=names)


# Profile flags that set the task's Config field of the same name (when given).
TASK_FLAGS = ("train_files", "format", "columns", "header", "batching", "max_tokens",
              "max_length", "block_length", "batch_size")


def task_config(task):
    """The task's Config from the flags given (``TASK_FLAGS``), as tfseq-train makes it."""
    import dataclasses

    from tfseq.pipelines import flag_config

    fields = {f.name for f in dataclasses.fields(task.Config)}
    values = {}
    for name in TASK_FLAGS:
        if not FLAGS[name].present:
            continue
        value = FLAGS[name].value
        if name not in fields:
            raise flags.ValidationError(f"--{name} is not used by --task={FLAGS.task}")
        if name in ("train_files", "columns"):
            value = tuple(value)
        if name == "train_files":
            value, weights = flag_config._split_weights(value, "--train_files")
            value = flag_config.absolute(value)
            if weights:
                values["train_weights"] = weights
        values[name] = value
    return task.Config(**values)


def task_stages(task_name, model_dir):
    """``[(name, dataset, count)]`` of the task's training input: records read, encoded,
    and the whole training stream; ``count(element) -> (examples, real tokens)``."""
    import tensorflow as tf

    import tfseq
    from tfseq.pipelines import tasks

    task = tasks.load(task_name)
    config = task_config(task)
    run = task.open(model_dir, config, model_config=task.model_config(),
                    write=lambda line: print(line, flush=True))
    counter = tfseq.DropCounter("train")
    stream = task.training_stream(config, run.state, counter, run.shards)
    if run.shards is None:  # an epoch replayed from its number: its batches, whole
        return counter, [(f"train dataset ({task_name})", stream.dataset(), _batch_rows)]
    inputs = task.features.inputs

    def records():
        return run.shards.epoch_batches(0, 0, 0, stream.read_batch).map(
            lambda batch, *_: batch)

    def encoded_counts(examples):
        present = [k for k in inputs if k in examples] or [
            k for k, v in examples.items() if isinstance(v, tf.RaggedTensor)][:1]
        first = examples[present[0]]
        return first.nrows(out_type=tf.int64), tf.add_n(
            [tf.size(examples[k].flat_values, out_type=tf.int64) for k in present])

    def stream_counts(element):
        _, meta = element
        return meta["examples"], meta["tokens"]

    return counter, [
        ("read records", records(),
         lambda batch: (tf.size(batch, out_type=tf.int64), tf.constant(0, tf.int64))),
        (f"encode ({task_name})", records().map(stream.encode,
                                                num_parallel_calls=tf.data.AUTOTUNE),
         encoded_counts),
        (f"train stream ({config.batching})", stream.dataset(), stream_counts),
    ]


def _batch_rows(element):
    """(rows of the element's first tensor, 0 tokens): the examples of any batch."""
    import tensorflow as tf

    first = tf.nest.flatten(element, expand_composites=False)[0]
    rows = first.nrows() if isinstance(first, tf.RaggedTensor) else tf.shape(first)[0]
    return tf.cast(rows, tf.int64), tf.constant(0, tf.int64)


def profile_task():
    """Rows of the ``--task`` profile, the counter, and the last stage's dataset."""
    import tempfile

    import tensorflow as tf

    rows, previous = [], None
    with tempfile.TemporaryDirectory(prefix="tfseq_profile_") as tmp:
        counter, staged = task_stages(FLAGS.task, os.path.join(tmp, "run"))
        for name, ds, count in staged:
            best = None
            for _ in range(FLAGS.repeats):
                counter.reset()  # the drops of one pass (the stream's own stay on its tapes)
                start = time.perf_counter()
                examples, tokens, elements = ds.with_options(options()).reduce(
                    (tf.constant(0, tf.int64),) * 3,
                    lambda acc, el, c=count: tuple(
                        a + b for a, b in zip(acc, (*c(el), tf.constant(1, tf.int64)))))
                result = (time.perf_counter() - start, int(examples), int(tokens),
                          int(elements))
                best = result if best is None or result[0] < best[0] else best
            previous = _row(rows, name, best, previous)
    return rows, counter, None


def _row(rows, name, best, previous):
    """Appends a stage's row (``best``: seconds, examples, tokens, elements); returns its
    milliseconds per 1,000 examples."""
    seconds, examples, tokens, elements = best
    per_1k = 1e6 * seconds / max(examples, 1)
    rows.append({"stage": name, "seconds": seconds, "examples": examples, "elements": elements,
                 "real_tokens": tokens, "examples_per_s": examples / seconds,
                 "tokens_per_s": tokens / seconds if tokens else None,
                 "ms_per_1k_examples": per_1k, "stage_ms_per_1k": per_1k - (previous or 0.0)})
    return per_1k


def main(argv):
    del argv
    import tensorflow as tf

    import tfseq

    if FLAGS.task:
        rows, counter, ds = profile_task()
        report(rows, counter, ds)
        return
    if FLAGS.train_files:
        from tfseq import formats

        files = formats.resolve(FLAGS.train_files)
        texts = formats.read_rows(files, user_format(files), tfseq.DropCounter("vocab")).map(
            lambda row: row[text_column()])
    else:
        files = tfseq.reading.resolve_files(FLAGS.files or [tfseq.corpus_path()])
        texts = tfseq.text_lines(files)
        if FLAGS.field >= 0:
            texts = texts.map(lambda line: tf.strings.split(line, "\t")[FLAGS.field])
    vocab = tfseq.Vocab.build(texts)
    counter = tfseq.DropCounter()

    rows, ds, previous = [], None, None
    for name, transform in stages(files, vocab, counter):
        ds = transform(ds)
        best = None
        for _ in range(FLAGS.repeats):
            result = run_pass(ds.with_options(options()))
            best = result if best is None or result[0] < best[0] else best
        previous = _row(rows, name, best, previous)
    report(rows, counter, ds)


def report(rows, counter, ds):
    """Prints the table (and the model check, the trace, the JSON) of the profiled stages."""
    import tensorflow as tf

    print(f"\n{'after stage':18s} {'examples/s':>11s} {'tokens/s':>11s} {'elements':>9s} "
          f"{'ms/1k ex':>9s} {'stage adds':>11s}")
    slowest = max(rows[1:], key=lambda r: r["stage_ms_per_1k"]) if len(rows) > 1 else rows[0]
    for r in rows:
        tokens = f"{r['tokens_per_s']:11,.0f}" if r["tokens_per_s"] else f"{'-':>11s}"
        mark = "  <- slowest" if r is slowest else ""
        print(f"{r['stage']:18s} {r['examples_per_s']:11,.0f} {tokens} {r['elements']:9d} "
              f"{r['ms_per_1k_examples']:9.2f} {r['stage_ms_per_1k']:+10.2f}{mark}")
    opts = options()
    print(f"\ntf.data options: autotune={opts.autotune.enabled} deterministic={opts.deterministic} "
          f"map_fusion={opts.experimental_optimization.map_fusion} "
          f"private_threadpool_size={opts.threading.private_threadpool_size or 'default'}; "
          f"{os.cpu_count()} CPUs; drops: {counter.drops()}")
    final = rows[-1]
    verdict = None
    if FLAGS.model_step_ms is not None:
        batch_ms = 1000 * final["seconds"] / max(final["elements"], 1)
        starves = batch_ms > FLAGS.model_step_ms
        verdict = {"batch_ms": batch_ms, "model_step_ms": FLAGS.model_step_ms, "starves": starves}
        print(f"pipeline: {batch_ms:.2f} ms per batch vs model step {FLAGS.model_step_ms:.2f} ms -> "
              + ("WOULD STARVE the model: speed up the stage marked slowest"
                 if starves else f"keeps up ({FLAGS.model_step_ms / batch_ms:.1f}x headroom)"))
    if FLAGS.trace_dir and ds is not None:
        tf.profiler.experimental.start(FLAGS.trace_dir)
        run_pass(ds.with_options(options()))
        tf.profiler.experimental.stop()
        print(f"profiler trace written to {FLAGS.trace_dir}")
    if FLAGS.json_out:
        os.makedirs(os.path.dirname(FLAGS.json_out) or ".", exist_ok=True)
        with open(FLAGS.json_out, "w") as f:
            json.dump({"rows": rows, "model_check": verdict, "drops": counter.drops()}, f, indent=2)


def run():
    """The ``tfseq-profile`` command."""
    from tfseq.scripts import run_command
    run_command(__name__, main)


if __name__ == "__main__":
    run()
