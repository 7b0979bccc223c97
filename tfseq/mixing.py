"""Exact mixtures of several datasets: ``mix`` and ``Mixture``.

Shapes: k = sources, G = the schedule's period (examples), L = examples in a block (a whole
number of periods), T = time.

``mix(datasets, weights)`` interleaves the examples of ``k`` sources so that over *every*
prefix of ``n`` emitted examples source ``i`` has ``n * w_i`` examples within one (not only on
average, as ``tf.data.Dataset.sample_from_datasets`` has them). How:

1. **Integer shares.** The weights become integer shares ``g_i`` of a period ``G``: the
   smallest ``G <= MAX_PERIOD`` for which every ``w_i * G`` is a whole number (weights such
   as 0.7 / 0.3 give ``G = 10``), else (weights from a temperature, say) ``G = MAX_PERIOD``
   with the largest-remainder rounding, so each share is off by less than ``1 / G``.
2. **A schedule of one period**, computed once in Python with integer arithmetic: at each
   step, among the sources behind their share (``(n + 1) g_i > c_i G``), the one whose next
   example is due first (the least ``(c_i + 1) / g_i``; ties broken by the seed), a deadline
   rule of the kind Tijdeman studied for the chairman-assignment problem. Every prefix stays
   within one of ``n g_i / G`` (a property test checks it over random shares; the greedy
   "most behind first" rule does not hold it); at the end of the period each source has
   exactly ``g_i``, so the schedule repeats without drift.
3. **Blocks in the graph.** Each source, cycled through its own epochs (``repeat()``: each
   example once per source epoch, reshuffled per epoch if the source shuffles), is cut into
   chunks of ``m * g_i`` examples; the ``k`` chunks of a block are concatenated and gathered
   into the schedule's order (one ``tf.gather`` per feature for ``L = m * G >= 1024``
   examples). No per-example Python, no per-example ``choose_from_datasets`` step: the cost
   per example is the gather.

Sources of one example an element skip the blocks: ``choose_from_datasets`` takes each
example from the source the schedule names, cycling one period's order (the same sequence).
Each example then pays ``tf.data``'s per-element cost, tens of microseconds; ragged batches
mix hundreds of times faster (``docs/sources.md``, "One example an element").

Each example gets an int32 feature ``key`` (default ``"source"``): the index of its source.
Sources are examples (dicts of ``[T]`` and scalar tensors) or ragged batches of examples (dicts
of ``RaggedTensor [B, (T)]`` and ``[B]``, what ``tokenize`` on batched lines gives); ragged
batches come out as ragged batches of ``L`` examples (``bucket_by_length`` and ``pack`` take
either). The sequence is the same for the same seed whatever the core count or thread timing:
the schedule is fixed and the chunks come from sources in their own deterministic order.

``Mixture`` holds the schedule (``names``, ``weights``, ``shares``, ``period``,
``counts(n)``: each source's examples among the first ``n``, the few integers a consumer
needs to report shares or to resume a mixture).
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from tfseq._common import is_ragged_batch, require_dict_spec

MAX_PERIOD = 16384   # the longest period of the schedule (examples)
MIN_BLOCK = 1024     # examples gathered at once (periods repeated up to at least this)


def mixture_weights(num_sources: int, weights=None, *, temperature: float | None = None,
                    sizes=None) -> np.ndarray:
    """float64 ``[k]`` summing to 1.

    ``weights`` (any positive scale) are normalized. ``temperature=T`` instead sets
    ``w_i ∝ size_i ** (1 / T)`` (``T = 1``: in proportion to the sizes, as concatenating
    would; large ``T``: towards equal). With neither: in proportion to ``sizes`` if given,
    else equal.

    Raises:
      ValueError: weights and temperature both given, a wrong count, a negative weight, all
        weights zero, or a temperature without sizes.
    """
    if weights is not None and temperature is not None:
        raise ValueError("mix: give weights or temperature, not both")
    if weights is None and temperature is None and sizes is not None:
        temperature = 1.0
    if temperature is not None:
        if sizes is None or any(s is None for s in sizes):
            raise ValueError("mix(temperature=...) needs each source's size: pass sizes=[...] "
                             "(the datasets' cardinality() is unknown)")
        if temperature <= 0:
            raise ValueError(f"mix: temperature must be positive; received {temperature}")
        if len(sizes) != num_sources or any(s < 0 for s in sizes):
            raise ValueError(f"mix: sizes={list(sizes)} must be {num_sources} counts >= 0")
        weights = [float(s) ** (1.0 / temperature) for s in sizes]
    if weights is None:
        weights = [1.0] * num_sources
    weights = np.asarray(weights, np.float64)
    if weights.shape != (num_sources,):
        raise ValueError(f"mix: {num_sources} sources but {weights.size} weights")
    if (weights < 0).any() or not np.isfinite(weights).all() or weights.sum() <= 0:
        raise ValueError(f"mix: weights must be >= 0 and not all 0; received {weights.tolist()}")
    return weights / weights.sum()


def integer_shares(weights: np.ndarray, max_period: int = MAX_PERIOD) -> tuple[np.ndarray, int]:
    """``(g int64 [k], G)``: integer shares of a period, ``g.sum() == G``.

    ``G`` is the least common denominator of the weights when it is at most ``max_period``
    (weights that are fractions, to 1e-12), else ``max_period`` with largest-remainder
    rounding (a positive weight keeps at least one example per period).
    """
    fractions = [Fraction(float(w)).limit_denominator(max_period) for w in weights]
    if all(abs(float(f) - w) <= 1e-12 for f, w in zip(fractions, weights)):
        period = math.lcm(*(f.denominator for f in fractions))
        if period <= max_period:
            shares = np.array([f.numerator * (period // f.denominator) for f in fractions],
                              np.int64)
            if shares.sum() == period:
                return shares, period
    period = max_period
    exact = weights * period
    shares = np.floor(exact).astype(np.int64)
    shares[(weights > 0) & (shares == 0)] = 1
    # Largest remainders get the examples left (the smallest lose any excess).
    order = np.argsort(-(exact - np.floor(exact)), kind="stable")
    short = period - int(shares.sum())
    i = 0
    while short != 0:
        j = order[i % len(order)] if short > 0 else order[::-1][i % len(order)]
        if short > 0 or shares[j] > 1:
            shares[j] += 1 if short > 0 else -1
            short += -1 if short > 0 else 1
        i += 1
    return shares, period


def schedule(shares: np.ndarray, seed: int | None = None) -> np.ndarray:
    """int32 ``[G]``: the source of each example of one period (earliest deadline among the
    sources behind their share; integer arithmetic, so exact; ties broken by ``seed``, 0 if ``None``).

    Every prefix ``n`` holds ``n * g_i / G`` examples of source ``i`` within one, and the
    whole period exactly ``g_i``.
    """
    shares = np.asarray(shares, np.int64)
    period = int(shares.sum())
    rng = np.random.default_rng(0 if seed is None else seed)
    counts = np.zeros_like(shares)
    active = shares > 0
    out = np.empty(period, np.int32)
    for n in range(period):
        behind = active & ((n + 1) * shares > counts * period)
        candidates = np.flatnonzero(behind)
        # Deadline (c + 1) / g compared as fractions: least numerator * other denominators.
        due = (counts[candidates] + 1) / shares[candidates]
        first = candidates[due <= due.min() * (1 + 1e-12)]
        if len(first) > 1:
            exact = [(int(counts[i]) + 1) * int(shares[first[0]]) -
                     (int(counts[first[0]]) + 1) * int(shares[i]) for i in first]
            first = first[np.asarray(exact) == min(exact)]
        pick = first[rng.integers(len(first))] if len(first) > 1 else first[0]
        out[n] = pick
        counts[pick] += 1
    return out


@dataclasses.dataclass(frozen=True)
class Mixture:
    """The schedule of a mixture of ``k`` sources (see the module docstring).

    Attributes:
      names: the sources' names (a dict's keys; ``"0"``, ``"1"``, ... for a list).
      weights: float64 ``[k]``, normalized.
      shares: int64 ``[k]``, examples of each source per period.
      period: ``G``.
      order: int32 ``[G]``, the source of each example of a period.
    """

    names: tuple[str, ...]
    weights: np.ndarray
    shares: np.ndarray
    period: int
    order: np.ndarray

    @classmethod
    def create(cls, names: Sequence[str], weights=None, *, temperature=None, sizes=None,
               seed: int | None = None, max_period: int = MAX_PERIOD) -> "Mixture":
        w = mixture_weights(len(names), weights, temperature=temperature, sizes=sizes)
        shares, period = integer_shares(w, max_period)
        return cls(tuple(names), w, shares, period, schedule(shares, seed))

    def counts(self, n: int) -> np.ndarray:
        """int64 ``[k]``: examples of each source among the first ``n`` emitted."""
        periods, rest = divmod(int(n), self.period)
        return periods * self.shares + np.bincount(self.order[:rest],
                                                   minlength=len(self.names))

    def block(self, min_block: int = MIN_BLOCK) -> tuple[np.ndarray, np.ndarray]:
        """``(chunk sizes int64 [k], gather index int32 [L])`` of one block of ``m`` periods:
        row ``j`` of the block is row ``index[j]`` of the sources' chunks concatenated."""
        m = max(1, -(-min_block // self.period))
        order = np.tile(self.order, m)
        chunk = self.shares * m
        starts = np.concatenate([[0], np.cumsum(chunk)[:-1]])
        index = np.empty(len(order), np.int32)
        seen = np.zeros(len(chunk), np.int64)
        for j, s in enumerate(order):
            index[j] = starts[s] + seen[s]
            seen[s] += 1
        return chunk, index


def _cardinality(ds: tf.data.Dataset) -> int | None:
    n = int(ds.cardinality())
    return n if n >= 0 else None


def mix(datasets, weights=None, *, temperature: float | None = None, sizes=None,
        seed: int | None = None, key: str = "source", batched: bool | None = None
        ) -> tf.data.Dataset:
    """An endless dataset of the sources' examples in an exact, deterministic mixture.

    Mix ragged batches where you can (``tokenize`` on batched lines): sources of one example
    an element pay ``tf.data``'s per-element cost, tens of microseconds an example.

    Args:
      datasets: a list of datasets, or a ``{name: dataset}`` dict (the source index follows
        its order; ``Mixture.create(list(d))`` gives the names). Finite, not repeated: each
        is cycled through its own epochs. Examples (dicts) or ragged batches of examples,
        the same features in every source.
      weights: relative proportions (normalized), or ``None`` (see ``mixture_weights``).
      temperature: ``w_i ∝ size_i ** (1 / T)`` instead of weights.
      sizes: examples per source (default: each dataset's ``cardinality()`` where known; for
        batched sources that counts batches: give ``sizes`` if their batch sizes differ).
      seed: breaks ties in the schedule (equal weights: the order within a round).
      key: the int32 feature added to each example, its source's index.
      batched: whether each element is a batch of examples (every feature ``[n, ...]``, e.g.
        the ``{column: tf.string [n]}`` rows of ``tfseq.formats.read_rows``); default: a
        ragged batch of examples (``RaggedTensor [n, (T)]`` features) is, anything else not.
        Batches give batches of ``L`` examples, and ``L`` example counts are exact per block.

    Returns:
      Examples (or ragged batches of ``L`` examples, as the sources are) with ``key``.

    Raises:
      ValueError: no sources, weights as ``mixture_weights`` refuses them, sources with
        different features, or examples that already have ``key``.
      TypeError: elements that are not dicts.
    """
    names, sources = _named(datasets)
    if sizes is None and temperature is not None:
        sizes = [_cardinality(ds) for ds in sources]
    elif sizes is None and weights is None:
        known = [_cardinality(ds) for ds in sources]
        sizes = known if all(s is not None for s in known) else None
    mixture = Mixture.create(names, weights, temperature=temperature, sizes=sizes, seed=seed)
    return mix_with(mixture, sources, key=key, batched=batched)


def mix_with(mixture: Mixture, sources: Sequence[tf.data.Dataset], *,
             key: str = "source", batched: bool | None = None) -> tf.data.Dataset:
    """``mix`` with a ``Mixture`` already built (kept for its names, weights and ``counts``)."""
    specs = [require_dict_spec(ds.element_spec, "tfseq.mix") for ds in sources]
    common = _common_spec(mixture.names, specs)
    if key in common:
        raise ValueError(f"mix: the examples already have a {key!r} feature; pass another "
                         f"key=, e.g. key='corpus'")
    if batched is None:
        batched = is_ragged_batch(specs[0])
    if not batched:
        return _choose(mixture, sources, key)
    chunk, index = mixture.block()
    chunks = []
    for i, ds in enumerate(sources):
        if mixture.shares[i] == 0:
            continue
        # Each source chunked on its own thread (the zip pulls them one after another).
        chunks.append(_rechunk(ds.repeat(), int(chunk[i])).prefetch(2))
    # Each row's source is fixed by the schedule: one constant for every block.
    source_of_row = tf.constant(np.repeat(np.arange(len(chunk), dtype=np.int32), chunk)[index])
    index = tf.constant(index)

    def merge(*parts):
        """The k chunks of a block -> its L examples in the schedule's order."""
        merged = {name: tf.gather(tf.concat([p[name] for p in parts], 0), index)
                  for name in parts[0]}
        merged[key] = source_of_row
        return merged

    return tf.data.Dataset.zip(tuple(chunks)).map(
        merge, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _choose(mixture: Mixture, sources: Sequence[tf.data.Dataset], key: str
            ) -> tf.data.Dataset:
    """Sources of one example an element -> the mixture, one example an element: each
    example taken from the source the schedule names (``choose_from_datasets`` on the
    period's order, cycled), the sequence the blocks give. Batching each source to gather
    blocks and unbatching them would add two ``tf.data`` steps per example to the one the
    consumer pays anyway (``docs/sources.md``, "One example an element")."""
    keyed = [ds.repeat().map(lambda example, i=i: {**example, key: tf.constant(i, tf.int32)})
             for i, ds in enumerate(sources)]
    order = tf.data.Dataset.from_tensor_slices(mixture.order.astype(np.int64)).repeat()
    return tf.data.Dataset.choose_from_datasets(keyed, order)


def _rechunk(batches: tf.data.Dataset, size: int) -> tf.data.Dataset:
    """Ragged batches of any sizes -> batches of exactly ``size`` examples, in order (a
    ``scan`` carrying the rows short of a whole chunk; ``Dataset.rebatch`` goes one example at
    a time on ragged features)."""
    spec = batches.element_spec

    def parts(batch):  # scan state holds plain tensors: (values, row lengths) per ragged
        return {k: (v.values, v.row_lengths()) if isinstance(v, tf.RaggedTensor) else v
                for k, v in batch.items()}

    def whole(state):
        return {k: tf.RaggedTensor.from_row_lengths(*v, validate=False) if isinstance(v, tuple)
                else v for k, v in state.items()}

    def empty(s):
        if isinstance(s, tf.RaggedTensorSpec):
            return tf.zeros([0], s.dtype), tf.zeros([0], s.row_splits_dtype)
        return tf.zeros([0] + s.shape[1:].as_list(), s.dtype)

    def step(carry, batch):
        joined = {k: tf.concat([v, batch[k]], 0) for k, v in whole(carry).items()}
        cut = _rows(joined) // size * size
        return (parts({k: v[cut:] for k, v in joined.items()}),
                {k: v[:cut] for k, v in joined.items()})

    def split(head):
        """``[k * size, ...]`` -> ``[k, size, ...]``."""
        return {k: tf.RaggedTensor.from_uniform_row_length(v, size, validate=False)
                if isinstance(v, tf.RaggedTensor)
                else tf.reshape(v, tf.concat([[-1, size], tf.shape(v)[1:]], 0))
                for k, v in head.items()}

    return batches.scan({k: empty(s) for k, s in spec.items()}, step).map(split).unbatch()


def _common_spec(names: Sequence[str], specs: Sequence[Mapping]) -> dict:
    """The features every source has, with shapes loosened where sources differ (one source
    of ``[2]`` ids, another of ``[None]``: ``[None]``).

    Raises:
      ValueError: a source with other feature names, dtypes or ranks (named).
    """
    common = dict(specs[0])
    for name, spec in zip(names[1:], specs[1:]):
        wider = None
        if set(spec) == set(common):
            try:
                wider = {k: common[k].most_specific_common_supertype([spec[k]]) for k in common}
            except (TypeError, ValueError):
                wider = None
        if wider is None or any(v is None for v in wider.values()):
            raise ValueError(f"mix: source {name!r} has features {_describe(spec)} but source "
                             f"{names[0]!r} has {_describe(specs[0])}")
        common = wider
    return common


def _rows(batch: Mapping[str, tf.Tensor]) -> tf.Tensor:
    """int32 scalar: the examples in a ragged batch."""
    first = next(iter(batch.values()))
    if isinstance(first, tf.RaggedTensor):
        return tf.cast(first.nrows(), tf.int32)
    return tf.shape(first)[0]


def _named(datasets) -> tuple[list[str], list[tf.data.Dataset]]:
    if isinstance(datasets, Mapping):
        names, sources = [str(k) for k in datasets], list(datasets.values())
    else:
        sources = list(datasets)
        names = [str(i) for i in range(len(sources))]
    if not sources:
        raise ValueError("mix: no datasets given")
    return names, sources


def _describe(spec) -> str:
    return "{" + ", ".join(f"{k}: {v.dtype.name} {v.shape}" for k, v in spec.items()) + "}"


# ----------------------------------------------------------------------------- training records

class MixedRecords:
    """The records of several sources in an exact mixture, epoch after epoch, from a cursor.

    What ``tfseq.ResumableStream`` reads in place of one ``RecordShards`` (the same
    ``epoch_batches``), so a mixture keeps the stream's cursor of three integers, its exact
    resume and its counts.

    The mixed record sequence is endless and fixed: block ``b`` (``L`` records) holds the
    records ``b * m * g_i ... (b + 1) * m * g_i - 1`` of source ``i``'s own sequence, which
    visits the source epoch after epoch, each epoch in the source's ``RecordShards`` order
    (shards and records permuted anew from the seed and the source epoch). Mixture epoch ``E``
    is blocks ``E * B ... (E + 1) * B - 1``, ``B = ceil(sum of the sources' records / L)``:
    about as many records as the sources hold together. A block's records are source by
    source (``chunk`` sizes); ``mixed_encode`` encodes each source's part with its own counts
    and interleaves the examples.

    Args:
      parts: one ``RecordShards`` per source.
      names: the sources' names (their keys in ``DropCounter.by_source``).
      weights, temperature: as ``mixture_weights`` (sizes: the sources' records).
      seed: the schedule's ties.

    The sources' sizes (``shard_sizes`` of each part) are read at first use, after the parts
    are spilled.

    Memory: one shard of each source at a time.
    """

    num_shards = 1  # to the stream, an epoch is one shard of B blocks

    def __init__(self, parts: Sequence, names: Sequence[str], weights=None, *,
                 temperature: float | None = None, seed: int | None = None):
        self.parts = list(parts)
        self.names = tuple(names)
        self._weights, self._temperature, self._seed = weights, temperature, seed
        self._shard_sizes = None
        self._mixture = None

    def _ready(self) -> None:
        if self._mixture is not None:
            return
        if self._shard_sizes is None:
            with tf.init_scope():
                self._shard_sizes = [part.shard_sizes() for part in self.parts]
        sizes = self.sizes
        empty = [name for name, n in zip(self.names, sizes) if n == 0]
        if empty:
            raise ValueError(f"mix: source {empty} has no training record")
        self._mixture = Mixture.create(self.names, self._weights,
                                       temperature=self._temperature,
                                       sizes=sizes if self._temperature else None,
                                       seed=self._seed)
        # Blocks of about MIN_BLOCK records, smaller for small sources (an epoch is a whole
        # number of blocks: at most an eighth more than the sources' records).
        self._chunk, self._index = self._mixture.block(
            max(1, min(MIN_BLOCK, sum(sizes) // 8)))

    @property
    def sizes(self) -> list[int]:
        """Records per source."""
        if self._shard_sizes is None:
            self._ready()
        return [sum(s) for s in self._shard_sizes]

    @property
    def mixture(self) -> Mixture:
        self._ready()
        return self._mixture

    @property
    def chunk(self) -> np.ndarray:
        """int64 ``[k]``: each source's records in a block."""
        self._ready()
        return self._chunk

    @property
    def block(self) -> int:
        """``L``: records per block."""
        return int(self.chunk.sum())

    @property
    def blocks_per_epoch(self) -> int:
        return max(1, -(-sum(self.sizes) // self.block))

    def _source_stream(self, i: int, start: tf.Tensor, read_batch: int) -> tf.data.Dataset:
        """Source ``i``'s records (``tf.string [n]`` batches) from position ``start`` of its
        endless sequence on."""
        part, size = self.parts[i], self.sizes[i]
        shard_sizes = tf.constant(self._shard_sizes[i], tf.int64)
        first_epoch, first = start // size, start % size

        def epoch(e):
            skip = tf.where(tf.equal(e, first_epoch), first, tf.constant(0, tf.int64))
            rank, offset = part.locate(e, skip, shard_sizes)
            return part.epoch_batches(e, rank, offset, read_batch).map(
                lambda records, *_: records)

        return tf.data.Dataset.range(first_epoch, 1 << 62).flat_map(epoch)

    def epoch_batches(self, epoch, start_shard, start_offset, batch_size: int
                      ) -> tf.data.Dataset:
        """Mixture epoch ``epoch`` from record ``start_offset`` (a block start) on:
        ``(records tf.string [L], rank 0, offset int64, epoch_end bool)`` per block."""
        del start_shard, batch_size  # one shard per epoch; blocks of L records
        epoch = tf.cast(epoch, tf.int64)
        first = tf.cast(start_offset, tf.int64) // self.block
        block = epoch * self.blocks_per_epoch + first
        streams = []
        for i, size in enumerate(self.chunk.tolist()):
            records = self._source_stream(i, block * size, max(256, size))
            streams.append(_rechunk(records.map(lambda r: {"r": r}), size).prefetch(2))
        left = self.blocks_per_epoch - first
        blocks = tf.data.Dataset.zip(tuple(streams)).take(left).map(
            lambda *parts: tf.concat([p["r"] for p in parts], 0))
        return blocks.enumerate().map(
            lambda k, records: (records, tf.constant(0, tf.int64),
                                (first + k) * self.block, tf.equal(k, left - 1)))


def mixed_encode(encodes: Sequence, chunk: Sequence[int], names: Sequence[str], counter,
                 keys_fn=None):
    """``records tf.string [L] -> examples`` for ``MixedRecords`` blocks: each source's part
    (``chunk[i]`` records, source by source) encoded by ``encodes[i]``, its counts added to
    ``counter`` in total and under ``names[i]`` (``DropCounter.by_source``, with the source's
    ``examples`` and ``tokens``), and the examples interleaved in proportion (the r-th of
    ``n_i`` kept examples of source ``i`` at ``(r + 1/2) / n_i``; ties by source)."""
    from tfseq._common import batch_lengths, example_keys
    from tfseq.stats import CountTape

    def encode(records):
        parts, start = [], 0
        for fn, size, name in zip(encodes, chunk, names):
            tape = CountTape()
            with counter.recording(tape):
                examples = fn(records[start:start + size])
            start += size
            keys, _ = example_keys({k: _spec_of(v) for k, v in examples.items()})
            lengths = batch_lengths(examples, keys_fn(examples) if keys_fn else keys)
            counter.forward(tape, name, {
                "examples": tf.size(lengths, out_type=tf.int64),
                "tokens": tf.reduce_sum(tf.cast(lengths, tf.int64))})
            parts.append(examples)
        kept = [tf.cast(_rows(p), tf.float64) for p in parts]
        position = tf.concat([(tf.range(n) + 0.5) / n for n in kept], 0)
        order = tf.argsort(position, stable=True)
        return {k: tf.gather(tf.concat([p[k] for p in parts], 0), order) for k in parts[0]}

    return encode


def _spec_of(value):
    if isinstance(value, tf.RaggedTensor):
        return tf.RaggedTensorSpec.from_value(value)
    return tf.TensorSpec(value.shape, value.dtype)
