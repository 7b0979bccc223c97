r"""Input throughput side by side: full tfseq pipeline vs the raw limit vs a Python feed.

Usage:
  python scripts/bench_pipeline.py --json_out=bench_out/pipeline.json
  python scripts/bench_pipeline.py --files='data/*.txt.gz' --field=-1 --repeats=3

Three feeds of the same lines, each run for whole epochs, in real (non-pad) tokens per second:
  raw       read + tokenize + vocab lookup alone, vectorized, consumed in the graph (the limit);
  tfseq     the full pipeline: read (files shuffled), clean (counted drops), tokenize, bucket
            by length under a token budget (length cap counted, seeded shuffle), prefetch;
  python    a Python generator: gzip + str.split + dict lookup + numpy padding (the feed_dict way).
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("files", [], "Text files (default: the embedded English corpus).")
flags.DEFINE_integer("field", 3, "0-based TSV field holding the text; -1 for the whole line.")
flags.DEFINE_integer("max_tokens", 8192, "Token budget per batch for tfseq bucketing.")
flags.DEFINE_integer("max_length", 512, "Length cap.")
flags.DEFINE_integer("batch_size", 64, "Batch size of the Python feed.")
flags.DEFINE_integer("repeats", 2, "Epochs timed per feed (the best is reported).")
flags.DEFINE_string("json_out", None, "Write the results here as JSON.")


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
    ds = tfseq.text_lines(files).batch(512)
    ds = ds.map(lambda lines: vocab.lookup(tok.tokenize(field_of(lines, field))),
                num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE), lambda ids: tf.cast(tf.size(ids.flat_values), tf.int64)


def tfseq_feed(files, vocab, field):
    import tensorflow as tf

    import tfseq

    counter = tfseq.DropCounter()
    ds = tfseq.text_lines(files, shuffle_files=True, seed=0)
    if field >= 0:
        ds = ds.map(lambda line: field_of(line, field), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.apply(tfseq.filter_lines(counter=counter))
    ds = ds.apply(tfseq.tokenize(vocab))
    # bucket_by_length drops (and counts) examples over max_length itself, and shuffles: a
    # seeded random order among equal lengths in each pool, and the pool's batches in random
    # order. shuffle_files adds file order to that.
    ds = ds.apply(tfseq.bucket_by_length(max_tokens=FLAGS.max_tokens, max_length=FLAGS.max_length,
                                         seed=0, counter=counter))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    return ds, lambda batch: tf.reduce_sum(tf.cast(batch["ids_length"], tf.int64))


def time_graph_feed(ds, count, repeats):
    import tensorflow as tf

    best = None
    tokens = 0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = int(ds.reduce(tf.constant(0, tf.int64), lambda acc, x: acc + count(x)))
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    return tokens, best


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

    files = tfseq.reading.resolve_files(FLAGS.files or [tfseq.corpus_path()])
    texts = tfseq.text_lines(files).map(lambda line: field_of(line, FLAGS.field))
    vocab = tfseq.Vocab.build(texts, min_count=1)

    results = {}
    ds, count = raw_feed(files, vocab, FLAGS.field)
    results["raw read+tokenize+lookup"] = time_graph_feed(ds, count, FLAGS.repeats)
    ds, count = tfseq_feed(files, vocab, FLAGS.field)
    results["tfseq full pipeline"] = time_graph_feed(ds, count, FLAGS.repeats)

    gen = python_feed(files, vocab, FLAGS.field, FLAGS.batch_size, FLAGS.max_length)
    best, tokens = None, 0
    for _ in range(FLAGS.repeats):
        start = time.perf_counter()
        tokens = sum(int(lengths.sum()) for _, lengths in gen())
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    results["python generator feed"] = (tokens, best)

    ref = results["tfseq full pipeline"]
    ref_rate = ref[0] / ref[1]
    rows = []
    print(f"\n{'feed':28s} {'real tokens':>12s} {'seconds':>8s} {'tokens/s':>12s} {'tfseq / feed':>13s}")
    for name, (tokens, seconds) in results.items():
        rate = tokens / seconds
        rows.append({"feed": name, "real_tokens": tokens, "seconds": seconds,
                     "tokens_per_second": rate, "tfseq_over_feed": ref_rate / rate})
        print(f"{name:28s} {tokens:12,d} {seconds:8.2f} {rate:12,.0f} {ref_rate / rate:12.2f}x")
    print(f"\n(files: {', '.join(os.path.basename(f) for f in files)}; best of {FLAGS.repeats} epochs; "
          f"{os.cpu_count()} CPUs)")
    if FLAGS.json_out:
        os.makedirs(os.path.dirname(FLAGS.json_out) or ".", exist_ok=True)
        with open(FLAGS.json_out, "w") as f:
            json.dump({"files": files, "flags": {"max_tokens": FLAGS.max_tokens,
                                                 "max_length": FLAGS.max_length,
                                                 "batch_size": FLAGS.batch_size},
                       "rows": rows}, f, indent=2)


if __name__ == "__main__":
    app.run(main)
