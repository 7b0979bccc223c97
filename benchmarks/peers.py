r"""tfseq against its peers, Grain and seqio, and plain tf.data: packing, bucketing, mixing.

Usage:
  make bench-peers   # .venv-peers: tfseq with grain==0.2.18 and seqio==0.0.20, then this run
  .venv-peers/bin/python -m benchmarks.peers --json_out=bench_out/peers.json
  python -m benchmarks.peers --sections=pack --corpora=emails  # a peer not installed: skipped

The peers are installed for this benchmark only (``make bench-peers``), never as tfseq's
dependencies; without one, its rows are skipped with one line.

Every scheme gets the same examples, in memory: whole corpora cut into pieces of at most
``--block_length`` tokens (seqio and Grain cut what is longer and drop the rest; tfseq would
split it), as ragged batches of ``--read_batch`` examples (what ``text_lines`` + ``tokenize``
hand out) or one example per element (``Dataset.from_tensor_slices`` + a map; Grain: a list
of numpy arrays). Corpora (``--corpora``): ``verses`` (the embedded corpus, both languages,
whitespace tokens numbered by first appearance), the synthetic shapes of ``harness.SHAPES``
(``prose``, ``entries``, ``emails``, ``phrases``) and ``zipf`` (``harness.power_law_lengths``),
ids uniform in 1..30,000.

Sections (``--sections``):

- ``pack``: rows of ``--block_length``, ``--rows`` rows a batch. ``tfseq.pack`` on ragged
  batches and on one example per element; seqio's ``utils.trim_and_pack_dataset`` (rows, then
  ``batch``); Grain's ``FirstFitPackIterDataset`` (``--rows`` bins, then ``batch``).
- ``bucket``: at most ``--max_tokens`` cells a batch. ``tfseq.bucket_by_length`` on both
  inputs; tf.data's ``bucket_by_sequence_length`` (``harness.tf_data_bucketing``). Neither peer
  buckets by length.
- ``mix``: ``--mix_corpora`` at ``--mix_weights``, the first ``--mix_examples`` examples.
  ``tfseq.mix`` on ragged batches and on one example per element; tf.data's
  ``sample_from_datasets``; Grain's ``MapDataset.mix`` (sources ``repeat()``-ed, as ``mix``
  cycles them).
- ``floor``: what a tf.data pipeline that hands one element at a time to its consumer costs
  with nothing else to do (``range``, ``range.map``, ``tfseq.unbatch`` of ragged batches), at
  1 and 2 threads (``threading.private_threadpool_size``), against a Python loop over Grain's
  ``MapDataset.range``.

Timing: one untimed pass of every feed that also checks it, then ``--repeats`` passes round
robin (``harness.best_passes``: each a new iterator, consumed in the graph by
``Dataset.reduce``; Grain in a Python loop), the fastest kept. Checks: every token once (the
multiset of ids out equals the multiset in) and as many segments (packed) or rows as
examples; efficiency = real tokens / cells (bucket: also step efficiency,
``ceil(real tokens / max_tokens) / batches``). Mixing: each source's largest drift from its
share over every prefix, ``max_n |c_i(n) - n w_i|`` (in examples), and whether each source's
examples come in their own order, cycled.
"""

from __future__ import annotations

import importlib.util
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from absl import flags  # noqa: E402

from benchmarks import harness  # noqa: E402

FLAGS = flags.FLAGS
SECTIONS = ("pack", "bucket", "mix", "floor")
CORPORA = ("verses", *harness.SHAPES, "zipf")
flags.DEFINE_list("sections", list(SECTIONS), f"Of {', '.join(SECTIONS)}.")
flags.DEFINE_list("corpora", ["verses", "emails", "zipf"],
                  f"pack and bucket run on each of {', '.join(CORPORA)}.")
flags.DEFINE_list("bucket_corpora", ["verses"], "The corpora of the bucket section.")
flags.DEFINE_integer("synthetic_size", None, "Examples in each synthetic corpus before cutting "
                     "(default: the shape's own; zipf: --zipf_size).")
