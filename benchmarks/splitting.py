"""Benchmarks split_batch: its cost per batch and the per-replica token imbalance.

Reads the embedded English corpus (4th TSV field), whitespace tokens (tensorflow_text), ids
from ``tf.strings.to_hash_bucket_fast(token) + 1``, shuffled padded batches of 256; then
splits every batch over ``--num_splits`` replicas with ``balance="examples"`` and
``balance="tokens"`` side by side.

Measures, from one run:
  * ms per batch of the full read+tokenize+batch pipeline (context), of iterating the cached
    batches unsplit, and of the same cached batches split: the difference is the split's cost;
  * per-replica real-token imbalance: max over replicas / mean over replicas, per batch,
    averaged over batches (1.0 = perfect) and its worst batch;
  * padded cells per replica (rows x width) max/mean, with ``trim=True``.

Usage:
  python -m benchmarks.splitting --json_out=bench_out/splitting.json
  python -m benchmarks.splitting --num_splits=8 --batch_size=512 --repeats=5
  python -m benchmarks.splitting --synthetic=emails --batch_size=32   # heavy tail

``largest/greedy``: the largest part's real tokens over the largest part of the longest-first
greedy partition of the same rows (the reference, mean over batches); ``cells/greedy``: the
largest part's padded cells (rows x its longest row, ``trim=True``) over the same reference.
"""

from __future__ import annotations

import os

from absl import flags

from benchmarks import harness

flags.DEFINE_string("corpus", None, "TSV(.gz) corpus; default: the embedded kjv_en.tsv.gz.")
flags.DEFINE_enum("synthetic", "none", ["none", "emails"],
                  "Synthetic lengths instead of --corpus: 'emails' is a heavy tail (log-normal, "
                  "median 169, p99 3166 tokens, capped at --max_length).")
flags.DEFINE_integer("max_length", 4096, "Cap on synthetic lengths.")
flags.DEFINE_integer("num_batches", 40, "Batches of synthetic lengths.")
flags.DEFINE_integer("num_splits", 4, "Replicas to split each batch over.")
flags.DEFINE_integer("batch_size", 256, "Rows per (global) padded batch.")
flags.DEFINE_integer("shuffle_buffer", 4096, "Example shuffle buffer before batching (0: none).")
harness.define_repeats(7, "Timed passes over the cached batches, round robin; the best is "
                       "kept.")
flags.DEFINE_integer("seed", 1, "Shuffle seed.")

FLAGS = flags.FLAGS


def batches(path: str, batch_size: int, shuffle_buffer: int, seed: int):
    import tensorflow as tf
    import tensorflow_text as tf_text

    tokenizer = tf_text.WhitespaceTokenizer()

    def to_example(line):
        text = tf.strings.split(line, "\t", maxsplit=3)[3]
        ids = tf.strings.to_hash_bucket_fast(tokenizer.tokenize(text), 2**20 - 1) + 1
        ids = tf.cast(ids, tf.int32)
        return {"ids": ids, "ids_length": tf.size(ids)}

    compression = "GZIP" if path.endswith(".gz") else None
    ds = tf.data.TextLineDataset(path, compression_type=compression)
    ds = ds.map(to_example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=False)
    return ds.padded_batch(batch_size)


def synthetic_batches(batch_size: int, num_batches: int, max_length: int, seed: int):
    """Padded batches of heavy-tailed synthetic lengths (email bodies)."""
    import numpy as np
    import tensorflow as tf

    lengths = harness.lognormal_lengths(batch_size * num_batches, np.random.default_rng(seed),
                                        median=169, p99=3166, longest=max_length)
    lengths = lengths.astype(np.int32)
    ids = tf.RaggedTensor.from_row_lengths(tf.ones([int(lengths.sum())], tf.int32), lengths)
    ds = tf.data.Dataset.from_tensor_slices({"ids": ids, "ids_length": lengths})
    return ds.map(lambda e: {"ids": e["ids"], "ids_length": e["ids_length"]}).padded_batch(
        batch_size)


def greedy_largest_part(lengths, num_splits: int) -> int:
    """The largest part (real tokens) of the longest-first greedy partition: the reference."""
    loads = [0] * num_splits
    for n in sorted(lengths, reverse=True):
        loads[loads.index(min(loads))] += int(n)
    return max(loads)


def ms_per_element(dataset) -> tuple[float, int]:
    """Wall time per element of one pass, counted in-graph (no Python loop)."""
    import tensorflow as tf

    count, seconds, _ = harness.count_pass(dataset, lambda _: tf.constant(1, tf.int64))
    return 1000.0 * seconds / max(count, 1), count


