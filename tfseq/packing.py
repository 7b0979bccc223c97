"""Sequence packing: several examples per fixed-length row, with segment ids, positions, resets.

Shapes: B = rows in a batch, T = ``block_length``, S = ``max_segments``.

``pack(block_length, ...)`` concatenates examples into rows of exactly ``block_length`` tokens
and records where each one begins, so padding nearly vanishes and nothing is cut except by the
``long_examples`` policy. Per sequence feature ``<name>`` a packed batch holds::

    <name>              [B, T]  the tokens, 0 on padding (the feature's own dtype)
    <name>_segment_ids  [B, T]  int32, 1-based segment (example) number in its row, 0 on padding
    <name>_positions    [B, T]  int32, 0-based position within the segment
    <name>_resets       [B, T]  bool, true on the first token of each example; false on
                                continuation pieces of a split example and on padding

Worked example, ``pack(10, batch_size=1)`` over ``{"ids": [7, 8, 5, 1]}``,
``{"ids": [8, 4, 9, 3, 1]}``::

    ids               7  8  5  1  8  4  9  3  1  0
    ids_segment_ids   1  1  1  1  2  2  2  2  2  0
    ids_positions     0  1  2  3  0  1  2  3  4  0
    ids_resets        T  F  F  F  T  F  F  F  F  F

Several sequence features (``"source"`` and ``"target"``) are packed together: each keeps its
own row (of ``block_length``, or of its own length when ``block_length`` is a dict) and its own
fill level, and an example goes into a row only if every feature fits, so segment k of the
source row and segment k of the target row are the same example::

    source              1  2  3  4  5  0        target             11 12 13 14 15 16
    source_segment_ids  1  1  1  2  2  0        target_segment_ids  1  2  2  2  2  2

Scalar features (``"label"``, ``"weight"``) become ``[B, S]`` per-segment tables: column k-1
holds the value of segment k of the row, 0 (False, "") where the row has no segment k. Segment
ids index them directly: ``tf.gather(label, segment_ids - 1, batch_dims=1)`` gives a per-token
label (mask the padding with ``segment_ids > 0``). ``S`` is ``max_segments`` (default: the
longest block length); a row never holds more segments than that.

Several row lengths (``block_length=[32, 64, 128]``, one sequence feature, ``long_examples``
"drop" or "truncate"): each example goes into rows of the shortest length that holds it, or
into the gap of a longer row; each batch has rows of one length (``max_tokens // length``
rows), and the batches of all lengths come out in the order of their oldest example. A
recurrent model then steps through 32 columns, not 128, for a batch of short examples.

Examples longer than a block (in any feature):

* ``"split"``: cut into consecutive pieces, each its own segment. The first piece ends its row;
  each further piece starts the row *of the same index in the next batch* (a lane), with
  ``resets`` false on its first token. An RNN that carries its last state from one batch to
  the next (``ResettableRNN`` with ``initial_state``) then computes exactly the unsplit run.
  Positions restart at 0 in each piece. Counted as ``"split"`` (one per example).
* ``"truncate"``: cut each feature to its block; counted as ``"truncated"``.
* ``"drop"``: dropped; counted as ``"too_long"``.

Examples with no token in any feature cannot be represented by segment ids; they are dropped
and counted as ``"empty"``.

How: the input is cut into parts of about 128 batches' worth of tokens, packed independently
of each other and in parallel (a few parts at once); each part ends with its open rows
flushed, so its last batch may be part-filled (about 1/128 of the batches at most).

* One sequence feature, and no example in the part longer than the block (always so with
  ``"drop"`` and ``"truncate"``): the whole part is planned at once (``tfseq._pack_plan``).
  Examples longer than half a block get a row each, whose gap takes the largest other
  examples that fit; the rest fill rows next-fit in arrival order, with the shortest few held
  back to fill the gaps left; rows come out in the order of their oldest example. A few
  hundred tf ops per part, whatever its size.
* Otherwise (several features, or a part with an example to split): examples wait in a pool
  of about ``window`` batches' worth of tokens beyond what one build takes. When the pool is
  full, a build places the rows of one batch: each row takes its carried continuation piece
  (if any), then the pool's examples in arrival order, each placed if it fits (greedy first
  fit per row, in tf ops), so the oldest examples leave first and the input order (its
  shuffle) is kept up to the window.

Everything runs in the tf.data graph; memory is bounded by the parts in flight (their tokens
and packed batches) plus one carried piece per lane. Every example is emitted exactly once per
epoch; ``unpack`` turns packed batches back into examples. Batches have B rows, except those
built after the input ends, which drop their trailing empty rows (a row may stay empty before
a row still carrying a split example, so that every lane keeps its index).
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from tfseq._common import (Transform, check_positive_int, example_keys, lazy_cond,
                           mark_last, require_dict_spec)
from tfseq._pack_plan import plan_part, plan_widths
from tfseq.stats import resolve_counter

SEGMENT_IDS_SUFFIX = "_segment_ids"
POSITIONS_SUFFIX = "_positions"
RESETS_SUFFIX = "_resets"
PACKED_SUFFIXES = (SEGMENT_IDS_SUFFIX, POSITIONS_SUFFIX, RESETS_SUFFIX)
LONG_EXAMPLES = ("split", "truncate", "drop")

# Examples move from the input into the pool this many at a time.
_GROUP_SIZE = 128
# Inside a part, the pool takes this many examples per step (256 and 512 measured the same).
_CHUNK_SIZE = 1024
# A part (packed independently of the others, in parallel) holds this many batches' worth of
# tokens; its last batch may be part-filled, so this bounds the loss to about 1/_PART_BATCHES.
_PART_BATCHES = 128
# Parts packed at once (each holds its part's tokens and output batches in memory).
_PART_PARALLELISM = max(2, min(4, os.cpu_count() or 1))


def pack(block_length: int | Sequence[int] | Mapping[str, int], *,
         batch_size: int | None = None,
         max_tokens: int | None = None, long_examples: str = "split",
         max_segments: int | None = None, window: int = 4, seed: int | None = None,
         counter=None) -> Transform:
    """Transformation that packs examples into batches of fixed-length rows.

    Args:
      block_length: tokens per row, for every sequence feature; or a dict ``{name: length}``
        giving each sequence feature its own row length; or a list of row lengths (one
        sequence feature only): each example goes into rows of the shortest length that
        holds it, and each batch has rows of one length (see "Several row lengths" in the
        module docstring).
      batch_size: rows per batch. Exactly one of ``batch_size`` and ``max_tokens``.
      max_tokens: token budget per batch; rows per batch = ``max_tokens // longest block``
        (with several row lengths: ``max_tokens // the batch's row length``).
      long_examples: ``"split"``, ``"truncate"`` or ``"drop"``, for examples longer than the
        block in any feature (see the module docstring).
      max_segments: most segments per row, and the width S of the scalar features' tables;
        default the longest block length (no limit in practice).
      window: when parts are built batch by batch (several features, or an example to
        split), the pool holds at least this many batches' worth of tokens beyond what a
        build takes before it builds; larger packs tighter and keeps more examples waiting.
        Parts planned whole (see below) do not use it.
      seed: if given, each group of 128 incoming examples is shuffled (stateless, from this
        seed and the group's index) before it joins the pool; ``None`` keeps the input order.
        Shuffle upstream (``Dataset.shuffle``) for a full shuffle.
      counter: a ``tfseq.DropCounter``: drops ``"empty"`` and (``"drop"``) ``"too_long"``;
        emitted-but-changed examples are noted in ``counter.seen()`` as ``"split"`` or
        ``"truncated"``. Default: the process-wide counter.

    Returns:
      A ``dataset -> dataset`` function. The input holds unbatched dict examples (1-D integer
      sequence features and scalar features), or ragged batches of them (``[n, (T)]`` and
      ``[n]``, e.g. from ``tokenize`` on batched lines; taken whole, with no tf.data call per
      example); the output holds packed batches as described
      in the module docstring, ``[B, T]`` per sequence key and ``[B, S]`` per scalar key, with
      ``B`` = rows per batch, fewer only in the batches built after the input ends.

    Raises:
      TypeError: an argument has the wrong type, or the elements are not dicts.
      ValueError: bad argument values, a feature that is neither a 1-D integer sequence nor a
        scalar, a dict ``block_length`` whose keys differ from the sequence features, or a
        dataset that is already packed.

    Example:
      >>> ds = tf.data.Dataset.from_tensor_slices({"ids": tf.ragged.constant([[7, 8, 5, 1],
      ...                                                                     [8, 4, 9, 3, 1]])})
      >>> batch = next(iter(ds.map(lambda e: {"ids": e["ids"]}).apply(pack(10, batch_size=1))))
      >>> batch["ids_segment_ids"].numpy().tolist()
      [[1, 1, 1, 1, 2, 2, 2, 2, 2, 0]]
    """
    widths = None
    if isinstance(block_length, Mapping):
        if not block_length:
            raise ValueError("block_length must not be an empty dict")
        for key, value in block_length.items():
            check_positive_int(f"block_length[{key!r}]", value)
        longest_block = max(block_length.values())
    elif isinstance(block_length, (list, tuple)):
        if not block_length:
            raise ValueError("block_length must not be an empty list")
        for i, value in enumerate(block_length):
            check_positive_int(f"block_length[{i}]", value)
        widths = sorted(set(block_length))
        longest_block = widths[-1]
        if len(widths) > 1 and long_examples == "split":
            raise ValueError(
                f"Several row lengths {list(block_length)} need long_examples='drop' or "
                "'truncate' (an example longer than the longest row cannot be split across "
                "batches whose rows differ in length)")
        if len(widths) == 1:
            block_length, widths = widths[0], None
    else:
        check_positive_int("block_length", block_length)
        longest_block = block_length
    if (batch_size is None) == (max_tokens is None):
        raise ValueError("Give exactly one of batch_size and max_tokens; received "
                         f"batch_size={batch_size!r}, max_tokens={max_tokens!r}")
    check_positive_int("batch_size", batch_size, allow_none=True)
    check_positive_int("max_tokens", max_tokens, allow_none=True)
    if long_examples not in LONG_EXAMPLES:
        raise ValueError(f"long_examples must be one of {LONG_EXAMPLES}; "
                         f"received long_examples={long_examples!r}")
    check_positive_int("max_segments", max_segments, allow_none=True)
    check_positive_int("window", window)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int or None; received seed={seed!r}")
    rows = batch_size
    if max_tokens is not None:
        rows = max_tokens // longest_block
        if rows < 1:
            raise ValueError(f"max_tokens={max_tokens} is smaller than one row of "
                             f"{longest_block} tokens")
    width_rows = None
    if widths is not None:
        width_rows = [rows if max_tokens is None else max_tokens // w for w in widths]
    segments = max_segments or longest_block

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        spec = require_dict_spec(dataset.element_spec, "pack")
        seq_keys, batched = example_keys(spec, "pack")
        scalar_keys = _check_features(spec, seq_keys, batched)
        if widths is not None and len(seq_keys) != 1:
            raise ValueError(f"Several row lengths {widths} take one sequence feature; the "
                             f"dataset has {sorted(seq_keys)}. Give one int, or a dict of "
                             "one length per feature")
        if isinstance(block_length, Mapping):
            if set(block_length) != set(seq_keys):
                raise ValueError(f"block_length keys {sorted(block_length)} must be the sequence "
                                 f"features {sorted(seq_keys)}")
            blocks = [block_length[k] for k in seq_keys]
        else:
            blocks = [longest_block] * len(seq_keys)
        packer = _Packer(seq_keys, blocks, scalar_keys, spec, rows, segments, window,
                         long_examples, resolve_counter(counter), seed,
                         widths=widths, width_rows=width_rows)
        return packer(dataset, batched)

    return apply


def _check_features(spec, seq_keys, batched: bool = False) -> list[str]:
    """Returns the scalar keys (``[n]`` in ragged batches); raises ValueError on any other
    kind of feature."""
    scalar_keys = []
    for key, s in spec.items():
        if any(key == k + suffix for k in seq_keys for suffix in PACKED_SUFFIXES):
            raise ValueError(f"pack found key {key!r}: the dataset looks packed already")
        if key in seq_keys:
            continue
        if not isinstance(s, tf.TensorSpec) or s.shape.rank != int(batched):
            raise ValueError(
                f"pack handles 1-D integer sequence features and scalar features; feature "
                f"{key!r} has spec {s}. Unbatch the dataset or drop the feature first.")
        scalar_keys.append(key)
    return scalar_keys


def _gather_spans(values: tf.Tensor, starts: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
    """Concatenation of ``values[starts[i]:starts[i] + lengths[i]]`` over i (1-D tensors)."""
    index = tf.ragged.range(starts, starts + lengths)
    return tf.gather(values, index.flat_values)


def _concat_list(handle: tf.Tensor, dtype: tf.DType, element_shape) -> tf.Tensor:
    """A TensorList's elements concatenated along their first axis."""
    return tf.raw_ops.TensorListConcatV2(
        input_handle=handle, element_shape=element_shape,
        leading_dims=tf.zeros([0], tf.int64), element_dtype=dtype)[0]


def _exclusive_cumsum(x: tf.Tensor) -> tf.Tensor:
    return tf.cumsum(x, axis=0, exclusive=True)


# Rounds of gap filling per build (each places at most one example per row); later rounds
# place very few examples, so a cap costs almost no padding and saves their fixed cost.
_FILL_ROUNDS = 6
# Up to this many rows, the rows' lookups are unrolled (a few scalar ops each) instead of a loop.
_UNROLL_ROWS = 64


def _chain(reach: tf.Tensor, offsets: tf.Tensor, rows: int) -> tf.Tensor:
    """``x[r] = reach[offsets[r] + x[r - 1]]`` with ``x[-1] = 0``, for r < rows: int32 ``[rows]``."""
    if rows > _UNROLL_ROWS:
        return tf.scan(lambda start, offset: tf.gather(reach, offset + start), offsets,
                       initializer=tf.constant(0))
    start, out = tf.constant(0), []
    for r in range(rows):
        start = tf.gather(reach, offsets[r] + start)
        out.append(start)
    return tf.stack(out)


def _lay_out(values, src, take, row, seg, cont, rows: int, block: int):
    """Dense rows from pieces listed in row-major order (by row, then segment).

    Args:
      values: the tokens ``[N]``; src, take: int32 ``[n]``, where each piece starts in
        ``values`` and how many tokens it has; row, seg: int32 ``[n]``, its row and 1-based
        segment; cont: bool ``[n]``, true for a continuation piece (no reset; always segment 1
        of its row).

    Returns:
      tokens (``values.dtype``), segment ids, positions (int32) and resets (bool), each
      ``[rows, block]``.
    """
    spans = tf.ragged.range(src, src + take, row_splits_dtype=tf.int32)   # [n, (take)]
    tokens = tf.gather(values, spans.flat_values)                 # row-major: rows are runs
    index = tf.range(tf.size(spans.flat_values))
    piece = tf.searchsorted(spans.row_splits[1:], index, side="right")   # each token's piece
    positions = index - tf.gather(spans.row_splits, piece)
    segment_ids = tf.gather(seg, piece)
    filled = tf.math.unsorted_segment_sum(take, row, rows)        # [rows] tokens per row

    def dense(per_token):
        return tf.RaggedTensor.from_row_lengths(per_token, filled, validate=False).to_tensor(
            0, shape=[rows, block])

    segment_ids, positions = dense(segment_ids), dense(positions)
    continued = tf.math.unsorted_segment_max(tf.cast(cont, tf.int32), row, rows) > 0
    resets = ((positions == 0) & (segment_ids > 0)
              & tf.logical_not(continued[:, None] & (segment_ids == 1)))
    return dense(tokens), segment_ids, positions, resets


def _lay_out_rows(values, src, take, row, rows, block: int):
    """``_lay_out`` for pieces that are whole examples (no continuation), in row-major order.

    Per-token work is gathers, two scatters of one value per piece and running sums along
    the rows (no search per token, no ragged-to-dense conversion).

    Args:
      values: the tokens ``[N]``; src, take: int32 ``[n]``, where each piece starts in
        ``values`` and its length; row: int32 ``[n]``, its row, non-decreasing; within a row
        the pieces are its segments 1, 2, ... in order.
      rows: int32 scalar, the number of rows.

    Returns:
      tokens, segment ids, positions, resets, each ``[rows, block]``.
    """
    filled = tf.math.unsorted_segment_sum(take, row, rows)                 # [rows]
    row_start = _exclusive_cumsum(filled)             # where each row's tokens begin in `flat`
    offset = _exclusive_cumsum(take) - tf.gather(row_start, row)
    # The tokens in row-major order, then each cell reads its row's run of them.
    flat = tf.gather(values, tf.raw_ops.RaggedRange(starts=src, limits=src + take,
                                                    deltas=tf.ones_like(src))[1])
    column = tf.range(block)[None, :]
    real = column < filled[:, None]
    index = tf.minimum(row_start[:, None] + column,
                       tf.maximum(tf.size(flat) - 1, 0))
    tokens = tf.where(real, tf.gather(flat, index), tf.zeros([], values.dtype))
    cell = (row * block + offset)[:, None]
    cells = tf.stack([rows * block])
    # A mark on each piece's first cell: running sums along the row give every cell its
    # segment number and the offset where its segment starts.
    first_of_row = tf.concat([[True], row[1:] > row[:-1]], 0)
    step = offset - tf.where(first_of_row, offset, tf.concat([[0], offset[:-1]], 0))
    segment_ids = tf.cumsum(tf.reshape(tf.scatter_nd(cell, tf.ones_like(row), cells),
                                       [rows, block]), axis=1)
    starts = tf.cumsum(tf.reshape(tf.scatter_nd(cell, step, cells), [rows, block]), axis=1)
    positions = tf.where(real, column - starts, 0)
    return (tokens, tf.where(real, segment_ids, 0), positions, real & tf.equal(positions, 0))


class _Packer:
    """The scan that turns a stream of examples into packed batches (see module docstring).

    State, per sequence feature f (F features): the pool's tokens ``pool_values[f]`` with
    per-example lengths ``pool_lengths`` ``[P, F]`` and scalar values ``[P]``; and one carried
    remainder of a split example per lane: ``carry_values[f]``, ``carry_lengths`` ``[B, F]``,
    carried scalars ``[B]``.
    """

    def __init__(self, seq_keys, blocks, scalar_keys, spec, rows, segments, window,
                 long_examples, counter, seed, widths=None, width_rows=None):
        self.seq_keys = list(seq_keys)
        self.blocks = list(blocks)
        self.scalar_keys = list(scalar_keys)
        self.seq_dtypes = [spec[k].dtype for k in seq_keys]
        self.scalar_dtypes = [spec[k].dtype for k in scalar_keys]
        self.batch_rows = rows
        # Nothing is ever carried (one feature, nothing split): every part is planned whole.
        self.no_carry = long_examples != "split" and len(seq_keys) == 1
        self.rows = rows  # rows placed per build (builds: see _pack_part)
        self.segments = segments
        # The pool holds `window` batches' worth beyond what one build takes.
        self.threshold = window * rows * max(blocks)
        self.part_tokens = max(_PART_BATCHES * rows * max(blocks), 2 * self.threshold)
        # Several row lengths (one feature, nothing split): each length ends a part on its own
        # part-filled batch, so a part holds proportionally more.
        self.widths, self.width_rows = widths, width_rows
        if widths is not None:
            self.part_tokens *= len(widths)
        self.long_examples = long_examples
        self.seed = seed
        self.counter = counter
        self.reason = {"split": "split", "truncate": "truncated", "drop": "too_long"}[long_examples]
        counter.register("empty")
        if long_examples == "drop":
            counter.register(self.reason)
        pool_spec = tuple(tf.nest.map_structure(
            lambda shape, dtype: tf.TensorSpec(shape, dtype), self._pool_shapes(),
            self._pool_dtypes()))
        carry_spec = tuple(tf.nest.map_structure(
            lambda shape, dtype: tf.TensorSpec(shape, dtype), self._carry_shapes(),
            self._pool_dtypes()))
        # Traced once, whatever the scan's own retracing.
        self._build = tf.function(self._build_batch,
                                  input_signature=(pool_spec, carry_spec),
                                  autograph=False)

    # ----- the dataset plumbing

    def __call__(self, dataset: tf.data.Dataset, batched: bool = False) -> tf.data.Dataset:
        # Ragged batches of examples are groups already: no tf.data call per example.
        groups = dataset if batched else dataset.ragged_batch(_GROUP_SIZE)
        plain = tf.autograph.experimental.do_not_convert
        groups = groups.enumerate().map(plain(self._flatten_group),
                                        num_parallel_calls=tf.data.AUTOTUNE)
        # A cheap scan collects groups into parts; the parts are packed independently, in
        # parallel (the packing itself is sequential within a part).
        parts = (mark_last(groups).scan(self._empty_lists(), plain(self._gather_part))
                 .filter(plain(lambda ready, part: ready))
                 .map(plain(lambda ready, part: part)))
        # A fixed parallelism: AUTOTUNE starts at one call and a pass has too few parts
        # (each a fraction of a second of work) for it to ramp up.
        # Deterministic even if the options say otherwise: a split example continues in the
        # next batch.
        if self.widths is not None:
            batches = parts.map(plain(lambda is_last, lists: self._pack_part_widths(
                self._part_arrays(lists))), num_parallel_calls=_PART_PARALLELISM,
                deterministic=True)
            return batches.unbatch().map(plain(self._dense), num_parallel_calls=tf.data.AUTOTUNE,
                                         deterministic=True)

        def pack_part(is_last, lists):
            arrays = self._part_arrays(lists)
            if self.no_carry:
                return self._plan_and_pack_part(is_last, arrays)
            if len(self.seq_keys) == 1:  # "split": planned whole unless the part must split
                # lazy_cond: the batch-by-batch builds are instantiated only if a part needs
                # them, not for every new iterator.
                return lazy_cond(tf.reduce_all(arrays[1] <= self.blocks[0]),
                               lambda: self._plan_and_pack_part(is_last, arrays),
                               lambda: self._pack_part(is_last, arrays))
            return self._pack_part(is_last, arrays)

        batches = parts.map(plain(pack_part), num_parallel_calls=_PART_PARALLELISM,
                            deterministic=True)
        return (batches.unbatch()
                .filter(plain(lambda batch, num_rows: num_rows > 0))
                .map(plain(self._trim), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True))

    # ----- parts: runs of groups packed independently of each other

    def _empty_lists(self):
        def empty(shape, dtype):
            return tf.raw_ops.EmptyTensorList(element_shape=shape, max_num_elements=-1,
                                              element_dtype=dtype)
        lists = (tuple(empty([-1], d) for d in self.seq_dtypes),
                 empty([-1, len(self.seq_keys)], tf.int32),
                 tuple(empty([-1], d) for d in self.scalar_dtypes))
        return tf.constant(0, tf.int64), lists

    def _gather_part(self, state, inputs):
        """Appends a group to the part being filled (amortized O(1), no copy); emits the
        part's lists once it holds ``part_tokens`` tokens or the input ends."""
        tokens, lists = state
        is_last, group = inputs
        lists = tf.nest.map_structure(
            lambda a, t: tf.raw_ops.TensorListPushBack(input_handle=a, tensor=t), lists, group)
        tokens += tf.reduce_sum(tf.cast(tf.reduce_max(group[1], axis=1), tf.int64))
        ready = is_last | (tokens >= self.part_tokens)
        state = tf.cond(ready, self._empty_lists, lambda: (tokens, lists))
        return state, (ready, (is_last, lists))

    def _pack_part(self, is_last, arrays):
        """One part (``_part_arrays``) -> its packed batches ``{key: [N, B, ...]}`` and rows
        ``[N]`` (0: skip), built batch by batch."""
        num = len(self.seq_keys)
        values, lengths, scalars = arrays
        offsets = tf.concat([tf.zeros([1, num], tf.int32), tf.cumsum(lengths, axis=0)], 0)
        count = tf.shape(lengths)[0]
        num_chunks = tf.maximum((count + _CHUNK_SIZE - 1) // _CHUNK_SIZE, 1)

        def chunk(i):
            lo = i * _CHUNK_SIZE
            hi = tf.minimum(lo + _CHUNK_SIZE, count)
            seq = tuple(v[offsets[lo, f]:offsets[hi, f]] for f, v in enumerate(values))
            return seq, lengths[lo:hi], tuple(v[lo:hi] for v in scalars)

        out_arrays = {k: tf.TensorArray(dtype, size=0, dynamic_size=True, element_shape=shape)
                      for k, (dtype, shape) in self._batch_signature().items()}
        rows_array = tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[])

        def body(i, state, written, out_arrays, rows_array):
            final = tf.equal(i, num_chunks - 1)
            state, written, out_arrays, rows_array = self._step(
                state, chunk(i), final, is_last, written, out_arrays, rows_array)
            return i + 1, state, written, out_arrays, rows_array

        state = self._initial_state()
        _, _, _, out_arrays, rows_array = tf.while_loop(
            lambda i, *_: i < num_chunks, body,
            (tf.constant(0), state, tf.constant(0), out_arrays, rows_array),
            shape_invariants=(tf.TensorShape([]), (self._pool_shapes(), self._carry_shapes()),
                              tf.TensorShape([]), {k: tf.TensorShape(None) for k in out_arrays},
                              tf.TensorShape(None)))
        return {k: a.stack() for k, a in out_arrays.items()}, rows_array.stack()

    def _part_arrays(self, lists):
        """A part's lists -> (values per feature ``[N]``, lengths ``[P, F]``, scalars ``[P]``)."""
        seq_lists, length_list, scalar_lists = lists
        return ([_concat_list(a, d, [-1]) for a, d in zip(seq_lists, self.seq_dtypes)],
                _concat_list(length_list, tf.int32, [-1, len(self.seq_keys)]),
                [_concat_list(a, d, [-1]) for a, d in zip(scalar_lists, self.scalar_dtypes)])

    def _plan_and_pack_part(self, is_last, arrays):
        """``_pack_part`` for one feature and nothing split: the whole part is planned at once
        (``_pack_plan.plan_part``) and laid out as rows, cut into batches of B rows."""
        values, lengths, scalars = arrays
        lengths = lengths[:, 0]
        block, b = self.blocks[0], self.batch_rows
        row_of, seg_of, rows, order = plan_part(lengths, block, self.segments)
        dense = self._planned_rows(values[0], _exclusive_cumsum(lengths), lengths, scalars,
                                   (row_of, seg_of, rows, order), block)
        num_batches = (rows + b - 1) // b
        pad = num_batches * b - rows

        def batched(x):
            x = tf.pad(x, [[0, pad], [0, 0]])
            return tf.reshape(x, tf.concat([[num_batches, b], tf.shape(x)[1:]], 0))

        # Every batch keeps all B rows, except the last one once the input has ended.
        last_rows = rows - (num_batches - 1) * b
        num_rows = tf.where(is_last & tf.equal(tf.range(num_batches), num_batches - 1),
                            last_rows, b)
        return {k: batched(x) for k, x in dense.items()}, num_rows

    def _pack_part_widths(self, arrays):
        """``_plan_and_pack_part`` with several row lengths: each example joins the rows of the
        shortest length that holds it, each length is planned on its own and cut into batches
        of its own row count, and the batches of all lengths are put in the order of their
        oldest example.

        Returns ``{key: RaggedTensor [N, (B), (T)]}`` per sequence key (and its companions) and
        ``[N, (B), S]`` per scalar key: N batches, each with its rows (no empty ones; a part's
        last batch of each length may have fewer) of one length.
        """
        values, lengths, scalars = arrays
        lengths = lengths[:, 0]
        starts = _exclusive_cumsum(lengths)
        key = self.seq_keys[0]
        names = [key + suffix for suffix in ("",) + PACKED_SUFFIXES]
        cells = {name: [] for name in names}
        tables = {name: [] for name in self.scalar_keys}
        batch_rows, row_widths, batch_oldest = [], [], []
        plans = plan_widths(lengths, self.widths, self.segments)
        for width, b, plan in zip(self.widths, self.width_rows, plans):
            members, row_of, seg_of, rows, order = plan
            members_of = lambda x: tf.gather(x, members)  # noqa: E731
            dense = self._planned_rows(values[0], members_of(starts), members_of(lengths),
                                       [members_of(v) for v in scalars],
                                       (row_of, seg_of, rows, order), width)
            for name in names:
                cells[name].append(tf.reshape(dense[name], [-1]))
            for name in self.scalar_keys:
                tables[name].append(dense[name])
            num_batches = (rows + b - 1) // b
            batch_rows.append(tf.minimum(b, rows - tf.range(num_batches) * b))
            row_widths.append(tf.fill([rows], width))
            # Rows come in the order of their oldest example: a batch's first row has its own.
            oldest = tf.math.unsorted_segment_min(members, row_of, rows)
            batch_oldest.append(oldest[::b])
        batch_rows, row_widths = tf.concat(batch_rows, 0), tf.concat(row_widths, 0)
        batch_order = tf.argsort(tf.concat(batch_oldest, 0), stable=True)
        out = {}
        for name in names:
            out[name] = tf.gather(tf.RaggedTensor.from_nested_row_lengths(
                tf.concat(cells[name], 0), [batch_rows, row_widths], validate=False),
                batch_order)
        for name in self.scalar_keys:
            out[name] = tf.gather(tf.RaggedTensor.from_row_lengths(
                tf.concat(tables[name], 0), batch_rows, validate=False), batch_order)
        return out

    def _planned_rows(self, values, starts, lengths, scalars, plan, block: int):
        """Examples laid out in their planned rows.

        Args:
          values: the part's tokens ``[N]``; starts, lengths: int32 ``[P]``, where each
            example begins in ``values`` and its length; scalars: per scalar key ``[P]``.
          plan: ``(row_of, seg_of, rows, order)`` of these examples (``plan_part``).
          block: the rows' length.

        Returns:
          ``{key: [rows, block]}`` for the sequence key and its companions, ``{name: [rows,
          S]}`` per scalar key (segment k's value in column k - 1).
        """
        row_of, seg_of, rows, order = plan
        in_order = lambda x: tf.gather(x, order)  # noqa: E731
        laid_out = _lay_out_rows(values, in_order(starts), in_order(lengths), in_order(row_of),
                                 rows, block)
        key = self.seq_keys[0]
        dense = {key + suffix: x for suffix, x in zip(("",) + PACKED_SUFFIXES, laid_out)}
        seg_index = tf.stack([row_of, seg_of - 1], 1)
        for name, dtype, v in zip(self.scalar_keys, self.scalar_dtypes, scalars):
            dense[name] = tf.tensor_scatter_nd_update(
                tf.zeros(tf.stack([rows, self.segments]), dtype), seg_index, v)
        return dense

    def _dense(self, batch):
        """One batch of ``_pack_part_widths`` -> dense ``[B, T]`` / ``[B, S]`` tensors (its rows
        have one length, so a reshape; a batch has at least one row)."""
        return {k: tf.reshape(v.flat_values, tf.stack([v.nrows(), -1]))
                if isinstance(v, tf.RaggedTensor) else v for k, v in batch.items()}

    def _flatten_group(self, index, group):
        """A ragged batch of examples -> (values, lengths, scalars), long-example policy applied.

        Empty examples are dropped; long ones are counted and dropped, truncated or kept whole
        (split later), per ``long_examples``; all counted in one update per group.
        """
        ragged = [group[k] if isinstance(group[k], tf.RaggedTensor)
                  else tf.RaggedTensor.from_tensor(group[k]) for k in self.seq_keys]
        scalars = [group[k] for k in self.scalar_keys]
        if self.seed is not None:
            order = tf.random.experimental.stateless_shuffle(
                tf.range(ragged[0].nrows()), seed=tf.stack([tf.constant(self.seed, tf.int64),
                                                            index]))
            ragged = [tf.gather(r, order) for r in ragged]
            scalars = [tf.gather(v, order) for v in scalars]
        lengths = tf.stack([tf.cast(r.row_lengths(), tf.int32) for r in ragged], 1)
        empty = tf.reduce_all(lengths == 0, axis=1)
        is_long = tf.logical_not(empty) & tf.reduce_any(lengths > self.blocks, axis=1)
        num_long = tf.reduce_sum(tf.cast(is_long, tf.int64))
        # Dropped long examples are drops; split or truncated ones are still emitted, so they
        # are noted under seen() and the invariant read == emitted + drops holds.
        counts = [self.counter.count("empty", tf.reduce_sum(tf.cast(empty, tf.int64))),
                  self.counter.count(self.reason, num_long) if self.long_examples == "drop"
                  else self.counter.note(self.reason, num_long)]
        keep = tf.logical_not(empty)
        if self.long_examples == "drop":
            keep &= tf.logical_not(is_long)
        if self.long_examples == "truncate":
            ragged = [r[:, :block] for r, block in zip(ragged, self.blocks)]
        with tf.control_dependencies(counts):
            kept = tf.where(keep)[:, 0]
        ragged = [tf.gather(r, kept) for r in ragged]  # one RaggedGather per feature
        seq = tuple(r.flat_values for r in ragged)
        lengths = tf.stack([tf.cast(r.row_lengths(), tf.int32) for r in ragged], 1)
        return seq, lengths, tuple(tf.gather(v, kept) for v in scalars)

    def _empty_group(self):
        seq = tuple(tf.zeros([0], d) for d in self.seq_dtypes)
        lengths = tf.zeros([0, len(self.seq_keys)], tf.int32)
        scalars = tuple(tf.zeros([0], d) for d in self.scalar_dtypes)
        return seq, lengths, scalars

    def _initial_state(self):
        pool = self._empty_group()
        carry = (tuple(tf.zeros([0], d) for d in self.seq_dtypes),
                 tf.zeros([self.rows, len(self.seq_keys)], tf.int32),
                 tuple(tf.zeros([self.rows], d) for d in self.scalar_dtypes))
        return pool, carry

    def _trim(self, batch, num_rows):
        return {k: v[:num_rows] for k, v in batch.items()}

    # ----- one step inside a part: add a group to the pool, emit every batch that is ready

    def _step(self, state, group, final, is_last, written, out_arrays, rows_array):
        """Adds a group to the pool and writes every batch that is ready to ``out_arrays``
        from index ``written`` on; ``final`` (the part's last group) flushes the pool and
        the carries. Returns the new state, count written and arrays."""
        g_seq, g_lengths, g_scalars = group
        (p_seq, p_lengths, p_scalars), carry = state
        pool = (tuple(tf.concat([a, b], 0) for a, b in zip(p_seq, g_seq)),
                tf.concat([p_lengths, g_lengths], 0),
                tuple(tf.concat([a, b], 0) for a, b in zip(p_scalars, g_scalars)))

        def ready(pool, carry):
            pool_tokens = tf.reduce_sum(tf.reduce_max(pool[1], axis=1))
            pending = tf.logical_or(tf.shape(pool[1])[0] > 0, tf.reduce_any(carry[1] > 0))
            return tf.logical_or(pool_tokens >= self.threshold,
                                 tf.logical_and(final, pending))

        def cond(written, pool, carry, out_arrays, rows_array):
            return ready(pool, carry)

        def body(written, pool, carry, out_arrays, rows_array):
            built, num_rows, pool, carry = self._build(pool, carry)
            out_arrays = {key: out_arrays[key].write(written, v) for key, v in built.items()}
            # Before the input ends every batch keeps all B rows, so lanes keep their index;
            # after, the trailing empty rows go. Empty batches are skipped.
            rows_array = rows_array.write(written, tf.where(
                is_last | tf.equal(num_rows, 0), num_rows, self.batch_rows))
            return written + 1, pool, carry, out_arrays, rows_array

        written, pool, carry, out_arrays, rows_array = tf.while_loop(
            cond, body, (written, pool, carry, out_arrays, rows_array),
            shape_invariants=(tf.TensorShape([]), self._pool_shapes(), self._carry_shapes(),
                              {k: tf.TensorShape(None) for k in out_arrays},
                              tf.TensorShape(None)))
        return (pool, carry), written, out_arrays, rows_array

    def _batch_signature(self):
        sig = {}
        for key, dtype, block in zip(self.seq_keys, self.seq_dtypes, self.blocks):
            sig[key] = (dtype, [self.batch_rows, block])
            sig[key + SEGMENT_IDS_SUFFIX] = (tf.int32, [self.batch_rows, block])
            sig[key + POSITIONS_SUFFIX] = (tf.int32, [self.batch_rows, block])
            sig[key + RESETS_SUFFIX] = (tf.bool, [self.batch_rows, block])
        for key, dtype in zip(self.scalar_keys, self.scalar_dtypes):
            sig[key] = (dtype, [self.batch_rows, self.segments])
        return sig

    def _pool_dtypes(self):
        return (tuple(self.seq_dtypes), tf.int32, tuple(self.scalar_dtypes))

    def _pool_shapes(self):
        num = len(self.seq_keys)
        return (tuple(tf.TensorShape([None]) for _ in range(num)), tf.TensorShape([None, num]),
                tuple(tf.TensorShape([None]) for _ in self.scalar_keys))

    def _carry_shapes(self):
        num = len(self.seq_keys)
        return (tuple(tf.TensorShape([None]) for _ in range(num)),
                tf.TensorShape([self.rows, num]),
                tuple(tf.TensorShape([self.rows]) for _ in self.scalar_keys))

    # ----- one batch

    def _assign(self, lengths, carry_lengths):
        """Places pool examples into the B rows of one batch.

        First, rows take the oldest examples in order, one row after the other (a long example
        in split mode ends its row with its first piece); a row gives its last example back
        when it would leave a gap shorter than any example. Then the gaps are filled by best
        fit (the largest example that leaves no gap or a fillable one) from the rest; a row
        that no example fits whole starts the oldest long example that can start there.

        Args:
          lengths: int32 ``[P, F]``, the pool examples' lengths, oldest first.
          carry_lengths: int32 ``[B, F]``, what each row still carries of a split example.

        Returns:
          Per pool example: row ``[P]`` (-1 if it stays in the pool), segment id ``[P]``,
          start offset ``[P, F]`` and tokens taken ``[P, F]`` (less than its length for the
          first piece of a split example); and per row the carried piece ``[B, F]``.
        """
        blocks = tf.constant(self.blocks, tf.int32)
        num_pool = tf.shape(lengths)[0]
        index = tf.range(num_pool)
        is_long = tf.reduce_any(lengths > blocks, axis=1)
        short = tf.logical_not(is_long)
        smallest = tf.reduce_min(tf.where(short[:, None], lengths, tf.int32.max), axis=0)
        carry_piece = tf.minimum(carry_lengths, blocks)
        nseg0 = tf.cast(tf.reduce_any(carry_lengths > 0, axis=1), tf.int32)
        closed0 = tf.reduce_any(carry_lengths > carry_piece, axis=1)
        ends = tf.cumsum(lengths, axis=0)
        starts = tf.concat([ends - lengths, tf.reduce_sum(lengths, 0, keepdims=True)], 0)
        longs_end = tf.cumsum(tf.cast(is_long, tf.int32))
        longs_start = tf.concat([longs_end - tf.cast(is_long, tf.int32),
                                 tf.reduce_sum(tf.cast(is_long, tf.int32), keepdims=True)], 0)

        # 1. Rows take consecutive runs of the oldest examples.
        run_start, run_end, long_at, fill, long_take = self._row_runs(
            lengths, is_long, smallest, carry_piece, nseg0, closed0, starts, ends, longs_start)

        runs = tf.ragged.range(run_start, run_end)
        items = runs.flat_values
        item_rows = tf.cast(runs.value_rowids(), tf.int32)
        item_starts = (tf.gather(carry_piece, item_rows) + tf.gather(starts, items)
                       - tf.gather(starts, tf.gather(run_start, item_rows)))
        num_run = run_end - run_start
        has_long = long_at >= 0
        long_rows = tf.cast(tf.where(has_long)[:, 0], tf.int32)
        long_items = tf.gather(long_at, long_rows)
        all_items = tf.concat([items, long_items], 0)[:, None]
        row_of = tf.scatter_nd(all_items, tf.concat([item_rows, long_rows], 0) + 1,
                               [num_pool]) - 1
        seg_of = tf.scatter_nd(all_items, tf.concat(
            [tf.gather(nseg0, item_rows) + items - tf.gather(run_start, item_rows) + 1,
             tf.gather(nseg0 + num_run + 1, long_rows)], 0), [num_pool])
        shape = tf.shape(lengths)
        start_of = tf.scatter_nd(all_items, tf.concat(
            [item_starts, tf.gather(fill, long_rows)], 0), shape)
        take_of = tf.scatter_nd(all_items, tf.concat(
            [tf.gather(lengths, items), tf.gather(long_take, long_rows)], 0), shape)
        fill = fill + long_take
        nseg = nseg0 + num_run + tf.cast(has_long, tf.int32)
        row_open = tf.logical_not(closed0 | has_long)

        # 2. Best fit into the gaps: each row proposes one example per round, lowest row wins.
        size = tf.reduce_sum(lengths, axis=1)
        rows = tf.range(self.rows)
        single = len(self.blocks) == 1
        if single:
            # One feature: the unplaced short examples sorted by (length, age), so a row's
            # best fit is a binary search, not a [B, P] comparison.
            wide = tf.cast(num_pool + 1, tf.int64)
            waiting = tf.cast(tf.where((row_of < 0) & short)[:, 0], tf.int32)
            keys = (tf.cast(tf.gather(size, waiting), tf.int64) * wide
                    + tf.cast(num_pool - waiting, tf.int64))
            order = tf.argsort(keys)
            sorted_keys, sorted_items = tf.gather(keys, order), tf.gather(waiting, order)
        else:
            sorted_keys, sorted_items = tf.zeros([0], tf.int64), tf.zeros([0], tf.int32)

        def choose_sorted(gap, unplaced, can_take, sorted_keys, sorted_items):
            """Best fit per row by search: returns choice and wants, ``[B]``."""
            gap = gap[:, 0]
            alive = tf.gather(unplaced, sorted_items)
            sorted_keys = tf.boolean_mask(sorted_keys, alive)
            sorted_items = tf.boolean_mask(sorted_items, alive)

            def largest_up_to(limit):
                # The longest waiting example of at most `limit` tokens, the oldest among equals.
                bound = limit * wide + tf.cast(num_pool, tf.int64)
                pos = tf.searchsorted(sorted_keys[None], bound[None], side="right")[0] - 1
                return tf.gather(tf.concat([[-1], sorted_items], 0), pos + 1), pos >= 0

            fit, fits = largest_up_to(tf.cast(gap, tf.int64))
            exact = fits & (tf.gather(size, tf.maximum(fit, 0)) == gap)
            clean, cleans = largest_up_to(tf.cast(gap, tf.int64)
                                          - tf.cast(smallest[0], tf.int64))
            short_choice = tf.where(exact | tf.logical_not(cleans), fit, clean)
            # A row that no short example fits starts the oldest long one (if it has room).
            oldest_long = tf.reduce_min(tf.where(unplaced & is_long, index, num_pool))
            starts_long = (oldest_long < num_pool) & (gap > 0)
            choice = tf.where(fits, short_choice, oldest_long)
            wants = can_take & (fits | starts_long)
            return choice, wants, sorted_keys, sorted_items

        def choose_scan(gap, unplaced, can_take, sorted_keys, sorted_items):
            """Best fit per row over a ``[B, P, F]`` comparison: returns choice and wants."""
            can_take = can_take[:, None]
            fits = (can_take & (unplaced & short)[None, :]
                    & tf.reduce_all(lengths[None] <= gap[:, None], axis=2))
            left = gap[:, None] - lengths[None]
            clean = fits & tf.reduce_all((left == 0) | (left >= smallest), axis=2)
            candidates = tf.where(tf.reduce_any(clean, axis=1, keepdims=True), clean, fits)
            # A row that no short example fits starts the oldest long one that can start.
            starts_long = (can_take & (unplaced & is_long)[None, :]
                           & tf.reduce_all((lengths[None] == 0) | (gap[:, None] > 0), axis=2))
            no_short = tf.logical_not(tf.reduce_any(fits, axis=1, keepdims=True))
            oldest = tf.cast(num_pool - index, tf.int32)[None, :]
            score = tf.where(candidates, size[None], tf.where(starts_long & no_short, oldest, -1))
            score = tf.concat([score, tf.fill([self.rows, 1], -1)], 1)
            choice = tf.argmax(score, axis=1, output_type=tf.int32)
            wants = tf.reduce_max(score, axis=1) >= 0
            return choice, wants, sorted_keys, sorted_items

        choose = choose_sorted if single else choose_scan

        def fill_gaps(placed_any, row_of, seg_of, start_of, take_of, fill, nseg, row_open,
                      sorted_keys, sorted_items):
            gap = blocks - fill
            choice, wants, sorted_keys, sorted_items = choose(
                gap, row_of < 0, row_open & (nseg < self.segments), sorted_keys, sorted_items)
            claim = tf.where(wants, choice, num_pool)
            winner = tf.math.unsorted_segment_min(rows, claim, num_pool + 1)
            won = wants & (tf.gather(winner, claim) == rows)
            won_rows = tf.cast(tf.where(won)[:, 0], tf.int32)
            won_items = tf.gather(choice, won_rows)[:, None]
            take = tf.minimum(tf.gather(lengths, won_items[:, 0]), tf.gather(gap, won_rows))
            row_of = tf.tensor_scatter_nd_update(row_of, won_items, won_rows)
            seg_of = tf.tensor_scatter_nd_update(seg_of, won_items,
                                                 tf.gather(nseg, won_rows) + 1)
            start_of = tf.tensor_scatter_nd_update(start_of, won_items,
                                                   tf.gather(fill, won_rows))
            take_of = tf.tensor_scatter_nd_update(take_of, won_items, take)
            fill = tf.tensor_scatter_nd_add(fill, won_rows[:, None], take)
            nseg = tf.tensor_scatter_nd_add(nseg, won_rows[:, None], tf.ones_like(won_rows))
            closes = tf.gather(is_long, won_items[:, 0])
            row_open = tf.tensor_scatter_nd_update(row_open, won_rows[:, None],
                                                   tf.logical_not(closes))
            return (tf.reduce_any(won), row_of, seg_of, start_of, take_of, fill, nseg,
                    row_open, sorted_keys, sorted_items)

        _, row_of, seg_of, start_of, take_of, _, _, _, _, _ = tf.while_loop(
            lambda placed_any, *_: placed_any, fill_gaps,
            (num_pool > 0, row_of, seg_of, start_of, take_of, fill, nseg, row_open,
             sorted_keys, sorted_items),
            shape_invariants=(tf.TensorShape([]), row_of.shape, seg_of.shape, start_of.shape,
                              take_of.shape, fill.shape, nseg.shape, row_open.shape,
                              tf.TensorShape([None]), tf.TensorShape([None])),
            maximum_iterations=_FILL_ROUNDS)
        return row_of, seg_of, start_of, take_of, carry_piece

    def _row_runs(self, lengths, is_long, smallest, carry_piece, nseg0, closed0, starts, ends,
                  longs_start):
        """Phase 1 of ``_assign``: the run of consecutive pool examples each row takes.

        Rows differ only by what they carry, so the run a row would take from every possible
        start p is tabulated once for an empty row and once per carrying row (K of them,
        usually none): ``[1 + K, P + 1]`` tables, by search over the cumulative lengths. Row r
        starts where row r - 1 ended: one table lookup per row.

        Args:
          lengths: int32 ``[P, F]``; is_long: bool ``[P]``; smallest: int32 ``[F]``, the
            shortest short example per feature; carry_piece: int32 ``[B, F]``; nseg0: int32
            ``[B]``, segments already in each row; closed0: bool ``[B]``, rows a carried piece
            fills; starts: int32 ``[P + 1, F]`` and ends ``[P, F]``, cumulative offsets;
            longs_start: int32 ``[P + 1]``, long examples before each index.

        Returns:
          Per row, int32 ``[B]``: the run's first and end index, the long example it starts
          (-1 if none), and int32 ``[B, F]``: tokens filled by the run, tokens of the long one.
        """
        blocks = tf.constant(self.blocks, tf.int32)
        num_pool = tf.shape(lengths)[0]
        lengths_pad = tf.concat([lengths, tf.zeros([1, len(self.blocks)], tf.int32)], 0)
        long_pad = tf.concat([is_long, [False]], 0)
        # Kind 0: a row that carries nothing; kind k > 0: the k-th carrying row.
        carrying = tf.cast(tf.where(nseg0 > 0)[:, 0], tf.int32)
        num_kinds = tf.size(carrying) + 1
        kind = tf.tensor_scatter_nd_update(tf.zeros([self.rows], tf.int32), carrying[:, None],
                                           tf.range(1, num_kinds))
        gap = tf.concat([blocks[None], tf.gather(blocks[None] - carry_piece, carrying)], 0)
        used = tf.concat([[0], tf.gather(nseg0, carrying)], 0)[:, None]          # [1 + K, 1]
        is_open = tf.concat([[True], tf.gather(tf.logical_not(closed0), carrying)], 0)[:, None]
        p = tf.range(num_pool + 1)[None]                                       # [1, P + 1]
        # The run from p ends before the first example that overflows a feature's gap, before
        # the next long example, and at the row's segment limit.
        target = starts[None] + gap[:, None]                                   # [1 + K, P + 1, F]
        fit_end = tf.reduce_min(tf.stack([
            tf.reshape(tf.searchsorted(ends[None, :, f], tf.reshape(target[:, :, f], [1, -1]),
                                       side="right"), [num_kinds, -1])
            for f in range(len(self.blocks))]), axis=0)
        long_index = tf.cast(tf.where(is_long)[:, 0], tf.int32)
        next_long = tf.gather(tf.concat([long_index, [num_pool]], 0), longs_start)[None]
        room = tf.maximum(self.segments - used, 0)
        end = tf.where(is_open, tf.minimum(tf.minimum(fit_end, next_long), p + room), p)
        end = tf.maximum(end, p)

        def left_at(q):
            return gap[:, None] - (tf.gather(starts, q) - starts[None])

        left = left_at(end)
        # (A row keeps its only example: giving it back would leave the row empty and stop
        # the chain of runs there.)
        give_back = ((end > p + 1) & tf.reduce_any((left > 0) & (left < smallest), axis=2)
                     & tf.logical_not(tf.gather(long_pad, end)))
        q = end - tf.cast(give_back, tf.int32)
        left = left_at(q)
        long_here = (is_open & tf.gather(long_pad, q)
                     & tf.reduce_all((tf.gather(lengths_pad, q) == 0) | (left > 0), axis=2)
                     & (used + q - p < self.segments))
        reach = tf.reshape(q + tf.cast(long_here, tf.int32), [-1])
        width = num_pool + 1
        ends_of_rows = _chain(reach, kind * width, self.rows)
        run_start = tf.concat([[0], ends_of_rows[:-1]], 0)
        at = kind * width + run_start
        run_end = tf.gather(tf.reshape(q, [-1]), at)
        here = tf.gather(tf.reshape(long_here, [-1]), at)
        left = tf.gather(tf.reshape(left, [-1, len(self.blocks)]), at)
        long_take = tf.where(here[:, None],
                             tf.minimum(tf.gather(lengths_pad, run_end), left), 0)
        return run_start, run_end, tf.where(here, run_end, -1), blocks - left, long_take

    def _build_batch(self, pool, carry):
        (p_seq, p_lengths, p_scalars), (c_seq, c_lengths, c_scalars) = pool, carry
        row_of, seg_of, start_of, take_of, carry_piece = self._assign(p_lengths, c_lengths)
        placed = row_of >= 0
        lanes = tf.range(self.rows)
        has_carry = tf.reduce_any(c_lengths > 0, axis=1)

        # Pieces: the placed pool examples, then the carried pieces (segment 1 of their row).
        pool_idx = tf.where(placed)[:, 0]
        lane_idx = tf.where(has_carry)[:, 0]
        piece_row = tf.concat([tf.gather(row_of, pool_idx), tf.gather(lanes, lane_idx)], 0)
        piece_seg = tf.concat([tf.gather(seg_of, pool_idx), tf.ones_like(lane_idx, tf.int32)], 0)
        piece_take = tf.concat([tf.gather(take_of, pool_idx), tf.gather(carry_piece, lane_idx)],
                               0)
        piece_cont = tf.concat([tf.zeros_like(pool_idx, tf.bool),
                                tf.ones_like(lane_idx, tf.bool)], 0)

        p_starts = _exclusive_cumsum(p_lengths)
        c_starts = _exclusive_cumsum(c_lengths)
        # Each row is the concatenation of its pieces in segment order, then padding.
        order = tf.argsort(tf.cast(piece_row, tf.int64) * (self.segments + 1)
                           + tf.cast(piece_seg, tf.int64))
        in_order = lambda x: tf.gather(x, order)  # noqa: E731
        batch = {}
        for f, key in enumerate(self.seq_keys):
            values = tf.concat([p_seq[f], c_seq[f]], 0)
            offset = tf.shape(p_seq[f])[0]
            src = tf.concat([tf.gather(p_starts[:, f], pool_idx),
                             offset + tf.gather(c_starts[:, f], lane_idx)], 0)
            laid_out = _lay_out(values, in_order(src), in_order(piece_take[:, f]),
                                in_order(piece_row), in_order(piece_seg), in_order(piece_cont),
                                self.rows, self.blocks[f])
            for suffix, dense in zip(("",) + PACKED_SUFFIXES[:3], laid_out):
                batch[key + suffix] = dense
        seg_index = tf.stack([piece_row, piece_seg - 1], 1)
        for s, key in enumerate(self.scalar_keys):
            values = tf.concat([tf.gather(p_scalars[s], pool_idx),
                                tf.gather(c_scalars[s], lane_idx)], 0)
            empty = tf.zeros([self.rows, self.segments], self.scalar_dtypes[s])
            batch[key] = tf.tensor_scatter_nd_update(empty, seg_index, values)
        num_rows = tf.reduce_max(tf.concat([piece_row, [-1]], 0)) + 1

        # New carries: the rest of a carried piece, or of a split example started here.
        started = placed & tf.reduce_any(take_of < p_lengths, axis=1)
        start_idx = tf.where(started)[:, 0]
        start_rows = tf.gather(row_of, start_idx)[:, None]
        new_len = tf.tensor_scatter_nd_update(
            c_lengths - carry_piece, start_rows,
            tf.gather(p_lengths - take_of, start_idx))
        new_carry_seq = []
        for f in range(len(self.seq_keys)):
            values = tf.concat([p_seq[f], c_seq[f]], 0)
            offset = tf.shape(p_seq[f])[0]
            src = tf.tensor_scatter_nd_update(
                offset + c_starts[:, f] + carry_piece[:, f], start_rows,
                tf.gather(p_starts[:, f] + take_of[:, f], start_idx))
            new_carry_seq.append(_gather_spans(values, src, new_len[:, f]))
        new_carry_scalars = [
            tf.tensor_scatter_nd_update(c, start_rows, tf.gather(p, start_idx))
            for p, c in zip(p_scalars, c_scalars)]

        # The pool keeps what was not placed.
        keep = tf.logical_not(placed)
        keep_idx = tf.where(keep)[:, 0]
        kept_lengths = tf.gather(p_lengths, keep_idx)
        new_pool_seq = tuple(
            _gather_spans(p_seq[f], tf.gather(p_starts[:, f], keep_idx), kept_lengths[:, f])
            for f in range(len(self.seq_keys)))
        new_pool_scalars = tuple(tf.gather(v, keep_idx) for v in p_scalars)
        return (batch, num_rows, (new_pool_seq, kept_lengths, new_pool_scalars),
                (tuple(new_carry_seq), new_len, tuple(new_carry_scalars)))


def _python(value):
    return value.item() if isinstance(value, np.generic) else value


def unpack(batches: Iterable[Mapping[str, object]]) -> list[dict]:
    """Turns packed batches back into examples, joining the pieces of split examples.

    Python and numpy, for tests and inspection (not for the input pipeline).

    Args:
      batches: the packed batches in order, e.g. ``list(packed_dataset)`` (tensors or numpy).

    Returns:
      The examples in the order they complete: dicts with a list of ints per sequence feature
      and a Python value per scalar feature.
    """
    done: list[dict] = []
    open_examples: dict[int, dict] = {}
    for batch in batches:
        batch = {k: np.asarray(v) for k, v in batch.items()}
        seq_keys = [k[:-len(SEGMENT_IDS_SUFFIX)] for k in batch
                    if k.endswith(SEGMENT_IDS_SUFFIX) and k[:-len(SEGMENT_IDS_SUFFIX)] in batch]
        derived = {k + s for k in seq_keys for s in PACKED_SUFFIXES}
        scalar_keys = [k for k in batch if k not in seq_keys and k not in derived]
        num_rows = batch[seq_keys[0]].shape[0]
        for lane in list(open_examples):
            if lane >= num_rows:
                done.append(open_examples.pop(lane))
        for r in range(num_rows):
            seg = {k: batch[k + SEGMENT_IDS_SUFFIX][r] for k in seq_keys}
            last = max(int(s.max()) for s in seg.values())
            ids = sorted({int(i) for s in seg.values() for i in s if i > 0})
            for s in ids:
                piece = {k: batch[k][r][seg[k] == s].tolist() for k in seq_keys}
                continues = s == 1 and any(
                    not batch[k + RESETS_SUFFIX][r][seg[k] == s][0]
                    for k in seq_keys if piece[k])
                if continues and r in open_examples:
                    example = open_examples.pop(r)
                    for k in seq_keys:
                        example[k] += piece[k]
                else:
                    if s == ids[0] and r in open_examples:
                        done.append(open_examples.pop(r))
                    example = dict(piece)
                    example.update({k: _python(batch[k][r][s - 1]) for k in scalar_keys})
                if s == last:
                    open_examples[r] = example
                else:
                    done.append(example)
            if not ids and r in open_examples:
                done.append(open_examples.pop(r))
    done.extend(open_examples[lane] for lane in sorted(open_examples))
    return done