flags.DEFINE_integer("zipf_size", 300_000, "Examples of the zipf corpus (power law, ~12M tokens).")
flags.DEFINE_integer("max_examples", None, "Keep only each corpus' first N pieces (a quick run).")
flags.DEFINE_integer("block_length", 128, "Tokens a packed row; the longest piece.")
flags.DEFINE_integer("rows", 64, "Rows a packed batch (Grain: packing bins).")
flags.DEFINE_integer("max_tokens", 8192, "Cells a bucketed batch.")
flags.DEFINE_integer("read_batch", 1024, "Examples a ragged batch of the input.")
flags.DEFINE_list("mix_corpora", ["prose", "entries", "phrases"], "The mix section's sources.")
flags.DEFINE_list("mix_weights", ["0.5", "0.3", "0.2"], "Their weights.")
flags.DEFINE_integer("mix_examples", 300_000, "Examples taken from each mixture a pass.")
flags.DEFINE_integer("floor_elements", 200_000, "Elements a pass of the floor section.")
flags.DEFINE_integer("seed", 0, "Seed of the synthetic corpora and of every scheme.")
harness.define_repeats(2, "Timed passes per feed, round robin, after one checked pass; the "
                       "best is reported.")

VOCAB = 30_000  # synthetic ids are uniform in 1..VOCAB


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def read_options():
    """Grain's in-process reading, no prefetch threads: its fastest on in-memory examples
    here (its default, 16 prefetch threads, ran ~10x slower on 2 cores)."""
    import grain

    return grain.ReadOptions(num_threads=0)


# ----------------------------------------------------------------------------- corpora

class Corpus:
    """Examples in memory: int32 ``values`` (every token, example after example), int64
    ``lengths``; ids in 1..``vocab``."""

    def __init__(self, name: str, values, lengths, vocab: int):
        self.name, self.values, self.lengths, self.vocab = name, values, lengths, vocab
        self._ragged = None

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    def histogram(self):
        """int64 ``[vocab + 1]``: how often each id occurs (id 0: never)."""
        return np.bincount(self.values, minlength=self.vocab + 1).astype(np.int64)

    def ragged(self):
        """int32 ``RaggedTensor [examples, (T)]``, built once."""
        import tensorflow as tf

        if self._ragged is None:
            self._ragged = tf.RaggedTensor.from_row_lengths(self.values, self.lengths)
        return self._ragged

    def batches(self):
        """Ragged batches of ``--read_batch`` examples: ``{"ids": int32 [n, (T)]}``."""
        import tensorflow as tf

        n = len(self.lengths)
        sizes = np.diff(np.append(np.arange(0, n, FLAGS.read_batch), n))
        return tf.data.Dataset.from_tensor_slices(
            {"ids": tf.RaggedTensor.from_row_lengths(self.ragged(), sizes)})

    def examples(self, extra: dict | None = None):
        """One example per element: ``{"ids": int32 [T]}`` (plus ``extra``, scalars)."""
        import tensorflow as tf

        keys = ["ids", *(extra or {})]
        features = {"ids": self.ragged(), **(extra or {})}
        return tf.data.Dataset.from_tensor_slices(features).map(
            lambda e: {k: e[k] for k in keys})

    def arrays(self, extra: dict | None = None) -> list[dict]:
        """One dict of numpy values per example (Grain's input)."""
        ids = np.split(self.values, np.cumsum(self.lengths)[:-1])
        if not extra:
            return [{"ids": x} for x in ids]
        return [{"ids": x, **{k: v[i] for k, v in extra.items()}} for i, x in enumerate(ids)]

    def fingerprints(self):
        """int64 ``[examples]``: ``sum_j (j + 1) * ids[j]`` of each example."""
        positions = np.arange(len(self.values)) - np.repeat(
            np.cumsum(self.lengths) - self.lengths, self.lengths) + 1
        return np.add.reduceat(positions * self.values.astype(np.int64),
                               np.cumsum(self.lengths) - self.lengths)


def cut(lengths, block: int):
    """Lengths -> the lengths of their pieces of at most ``block`` tokens, in order."""
    whole, rest = lengths // block, lengths % block
    pieces = whole + (rest > 0)
    out = np.full(int(pieces.sum()), block, np.int64)
    out[(np.cumsum(pieces) - 1)[rest > 0]] = rest[rest > 0]
    return out