def best_ms(datasets: dict, repeats: int) -> dict:
    """Best ms per element of each dataset; passes interleaved so load hits all alike."""
    import tensorflow as tf

    one = lambda _: tf.constant(1, tf.int64)  # noqa: E731
    best = harness.best_passes({name: (ds, one) for name, ds in datasets.items()}, repeats)
    return {name: 1000.0 * seconds / max(count, 1) for name, (count, seconds, _) in best.items()}


def imbalance(split_dataset) -> dict:
    """Per-batch max/mean of real tokens and of padded cells over the replicas."""
    import numpy as np

    tokens, cells, vs_greedy, cells_vs_greedy = [], [], [], []
    for parts in split_dataset:
        real = np.array([float(np.sum(p["ids_length"].numpy() * p["weight"].numpy()))
                         for p in parts])
        area = np.array([float(np.prod(p["ids"].shape)) for p in parts])
        lengths = np.concatenate([p["ids_length"].numpy()[p["weight"].numpy() > 0]
                                  for p in parts])
        reference = greedy_largest_part(lengths, len(parts))
        tokens.append(real.max() / max(real.mean(), 1e-9))
        cells.append(area.max() / max(area.mean(), 1e-9))
        vs_greedy.append(real.max() / max(reference, 1))
        cells_vs_greedy.append(area.max() / max(reference, 1))
    return {"token_imbalance_mean": float(np.mean(tokens)),
            "token_imbalance_worst": float(np.max(tokens)),
            "cell_imbalance_mean": float(np.mean(cells)),
            "largest_part_vs_greedy": float(np.mean(vs_greedy)),
            "largest_part_cells_vs_greedy_tokens": float(np.mean(cells_vs_greedy))}


def main(argv):
    del argv
    import tfseq
    from tfseq.splitting import split_batch

    path = FLAGS.corpus or tfseq.corpus_path("kjv_en")
    if FLAGS.synthetic == "emails":
        path = f"synthetic emails (capped at {FLAGS.max_length})"
        source = synthetic_batches(FLAGS.batch_size, FLAGS.num_batches, FLAGS.max_length,
                                   FLAGS.seed)
    else:
        source = batches(path, FLAGS.batch_size, FLAGS.shuffle_buffer, FLAGS.seed)
    full_ms, num_batches = ms_per_element(source)
    cached = source.cache()
    ms_per_element(cached)  # fills the cache
    # (name, split_batch arguments)
    balances = {"examples": dict(balance="examples"),
                "tokens": dict(balance="tokens"),
                "tokens, equal_rows": dict(balance="tokens", equal_rows=True)}
    timed = {"unsplit": cached}
    for balance, kwargs in balances.items():
        timed[balance] = cached.apply(split_batch(FLAGS.num_splits, **kwargs))
    best = best_ms(timed, FLAGS.repeats)
    unsplit_ms = best["unsplit"]

    rows = []
    for balance, kwargs in balances.items():
        trimmed = cached.apply(split_batch(FLAGS.num_splits, trim=True, **kwargs))
        split_ms = best[balance]
        rows.append({"balance": balance, "split_ms_per_batch": split_ms,
                     "split_cost_ms": split_ms - unsplit_ms,
                     "split_cost_vs_full_pipeline": (split_ms - unsplit_ms) / full_ms,
                     **imbalance(trimmed)})

    result = {"corpus": os.path.basename(path) if FLAGS.synthetic == "none" else path,
              "num_batches": num_batches,
              "batch_size": FLAGS.batch_size, "num_splits": FLAGS.num_splits,
              "full_pipeline_ms_per_batch": full_ms, "cached_unsplit_ms_per_batch": unsplit_ms,
              "schemes": rows}
    print(f"corpus {result['corpus']}: {num_batches} batches of {FLAGS.batch_size} over "
          f"{FLAGS.num_splits} replicas; full pipeline {full_ms:.2f} ms/batch, cached "
          f"unsplit {unsplit_ms:.3f} ms/batch")
    harness.print_table(rows, [
        ("balance", "balance", ""), ("split ms/b", "split_ms_per_batch", ".3f"),
        ("cost ms/b", "split_cost_ms", ".3f"), ("cost/full", "split_cost_vs_full_pipeline", ".3f"),
        ("tok max/mean", "token_imbalance_mean", ".3f"), ("worst", "token_imbalance_worst", ".3f"),
        ("cells max/mean", "cell_imbalance_mean", ".3f"),
        ("largest/greedy", "largest_part_vs_greedy", ".3f"),
        ("cells/greedy", "largest_part_cells_vs_greedy_tokens", ".3f")])
    ex, tok = rows[0], rows[1]
    print(f"tokens/examples: imbalance excess {(tok['token_imbalance_mean'] - 1):.4f} vs "
          f"{(ex['token_imbalance_mean'] - 1):.4f}; split cost ratio "
          f"{tok['split_ms_per_batch'] / ex['split_ms_per_batch']:.2f}x")
    harness.write_json(result)

if __name__ == "__main__":
    harness.run(main)
