"""Length bucketing and token-budget batching: ``bucket_by_length`` and ``fit_boundaries``.

Shapes: B = batch (rows), T = time (tokens), W = pool size (examples), K = examples kept in a
pool, N = batches of a pool.

How it batches, all in the tf.data graph, as stages of ``Bucketer`` (the validated arguments,
a frozen dataclass; each stage runs alone on tensors):

1. Fill pools (``tfseq._pools.fill_pools``): consecutive examples, whole input batches at a
   time (single examples are first batched ``ragged_batch(256)``). A pool closes at
   ``pool_tokens`` tokens (default ``DEFAULT_POOL_BUDGETS`` budgets' worth, so about that many
   batches whatever the lengths) or ``pool_size`` examples, and at the end of the input
   (found by looking one input batch ahead, so it also works on each worker of the
   ``tf.data`` service). This per-batch ``scan`` only appends; steps 2-6 (``split_pool``) run
   once per pool, several pools at once (as many as the process has cores, 2 to 16; a
   deterministic parallel map: the same batches at any parallelism).
2. Examples longer than ``max_length`` are dropped and counted under ``"too_long"``.
3. ``order_pool``: longest bucket first, a random (seeded) order inside a bucket. With no
   ``boundaries``/``bucket_width`` every length is its own bucket.
4. ``cut``: greedy batches, each as many rows as fit ``rows x padded length <= max_tokens``
   (the padded length is the batch's longest example, or its bucket boundary with
   ``pad_to_boundary``), rounded down to ``batch_multiple``. A batch may run past the end of
   a bucket into the next, shorter one, so buckets leave no part-filled batches behind.
5. ``choose_carried``: the pool's last batch is not emitted: its examples go to the *tail
   pool*; with a budget, neither are the batches that fill less than 90% of their cells,
   worst first, up to 8 budgets' worth. The tail pool (a small sequential ``scan``) gathers
   the tails of ``_TAIL_POOLS`` consecutive pools (of each pool with ``shuffle=False``, so
   inference that restores the input order holds about one pool) and is split by the same
   steps 2-6, its own tail waiting for the next tail pool. The stream's last pool joins the
   tail pool whole and ends the stream: only there is a part-filled batch emitted, so every
   batch but the last has a multiple of ``batch_multiple`` rows. A stream of one pool is
   batched as that pool alone.
6. ``shuffle_batches``: the other batches go out in a random (seeded) order; at the end of the
   stream the last batch comes last. A tail pool's batches follow those of the pool that
   completed it.
7. ``pad``: each batch's rows become dense ``[B, T]`` tensors.

Worked example: lengths 1..10 in this order, ``boundaries=[3, 7, 11]``, ``max_tokens=20``,
``shuffle=False`` (input order kept inside a bucket, batches emitted longest first), one pool.
``[7 1 2]`` would need 3 x 7 = 21 cells, so the fourth batch stops at ``[7 1]``::

  bucket (upper bound)    11: 8 9 10     7: 4 5 6 7     3: 1 2 3
  pool order              8  9  10  4  5  6  7  1  2  3
  batch lengths           [8 9]    [10 4]    [5 6]    [7 1]    [2 3]
  padded shape            [2, 9]   [2, 10]   [2, 6]   [2, 7]   [2, 3]
  cells (<= 20)           18       20        12       14       6
  pad_to_boundary,        [8 9]    [10 4]    [5 6 7]  [1 2 3]
    max_tokens=22         [2, 11]  [2, 11]   [3, 7]   [3, 3]

Why this design: ``group_by_window`` bucketing sizes rows by the bucket's upper bound and
leaves a part-filled batch in every bucket at the end of an epoch, which costs a corpus of ~100
batches an epoch ~20% of its steps. Sorting a pool instead approaches a global sort (fairseq's
``batch_by_size``) while the pool bounds memory and the batch order stays random; larger pools
sort better (docs/benchmarks.md#batching-step-and-padding-efficiency).

Batches keep the element contract: each sequence feature becomes int ``[B, T]`` padded with 0
plus ``"<name>_length"`` int32 ``[B]``; scalar features become ``[B]``. The length used for
buckets and budgets is the max over the sequence features (``source``/``target`` pairs).
E.g. ``{"ids": int32 [(T)], "label": int32 []}`` examples give the element spec
``{"ids": [None, None] int32, "ids_length": [None] int32, "label": [None] int32}``.

Pool-level entry points, for a pipeline that gathers its own pools (dicts of int
``RaggedTensor [W, (T)]`` and ``[W]`` tensors); ``Bucketer`` takes ``bucket_by_length``'s
arguments and validates them the same way. ``pool_batches(pool, pool_seed)``: one pool -> its
batches ``[N, (B), (T)]``, as the stream of that pool alone would emit them (nothing carried;
drops counted); ``finish(element)``: one of them -> the padded batch; ``split_pool(pool,
pool_seed, is_last)`` also returns the tail to put in front of the next pool::

    bucketer = Bucketer(max_tokens=8192, seed=0)
    batches = bucketer.pool_batches(pool, tf.constant(7, tf.int64))
    ds = tf.data.Dataset.from_tensor_slices(batches).map(bucketer.finish)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from tfseq._common import (LENGTH_SUFFIX, Transform, batch_lengths, check_positive_int,
                           example_keys, lazy_cond, parallel_calls)
from tfseq._pools import PoolLists, check_pool, fill_pools
from tfseq.stats import DropCounter, resolve_counter

# Pools of 256 budgets (DEFAULT_POOL_BUDGETS) batch nearly as well as a global sort:
# see docs/benchmarks.md#batching-step-and-padding-efficiency
DEFAULT_POOL_SIZE = 32768      # examples per pool with a fixed batch_size
DEFAULT_POOL_BUDGETS = 256     # budgets' worth of tokens per pool with max_tokens
_EXAMPLES_PER_CHUNK = 256      # per-example input is batched this much before pooling
_CARRY_FILL = 0.9              # batches filling less of their cells wait for the next pool
_CARRY_BUDGETS = 8             # ... up to this many budgets of cells
_TAIL_POOLS = 8                # the tails of this many pools are batched together


def fit_boundaries(lengths, num_buckets: int) -> list[int]:
    """Bucket boundaries at the length quantiles of a sample.

    Boundary ``i`` (1-based) is the smallest length that at least ``i / num_buckets`` of the
    sample does not exceed (the inverted-CDF quantile), so every boundary is a length that
    occurs and the last one is the sample's maximum. Repeated values are merged, so fewer than
    ``num_buckets`` boundaries come back when lengths repeat a lot.

    Args:
      lengths: a sequence or 1-D array of non-negative ints, e.g. the lengths of a sample of
        examples. Zero lengths count as 1.
      num_buckets: positive int, the number of quantile buckets wanted.

    Returns:
      Sorted, distinct, positive Python ints, usable as ``bucket_by_length(boundaries=...)``.

    Raises:
      TypeError: ``num_buckets`` is not an int.
      ValueError: ``num_buckets`` is not positive, or ``lengths`` is empty, not 1-D, not
        integer or has a negative value.

    Example:
      >>> fit_boundaries([1, 1, 2, 3, 5, 8, 13, 21, 34, 55], 4)
      [2, 5, 21, 55]
    """
    check_positive_int("num_buckets", num_buckets)
    values = np.asarray(lengths.numpy() if isinstance(lengths, tf.Tensor) else lengths)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"lengths must be a non-empty 1-D sequence; received shape {values.shape}")
    if not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"lengths must be integers; received dtype {values.dtype}")
    if values.min() < 0:
        raise ValueError(f"lengths must be non-negative; received min(lengths)={values.min()}")
    ordered = np.sort(np.maximum(values, 1))
    n = ordered.size
    picks = [ordered[math.ceil(i * n / num_buckets) - 1] for i in range(1, num_buckets + 1)]
    return sorted({int(v) for v in picks})


def _check_boundaries(boundaries) -> list[int]:
    if isinstance(boundaries, (str, bytes)) or not isinstance(boundaries, Sequence):
        raise TypeError(f"boundaries must be a list of ints; received boundaries={boundaries!r}")
    values = list(boundaries)
    if not values:
        raise ValueError("boundaries must not be empty; received boundaries=[]")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"boundaries must be ints; received boundaries={boundaries!r}")
        if v <= 0:
            raise ValueError(f"boundaries must be positive; received boundaries={boundaries!r}")
    if any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(
            f"boundaries must be strictly increasing; received boundaries={boundaries!r}")
    return [int(v) for v in values]


def _unwrap_flat_ragged(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Turns ``RaggedTensorSpec`` features of ragged_rank 0 (from slicing a ragged tensor) into
    the plain ``TensorSpec`` their values already have, so they count as sequence features."""
    spec = dataset.element_spec
    if isinstance(spec, Mapping) and any(
            isinstance(s, tf.RaggedTensorSpec) and s.ragged_rank == 0 for s in spec.values()):
        return dataset.map(lambda example: example)
    return dataset


