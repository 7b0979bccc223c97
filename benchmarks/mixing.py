r"""How mixed are batches built from a label-sorted file, with and without the line shuffle?

Usage:
  python -m benchmarks.mixing --json_out=bench_out/mixing.json
  python -m benchmarks.mixing --lines=20000 --repeats=1

A synthetic single file of ``--lines`` lines in 15 labels, sorted by label, lengths varied
(geometric, mean depending mildly on the label). Composition:
``text_lines(batch_size=1024[, shuffle_lines=True, seed=0])`` -> ``tokenize`` -> one of
``bucket_by_length(max_tokens)``, ``pack(block_length, max_tokens)``, ``pad_batch(64)``.

Mixing ratio: the mean total-variation distance between each batch's label histogram and the
corpus', divided by the same for a perfect shuffle (the file shuffled offline) pushed through
the same batching; 1.0 = as mixed as a perfect shuffle. Also: batches holding one label only,
and the rate (lines/s) with and without the shuffle.

Rates: one untimed warm-up epoch per pipeline, then ``--repeats`` rounds, each timing one
epoch without the shuffle and one with it, back to back (a new iterator each, as in
``model.fit``). The rate is the median over the rounds; the ratio shuffled / unshuffled is the
median of the rounds' ratios, with their min and max. Pairing the epochs cancels the machine's
drift, which on a 2-3 s epoch moves a single ratio by 20% or more.
"""

from __future__ import annotations

import os
import random
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from absl import flags  # noqa: E402

from benchmarks import harness  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("lines", 50_000, "Lines in the synthetic file.")
flags.DEFINE_integer("labels", 15, "Labels (the file is sorted by label).")
flags.DEFINE_integer("max_tokens", 4096, "Token budget per batch (bucket, pack).")
flags.DEFINE_integer("read_batch", 1024, "text_lines batch_size.")
harness.define_repeats(7, "Timed rounds (one epoch without and one with the shuffle each) "
                       "per scheme, after a warm-up epoch of each.")
flags.DEFINE_list("schemes", ["bucket", "pack", "pad"], "Batching schemes.")
flags.DEFINE_integer("shuffle_shard_bytes", 64 << 20, "text_lines shuffle_shard_bytes (K = "
                     "file bytes / this, rounded up).")


