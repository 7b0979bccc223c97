r"""Packing at one token budget: tfseq.pack against plain padding and an offline first fit.

For each corpus, the same examples (read, hashed to ids, 1..max_length tokens, cached, then
shuffled with one seed) go through each scheme at ``--max_tokens`` cells per batch:

- plain padded_batch: ``max_tokens // max_length`` examples per batch;
- tfseq pack: ``tfseq.pack(block_length, max_tokens=...)`` rows of ``block_length``;
- tfseq pack, 3 row lengths: ``tfseq.pack([block_length // 4, block_length // 2,
  block_length], ...)``: each example in the shortest rows that hold it, each batch of one
  row length (the pipelines' pack default, for recurrent models);
- first-fit decreasing (offline reference): the whole epoch sorted by length and packed by
  first fit into rows of ``block_length`` in Python, then batched; no shuffle, not streaming.

Columns: step efficiency ``ceil(real tokens / max_tokens) / batches``, padding efficiency
(real tokens / cells), batches, the largest batch in cells, pipeline tokens/s (in-graph
``Dataset.reduce`` over the cached input) and
ratios against tfseq pack. Streaming schemes are timed on a second pass (the first pass, with
tracing and setup, is reported as ``first_pass_s``); the offline reference is timed on its
Python packing plus one pass. With ``--train_steps`` > 0 it also trains a small ResettableRNN
language model (ids folded to 1024 types, Embedding 64, GRU 128, Dense; loss weights from
``tfseq.lm_targets``) on packed rows and on plain padded batches at the same budget, and
reports real (non-pad) tokens/s over the timed ``train_on_batch`` steps (after 3 warm-up
steps; the two schemes' steps interleaved). One JSON file holds everything.

Usage:
  python -m benchmarks.packing --json_out=bench_out/packing.json
  python -m benchmarks.packing --corpora=kjv --train_steps=0
  python -m benchmarks.packing --files='data/*.txt.gz' --field=-1   # your own text
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfseq  # noqa: E402
from benchmarks import harness  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("corpora", ["kjv", "zipf"],
                  "kjv: the embedded corpus (4th TSV field, whitespace tokens); zipf: synthetic "
                  "power-law lengths (8 * Pareto(1.2)); lognormal: median 20, sigma 1.2.")
flags.DEFINE_list("files", [], "Your own text files or globs (gzip if they end in .gz), one "
                  "example per line: a corpus of their own, run instead of --corpora unless "
                  "--corpora is given too.")
flags.DEFINE_integer("field", -1, "0-based tab-separated field of --files holding the text; -1 "
                     "for the whole line.")
flags.DEFINE_integer("synthetic_size", 20000, "Examples in a synthetic corpus.")
flags.DEFINE_integer("max_tokens", 8192, "Budget: rows x padded length per batch.")
flags.DEFINE_integer("block_length", 512, "Row length for packing; also the max length kept.")
flags.DEFINE_integer("window", 4, "tfseq.pack window (batches' worth of tokens kept open).")
flags.DEFINE_integer("seed", 0, "Seed for the shuffle and the synthetic corpus.")
flags.DEFINE_integer("train_steps", 8, "Timed training steps per scheme (0: no training bench).")

HASH_BUCKETS = 30000
TRAIN_VOCAB = 1024


def text_corpus(files, field: int) -> tf.data.Dataset:
    """Text lines as ``{"ids": int32 [(T)]}``: the whitespace tokens of tab-separated
    ``field`` (-1: the whole line; a missing field is empty) hashed to ids >= 1."""
    lines = tfseq.text_lines(files)

    def to_example(line):
        text = line
        if field >= 0:
            fields = tf.strings.split(line, "\t")
            text = tf.concat([fields, tf.fill([field + 1], "")], 0)[field]
        tokens = tf.strings.split(text)
        return {"ids": tf.cast(tf.strings.to_hash_bucket_fast(tokens, HASH_BUCKETS) + 1,
                               tf.int32)}

    return lines.map(to_example, num_parallel_calls=tf.data.AUTOTUNE)


def kjv_corpus() -> tf.data.Dataset:
    """The embedded corpus (its 4th TSV field) as ``text_corpus``."""
    return text_corpus(tfseq.corpus_path("kjv_en"), 3)


def synthetic_corpus(kind: str, size: int, seed: int) -> tf.data.Dataset:
    rng = np.random.default_rng(seed)
    lengths = (harness.power_law_lengths(size, rng) if kind == "zipf" else
               harness.lognormal_lengths(size, rng, median=20, sigma=1.2))
    return harness.id_examples(lengths, rng, HASH_BUCKETS)


@dataclasses.dataclass(frozen=True)
class Setting:
    """What every scheme is given (the fields benchmarks/batching.py's Setting also has)."""
    max_tokens: int
    max_length: int
    seed: int = 0
    window: int = 4


def plain(s: Setting):
    """padded_batch at the largest batch size that can never exceed the budget."""
    return lambda ds: ds.padded_batch(s.max_tokens // s.max_length)


def tfseq_pack(s: Setting):
    """tfseq.pack: rows of max_length tokens, max_tokens // max_length rows per batch."""
    return lambda ds: ds.apply(tfseq.pack(s.max_length, max_tokens=s.max_tokens, window=s.window,
                                          counter=tfseq.DropCounter()))


def tfseq_pack_lengths(s: Setting):
    """tfseq.pack with rows of max_length / 4, / 2 and max_length, max_tokens // (the batch's
    row length) rows per batch."""
    lengths = sorted({max(1, s.max_length // 4), max(1, s.max_length // 2), s.max_length})
    return lambda ds: ds.apply(tfseq.pack(lengths, max_tokens=s.max_tokens, window=s.window,
                                          long_examples="drop", counter=tfseq.DropCounter()))


def first_fit_decreasing(lengths, capacity: int) -> list[list[int]]:
    """Offline first-fit decreasing: bins (lists of indices) of total length <= capacity.

    Every length must be in 1..capacity. Bench reference only (numpy, whole epoch in memory).
    """
    lengths = np.asarray(lengths, np.int64)
    order = np.argsort(-lengths, kind="stable")
    room = np.zeros(len(lengths), np.int64)
    bins: list[list[int]] = []
    for i in order:
        fits = np.flatnonzero(room[: len(bins)] >= lengths[i])
        if fits.size:
            b = fits[0]
        else:
            b = len(bins)
            bins.append([])
            room[b] = capacity
        bins[b].append(int(i))
        room[b] -= lengths[i]
    return bins


def ffd_reference(s: Setting):
    """First-fit decreasing over the whole epoch, batched max_tokens // max_length rows."""

    def apply(ds):
        examples = [e["ids"] for e in ds.as_numpy_iterator()]
        bins = first_fit_decreasing([len(e) for e in examples], s.max_length)
        ids = np.zeros([len(bins), s.max_length], np.int32)
        segment_ids = np.zeros_like(ids)
        for r, members in enumerate(bins):
            at = 0
            for k, i in enumerate(members, start=1):
                ids[r, at: at + len(examples[i])] = examples[i]
                segment_ids[r, at: at + len(examples[i])] = k
                at += len(examples[i])
        return tf.data.Dataset.from_tensor_slices(
            {"ids": ids, "ids_segment_ids": segment_ids}).batch(s.max_tokens // s.max_length)

    return apply


OFFLINE = "first-fit decreasing, offline (reference)"
PACK_LENGTHS = "tfseq pack, 3 row lengths"

# (name, builder(Setting) -> (dataset -> batched dataset)), as in benchmarks/batching.py.
SCHEMES = [
    ("plain padded_batch", plain),
    ("tfseq pack", tfseq_pack),
    (PACK_LENGTHS, tfseq_pack_lengths),
    (OFFLINE, ffd_reference),
]


def measure(dataset: tf.data.Dataset) -> np.ndarray:
    """[batches, examples, real tokens, cells, max cells] of one pass (``harness.batch_totals``)."""
    return harness.batch_totals(dataset)[0]


def lm_model() -> keras.Model:
    ids = keras.Input(shape=(None,), dtype="int32", name="ids")
    resets = keras.Input(shape=(None,), dtype="bool", name="ids_resets")
    x = keras.layers.Embedding(TRAIN_VOCAB + 1, 64, mask_zero=True)(ids)
    x = tfseq.layers.ResettableRNN(keras.layers.GRUCell(128))(x, resets)
    model = keras.Model({"ids": ids, "ids_resets": resets}, keras.layers.Dense(TRAIN_VOCAB + 1)(x))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def training_batches(batched: tf.data.Dataset, packed: bool) -> tf.data.Dataset:
    """(features, targets, weights) for the LM; ids folded into the small training vocab."""

    def prepare(batch):
        ids = batch["ids"]
        ids = tf.where(ids > 0, ids % TRAIN_VOCAB + 1, 0)
        if packed:
            batch = dict(batch, ids=ids)
        else:  # a plain padded batch: one segment per row
            real = tf.cast(ids > 0, tf.int32)
            first = tf.concat([tf.ones_like(ids[:, :1], tf.bool),
                               tf.zeros_like(ids[:, 1:], tf.bool)], 1)
            batch = {"ids": ids, "ids_segment_ids": real, "ids_resets": first & (real > 0)}
        features, targets, weights = tfseq.lm_targets(batch)
        return ({"ids": features["ids"], "ids_resets": features["ids_resets"]}, targets,
                weights)

    return batched.map(prepare)


def train_speeds(batched: dict, steps: int) -> dict:
    """Real (non-pad) tokens/s per scheme over ``steps`` train steps after 3 warm-up steps.

    ``batched`` maps a scheme name to ``(batched dataset, packed?)``. The schemes' steps are
    interleaved (one step of each in turn), so a change in machine load hits them alike.
    """
    runs = {}
    for name, (dataset, packed) in batched.items():
        model = lm_model()
        it = iter(training_batches(dataset, packed).repeat())
        for _ in range(3):
            model.train_on_batch(*next(it))
        timed = [next(it) for _ in range(steps)]
        # One untimed step per batch shape first (rows of several lengths: one trace each).
        shapes = {}
        for batch in timed:
            shapes.setdefault(tuple(batch[0]["ids"].shape), batch)
        for batch in shapes.values():
            model.train_on_batch(*batch)
        runs[name] = (model, timed, [0.0])
    for step in range(steps):
        for model, batches, seconds in runs.values():
            x, y, w = batches[step]
            start = time.perf_counter()
            model.train_on_batch(x, y, sample_weight=w)
            seconds[0] += time.perf_counter() - start
    out = {}
    for name, (_, batches, seconds) in runs.items():
        real = sum(int(tf.math.count_nonzero(x["ids"])) for x, _, _ in batches)
        out[name] = {"train_real_tokens_per_s": real / seconds[0],
                     "train_real_tokens_per_step": real / steps}
    return out


def run_corpus(name: str, examples: tf.data.Dataset, setting: Setting) -> dict:
    examples = examples.cache()
    start = time.perf_counter()
    lengths = np.concatenate(list(examples.map(lambda e: tf.size(e["ids"])).batch(1 << 16)
                                  .as_numpy_iterator()))
    raw_seconds = time.perf_counter() - start
    keep = (lengths >= 1) & (lengths <= setting.max_length)
    real_per_epoch, n_kept = int(lengths[keep].sum()), int(keep.sum())
    data = examples.filter(lambda e: (tf.size(e["ids"]) >= 1)
                           & (tf.size(e["ids"]) <= setting.max_length))
    data = data.shuffle(n_kept, seed=setting.seed)
    measure(data)  # fill the cache
    fewest = math.ceil(real_per_epoch / setting.max_tokens)
    rows = []
    for scheme, build in SCHEMES:
        start = time.perf_counter()
        batched = data.apply(build(setting))
        batches, n_examples, real, cells, max_cells = measure(batched)
        first_pass = time.perf_counter() - start
        seconds = first_pass
        if scheme != OFFLINE:  # streaming: time a second epoch, without tracing and setup
            start = time.perf_counter()
            measure(batched)
            seconds = time.perf_counter() - start
        logging.info("%s / %s: %d batches; %.1f s first pass, %.1f s timed", name, scheme,
                     batches, first_pass, seconds)
        assert n_examples == n_kept and real == real_per_epoch, (scheme, n_examples, real)
        rows.append({"scheme": scheme, "step_efficiency": fewest / batches,
                     "padding_efficiency": real / cells, "batches": int(batches),
                     "max_batch_cells": int(max_cells), "tokens_per_s": real / seconds,
                     "first_pass_s": first_pass})
    ref = next(r for r in rows if r["scheme"] == "tfseq pack")
    harness.add_ratios(rows, ref, steps_vs_pack="batches", speed_vs_pack="tokens_per_s")
    if FLAGS.train_steps > 0:
        trained = train_speeds({
            "plain padded_batch": (data.apply(plain(setting)), False),
            "tfseq pack": (data.apply(tfseq_pack(setting)), True),
            PACK_LENGTHS: (data.apply(tfseq_pack_lengths(setting)), True)}, FLAGS.train_steps)
        for r in rows:
            r.update(trained.get(r["scheme"], {}))
    kept = lengths[keep]
    return {"corpus": name, "examples": int(len(lengths)), "kept": n_kept,
            "real_tokens": real_per_epoch, "median_length": float(np.median(kept)),
            "p90_length": float(np.percentile(kept, 90)), "max_length": int(kept.max()),
            "fewest_batches": fewest, "read_tokens_per_s": float(lengths.sum() / raw_seconds),
            "schemes": rows}


def print_table(result: dict, setting: Setting) -> None:
    print(f"\n{result['corpus']}: {result['examples']} examples, {result['kept']} kept "
          f"(1..{setting.max_length} tokens), {result['real_tokens']} tokens; median "
          f"{result['median_length']:.0f}, p90 {result['p90_length']:.0f}, max "
          f"{result['max_length']}; fewest batches at max_tokens={setting.max_tokens}: "
          f"{result['fewest_batches']}")
    harness.print_table(result["schemes"], [
        ("scheme", "scheme", ""), ("step eff", "step_efficiency", ".3f"),
        ("pad eff", "padding_efficiency", ".3f"), ("batches", "batches", "d"),
        ("max cells", "max_batch_cells", "d"), ("tok/s", "tokens_per_s", ",.0f"),
        ("steps/pack", "steps_vs_pack", ".2f"), ("speed/pack", "speed_vs_pack", ".2f"),
        ("train tok/s", "train_real_tokens_per_s", ",.0f")])


def main(argv):
    del argv
    setting = Setting(FLAGS.max_tokens, FLAGS.block_length, FLAGS.seed, FLAGS.window)
    results = []
    if FLAGS.files:
        files = tfseq.reading.resolve_files(FLAGS.files)
        name = ", ".join(os.path.basename(f) for f in files[:3]) + (
            f" and {len(files) - 3} more" if len(files) > 3 else "")
        results.append(run_corpus(f"{name} (field {FLAGS.field})",
                                  text_corpus(files, FLAGS.field), setting))
        print_table(results[-1], setting)
    for name in FLAGS.corpora if FLAGS["corpora"].present or not FLAGS.files else []:
        if name == "kjv":
            examples = kjv_corpus()
        elif name in ("zipf", "lognormal"):
            examples = synthetic_corpus(name, FLAGS.synthetic_size, FLAGS.seed)
            name = f"synthetic {name} ({FLAGS.synthetic_size} examples, seed {FLAGS.seed})"
        else:
            raise app.UsageError(f"Unknown corpus {name!r}; use kjv, zipf or lognormal")
        results.append(run_corpus(name, examples, setting))
        print_table(results[-1], setting)
    harness.write_json({"max_tokens": setting.max_tokens, "block_length": setting.max_length,
                        "window": setting.window, "train_steps": FLAGS.train_steps,
                        "results": results})

if __name__ == "__main__":
    harness.run(main)