def _checked(max_tokens, batch_size, boundaries, bucket_width, max_length, batch_multiple,
             pad_to_boundary, length_noise, pool_size, pool_tokens, seed):
    """``bucket_by_length``'s argument checks (raises as it documents); returns the resolved
    ``(boundaries, max_length, pool_size, pool_tokens)``."""
    if (max_tokens is None) == (batch_size is None):
        raise ValueError("Give exactly one of max_tokens and batch_size; received "
                         f"max_tokens={max_tokens!r}, batch_size={batch_size!r}")
    check_positive_int("max_tokens", max_tokens, allow_none=True)
    check_positive_int("batch_size", batch_size, allow_none=True)
    check_positive_int("bucket_width", bucket_width, allow_none=True)
    check_positive_int("max_length", max_length, allow_none=True)
    check_positive_int("batch_multiple", batch_multiple)
    check_positive_int("pool_size", pool_size, allow_none=True)
    check_positive_int("pool_tokens", pool_tokens, allow_none=True)
    if boundaries is not None and bucket_width is not None:
        raise ValueError("Give at most one of boundaries and bucket_width; received "
                         f"boundaries={boundaries!r}, bucket_width={bucket_width!r}")
    if boundaries is not None:
        boundaries = _check_boundaries(boundaries)
    if max_tokens is not None:
        if max_length is None:
            max_length = max_tokens // batch_multiple
        if max_length * batch_multiple > max_tokens:
            raise ValueError(
                "max_tokens must hold batch_multiple rows of max_length tokens; received "
                f"max_tokens={max_tokens}, max_length={max_length}, "
                f"batch_multiple={batch_multiple}")
    if batch_size is not None and batch_size % batch_multiple:
        raise ValueError(f"batch_size must be a multiple of batch_multiple={batch_multiple}; "
                         f"received batch_size={batch_size}")
    if boundaries is not None and max_length is not None and boundaries[-1] > max_length:
        raise ValueError(
            f"boundaries must not exceed max_length={max_length} (which defaults to "
            f"max_tokens // batch_multiple); received boundaries={boundaries!r}")
    if (pad_to_boundary and max_length is None and bucket_width is None):
        raise ValueError(
            "pad_to_boundary with batch_size needs max_length (the padded length of the last "
            f"bucket) or bucket_width; received max_length=None, boundaries={boundaries!r}")
    if isinstance(length_noise, bool) or not isinstance(length_noise, (int, float)):
        raise TypeError(f"length_noise must be a float; received length_noise={length_noise!r}")
    if not 0.0 <= length_noise < 1.0:
        raise ValueError(f"length_noise must be in [0, 1); received length_noise={length_noise!r}")
    if pool_size is None and pool_tokens is None:
        if max_tokens is not None:
            pool_tokens = DEFAULT_POOL_BUDGETS * max_tokens
        else:
            pool_size = max(DEFAULT_POOL_SIZE, 64 * batch_size)
            pool_size = -(-pool_size // batch_multiple) * batch_multiple
    if pool_size is not None and pool_size % batch_multiple:
        raise ValueError(f"pool_size must be a multiple of batch_multiple={batch_multiple}; "
                         f"received pool_size={pool_size}")
    if batch_size is not None and pool_size is not None and pool_size < batch_size:
        raise ValueError(f"pool_size must be at least batch_size={batch_size}; "
                         f"received pool_size={pool_size}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int or None; received seed={seed!r}")
    return boundaries, max_length, pool_size, pool_tokens


def _batch_seeds(seed: int | None) -> tf.data.Dataset:
    """The int64 seeds zipped with the input batches; a pool is ordered with the seed of its
    last batch. A new sequence each pass over the data, the same sequence on every run."""
    return tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)


