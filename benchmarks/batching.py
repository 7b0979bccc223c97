"""Batching schemes side by side at one token budget: steps, padding and pipeline speed.

Every scheme batches the same examples (read, tokenized, length-filtered and cached once,
then shuffled with the same seed) under the same memory budget of ``--max_tokens`` cells
per batch (rows x padded length). For one run it prints one table and writes it as JSON:

- step efficiency: ceil(real tokens per epoch / max_tokens) / batches per epoch (1.0 = the
  fewest steps any batching can take at this budget);
- padding efficiency: real tokens / cells of the batch tensors;
- batches per epoch, the largest batch in cells (must be <= max_tokens), and pipeline
  throughput: real tokens out of the batching step per wall second and per CPU second of
  the process (measured in-graph with ``Dataset.reduce`` on cached, shuffled input; on a
  shared machine the CPU figure is the steadier one);
- ratios against tfseq (steps: scheme batches / tfseq batches; speed: scheme tok/cpu-s /
  tfseq tok/cpu-s; the JSON also has the wall-clock ratio).

Usage:
  python -m benchmarks.batching --json_out=bench_out/batching.json
  python -m benchmarks.batching --files='data/*.txt' --field=-1
  python -m benchmarks.batching --synthetic=zipf     # skewed synthetic lengths

Tokens are whitespace tokens (tensorflow_text.WhitespaceTokenizer) hashed to ids in
[1, 30000]; the vocabulary does not change lengths, so it does not change the table.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

from absl import flags, logging

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_text as tf_text  # noqa: E402

import tfseq  # noqa: E402
from benchmarks import harness  # noqa: E402
from tfseq.bucketing import bucket_by_length  # noqa: E402
from tfseq.formats import LINE_FORMATS  # noqa: E402

SHAPES = harness.SHAPES

FLAGS = flags.FLAGS
flags.DEFINE_list("files", [tfseq.corpus_path("kjv_en")], "Text files (gzip if they end in .gz).")
flags.DEFINE_list("train_files", [], "Your files, as train.py (their 'text' column; "
                  "overrides --files/--field).")
flags.DEFINE_enum("format", None, list(LINE_FORMATS),
                  "With --train_files (default: from the extension).")
flags.DEFINE_list("columns", [], "With --train_files: field names in order, one 'text'.")
flags.DEFINE_boolean("header", False, "With --train_files: skip each file's first line.")
flags.DEFINE_integer("field", 3, "0-based tab-separated field holding the text; -1: whole line.")
flags.DEFINE_enum("synthetic", "none", ["none", "zipf", "lognormal", *SHAPES],
                  "Use synthetic lengths instead of --files: 'zipf' has a power-law tail "
                  "(8 * Pareto(1.2), median ~14, some over max_length), 'lognormal' has "
                  "median 20 and sigma 1.2; the others are log-normal stand-ins for corpus "
                  "shapes (median / p99 / max tokens, default size): " + "; ".join(
                      f"{k} {v[1]} / {v[2]} / {v[3]} ({v[0]:,})" for k, v in SHAPES.items()))
flags.DEFINE_integer("synthetic_size", None, "Examples in the synthetic corpus (default: 50,000 "
                     "for zipf/lognormal, the shape's own size for the others).")
flags.DEFINE_list("schemes", [], "Run only the schemes whose name contains one of these "
                  "words (default: all), e.g. --schemes=tfseq,sorted.")
flags.DEFINE_integer("max_tokens", 8192, "Budget: rows x padded length per batch.")
flags.DEFINE_integer("max_length", 512, "Longer examples are dropped (same for every scheme).")
flags.DEFINE_integer("epochs", 1, "Passes over the data per scheme.")
flags.DEFINE_integer("pool_size", None, "tfseq pool size (default: the library default).")
flags.DEFINE_integer("pool_budgets", None, "tfseq pool in budgets of tokens (pool_tokens = "
                     "pool_budgets * max_tokens; default: the library default).")
flags.DEFINE_list("extra_pool_sizes", [],
                  "Also run tfseq with each of these pool sizes (one more row each).")
flags.DEFINE_integer("seed", 0, "Seed for the shuffle and for tfseq.")

HASH_BUCKETS = 30000


def read_corpus(files, field) -> tf.data.Dataset:
    """Lines -> {"ids": int32 [(T)]}: whitespace tokens hashed to ids in [1, HASH_BUCKETS]."""
    if FLAGS.train_files:  # the text column of the user's files (parsed in graph)
        from tfseq import formats

        lines = formats.text_column(FLAGS.train_files, format=FLAGS.format,
                                    columns=FLAGS.columns, header=FLAGS.header)
        field = -1
    else:
        compression = "GZIP" if all(f.endswith(".gz") for f in files) else None
        lines = tf.data.TextLineDataset(files, compression_type=compression)
    tokenizer = tf_text.WhitespaceTokenizer()

    def to_example(line):
        text = line if field < 0 else tf.strings.split(line, "\t")[field]
        tokens = tokenizer.tokenize(text)
        ids = tf.strings.to_hash_bucket_fast(tokens, HASH_BUCKETS) + 1
        return {"ids": tf.cast(ids, tf.int32)}

    return lines.map(to_example, num_parallel_calls=tf.data.AUTOTUNE)


def synthetic_corpus(kind, size, seed) -> tf.data.Dataset:
    return harness.id_examples(harness.synthetic_lengths(kind, size, seed),
                               np.random.default_rng(seed + 1), HASH_BUCKETS)


def length_of(example):
    return tf.shape(example["ids"], out_type=tf.int32)[0]


@dataclasses.dataclass(frozen=True)
class Setting:
    """What every scheme is given."""
    max_tokens: int
    max_length: int
    seed: int
    pool_size: int | None  # tfseq's pool (None: the library default)
    epoch_size: int  # examples per epoch
    pool_budgets: int | None = None  # tfseq's pool in budgets of tokens


def plain(s: Setting):
    """padded_batch at the largest batch size that can never exceed the budget."""
    return lambda ds: ds.padded_batch(s.max_tokens // s.max_length)


def tf_data_buckets(s: Setting):
    """tf.data bucket_by_sequence_length, tensor2tensor boundaries (8, x1.1), sized by budget."""
    return harness.tf_data_bucketing(s.max_tokens, s.max_length)


def opennmt_buckets(s: Setting, width=8):
    """OpenNMT-tf's batch_sequence_dataset with batch_type="tokens", length_bucket_width=8."""
    max_tokens, max_length = s.max_tokens, s.max_length

    def key(example):
        return tf.cast(tf.minimum(length_of(example) // width, max_length // width), tf.int64)

    def window_size(bucket):
        return max_tokens // ((bucket + 1) * width)

    return lambda ds: ds.group_by_window(key, lambda _, w: w.padded_batch(window_size(_)),
                                         window_size_func=window_size)


def width1_buckets(s: Setting):
    """group_by_window with one bucket per length, rows = budget // length (a candidate design)."""
    def rows(length):
        return s.max_tokens // tf.maximum(length, 1)

    return lambda ds: ds.group_by_window(
        lambda x: tf.cast(length_of(x), tf.int64), lambda key, w: w.padded_batch(rows(key)),
        window_size_func=rows)


def tfseq_buckets(s: Setting):
    return lambda ds: ds.apply(bucket_by_length(
        max_tokens=s.max_tokens, max_length=s.max_length, seed=s.seed, pool_size=s.pool_size,
        pool_tokens=s.pool_budgets * s.max_tokens if s.pool_budgets else None))


def sorted_epoch(s: Setting):
    """Reference: one pool holding the whole epoch and no shuffle, like fairseq batch_by_size."""
    return lambda ds: ds.apply(bucket_by_length(
        max_tokens=s.max_tokens, max_length=s.max_length, pool_size=s.epoch_size, shuffle=False))


# (name, builder(Setting) -> (dataset -> batched dataset)).
# A new scheme (packing, first-fit) is one more line here.
SCHEMES = [
    ("plain padded_batch", plain),
    ("tf.data bucket_by_sequence_length", tf_data_buckets),
    ("OpenNMT-tf tokens, width 8", opennmt_buckets),
    ("group_by_window, width 1", width1_buckets),
    ("tfseq bucket_by_length", tfseq_buckets),
    ("sorted epoch, unshuffled (reference)", sorted_epoch),
]


def main(argv):
    del argv
    if FLAGS.synthetic != "none":
        source = f"synthetic {FLAGS.synthetic}, seed {FLAGS.seed}"
        examples = synthetic_corpus(FLAGS.synthetic, FLAGS.synthetic_size, FLAGS.seed)
    else:
        source = (",".join(FLAGS.train_files) if FLAGS.train_files else
                  f"{','.join(os.path.relpath(f) for f in FLAGS.files)} field {FLAGS.field}")
        examples = read_corpus(FLAGS.files, FLAGS.field)
    budget, max_length = FLAGS.max_tokens, FLAGS.max_length

    examples = examples.cache()
    start = time.perf_counter()
    all_lengths = np.concatenate(list(examples.map(length_of).batch(1 << 16).as_numpy_iterator()))
    raw_seconds = time.perf_counter() - start
    n_in = len(all_lengths)
    kept_lengths = all_lengths[(all_lengths >= 1) & (all_lengths <= max_length)]
    n_kept, real_per_epoch = len(kept_lengths), int(kept_lengths.sum())
    kept = examples.filter(lambda x: tf.logical_and(length_of(x) >= 1,
                                                    length_of(x) <= max_length))

    def shuffled():
        """The same sequence of epoch orders for every scheme (a fresh dataset each time)."""
        data = kept.shuffle(n_kept, seed=FLAGS.seed, reshuffle_each_iteration=True)
        return data.repeat(FLAGS.epochs) if FLAGS.epochs > 1 else data

    fewest = math.ceil(real_per_epoch / budget) * FLAGS.epochs

    setting = Setting(budget, max_length, FLAGS.seed, FLAGS.pool_size, n_kept, FLAGS.pool_budgets)
    schemes = [s for s in SCHEMES
               if not FLAGS.schemes or any(w in s[0] for w in FLAGS.schemes)]
    for size in FLAGS.extra_pool_sizes:
        at = dataclasses.replace(setting, pool_size=int(size))
        schemes.append((f"tfseq, pool_size={int(size)}", lambda _, at=at: tfseq_buckets(at)))
    rows = []
    for name, build in schemes:
        (batches, n_rows, real, cells, max_cells), seconds, cpu = harness.batch_totals(
            shuffled().apply(build(setting)))
        logging.info("%s: %d batches in %.1f s", name, batches, seconds)
        assert n_rows == n_kept * FLAGS.epochs and real == real_per_epoch * FLAGS.epochs, name
        rows.append({
            "scheme": name, "step_efficiency": fewest / batches,
            "padding_efficiency": real / cells, "batches_per_epoch": batches / FLAGS.epochs,
            "max_batch_cells": int(max_cells), "tokens_per_s": real / seconds,
            "tokens_per_cpu_s": real / cpu,
        })
    ref = next((r for r in rows if r["scheme"] == "tfseq bucket_by_length"), rows[0])
    harness.add_ratios(rows, ref, steps_vs_tfseq="batches_per_epoch",
                       speed_vs_tfseq="tokens_per_s", cpu_speed_vs_tfseq="tokens_per_cpu_s")

    print(f"corpus: {source}; {n_in} examples, {n_kept} kept (1..{max_length} tokens), "
          f"{real_per_epoch} tokens/epoch; median {int(np.median(kept_lengths))}, "
          f"p90 {int(np.percentile(kept_lengths, 90))}, max {kept_lengths.max()}")
    print(f"max_tokens={budget} max_length={max_length} epochs={FLAGS.epochs}: fewest "
          f"possible batches/epoch {fewest // FLAGS.epochs}; read+tokenize "
          f"{all_lengths.sum() / raw_seconds:,.0f} tok/s")
    harness.print_table(rows, [
        ("scheme", "scheme", ""), ("step eff", "step_efficiency", ".3f"),
        ("pad eff", "padding_efficiency", ".3f"), ("batches", "batches_per_epoch", ".0f"),
        ("max cells", "max_batch_cells", "d"), ("tok/s", "tokens_per_s", ",.0f"),
        ("tok/cpu-s", "tokens_per_cpu_s", ",.0f"), ("steps/tfseq", "steps_vs_tfseq", ".2f"),
        ("tok/cpu-s/tfseq", "cpu_speed_vs_tfseq", ".2f")])
    harness.write_json({"corpus": source, "examples": n_in, "kept": n_kept,
                        "real_tokens_per_epoch": real_per_epoch, "max_tokens": budget,
                        "max_length": max_length, "epochs": FLAGS.epochs,
                        "fewest_batches_per_epoch": fewest // FLAGS.epochs,
                        "read_tokenize_tokens_per_s": float(all_lengths.sum() / raw_seconds),
                        "schemes": rows})

if __name__ == "__main__":
    harness.run(main)