def verses():
    """The embedded corpora's text, whitespace tokens numbered 1, 2, ... by first appearance."""
    numbers, values, lengths = {}, [], []
    for _, text in harness.embedded_rows():
        words = text.split()
        values += [numbers.setdefault(w, len(numbers) + 1) for w in words]
        lengths.append(len(words))
    return np.asarray(values, np.int32), np.asarray(lengths, np.int64), len(numbers)


def load(name: str) -> Corpus:
    """Corpus ``name``, cut into pieces of at most ``--block_length`` (``--max_examples``:
    the first pieces only); empty examples left out."""
    if name == "verses":
        values, lengths, vocab = verses()
    else:
        size = FLAGS.synthetic_size or (FLAGS.zipf_size if name == "zipf" else None)
        lengths = harness.synthetic_lengths(name, size, FLAGS.seed)
        rng = np.random.default_rng(FLAGS.seed + 1)
        values = rng.integers(1, VOCAB + 1, int(lengths.sum()), dtype=np.int32)
        vocab = VOCAB
    lengths = cut(lengths[lengths > 0], FLAGS.block_length)
    if FLAGS.max_examples:
        lengths = lengths[:FLAGS.max_examples]
        values = values[:int(lengths.sum())]
    return Corpus(name, values, lengths, vocab)


# ----------------------------------------------------------------------------- feeds

def real_tokens(batch):
    import tensorflow as tf

    return tf.math.count_nonzero(batch["ids"], dtype=tf.int64)


def tf_feed(dataset):
    """A tf.data feed: ``(dataset, count)`` counting real tokens, in tfseq's options."""
    import tfseq

    return dataset.with_options(tfseq.pipeline_options()), real_tokens


def check_tf(dataset, vocab: int) -> dict:
    """One pass over dense batches ``{"ids": [B, T], ...}`` in the graph: the histogram of
    the ids (id 0: padding), batches, segments (``ids_segment_ids``' largest per row, else
    rows), cells and the largest batch's cells."""
    import tensorflow as tf

    def numbers(batch):
        ids = batch["ids"]
        if "ids_segment_ids" in batch:
            segments = tf.reduce_sum(tf.cast(tf.reduce_max(batch["ids_segment_ids"], 1),
                                             tf.int64))
        else:
            segments = tf.cast(tf.shape(ids)[0], tf.int64)
        cells = tf.cast(tf.size(ids), tf.int64)
        histogram = tf.math.bincount(tf.reshape(ids, [-1]), minlength=vocab + 1,
                                     maxlength=vocab + 1, dtype=tf.int64)
        return tf.stack([tf.constant(1, tf.int64), segments, cells]), histogram

    totals, largest, histogram = dataset.map(numbers).reduce(
        (tf.zeros([3], tf.int64), tf.zeros([1], tf.int64), tf.zeros([vocab + 1], tf.int64)),
        lambda acc, x: ((acc[0] + x[0]), tf.maximum(acc[1], x[0][2:]), acc[2] + x[1]))
    batches, segments, cells = totals.numpy().tolist()
    return {"batches": batches, "segments": segments, "cells": cells,
            "largest": int(largest.numpy()[0]), "histogram": histogram.numpy()}


def check_numpy(batches, vocab: int) -> dict:
    """``check_tf`` for batches of numpy arrays (Grain's)."""
    histogram = np.zeros(vocab + 1, np.int64)
    n = segments = cells = largest = 0
    for batch in batches:
        ids = batch["ids"]
        n += 1
        segments += int(batch["ids_segment_ids"].max(axis=1).sum())
        cells += ids.size
        largest = max(largest, ids.size)
        histogram += np.bincount(ids.ravel(), minlength=vocab + 1)
    return {"batches": n, "segments": segments, "cells": cells, "largest": largest,
            "histogram": histogram}


def verdict(corpus: Corpus, checked: dict) -> dict:
    """The checked pass against the corpus: exactness, efficiency."""
    histogram = checked.pop("histogram")
    real = int(histogram[1:].sum())
    exact = (np.array_equal(histogram[1:], corpus.histogram()[1:])
             and checked["segments"] == len(corpus.lengths))
    return {**checked, "real_tokens": real, "exact": bool(exact),
            "efficiency": real / max(checked["cells"], 1)}


# ----------------------------------------------------------------------------- pack

