r"""Input throughput side by side: the tfseq pipelines vs the raw limit vs what users write.

Usage:
  python -m benchmarks.pipeline --json_out=bench_out/pipeline.json
  python -m benchmarks.pipeline --train_files='data/*.txt.gz' --field=-1 --repeats=3
  python -m benchmarks.pipeline --feeds=pack,shuffle_lines --repeats=3   # a subset

Feeds of the same lines, each run for whole epochs, in real (non-pad) tokens per second:
  raw       read + tokenize + vocab lookup alone, vectorized, consumed in the graph (the limit);
  tfseq     the full pipeline on batched lines: read (files shuffled, 1024-line batches), line
            batches shuffled, clean (counted drops), tokenize, bucket by length under a token
            budget (length cap counted, seeded shuffle), prefetch. No tf.data call per line;
  tfseq pack   the same pipeline with ``pack(max_length, max_tokens=...)`` instead of
            bucketing (over-long examples dropped, as bucketing drops them);
  tfseq pack, 3 row lengths   ``pack([max_length // 4, max_length // 2, max_length], ...)``:
            each example in the shortest rows that hold it (the pipelines' pack default);
  tfseq shuffle_lines   the same pipeline reading with ``text_lines(shuffle_lines=True)``
            (a global line shuffle) instead of shuffling files and line batches; with one
            shuffle shard the first pass reads the input, later passes permute the kept lines;
            with several (``--shuffle_shard_mb`` below the input) the input is read and the
            shards written to files when the feed is built ("build s"), each pass reads those;
  tfseq per-example   the same steps composed one example at a time (text_lines without
            batch_size): what the batched path saves;
  plain tf.data   the pipeline as users write it: TextLineDataset, per-line split, tokenize and
            lookup, length filter, shuffle, ``Dataset.bucket_by_sequence_length`` with
            per-bucket batch sizes from the same token budget;
  python    a Python generator (gzip + str.split + dict lookup + numpy padding) through
            ``Dataset.from_generator``, as a Keras user feeds one.
"""

from __future__ import annotations

import atexit
import gzip
import os
import shutil
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from absl import flags  # noqa: E402

from benchmarks import harness  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("files", [], "Text files (default: the embedded English corpus).")
flags.DEFINE_list("train_files", [], "Your own text files or globs (same as --files).")
flags.DEFINE_integer("field", 3, "0-based TSV field holding the text; -1 for the whole line.")
flags.DEFINE_integer("max_tokens", 8192, "Token budget per batch for tfseq bucketing.")
flags.DEFINE_integer("max_length", 512, "Length cap.")
flags.DEFINE_integer("batch_size", 64, "Batch size of the Python feed.")
harness.define_repeats(2)
harness.define_copies(16)
flags.DEFINE_integer("epochs", 1, "Epochs per timed pass (repeat).")
flags.DEFINE_boolean("map_fusion", True, "tfseq.pipeline_options() (map fusion) on every "
                     "graph feed.")
flags.DEFINE_integer("read_batch", 1024, "Lines per batch on the batched path.")
flags.DEFINE_integer("shuffle_batches", 64, "Shuffle buffer, in line batches (x read_batch "
                     "examples on the per-example path).")
flags.DEFINE_integer("shuffle_shard_mb", 256, "shuffle_shard_bytes of the shuffle_lines feed, "
                     "in MiB (gzip counts 4x): the default keeps the whole stream in one shard.")
flags.DEFINE_list("feeds", [], "Run only these feeds (names as printed, or a word of them: "
                  "raw, pipeline, pack, shuffle_lines, per-example, plain, python); the "
                  "raw and tfseq full pipeline feeds always run, as the ratios need them.")


def field_of(line_tensor, field):
    import tensorflow as tf

    if field < 0:
        return line_tensor
    parts = tf.strings.split(line_tensor, "\t")
    if line_tensor.shape.rank == 0:
        return parts[field]
    return parts.to_tensor(shape=[None, field + 1])[:, field]


def raw_feed(files, vocab, field):
    import tensorflow as tf

    import tfseq

    tok = tfseq.text.get_tokenizer()
    ds = tfseq.text_lines(files, batch_size=FLAGS.read_batch)
    ds = ds.map(lambda lines: vocab.lookup(tok.tokenize(field_of(lines, field))),
                num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE), lambda ids: tf.cast(tf.size(ids.flat_values), tf.int64)