def _cut(padded: tf.Tensor, max_tokens, batch_size, batch_multiple, descending=False):
    """Greedy split of an ordered pool into batches.

    Args:
      padded: int32 [W], each example's padded length (>= 1) in pool order.
      descending: ``padded`` is non-increasing, so a batch's first row is its longest (a
        cheaper loop body).

    Returns:
      (starts, sizes): int32 [num_batches] each, covering [0, W) in order.
    """
    total = tf.size(padded)

    def rows_at(start):
        remaining = total - start
        if max_tokens is None:
            return tf.minimum(batch_size, remaining)
        # k rows from `start` fit iff k * padded[j] <= max_tokens for every j < k, i.e.
        # k <= max(j, max_tokens // padded[j]) for every j: the largest such k is the min.
        cap = tf.minimum(remaining, max_tokens // padded[start])
        if descending:
            rows = cap
            return tf.where(rows < remaining, rows // batch_multiple * batch_multiple, rows)
        allowed = max_tokens // padded[start:start + cap]
        rows = tf.minimum(cap, tf.reduce_min(tf.maximum(tf.range(cap), allowed)))
        return tf.where(rows < remaining, rows // batch_multiple * batch_multiple, rows)

    def body(start, starts, sizes):
        rows = rows_at(start)
        index = starts.size()
        return start + rows, starts.write(index, start), sizes.write(index, rows)

    _, starts, sizes = tf.while_loop(
        lambda start, *_: start < total, body,
        (tf.constant(0), tf.TensorArray(tf.int32, size=0, dynamic_size=True),
         tf.TensorArray(tf.int32, size=0, dynamic_size=True)))
    return starts.stack(), sizes.stack()


def bucket_by_length(
    *,
    max_tokens: int | None = None,
    batch_size: int | None = None,
    boundaries: Sequence[int] | None = None,
    bucket_width: int | None = None,
    max_length: int | None = None,
    batch_multiple: int = 1,
    pad_to_boundary: bool = False,
    fill_rows: bool = False,
    length_noise: float = 0.0,
    pool_size: int | None = None,
    pool_tokens: int | None = None,
    shuffle: bool = True,
    seed: int | None = None,
    counter: DropCounter | None = None,
) -> Transform:
    """Transformation that batches examples of similar length under a token budget.

    See the module docstring for the algorithm and a worked example. Every example is emitted
    exactly once per pass, or dropped and counted under ``"too_long"``. Works on infinite
    (repeated) datasets and on the ``tf.data`` service. Memory: the pools in flight (one
    filling, one per core being sorted, one being emitted) plus a tail pool
    of at most ``_TAIL_POOLS`` x 9 budgets. Shuffle the examples upstream: a pool is a run of
    consecutive examples.

    Args:
      max_tokens: int, the budget of cells per batch: rows x padded length <= max_tokens for
        every batch, the last ones of an epoch included. Exactly one of ``max_tokens`` and
        ``batch_size``.
      batch_size: int, a fixed number of rows per batch (fewer at the end of a pool).
      boundaries: sorted ints, the *inclusive* upper length of each bucket (the length a
        bucket pads to with ``pad_to_boundary``); longer examples form one last bucket up to
        ``max_length``. Unlike ``tf.data``'s ``bucket_by_sequence_length``, where boundaries
        are exclusive. See ``fit_boundaries``.
      bucket_width: int, buckets of lengths (0, w], (w, 2w], ... instead of ``boundaries``.
        With neither, every length is its own bucket (the most efficient).
      max_length: int, longer examples are dropped and counted as ``"too_long"``. Defaults to
        ``max_tokens // batch_multiple`` with a budget, and to no limit with ``batch_size``.
      batch_multiple: int, row counts are multiples of it (e.g. 8 for tensor cores), except in
        the last batch of the stream when fewer examples remain.
      pad_to_boundary: bool, pad to the bucket's upper bound (``max_length`` without buckets)
        instead of the batch's longest example, so padded lengths come from a fixed set
        (static shapes for XLA). Rows are then sized by that bound.
      fill_rows: bool, with ``pad_to_boundary``: every batch gets the full row count of its
        padded length (``max_tokens // T``, or ``batch_size``) by adding empty rows (0
        tokens, length 0, scalars 0) and a float32 ``"weight"`` ``[B]`` feature, 1.0 on real
        rows and 0.0 on the added ones (an input ``"weight"`` is kept, 0 on added rows), so
        ``tfseq.ModelFeatures`` weighs them out. Then an epoch has at most
        ``Bucketer.num_shapes`` distinct batch shapes: what a jit-compiled (XLA) step
        compiles. The added rows are compute spent on nothing: about one part-filled batch
        per bucket and pool.
      length_noise: float in [0, 1): each example is bucketed by ``length * (1 + u * noise)``,
        u uniform in [-1, 1), so examples of nearby lengths also meet in a batch. Budgets
        always use the true lengths.
      pool_size: int, a pool closes once it holds this many examples (a multiple of
        ``batch_multiple``). Defaults to 32768 (and at least 64 batches) with ``batch_size``,
        and to no example cap with ``max_tokens``.
      pool_tokens: int, a pool closes once it holds this many tokens. Defaults to
        ``DEFAULT_POOL_BUDGETS * max_tokens`` when neither pool argument is given. Larger
        pools sort closer to a global sort (fewer steps) and cost memory, start-up time and
        some randomness of the batches.
      shuffle: bool, randomize the order inside a bucket and the order of a pool's batches.
        ``False`` keeps the input order inside a bucket and emits longest first.
      seed: int, makes the order deterministic (a new order each pass over the dataset, the
        same sequence of orders on every run).
      counter: ``tfseq.DropCounter`` where the dropped examples are counted (the
        ``"too_long"`` reason of ``filter_by_length``); defaults to the process-wide counter.

    Returns:
      A ``dataset -> dataset`` function. Input: dict examples with 1-D integer sequence
      features and scalar features, or ragged batches of them (sequence features
      ``[n, (T)]``, scalars ``[n]``, any ``n``, e.g. from ``tokenize`` on batched lines):
      those are pooled whole (a pool closes at ``pool_size`` examples or more), with no
      tf.data call per example. Output: dicts with each sequence feature as int
      ``[B, T]`` (0-padded) plus ``"<name>_length"`` int32 ``[B]``, and scalars ``[B]``.

    Raises:
      ValueError: both or neither of ``max_tokens``/``batch_size``; both ``boundaries`` and
        ``bucket_width``; boundaries empty, unsorted, non-positive or above ``max_length``;
        ``max_tokens`` smaller than ``max_length * batch_multiple``; ``batch_size`` or
        ``pool_size`` not a multiple of ``batch_multiple``; ``pool_size`` < ``batch_size``;
        ``length_noise`` outside [0, 1); ``pad_to_boundary`` with a ``batch_size``, no
        ``bucket_width`` and no ``max_length``; no sequence feature in the dataset.
      TypeError: an argument of the wrong type, or a dataset whose elements are not dicts.

    Example:
      >>> ds = tf.data.Dataset.from_tensor_slices(
      ...     {"ids": tf.ragged.constant([[1], [2, 3, 4], [5, 6]])})
      >>> ds = ds.apply(bucket_by_length(max_tokens=6, shuffle=False))
      >>> [b["ids"].numpy().tolist() for b in ds]
      [[[2, 3, 4], [5, 6, 0]], [[1]]]
    """
    return Bucketer(max_tokens=max_tokens, batch_size=batch_size, boundaries=boundaries,
                    bucket_width=bucket_width, max_length=max_length,
                    batch_multiple=batch_multiple, pad_to_boundary=pad_to_boundary,
                    fill_rows=fill_rows, length_noise=length_noise, pool_size=pool_size,
                    pool_tokens=pool_tokens, shuffle=shuffle, seed=seed,
                    counter=counter).transform


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bucketer:
    """``bucket_by_length``'s arguments, validated (same defaults, checks and errors), and the
    stages of its algorithm (see the module docstring), each testable alone.

    Once built, ``boundaries`` is a tuple and ``max_length``, ``pool_size``, ``pool_tokens``
    and ``counter`` hold their resolved defaults. A *pool* is a dict of int ``RaggedTensor
    [W, (T)]`` (sequence features) and ``[W]`` tensors (scalar features).
    """

    max_tokens: int | None = None
    batch_size: int | None = None
    boundaries: Sequence[int] | None = None
    bucket_width: int | None = None
    max_length: int | None = None
    batch_multiple: int = 1
    pad_to_boundary: bool = False
    fill_rows: bool = False
    length_noise: float = 0.0
    pool_size: int | None = None
    pool_tokens: int | None = None
    shuffle: bool = True
    seed: int | None = None
    counter: DropCounter | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        boundaries, max_length, pool_size, pool_tokens = _checked(
            self.max_tokens, self.batch_size, self.boundaries, self.bucket_width,
            self.max_length, self.batch_multiple, self.pad_to_boundary, self.length_noise,
            self.pool_size, self.pool_tokens, self.seed)
        resolved = {"boundaries": None if boundaries is None else tuple(boundaries),
                    "max_length": max_length, "pool_size": pool_size,
                    "pool_tokens": pool_tokens, "counter": resolve_counter(self.counter)}
        for name, value in resolved.items():
            object.__setattr__(self, name, value)
        if max_length is not None:
            self.counter.register("too_long")
        if self.fill_rows and not self.pad_to_boundary:
            raise ValueError("fill_rows needs pad_to_boundary=True (rows are filled to the "
                             "count of the batch's padded length)")

    @property
    def padded_lengths(self) -> tuple[int, ...] | None:
        """Every padded length a batch can have with ``pad_to_boundary``; None without it,
        or with ``bucket_width`` and no ``max_length`` (no bound)."""
        if not self.pad_to_boundary:
            return None
        if self.boundaries is not None:
            return tuple(self.boundaries) + (
                (self.max_length,) if self.max_length > self.boundaries[-1] else ())
        if self.bucket_width is not None:
            if self.max_length is None:
                return None
            w, longest = self.bucket_width, self.max_length
            return tuple(min(k * w, longest) for k in range(1, -(-longest // w) + 1))
        return (self.max_length,)

    @property
    def num_shapes(self) -> int | None:
        """With ``fill_rows``: the most distinct batch shapes an epoch can have (one per
        padded length); None otherwise (any row count and, without ``pad_to_boundary``, any
        length), or when the padded lengths have no bound."""
        lengths = self.padded_lengths
        return len(lengths) if self.fill_rows and lengths is not None else None

    def full_rows(self, width: tf.Tensor) -> tf.Tensor:
        """int32 scalar: the rows of a full batch padded to ``width`` (int32 scalar)."""
        if self.max_tokens is None:
            return tf.constant(self.batch_size, tf.int32)
        return tf.constant(self.max_tokens, tf.int32) // width

    # ----- the streaming transformation

    def transform(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """The ``bucket_by_length`` transformation (see there)."""
        dataset = _unwrap_flat_ragged(dataset)
        keys, batched = example_keys(dataset.element_spec, "bucket_by_length")
        if not batched:  # examples -> small ragged batches; one code path from here on
            dataset = dataset.ragged_batch(_EXAMPLES_PER_CHUNK, row_splits_dtype=tf.int32)
            dataset = dataset.map(lambda b: {k: (tf.RaggedTensor.from_tensor(
                v, row_splits_dtype=tf.int32) if k in keys and not isinstance(
                    v, tf.RaggedTensor) else v) for k, v in b.items()})
        lists = PoolLists(dataset.element_spec)
        if self.shuffle or self.length_noise > 0:
            # One seed per input batch: new orders each pass over the data.
            chunks = tf.data.Dataset.zip(dataset, _batch_seeds(self.seed))
        else:  # no second source to zip (on the tf.data service every source is split)
            chunks = dataset.map(lambda b: (b, tf.constant(0, tf.int64)))

        def measure(batch):
            lengths = batch_lengths(batch, keys)
            return (tf.size(lengths, out_type=tf.int64),
                    tf.reduce_sum(tf.cast(tf.maximum(lengths, 1), tf.int64)))

        def no_batches(pool):
            """``split_pool``'s batches, none of them: ``[0, (B), (T)]`` / ``[0, (B)]``."""
            return {k: tf.RaggedTensor.from_row_lengths(v[:0], tf.zeros([0], tf.int32),
                                                        validate=False)
                    for k, v in pool.items()}

        def sort_pool(is_last, pool_lists, pool_seed):
            """Stages 2-6 on one pool, in parallel with other pools: its batches, and the
            examples it sets aside (its tail) for the tail pool. The stream's last pool is
            all tail: it is split once with the tails still waiting, so a stream of one pool
            is batched as that pool alone."""
            pool = lists.concat(pool_lists)
            batches, tail = lazy_cond(is_last, lambda: (no_batches(pool), pool),
                                    lambda: self.split_pool(pool, pool_seed, False))
            return is_last, batches, tail, pool_seed

        def merge_tails(state, sorted_pool):
            """A ``scan`` step per pool: its tail joins the tail pool, which is split (its
            own tail carried on) every ``tail_pools`` pools and at the end of the stream."""
            waiting, tails = state
            is_last, batches, tail, pool_seed = sorted_pool
            tails = lists.push(tails, tail)
            waiting += 1

            def split_tails():
                out, rest = self.split_pool(lists.concat(tails), pool_seed, is_last)
                return (tf.constant(0), lists.push(lists.empty(), rest)), out

            def keep_waiting():
                return (waiting, tails), tf.nest.map_structure(lambda b: b[:0], batches)

            # lazy_cond: the tail pool's split is instantiated when it first runs, not
            # optimized again for every new iterator.
            state, tail_batches = lazy_cond(is_last | (waiting >= tail_pools), split_tails,
                                            keep_waiting)
            return state, (batches, tail_batches)

        # In input order (no shuffle: inference that restores the order) each pool's tail is
        # batched right after it, so a reorder buffer holds about one pool and a tail.
        tail_pools = _TAIL_POOLS if self.shuffle else 1
        plain = tf.autograph.experimental.do_not_convert
        # Memory: the pools in flight (one filling, up to ``parallel_calls()`` being sorted,
        # one being emitted) plus the tail pool (at most ``tail_pools`` tails).
        pools = fill_pools(chunks, lists, measure, max_tokens=self.pool_tokens,
                           max_rows=self.pool_size)
        # The expensive work (sort, cut, gather of the rows in emission order) is per pool
        # and parallel; ``deterministic=True`` whatever the options say, so the batches are
        # the same at any parallelism. Only the tails (a few budgets a pool) meet in a scan.
        sorted_pools = pools.map(plain(sort_pool),
                                 num_parallel_calls=parallel_calls(),
                                 deterministic=True)
        slices = tf.data.Dataset.from_tensor_slices
        return (sorted_pools.scan((tf.constant(0), lists.empty()), plain(merge_tails))
                .prefetch(1)
                .flat_map(plain(lambda batches, tail_batches: slices(batches).concatenate(
                    slices(tail_batches))))
                .map(plain(self.pad), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True))

    # ----- pool-level entry points

    @tf.autograph.experimental.do_not_convert
    def pool_batches(self, pool: Mapping[str, tf.Tensor], pool_seed) -> dict:
        """One pool -> its batches, as ``transform`` emits them for a stream of this pool
        alone (every kept example once, nothing carried). Works eagerly and inside
        ``Dataset.map`` / ``Dataset.scan``; drops are counted in ``counter``.

        Args:
          pool: dict of int ``RaggedTensor [W, (T)]`` (sequence features) and ``[W]`` tensors.
          pool_seed: int64 scalar (tensor or int), orders the pool and its batches (the
            streaming transformation uses the seed of the pool's last input batch).

        Returns:
          The same keys, ``RaggedTensor [N, (B), (T)]`` (sequence features) or ``[N, (B)]``:
          batch i is ``tf.nest.map_structure(lambda x: x[i], out)``, or an element of
          ``Dataset.from_tensor_slices(out)``; ``finish`` pads it.

        Raises:
          TypeError: ``pool`` is not a dict.
          ValueError: ``pool`` has no ragged sequence feature or a feature of another shape.
        """
        pool = check_pool(pool, "Bucketer.pool_batches")
        pool_seed = tf.cast(pool_seed, tf.int64)
        if tf.inside_function():
            return self.split_pool(pool, pool_seed, True)[0]
        return self._traced_pool_batches(pool, pool_seed)

    @tf.autograph.experimental.do_not_convert
    def finish(self, element: Mapping[str, tf.Tensor]) -> dict:
        """One batch of ``pool_batches`` (sequence features ``[B, (T)]``, scalars ``[B]``) ->
        the padded batch ``transform`` emits (``pad``)."""
        return self.pad(element)

    def split_pool(self, pool: Mapping[str, tf.Tensor], pool_seed: tf.Tensor, is_last):
        """Stages 2-6 on one pool (int32 row splits): drops, order, cut, carry, batch order.

        Args:
          pool, pool_seed: as ``pool_batches``; the pool starts with the previous tail.
          is_last: bool (scalar tensor or Python): the stream ends with this pool, so
            nothing is carried and its last batch goes out last.

        Returns:
          ``(batches, tail)``: the emitted batches as ``pool_batches`` returns them, and a
          pool ``[C, (T)]`` / ``[C]`` of the carried examples for the front of the next pool.
        """
        keys = [k for k, v in pool.items() if isinstance(v, tf.RaggedTensor)]
        lengths = batch_lengths(pool, keys)
        keep = None
        if self.max_length is not None:  # one counter update per pool, not a call per example
            keep = self.counter.keep_if({"too_long": lengths > self.max_length})
        order = self.order_pool(lengths, pool_seed, keep)
        ordered_lengths = tf.gather(lengths, order)
        starts, sizes = self.cut(ordered_lengths)
        carry = self.choose_carried(ordered_lengths, sizes) & tf.logical_not(is_last)
        carried = tf.boolean_mask(order, tf.repeat(carry, sizes))
        tail = {k: tf.gather(v, carried) for k, v in pool.items()}
        starts, sizes = self.shuffle_batches(starts, sizes, tf.logical_not(carry), pool_seed)
        # The emitted rows, gathered once in emission order: batch i is rows
        # [sum(sizes[:i]), sum(sizes[:i + 1])), so the batches are slices, not gathers.
        rows = tf.gather(order, tf.ragged.range(starts, starts + sizes).flat_values)
        batches = {k: tf.RaggedTensor.from_row_lengths(tf.gather(v, rows), sizes,
                                                       validate=False)
                   for k, v in pool.items()}
        return batches, tail

    @functools.cached_property
    def _traced_pool_batches(self):
        """``pool_batches`` as one graph, for eager calls (its loops run as ops)."""
        return tf.function(lambda pool, pool_seed: self.split_pool(pool, pool_seed, True)[0],
                           reduce_retracing=True, autograph=False)

    # ----- the stages

    def padded_length(self, lengths: tf.Tensor) -> tf.Tensor:
        """int32 ``[n]``: the length each of ``lengths`` (int32 ``[n]``) pads to in a batch:
        its bucket's upper bound with ``pad_to_boundary``, else itself (at least 1)."""
        lengths = tf.maximum(lengths, 1)
        if not self.pad_to_boundary:
            return lengths
        if self.boundaries is not None:
            uppers = list(self.boundaries) + (
                [self.max_length] if self.max_length > self.boundaries[-1] else [])
            index = tf.searchsorted(tf.constant(self.boundaries, tf.int32), lengths, side="left")
            return tf.gather(tf.constant(uppers, tf.int32), tf.minimum(index, len(uppers) - 1))
        if self.bucket_width is not None:
            upper = (lengths + self.bucket_width - 1) // self.bucket_width * self.bucket_width
            return upper if self.max_length is None else tf.minimum(upper, self.max_length)
        return tf.fill(tf.shape(lengths), tf.constant(self.max_length, tf.int32))

    def order_pool(self, lengths: tf.Tensor, pool_seed: tf.Tensor,
                   keep: tf.Tensor | None = None) -> tf.Tensor:
        """Stage 3: int32 ``[K]``, the indices of the kept examples in pool order (longest
        bucket first, shuffled inside a bucket), from their int32 ``[W]`` ``lengths``, an
        int64 scalar ``pool_seed`` and ``keep`` (bool ``[W]``, false on the dropped ones)."""
        seed_a = tf.stack([pool_seed, tf.constant(1, tf.int64)])
        seed_b = tf.stack([pool_seed, tf.constant(2, tf.int64)])
        order = tf.range(tf.size(lengths))
        if self.shuffle:
            order = tf.random.experimental.stateless_shuffle(tf.range(tf.size(lengths)),
                                                             seed=seed_a)
        key = self._sort_key(tf.gather(lengths, order), seed_b)
        if keep is not None:  # dropped examples sort last (keys are >= 0) and are cut off
            key = tf.where(tf.gather(keep, order), key, -1.0)
        order = tf.gather(order, tf.argsort(key, direction="DESCENDING", stable=True))
        if keep is not None:
            order = order[:tf.reduce_sum(tf.cast(keep, tf.int32))]
        return order

    def _sort_key(self, lengths: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        """float32 ``[W]``: larger keys come first; equal keys are one bucket."""
        noisy = tf.cast(lengths, tf.float32)
        if self.length_noise > 0:
            u = tf.random.stateless_uniform(tf.shape(lengths), seed=seed, minval=-1.0,
                                            maxval=1.0)
            noisy = noisy * (1.0 + self.length_noise * u)
        if self.boundaries is not None:
            edges = tf.constant(self.boundaries, tf.float32)
            return tf.cast(tf.searchsorted(edges, noisy, side="left"), tf.float32)
        if self.bucket_width is not None:
            return tf.math.ceil(noisy / self.bucket_width)
        return noisy

    def cut(self, ordered_lengths: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Stage 4: int32 ``[K]`` lengths in pool order -> ``(starts, sizes)``, int32 ``[N]``
        each: the greedy cut into batches (``_cut``), covering ``[0, K)`` in order."""
        sorted_by_length = (self.boundaries is None and self.bucket_width is None
                            and self.length_noise == 0)
        return _cut(self.padded_length(ordered_lengths), self.max_tokens, self.batch_size,
                    self.batch_multiple, descending=sorted_by_length)

    def choose_carried(self, ordered_lengths: tf.Tensor, sizes: tf.Tensor) -> tf.Tensor:
        """Stage 5: bool ``[N]``, the batches that wait for the next pool, from the lengths in
        pool order (int32 ``[K]``) and the rows of each batch (int32 ``[N]``, ``cut``).

        The pool's last batch always waits. With a token budget so do the batches that fill
        less than ``_CARRY_FILL`` of their cells with real tokens, worst first, up to
        ``_CARRY_BUDGETS`` budgets of cells: with the next pool's examples they sort into
        fuller batches.
        """
        num = tf.size(sizes)
        last = tf.equal(tf.range(num), num - 1)
        if self.max_tokens is None:
            return last
        batch_of = tf.repeat(tf.range(num), sizes)  # [K] the batch of each row
        width = tf.math.segment_max(self.padded_length(ordered_lengths), batch_of)
        real = tf.math.segment_sum(ordered_lengths, batch_of)
        cells = sizes * width
        fill = tf.cast(real, tf.float32) / tf.cast(tf.maximum(cells, 1), tf.float32)
        priority = tf.where(last, -1.0, tf.where(fill < _CARRY_FILL, fill, 2.0))
        worst_first = tf.argsort(priority, stable=True)
        within_cap = (tf.cumsum(tf.gather(cells, worst_first))
                      <= _CARRY_BUDGETS * self.max_tokens)
        chosen = (tf.gather(priority, worst_first) < 2.0) & (
            within_cap | tf.equal(tf.range(num), 0))
        return tf.scatter_nd(worst_first[:, None], chosen, [num])

    def shuffle_batches(self, starts: tf.Tensor, sizes: tf.Tensor, emitted: tf.Tensor,
                        pool_seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Stage 6: ``(starts, sizes)`` (int32 ``[N]``, ``cut``) of the batches where
        ``emitted`` (bool ``[N]``), in the order they go out: random with ``shuffle`` (the
        pool's last batch still last; int64 scalar ``pool_seed``), else pool order."""
        if self.shuffle:
            last = tf.equal(tf.range(tf.size(starts)), tf.size(starts) - 1)
            noise = tf.random.stateless_uniform(
                tf.shape(starts), seed=tf.stack([tf.constant(1, tf.int64), pool_seed]))
            batch_order = tf.argsort(tf.where(last, 2.0, noise))
            starts, sizes = tf.gather(starts, batch_order), tf.gather(sizes, batch_order)
            emitted = tf.gather(emitted, batch_order)
        return tf.boolean_mask(starts, emitted), tf.boolean_mask(sizes, emitted)

    def pad(self, rows: Mapping[str, tf.Tensor]) -> dict:
        """Stage 7: one batch's rows (sequence features int ``RaggedTensor [B, (T)]``,
        scalars ``[B]``) -> the padded batch: ``[B, T]`` plus ``<name>_length`` int32 ``[B]``
        per sequence feature (``T`` the longest row, or its bucket's bound with
        ``pad_to_boundary``), scalars as they are."""
        keys = [k for k, v in rows.items() if isinstance(v, tf.RaggedTensor)]
        row_lengths = {k: tf.cast(rows[k].row_lengths(), tf.int32) for k in keys}
        size = tf.size(row_lengths[keys[0]])
        if self.pad_to_boundary:
            longest = tf.reduce_max(tf.stack([tf.reduce_max(r) for r in row_lengths.values()]))
            width = self.padded_length(longest[tf.newaxis])[0]
        static_width = (self.max_length if self.pad_to_boundary and self.boundaries is None
                        and self.bucket_width is None else None)
        batch = {}
        for k, v in rows.items():
            if k in row_lengths:
                shape = tf.stack([size, width]) if self.pad_to_boundary else None
                batch[k] = tf.ensure_shape(v.to_tensor(0, shape=shape), [None, static_width])
                batch[k + LENGTH_SUFFIX] = row_lengths[k]
            else:
                batch[k] = v
        if self.fill_rows:
            batch = fill_rows(batch, tf.maximum(self.full_rows(width) - size, 0))
        return batch


def fill_rows(batch: Mapping[str, tf.Tensor], extra: tf.Tensor) -> dict:
    """``batch`` (``[B, ...]`` features) with ``extra`` (int32 scalar >= 0) rows of zeros
    appended to every feature, and ``"weight"`` float32 ``[B + extra]``: the input's weight
    (or 1.0) on the B real rows, 0.0 on the added ones."""
    batch = dict(batch)
    first = next(iter(batch.values()))
    if WEIGHT_KEY not in batch:
        batch[WEIGHT_KEY] = tf.ones(tf.shape(first)[:1], tf.float32)
    out = {}
    for k, v in batch.items():
        pad = [[0, extra]] + [[0, 0]] * (v.shape.rank - 1)
        out[k] = tf.pad(v, pad)
    return out


WEIGHT_KEY = "weight"  # tfseq.model_inputs.WEIGHT: rows weighted 0 are not examples