def pack_feeds(corpus: Corpus) -> dict:
    """name -> (feed for ``best_passes``, checked pass -> dict)."""
    import tfseq

    block, rows = FLAGS.block_length, FLAGS.rows
    feeds = {}

    def tf_scheme(dataset):
        return tf_feed(dataset), lambda: check_tf(dataset, corpus.vocab)

    feeds["tfseq pack, ragged batches"] = tf_scheme(
        corpus.batches().apply(tfseq.pack(block, batch_size=rows)))
    feeds["tfseq pack, one example an element"] = tf_scheme(
        corpus.examples().apply(tfseq.pack(block, batch_size=rows)))
    if installed("seqio"):
        import seqio

        feeds["seqio trim_and_pack_dataset"] = tf_scheme(
            seqio.utils.trim_and_pack_dataset(corpus.examples(), {"ids": block}).batch(rows))
    if installed("grain"):
        import grain

        examples = corpus.arrays()

        def grain_batches():
            ds = grain.MapDataset.source(examples).to_iter_dataset(read_options())
            return grain.experimental.FirstFitPackIterDataset(
                ds, length_struct={"ids": block}, num_packing_bins=rows,
                seed=FLAGS.seed).batch(rows)

        def grain_pass():
            return sum(np.count_nonzero(b["ids"]) for b in grain_batches())

        feeds["Grain FirstFitPackIterDataset"] = (
            grain_pass, lambda: check_numpy(grain_batches(), corpus.vocab))
    return feeds


def bucket_feeds(corpus: Corpus) -> dict:
    import tfseq

    def bucketing():
        return tfseq.bucket_by_length(max_tokens=FLAGS.max_tokens,
                                      max_length=FLAGS.block_length, seed=FLAGS.seed)

    feeds = {}
    for name, dataset in (
            ("tfseq bucket_by_length, ragged batches", corpus.batches().apply(bucketing())),
            ("tfseq bucket_by_length, one example an element",
             corpus.examples().apply(bucketing())),
            ("tf.data bucket_by_sequence_length", corpus.examples().apply(
                harness.tf_data_bucketing(FLAGS.max_tokens, FLAGS.block_length)))):
        feeds[name] = tf_feed(dataset), (lambda d=dataset: check_tf(d, corpus.vocab))
    return feeds


def run_batching(section: str, corpus: Corpus) -> list[dict]:
    """One corpus through every scheme of ``section`` (``pack`` or ``bucket``): checked
    once, then timed; rows of the table."""
    feeds = (pack_feeds if section == "pack" else bucket_feeds)(corpus)
    checked = {name: verdict(corpus, check()) for name, (_, check) in feeds.items()}
    best = harness.best_passes({name: feed for name, (feed, _) in feeds.items()},
                               FLAGS.repeats)
    rows = []
    for name, result in checked.items():
        count, seconds, cpu = best[name]
        assert count == result["real_tokens"], (name, count, result["real_tokens"])
        row = {"corpus": corpus.name, "examples": len(corpus.lengths), "tokens": corpus.tokens,
               "scheme": name, "tokens_per_s": count / seconds, "tokens_per_cpu_s": count / cpu,
               **result}
        if section == "bucket":
            row["step_efficiency"] = math.ceil(corpus.tokens / FLAGS.max_tokens) / max(
                result["batches"], 1)
        rows.append(row)
    harness.add_ratios(rows, rows[0], vs_tfseq="tokens_per_s")
    return rows


# ----------------------------------------------------------------------------- mix