def tfseq_feed(files, vocab, field, batched=True, shuffle_lines=False):
    import tensorflow as tf

    import tfseq

    counter = tfseq.DropCounter()
    if shuffle_lines:  # a global line shuffle replaces the file and line-batch shuffles
        ds = tfseq.text_lines(files, seed=0, batch_size=FLAGS.read_batch, shuffle_lines=True,
                              shuffle_shard_bytes=FLAGS.shuffle_shard_mb << 20)
    else:
        ds = tfseq.text_lines(files, shuffle_files=True, seed=0,
                              batch_size=FLAGS.read_batch if batched else None)
    if batched and not shuffle_lines:
        ds = ds.shuffle(FLAGS.shuffle_batches, seed=0, reshuffle_each_iteration=True)
    if field >= 0:
        ds = ds.map(lambda line: field_of(line, field), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.apply(tfseq.filter_lines(counter=counter))
    ds = ds.apply(tfseq.tokenize(vocab))
    if not batched:
        ds = ds.shuffle(FLAGS.shuffle_batches * FLAGS.read_batch, seed=0,
                        reshuffle_each_iteration=True)
    # bucket_by_length drops (and counts) examples over max_length itself, and shuffles: a
    # seeded random order among equal lengths in each pool, and the pool's batches in random
    # order.
    ds = ds.apply(tfseq.bucket_by_length(max_tokens=FLAGS.max_tokens, max_length=FLAGS.max_length,
                                         seed=0, counter=counter))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    return ds, lambda batch: tf.reduce_sum(tf.cast(batch["ids_length"], tf.int64))


def pack_feed(files, vocab, field, several_lengths=False):
    """The tfseq pipeline with packing instead of bucketing (same read, clean, tokenize);
    ``several_lengths``: rows of max_length / 4, / 2 and max_length."""
    import tensorflow as tf

    import tfseq

    counter = tfseq.DropCounter()
    ds = tfseq.text_lines(files, shuffle_files=True, seed=0, batch_size=FLAGS.read_batch)
    ds = ds.shuffle(FLAGS.shuffle_batches, seed=0, reshuffle_each_iteration=True)
    if field >= 0:
        ds = ds.map(lambda line: field_of(line, field), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.apply(tfseq.filter_lines(counter=counter))
    ds = ds.apply(tfseq.tokenize(vocab))
    block = FLAGS.max_length
    if several_lengths:
        block = [max(1, FLAGS.max_length // 4), max(1, FLAGS.max_length // 2), FLAGS.max_length]
    ds = ds.apply(tfseq.pack(block, max_tokens=FLAGS.max_tokens, long_examples="drop",
                             counter=counter))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    return ds, lambda batch: tf.reduce_sum(tf.cast(batch["ids_segment_ids"] > 0, tf.int64))


def plain_tf_data_feed(files, vocab, field):
    """What a user writes with tf.data alone: one example at a time, bucket_by_sequence_length
    with batch sizes from the token budget (bucket upper bounds 8, 16, ..., max_length)."""
    import tensorflow as tf

    import tfseq

    tok = tfseq.text.get_tokenizer()
    gzipped = [f for f in files if f.endswith(".gz")]
    plain = [f for f in files if not f.endswith(".gz")]
    parts = [tf.data.Dataset.from_tensor_slices(group).interleave(
        lambda path, kind=kind: tf.data.TextLineDataset(path, compression_type=kind),
        num_parallel_calls=tf.data.AUTOTUNE)
        for group, kind in ((gzipped, "GZIP"), (plain, "")) if group]
    ds = parts[0] if len(parts) == 1 else parts[0].concatenate(parts[1])
    ds = ds.map(lambda line: vocab.lookup(tok.tokenize(field_of(line, field))),
                num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.filter(lambda ids: (tf.size(ids) >= 1) & (tf.size(ids) <= FLAGS.max_length))
    ds = ds.shuffle(FLAGS.shuffle_batches * FLAGS.read_batch, seed=0,
                    reshuffle_each_iteration=True)
    uppers = [8]
    while uppers[-1] < FLAGS.max_length:
        uppers.append(min(2 * uppers[-1], FLAGS.max_length))
    ds = ds.bucket_by_sequence_length(
        lambda ids: tf.size(ids), bucket_boundaries=[u + 1 for u in uppers[:-1]],
        bucket_batch_sizes=[max(1, FLAGS.max_tokens // u) for u in uppers])
    ds = ds.prefetch(tf.data.AUTOTUNE)
    return ds, lambda ids: tf.cast(tf.math.count_nonzero(ids), tf.int64)


def timed(ds):
    """``ds`` as timed: ``--epochs`` epochs a pass, with ``tfseq.pipeline_options()`` (map
    fusion) unless ``--nomap_fusion``."""
    import tfseq

    ds = ds.repeat(FLAGS.epochs)
    return ds.with_options(tfseq.pipeline_options()) if FLAGS.map_fusion else ds


def python_feed(files, vocab, field, batch_size, max_length):
    index = {t: i for i, t in enumerate(vocab.tokens)}

    def lines():
        for path in files:
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rt", encoding="utf-8", errors="replace") as f:
                for line in f:
                    line = line.rstrip("\r\n")
                    yield line.split("\t")[field] if field >= 0 else line

    def batches():
        batch = []
        for text in lines():
            ids = [index.get(w, 1) for w in text.split()]
            if not 1 <= len(ids) <= max_length:
                continue
            batch.append(ids)
            if len(batch) == batch_size:
                yield pad(batch)
                batch = []
        if batch:
            yield pad(batch)

    def pad(batch):
        lengths = np.array([len(b) for b in batch], np.int32)
        out = np.zeros((len(batch), lengths.max()), np.int32)
        for row, ids in enumerate(batch):
            out[row, : len(ids)] = ids
        return out, lengths

    return batches


def main(argv):
    del argv
    import tensorflow as tf

    import tfseq

    files = tfseq.reading.resolve_files(FLAGS.files + FLAGS.train_files
                                        or [tfseq.corpus_path()])
    texts = tfseq.text_lines(files).map(lambda line: field_of(line, FLAGS.field))
    vocab = tfseq.Vocab.build(texts, min_count=1)
    if FLAGS.copies > 1:
        copies_dir = tempfile.mkdtemp(prefix="bench_pipeline_")
        atexit.register(shutil.rmtree, copies_dir, ignore_errors=True)
        files = harness.linked_copies(files, FLAGS.copies, copies_dir)
    gen = python_feed(files, vocab, FLAGS.field, FLAGS.batch_size, FLAGS.max_length)

    python_ds = tf.data.Dataset.from_generator(
        gen, output_signature=(tf.TensorSpec([None, None], tf.int32),
                               tf.TensorSpec([None], tf.int32))).prefetch(tf.data.AUTOTUNE)

    builders = {
        "raw read+tokenize+lookup": lambda: raw_feed(files, vocab, FLAGS.field),
        "tfseq full pipeline": lambda: tfseq_feed(files, vocab, FLAGS.field),
        "tfseq full pipeline, pack": lambda: pack_feed(files, vocab, FLAGS.field),
        "tfseq pack, 3 row lengths": lambda: pack_feed(files, vocab, FLAGS.field,
                                                       several_lengths=True),
        "tfseq full pipeline, shuffle_lines": lambda: tfseq_feed(
            files, vocab, FLAGS.field, shuffle_lines=True),
        "tfseq per-example pipeline": lambda: tfseq_feed(files, vocab, FLAGS.field,
                                                         batched=False),
        "plain tf.data pipeline": lambda: plain_tf_data_feed(files, vocab, FLAGS.field),
        "python generator feed": lambda: (
            python_ds, lambda batch: tf.reduce_sum(tf.cast(batch[1], tf.int64))),
    }
    if FLAGS.feeds:
        always = ("raw read+tokenize+lookup", "tfseq full pipeline")
        builders = {name: build for name, build in builders.items()
                    if name in always or any(word in name for word in FLAGS.feeds)}
    # Building a feed is timed apart: the line shuffle over several shards reads the input and
    # writes its shards then.
    feeds, build_seconds = {}, {}
    for name, build in builders.items():
        start = time.perf_counter()
        ds, count = build()
        feeds[name] = (timed(ds), count)
        build_seconds[name] = time.perf_counter() - start
    first = {}
    best = harness.best_passes(feeds, FLAGS.repeats,
                               on_pass=lambda name, run: first.setdefault(name, run[1]))
    results = {name: (tokens, seconds) for name, (tokens, seconds, _) in best.items()}

    ref = results["tfseq full pipeline"]
    ref_rate = ref[0] / ref[1]
    rows = []
    for name, (tokens, seconds) in results.items():
        rate = tokens / seconds
        rows.append({"feed": name, "real_tokens": tokens, "seconds": seconds,
                     "first_pass_seconds": first[name], "build_seconds": build_seconds[name],
                     "tokens_per_second": rate, "tfseq_over_feed": ref_rate / rate})
    print()
    harness.print_table(rows, [
        ("feed", "feed", ""), ("real tokens", "real_tokens", ",d"), ("seconds", "seconds", ".2f"),
        ("tokens/s", "tokens_per_second", ",.0f"), ("tfseq / feed", "tfseq_over_feed", ".2f"),
        ("build s", "build_seconds", ".2f")])

    def rate_of(name):
        tokens, seconds = results[name]
        return tokens / seconds

    summary = [f"tfseq full pipeline / raw: {ref_rate / rate_of('raw read+tokenize+lookup'):.2f}x"]
    if "tfseq full pipeline, pack" in results:
        summary.append(f"pack / bucket: {rate_of('tfseq full pipeline, pack') / ref_rate:.2f}x")
    if "tfseq pack, 3 row lengths" in results:
        summary.append("pack with 3 row lengths / bucket: "
                       f"{rate_of('tfseq pack, 3 row lengths') / ref_rate:.2f}x")
    shuffled_name = "tfseq full pipeline, shuffle_lines"
    if shuffled_name in results:
        summary.append(
            f"shuffle_lines / unshuffled: {rate_of(shuffled_name) / ref_rate:.2f}x (first pass, "
            f"which reads the input before its first batch: "
            f"{results[shuffled_name][1] / first[shuffled_name]:.2f} of the best pass's rate)")
    print("\n" + "; ".join(summary))
    names = sorted({harness.original_name(f) if FLAGS.copies > 1 else os.path.basename(f)
                    for f in files})
    print(f"\n(files: {', '.join(names)} x {FLAGS.copies} copies; best of {FLAGS.repeats} "
          f"passes of {FLAGS.epochs} epoch(s); {os.cpu_count()} CPUs)")
    harness.write_json({"files": files, "flags": harness.flag_values(
        "max_tokens", "epochs", "copies", "map_fusion", "read_batch", "max_length", "batch_size"),
        "rows": rows})


if __name__ == "__main__":
    harness.run(main)
