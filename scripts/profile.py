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
import sys
import time
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from tfseq.scripts import flag_table  # noqa: E402

FLAGS = flags.FLAGS
flag_table.define(
    flag_table.INPUT_FLAGS, defaults={"task": None},
    helps={"task": "Profile this task's training input as tfseq-train builds it from the same "
                   "flags (default: a generic pipeline over --files' text field).",
           "files": "Files in the embedded corpus' layout (tab-separated, the text in --field; "
                    "default: the embedded English corpus). Other files: --train_files with "
                    "--format/--columns.",
           "train_files": "Your files (as tfseq-train): their text column is profiled ('text', "
                          "or the first of source, target, tokens, token).",
           "batching": "Batching stage (with --task: the task's default; else bucket).",
           "batch_size": "Rows per batch for --batching=pad (default: the task's; else 64).",
           "max_tokens": "Token budget per batch, bucket and pack (default: the task's; else "
                         "8192).",
           "max_length": "Length cap (default: the task's; else 512; longer examples are "
                         "dropped, counted).",
           "block_length": "Row length(s) for --batching=pack (default: the task's; else 512)."})
flags.DEFINE_integer("field", 3, "With --files: the 0-based tab-separated field with the text "
                     "(3: the embedded corpus' layout); -1: the whole line.")
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

    batch = tfseq.Batching.for_examples(
        FLAGS.batching or "bucket", longest=setting("max_length"),
        batch_size=setting("batch_size"), max_tokens=setting("max_tokens"),
        block_length=FLAGS.block_length and [int(b) for b in FLAGS.block_length]
        or setting("block_length"),
        boundaries=[int(b) for b in FLAGS.boundaries or ()]).transform(training=True, seed=0,
                                                                      counter=counter)
    out = [
        ("read", read),
        ("field", field),
        ("clean lines", tfseq.filter_lines(counter=counter)),
        ("tokenize+lookup", tfseq.tokenize(vocab)),
        ("length filter", tfseq.filter_by_length(max_length=setting("max_length"),
                                                 counter=counter)),
        ("shuffle", shuffle),
        (f"batch ({FLAGS.batching or 'bucket'})", batch),
    ]
    if FLAGS.num_splits > 1:
        out.append((f"split x{FLAGS.num_splits}", tfseq.split_batch(FLAGS.num_splits)))
    out.append(("prefetch", lambda ds: ds.prefetch(tf.data.AUTOTUNE)))
    return out


GENERIC_DEFAULTS = {"batch_size": 64, "max_tokens": 8192, "max_length": 512,
                    "block_length": 512}


def setting(name: str) -> int:
    """A batching flag of the generic profile: as given, else ``GENERIC_DEFAULTS``."""
    value = FLAGS[name].value
    if name == "block_length":
        return int(value[0]) if value else GENERIC_DEFAULTS[name]
    return GENERIC_DEFAULTS[name] if value is None else value


def field_of(lines):
    """``tf.string []`` or ``[n]`` lines -> their ``--field`` (``""`` where a line has fewer
    fields; ``check_field`` refuses files whose first line does)."""
    import tensorflow as tf

    parts = tf.strings.split(lines, "\t")
    if lines.shape.rank == 0:
        return tf.concat([parts, tf.fill([FLAGS.field + 1], "")], 0)[FLAGS.field]
    return parts.to_tensor(shape=[None, FLAGS.field + 1])[:, FLAGS.field]


def check_field(files) -> None:
    """Raises ``InputError`` when the first line of ``files`` has no ``--field``."""
    import gzip

    from tfseq.errors import InputError

    if FLAGS.field < 0:
        return
    path = files[0]
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8",
                                                       errors="replace") as f:
        line = f.readline().rstrip("\r\n")
    fields = line.count("\t") + 1
    if fields <= FLAGS.field:
        raise InputError(
            f"--field={FLAGS.field} (the embedded corpus' text field), but {path}:1 has "
            f"{fields} tab-separated field(s): give --field={fields - 1} (0-based) or "
            f"--field=-1 (the whole line), or read it as your training files: --train_files="
            f"{path} --columns=...")


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
    from tfseq.formats import TEXT_COLUMNS, split_columns

    return next((c for c in split_columns(FLAGS.columns)[0] if c in TEXT_COLUMNS), "text")