def mix_feeds(sources: list[Corpus], weights: list[float]) -> dict:
    """name -> (feed, checked pass -> (int32 source [N], int64 fingerprint [N]))."""
    import tensorflow as tf

    import tfseq

    n = FLAGS.mix_examples
    feeds = {}

    def fingerprint(ids):  # ids: [T] or RaggedTensor [B, (T)]
        if isinstance(ids, tf.RaggedTensor):
            positions = tf.ragged.range(ids.row_lengths(), dtype=tf.int64) + 1
            return tf.reduce_sum(positions * tf.cast(ids, tf.int64), axis=1)
        return tf.reduce_sum((tf.range(tf.size(ids, out_type=tf.int64)) + 1) *
                             tf.cast(ids, tf.int64))

    def collect(dataset, batched):
        dataset = dataset.map(lambda x: (x["source"], fingerprint(x["ids"])))
        parts = list((dataset if batched else dataset.batch(4096)).as_numpy_iterator())
        return (np.concatenate([np.atleast_1d(s) for s, _ in parts])[:n],
                np.concatenate([np.atleast_1d(f) for _, f in parts])[:n])

    mixed = tfseq.mix([s.batches() for s in sources], weights, seed=FLAGS.seed)
    size = tfseq.Mixture.create([s.name for s in sources], weights).block()[1].size
    mixed = mixed.take(-(-n // size))
    feeds["tfseq mix, ragged batches"] = (
        (mixed.with_options(tfseq.pipeline_options()),
         lambda b: tf.cast(b["ids"].nrows(), tf.int64)),
        lambda: collect(mixed, True))

    def per_example(dataset):
        dataset = dataset.take(n).with_options(tfseq.pipeline_options())
        return ((dataset, lambda e: tf.constant(1, tf.int64)),
                lambda: collect(dataset, False))

    feeds["tfseq mix, one example an element"] = per_example(
        tfseq.mix([s.examples() for s in sources], weights, seed=FLAGS.seed))
    labelled = [s.examples({"source": np.full(len(s.lengths), i, np.int32)})
                for i, s in enumerate(sources)]
    feeds["tf.data sample_from_datasets"] = per_example(tf.data.Dataset.sample_from_datasets(
        [ds.repeat() for ds in labelled], weights, seed=FLAGS.seed))
    if installed("grain"):
        import grain

        arrays = [s.arrays({"source": np.full(len(s.lengths), i, np.int32)})
                  for i, s in enumerate(sources)]

        def grain_mixed():
            return grain.MapDataset.mix(
                [grain.MapDataset.source(a).repeat() for a in arrays], weights)[:n]

        def iterated():
            count = 0
            for _ in grain_mixed().to_iter_dataset(read_options()):
                count += 1
            return count

        def indexed():
            mixed, count = grain_mixed(), 0
            for i in range(n):
                mixed[i]
                count += 1
            return count

        def grain_check():
            got = list(grain_mixed().to_iter_dataset(read_options()))
            return (np.array([int(x["source"]) for x in got]),
                    np.array([int(np.dot(np.arange(1, len(x["ids"]) + 1), x["ids"]))
                              for x in got]))

        feeds["Grain MapDataset.mix, iterated"] = iterated, grain_check
        feeds["Grain MapDataset.mix, indexed"] = indexed, grain_check
    return feeds


def mix_verdict(sources: list[Corpus], weights, order, prints) -> dict:
    """The mixture's first examples (source, fingerprint) -> each source's largest drift from
    its share over every prefix, and whether each source's examples came in their own order,
    cycled."""
    n = len(order)
    w = np.asarray(weights, np.float64) / np.sum(weights)
    steps = np.arange(1, n + 1)
    drift = [float(np.max(np.abs(np.cumsum(order == i) - steps * w[i])))
             for i in range(len(sources))]
    in_order = True
    for i, source in enumerate(sources):
        got = prints[order == i]
        expected = np.resize(source.fingerprints(), len(got))
        in_order &= bool(np.array_equal(got, expected))
    return {"examples": n, "drift": max(drift), "drift_per_source": drift,
            "shares": [float(np.mean(order == i)) for i in range(len(sources))],
            "in_order": in_order}


def run_mix() -> list[dict]:
    sources = [load(name) for name in FLAGS.mix_corpora]
    weights = [float(w) for w in FLAGS.mix_weights]
    feeds = mix_feeds(sources, weights)
    checked = {name: mix_verdict(sources, weights, *check())
               for name, (_, check) in feeds.items()}
    best = harness.best_passes({name: feed for name, (feed, _) in feeds.items()},
                               FLAGS.repeats)
    rows = []
    for name, result in checked.items():
        count, seconds, cpu = best[name]
        rows.append({"scheme": name, "examples_per_s": count / seconds,
                     "examples_per_cpu_s": count / cpu, "counted": count, **result})
    harness.add_ratios(rows, rows[0], vs_tfseq="examples_per_s")
    return rows


# ----------------------------------------------------------------------------- floor

def floor_feeds() -> dict:
    """What handing out one element at a time costs in tf.data (and in Grain)."""
    import tensorflow as tf

    import tfseq

    n = FLAGS.floor_elements
    one = lambda x: tf.constant(1, tf.int64)  # noqa: E731
    rows = np.random.default_rng(FLAGS.seed).integers(1, 40, n)
    batches = Corpus("floor", np.ones(int(rows.sum()), np.int32), rows, 1).batches()
    feeds = {}
    for threads in (1, 2):
        options = tf.data.Options()
        options.threading.private_threadpool_size = threads
        for name, dataset in (
                ("range", tf.data.Dataset.range(n)),
                ("range.map(identity)", tf.data.Dataset.range(n).map(lambda x: x)),
                ("range.map(x + 1)", tf.data.Dataset.range(n).map(lambda x: x + 1)),
                ("tfseq.unbatch of ragged batches", tfseq.unbatch(batches))):
            feeds[f"{name}, {threads} thread{'s' * (threads > 1)}"] = (
                dataset.with_options(options), one)
    if installed("grain"):
        import grain

        def grain_pass():
            count = 0
            for _ in grain.MapDataset.range(n).to_iter_dataset(read_options()):
                count += 1
            return count

        feeds["Grain MapDataset.range, a Python loop"] = grain_pass
    return feeds


def run_floor() -> list[dict]:
    best = harness.best_passes(floor_feeds(), FLAGS.repeats + 1)
    return [{"pipeline": name, "elements_per_s": count / seconds,
             "us_per_element": 1e6 * seconds / count}
            for name, (count, seconds, _) in best.items()]


# ----------------------------------------------------------------------------- main

BATCHING_COLUMNS = [("corpus", "corpus", ""), ("scheme", "scheme", ""),
                    ("M tokens/s", lambda r: r["tokens_per_s"] / 1e6, ".2f"),
                    ("x tfseq", "vs_tfseq", ".2f"), ("efficiency", "efficiency", ".3f"),
                    ("batches", "batches", ",d"), ("exact", "exact", "")]


def main(argv):
    del argv
    skipped = [f"{peer} is not installed: its rows are skipped (make bench-peers installs it)"
               for peer in ("grain", "seqio") if not installed(peer)]
    for line in skipped:
        print(line)
    result = {"flags": harness.flag_values(
        "sections", "corpora", "bucket_corpora", "block_length", "rows", "max_tokens",
        "read_batch", "mix_corpora", "mix_weights", "mix_examples", "repeats", "seed"),
        "load": os.getloadavg(), "skipped": skipped}
    corpora = {}

    def corpus(name):
        if name not in corpora:
            corpora[name] = load(name)
        return corpora[name]

    for section in [s for s in SECTIONS if s in FLAGS.sections]:
        if section in ("pack", "bucket"):
            rows = []
            for name in (FLAGS.corpora if section == "pack" else FLAGS.bucket_corpora):
                c = corpus(name)
                print(f"{section}: {c.name}, {len(c.lengths):,} examples, {c.tokens:,} tokens",
                      flush=True)
                rows += run_batching(section, c)
            columns = BATCHING_COLUMNS + ([("step eff", "step_efficiency", ".3f")]
                                          if section == "bucket" else [])
            harness.print_table(rows, columns, title=f"\n{section}: best of {FLAGS.repeats} "
                                f"passes, load {os.getloadavg()[0]:.1f}")
        elif section == "mix":
            rows = run_mix()
            harness.print_table(rows, [
                ("scheme", "scheme", ""), ("k examples/s", lambda r: r["examples_per_s"] / 1e3,
                                           ",.1f"),
                ("x tfseq", "vs_tfseq", ".2f"), ("largest drift", "drift", ".2f"),
                ("in order", "in_order", "")],
                title=f"\nmix: {', '.join(FLAGS.mix_corpora)} at {', '.join(FLAGS.mix_weights)}, "
                f"first {FLAGS.mix_examples:,} examples, load {os.getloadavg()[0]:.1f}")
        else:
            rows = run_floor()
            harness.print_table(rows, [
                ("one element at a time", "pipeline", ""),
                ("k elements/s", lambda r: r["elements_per_s"] / 1e3, ",.1f"),
                ("us an element", "us_per_element", ".1f")],
                title=f"\nfloor: {FLAGS.floor_elements:,} elements, Dataset.reduce, "
                f"load {os.getloadavg()[0]:.1f}")
        result[section] = rows
    harness.write_json(result)


if __name__ == "__main__":
    harness.run(main)