def write_corpus(directory, n, labels, seed=0):
    """Writes sorted.tsv (sorted by label) and shuffled.tsv (the same lines, shuffled)."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(2000)]
    lines = []
    for i in range(n):
        label = 1 + i * labels // n
        length = min(120, 1 + int(rng.expovariate(1 / (8 + label))))
        lines.append(f"{label}\t" + " ".join(rng.choice(words) for _ in range(length)))
    sorted_path = os.path.join(directory, "sorted.tsv")
    shuffled_path = os.path.join(directory, "shuffled.tsv")
    with open(sorted_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    rng.shuffle(lines)
    with open(shuffled_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return sorted_path, shuffled_path


def pipeline(path, vocab, scheme, shuffle):
    import tensorflow as tf

    import tfseq

    kwargs = ({"shuffle_lines": True, "seed": 0,
               "shuffle_shard_bytes": FLAGS.shuffle_shard_bytes} if shuffle else {})
    ds = tfseq.text_lines(path, batch_size=FLAGS.read_batch, **kwargs)

    def split(lines):
        parts = tf.strings.split(lines, "\t", maxsplit=1).to_tensor(shape=[None, 2])
        return {"label": tf.strings.to_number(parts[:, 0], tf.int32), "text": parts[:, 1]}

    ds = ds.map(split, num_parallel_calls=tf.data.AUTOTUNE).apply(tfseq.tokenize(vocab, key="text"))
    if scheme == "bucket":
        ds = ds.apply(tfseq.bucket_by_length(max_tokens=FLAGS.max_tokens, max_length=128, seed=0))
    elif scheme == "pack":
        ds = ds.apply(tfseq.pack(128, max_tokens=FLAGS.max_tokens, seed=0))
    elif scheme == "pad":
        ds = ds.apply(tfseq.unbatch).apply(tfseq.pad_batch(64))
    else:
        raise ValueError(f"Unknown scheme {scheme!r}")
    return ds.prefetch(tf.data.AUTOTUNE).with_options(tfseq.pipeline_options())


def label_counts(ds, labels):
    """One epoch -> ([batches, labels] label counts, seconds)."""
    rows = []
    start = time.perf_counter()
    for batch in ds:
        lab = batch["label"].numpy().reshape(-1)
        lab = lab[lab > 0]  # pack's scalar tables are padded with 0
        rows.append(np.bincount(lab - 1, minlength=labels))
    return np.array(rows), time.perf_counter() - start


def mean_tv(counts):
    corpus = counts.sum(0) / counts.sum()
    per_batch = counts / counts.sum(1, keepdims=True)
    return float(np.mean(0.5 * np.abs(per_batch - corpus).sum(1)))


def main(argv):
    del argv
    import tensorflow as tf

    import tfseq

    directory = tempfile.mkdtemp(prefix="tfseq_mixing_")
    sorted_path, shuffled_path = write_corpus(directory, FLAGS.lines, FLAGS.labels)
    text = tfseq.text_lines(sorted_path, batch_size=FLAGS.read_batch).map(
        lambda b: tf.strings.split(b, "\t", maxsplit=1).to_tensor(shape=[None, 2])[:, 1])
    vocab = tfseq.Vocab.build(text, min_count=1)
    results = []
    print(f"{FLAGS.lines} lines, {FLAGS.labels} labels, sorted by label, one file "
          f"(shared 2-core machine: rates are rough)")
    print(f"{'scheme':8} {'shuffle':8} {'ratio':>6} {'one-label':>10} {'batches':>8} "
          f"{'lines/s':>9} {'1st epoch':>9}")
    for scheme in FLAGS.schemes:
        perfect, _ = label_counts(pipeline(shuffled_path, vocab, scheme, False), FLAGS.labels)
        perfect_tv = mean_tv(perfect)
        datasets = {shuffle: pipeline(sorted_path, vocab, scheme, shuffle)
                    for shuffle in (False, True)}
        first_seconds = {shuffle: label_counts(ds, FLAGS.labels)[1]
                         for shuffle, ds in datasets.items()}
        seconds = {False: [], True: []}
        counts = {}
        for _ in range(FLAGS.repeats):
            for shuffle, ds in datasets.items():
                counts[shuffle], epoch_seconds = label_counts(ds, FLAGS.labels)
                assert counts[shuffle].sum() == FLAGS.lines, (scheme, shuffle)
                seconds[shuffle].append(epoch_seconds)
        pair_ratios = np.array(seconds[False]) / np.array(seconds[True])
        for shuffle in (False, True):
            one_label = float(np.mean((counts[shuffle] > 0).sum(1) == 1))
            rate = FLAGS.lines / float(np.median(seconds[shuffle]))
            row = {"scheme": scheme, "shuffle_lines": shuffle,
                   "mixing_ratio": round(mean_tv(counts[shuffle]) / perfect_tv, 3),
                   "one_label_batches": round(one_label, 3), "batches": len(counts[shuffle]),
                   "lines_per_s": round(rate),
                   "first_epoch_lines_per_s": round(FLAGS.lines / first_seconds[shuffle]),
                   "perfect_shuffle_tv": round(perfect_tv, 4)}
            results.append(row)
            print(f"{scheme:8} {str(shuffle):8} {row['mixing_ratio']:6.2f} "
                  f"{one_label:10.0%} {len(counts[shuffle]):8d} {rate:9.0f} "
                  f"{row['first_epoch_lines_per_s']:9d}")
        results[-1]["rate_vs_unshuffled"] = round(float(np.median(pair_ratios)), 3)
        results[-1]["rate_vs_unshuffled_range"] = [round(float(pair_ratios.min()), 3),
                                                   round(float(pair_ratios.max()), 3)]
        print(f"{scheme:8} shuffled rate / unshuffled rate, median of {FLAGS.repeats} paired "
              f"epochs: {np.median(pair_ratios):.2f} (range {pair_ratios.min():.2f}-"
              f"{pair_ratios.max():.2f})")
    harness.write_json({"lines": FLAGS.lines, "labels": FLAGS.labels,
                        "max_tokens": FLAGS.max_tokens, "results": results})

if __name__ == "__main__":
    harness.run(main)