def user_format(files):
    """The ``RowFormat`` of ``--train_files`` (any column names; one a text column)."""
    from tfseq import formats

    names = tuple(c for c in formats.split_columns(FLAGS.columns)[0] if c != "_") or ("text",)
    return formats.row_format(files, FLAGS.format, FLAGS.columns or None, FLAGS.header,
                              required=(text_column(),), allowed=names)


def task_stages(task_name, model_dir):
    """``[(name, dataset, count)]`` of the task's training input: records read, encoded,
    and the whole training stream; ``count(element) -> (examples, real tokens)``."""
    import tensorflow as tf

    import tfseq
    from tfseq.pipelines import tasks

    task = tasks.load(task_name)
    config = flag_table.build_config(task, FLAGS)
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


def progress(message: str) -> None:
    """One line on stderr while the profile runs (the table comes at the end, on stdout)."""
    print(message, file=sys.stderr, flush=True)


def profile_task():
    """Rows of the ``--task`` profile, the counter, and the last stage's dataset."""
    import tempfile

    import tensorflow as tf

    rows, previous = [], None
    with tempfile.TemporaryDirectory(prefix="tfseq_profile_") as tmp:
        progress("reading the files as the task's training does (labels, vocabulary) ...")
        counter, staged = task_stages(flag_table.task_name(FLAGS), os.path.join(tmp, "run"))
        for name, ds, count in staged:
            progress(f"timing the stage '{name}' ...")
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
    milliseconds per 1,000 examples. A stage's cost is what it adds to the pipeline before it;
    a stage that makes the whole faster (prefetching, fewer elements) or adds less than the
    timing noise adds 0 (``within_noise``)."""
    seconds, examples, tokens, elements = best
    per_1k = 1e6 * seconds / max(examples, 1)
    added = per_1k - (previous or 0.0)
    rows.append({"stage": name, "seconds": seconds, "examples": examples, "elements": elements,
                 "real_tokens": tokens, "examples_per_s": examples / seconds,
                 "tokens_per_s": tokens / seconds if tokens else None,
                 "ms_per_1k_examples": per_1k, "stage_ms_per_1k": max(0.0, added),
                 "within_noise": added <= 0})
    return per_1k


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    import tfseq
    from tfseq import formats

    if FLAGS.task:
        rows, counter, ds = profile_task()
        report(rows, counter, ds)
        return
    flag_table.check_no_effect(types.SimpleNamespace(train_files=tuple(FLAGS.train_files)),
                               FLAGS)
    if FLAGS.train_files:
        files = formats.resolve(FLAGS.train_files)
        texts = formats.read_rows(files, user_format(files), tfseq.DropCounter("vocab")).map(
            lambda row: row[text_column()])
    else:
        files = formats.resolve(FLAGS.files or [tfseq.corpus_path()], "--files")
        check_field(files)
        texts = tfseq.text_lines(files)
        if FLAGS.field >= 0:
            texts = texts.map(field_of)
    progress("building the vocabulary of the text ...")
    vocab = tfseq.Vocab.build(texts)
    counter = tfseq.DropCounter()

    rows, ds, previous = [], None, None
    for name, transform in stages(files, vocab, counter):
        progress(f"timing the stage '{name}' ...")
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

    width = max(len("after stage"), *(len(r["stage"]) for r in rows))
    print(f"\n{'after stage':{width}s} {'examples/s':>11s} {'tokens/s':>11s} {'elements':>9s} "
          f"{'ms/1k ex':>9s} {'stage adds':>11s}")
    slowest = max(rows[1:], key=lambda r: r["stage_ms_per_1k"]) if len(rows) > 1 else rows[0]
    for r in rows:
        tokens = f"{r['tokens_per_s']:11,.0f}" if r["tokens_per_s"] else f"{'-':>11s}"
        adds = f"{'~0':>11s}" if r["within_noise"] else f"{r['stage_ms_per_1k']:+11.2f}"
        mark = "  <- slowest" if r is slowest and not r["within_noise"] else ""
        print(f"{r['stage']:{width}s} {r['examples_per_s']:11,.0f} {tokens} {r['elements']:9d} "
              f"{r['ms_per_1k_examples']:9.2f} {adds}{mark}")
    if any(r["within_noise"] for r in rows[1:]):
        print("~0: the stage added no measurable time (a faster pass than the stages before it: "
              "timing noise, or a stage such as prefetch that overlaps them)")
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
