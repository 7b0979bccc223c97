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
of each other and in parallel (as many at once as the process has cores, 2 to 16); each part
ends with its open rows flushed, so its last batch may be part-filled (about 1/128 of the
batches at most).

Each part goes to one strategy (one class each):

* ``tfseq._pack_planned.PlannedPacker``: one sequence feature, and no example in the part
  longer than the block (always so with ``"drop"`` and ``"truncate"``): the whole part is
  planned at once (``tfseq._pack_plan``). Examples longer than half a block get a row each,
  whose gap takes the largest other examples that fit; the rest fill rows next-fit in arrival
  order, with the shortest few held back to fill the gaps left; rows come out in the order of
  their oldest example. A few hundred tf ops per part, whatever its size.
* ``tfseq._pack_planned.WidthsPacker``: the same with several row lengths.
* ``tfseq._pack_greedy.GreedyPacker``: several features, or a part with an example to split.
  Examples wait in a pool of about ``window`` batches' worth of tokens beyond what one build
  takes. When the pool is full, a build places the rows of one batch: each row takes its
  carried continuation piece (if any), then the pool's oldest examples in order, then the gaps
  take the best-fitting rest (in tf ops), so the oldest examples leave first and the input
  order (its shuffle) is kept up to the window.

Whatever placed them, ``tfseq._pack_layout`` lays the examples out as rows. Everything runs in
the tf.data graph; memory is bounded by the parts in flight (their tokens and packed batches)
plus one carried piece per lane. Every example is emitted exactly once per epoch; ``unpack``
turns packed batches back into examples. Batches have B rows, except those built after the
input ends, which drop their trailing empty rows (a row may stay empty before a row still
carrying a split example, so that every lane keeps its index). The element spec, for
``pack(10, batch_size=4)`` over ``{"ids": int32 [(T)], "label": int32 []}``::

    {"ids": TensorSpec([None, 10], int32), "ids_segment_ids": TensorSpec([None, 10], int32),
     "ids_positions": TensorSpec([None, 10], int32), "ids_resets": TensorSpec([None, 10], bool),
     "label": TensorSpec([None, 10], int32)}

Pool-level entry points, for a pipeline that gathers its own pools (``Packer`` takes the
arguments of ``pack`` and validates them the same way):

* ``Packer(...).pool_batches(pool, pool_seed)``: one pool (a dict of int ``RaggedTensor
  [W, (T)]`` and ``[W]`` tensors) -> its packed batches, as ``pack`` emits them for a stream
  made of that pool alone (one part, flushed at its end: nothing carried).
* ``Packer(...).finish(element)``: one of those batches -> the batch ``pack`` emits.

Example::

    packer = Packer(512, max_tokens=8192, seed=0)
    batches = packer.pool_batches(pool, tf.constant(3, tf.int64))   # [N, (B), T] each
    ds = tf.data.Dataset.from_tensor_slices(batches).map(packer.finish)
"""

from __future__ import annotations

import functools
from typing import Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from tfseq._common import (Transform, check_positive_int, example_keys, lazy_cond,
                           parallel_calls, require_dict_spec)
from tfseq._pack_greedy import GreedyPacker
from tfseq._pack_layout import (PACKED_SUFFIXES, POSITIONS_SUFFIX, RESETS_SUFFIX,
                                SEGMENT_IDS_SUFFIX, PackLayout, dense_rows)
from tfseq._pack_planned import PlannedPacker, WidthsPacker
from tfseq._pools import PoolLists, check_pool, fill_pools
from tfseq.stats import DropCounter, resolve_counter

__all__ = ["LONG_EXAMPLES", "PACKED_SUFFIXES", "POSITIONS_SUFFIX", "Packer", "RESETS_SUFFIX",
           "SEGMENT_IDS_SUFFIX", "pack", "unpack"]

LONG_EXAMPLES = ("split", "truncate", "drop")

# Examples move from the input into the pool this many at a time.
_GROUP_SIZE = 128
# A part (packed independently of the others, in parallel) holds this many batches' worth of
# tokens; its last batch may be part-filled, so this bounds the loss to about 1/_PART_BATCHES.
_PART_BATCHES = 128


def pack(block_length: int | Sequence[int] | Mapping[str, int], *,
         batch_size: int | None = None,
         max_tokens: int | None = None, long_examples: str = "split",
         max_segments: int | None = None, window: int = 4, seed: int | None = None,
         counter: DropCounter | None = None) -> Transform:
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
    return Packer(block_length, batch_size=batch_size, max_tokens=max_tokens,
                  long_examples=long_examples, max_segments=max_segments, window=window,
                  seed=seed, counter=counter).transform


def _checked(block_length, batch_size, max_tokens, long_examples, max_segments, window, seed):
    """``pack``'s argument checks (raises as it documents); returns the resolved
    ``(block_length, widths, longest_block, rows, width_rows, segments)``: ``widths`` the
    sorted row lengths when there are several (else None), ``rows`` B, ``width_rows`` B per
    row length, ``segments`` S."""
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
        raise ValueError("pack needs the size of a batch: give exactly one of batch_size=ROWS "
                         "or max_tokens=CELLS; received "
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
    return block_length, widths, longest_block, rows, width_rows, segments


class Packer:
    """``pack``'s arguments, validated: the streaming transformation (``transform``) and the
    pool-level entry points (``pool_batches``, ``finish``).

    Takes the arguments of ``pack`` (same defaults, same checks and errors; see there).
    """

    def __init__(self, block_length: int | Sequence[int] | Mapping[str, int], *,
                 batch_size: int | None = None, max_tokens: int | None = None,
                 long_examples: str = "split", max_segments: int | None = None,
                 window: int = 4, seed: int | None = None,
                 counter: DropCounter | None = None):
        block_length, widths, longest_block, rows, width_rows, segments = _checked(
            block_length, batch_size, max_tokens, long_examples, max_segments, window, seed)
        self.block_length, self.widths, self.longest_block = block_length, widths, longest_block
        self.rows, self.width_rows, self.segments = rows, width_rows, segments
        self.long_examples, self.window, self.seed = long_examples, window, seed
        self.counter = resolve_counter(counter)
        self._reason = {"split": "split", "truncate": "truncated",
                        "drop": "too_long"}[long_examples]
        self.counter.register("empty")
        if long_examples == "drop":
            self.counter.register(self._reason)
        self._strategies = {}   # PackLayout -> its strategy
        self._traced = {}       # PackLayout -> pool_batches as one graph, for eager calls

    # ----- the streaming transformation

    def transform(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """The ``pack`` transformation (see there)."""
        spec = require_dict_spec(dataset.element_spec, "pack")
        seq_keys, batched = example_keys(spec, "pack")
        layout = self._layout(spec, seq_keys, batched)
        strategy = self._strategy(layout)
        plain = tf.autograph.experimental.do_not_convert
        # Ragged batches of examples are groups already: no tf.data call per example.
        groups = dataset if batched else dataset.ragged_batch(_GROUP_SIZE)
        groups = groups.enumerate().map(
            plain(lambda index, group: (self._flatten_group(layout, index, group), index)),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        # A cheap scan collects groups into parts; the parts are packed independently, in
        # parallel (the packing itself is sequential within a part).
        lists = PoolLists(layout.part_spec())
        parts = fill_pools(groups, lists, _measure_group, max_tokens=self._part_tokens(layout))
        # A fixed parallelism: AUTOTUNE starts at one call and a pass has too few parts
        # (each a fraction of a second of work) for it to ramp up. It changes the speed
        # only: the map is deterministic.
        # Deterministic even if the options say otherwise: a split example continues in the
        # next batch.
        batches = parts.map(
            plain(lambda is_last, part, index: strategy.pack_part(is_last, lists.concat(part))),
            num_parallel_calls=parallel_calls(), deterministic=True)
        return (batches.unbatch()
                .filter(plain(lambda batch, num_rows: num_rows > 0))
                .map(plain(strategy.finish), num_parallel_calls=tf.data.AUTOTUNE,
                     deterministic=True))

    # ----- pool-level entry points

    @tf.autograph.experimental.do_not_convert
    def pool_batches(self, pool: Mapping[str, tf.Tensor], pool_seed) -> dict:
        """One pool -> its packed batches, as ``transform`` emits them for a stream made of
        this pool alone (one ragged batch): every example once or counted as dropped, no
        piece carried past the pool, the batches in emission order.

        Works eagerly and inside ``Dataset.map`` / ``Dataset.scan`` functions. Drops
        (``"empty"``, ``"too_long"``) and changes (``"split"``, ``"truncated"``) are counted
        in ``counter`` as ``transform`` counts them.

        Args:
          pool: dict of int ``RaggedTensor [W, (T)]`` (sequence features) and ``[W]`` tensors
            (scalar features).
          pool_seed: int64 scalar (tensor or int). With ``seed``, the pool is shuffled with
            the stateless seed ``(seed, pool_seed)`` before packing (``transform`` uses the
            index of each input group: 0 for a stream of one pool); ignored without ``seed``.

        Returns:
          dict: per sequence feature ``<name>`` and its ``_segment_ids``, ``_positions``,
          ``_resets``, ``RaggedTensor [N, (B), T]`` (``[N, (B), (T)]`` with several row
          lengths); per scalar feature ``[N, (B), S]``. Batch i is
          ``tf.nest.map_structure(lambda x: x[i], out)`` or an element of
          ``Dataset.from_tensor_slices(out)``; ``finish`` makes it dense.

        Raises:
          TypeError: ``pool`` is not a dict.
          ValueError: as ``pack`` for the features, or ``pool`` is not a ragged batch.
        """
        pool = check_pool(pool, "Packer.pool_batches")
        seq_keys = [k for k, v in pool.items() if isinstance(v, tf.RaggedTensor)]
        layout = self._layout({k: tf.type_spec_from_value(v) for k, v in pool.items()},
                              seq_keys, batched=True)
        pool_seed = tf.cast(pool_seed, tf.int64)
        if tf.inside_function():
            return self._pool_batches(layout, pool, pool_seed)
        if layout not in self._traced:
            self._traced[layout] = tf.function(functools.partial(self._pool_batches, layout),
                                               reduce_retracing=True, autograph=False)
        return self._traced[layout](pool, pool_seed)

    @tf.autograph.experimental.do_not_convert
    def finish(self, element: Mapping[str, tf.Tensor]) -> dict:
        """One batch of ``pool_batches`` (``[B, T]`` / ``[B, S]``, or ``RaggedTensor
        [B, (T)]`` with several row lengths) -> the dense batch ``transform`` emits."""
        return dense_rows(element)

    def _pool_batches(self, layout: PackLayout, pool, pool_seed):
        part = self._flatten_group(layout, pool_seed, pool)
        batches, num_rows = self._strategy(layout).pack_part(tf.constant(True), part)
        kept = tf.where(num_rows > 0)[:, 0]   # a build may place nothing: skip its batch
        num_rows = tf.gather(num_rows, kept)
        out = {}
        for key, value in batches.items():
            value = tf.gather(value, kept)
            out[key] = (value if isinstance(value, tf.RaggedTensor)    # several row lengths
                        else tf.RaggedTensor.from_tensor(value, lengths=num_rows))
        return out

    # ----- helpers

    def _layout(self, spec, seq_keys, batched: bool) -> PackLayout:
        """The packed batches' layout for a dataset (or pool) of this spec; raises
        ``ValueError`` on features ``pack`` does not take."""
        scalar_keys = _check_features(spec, seq_keys, batched)
        if self.widths is not None and len(seq_keys) != 1:
            raise ValueError(f"Several row lengths {self.widths} take one sequence feature; "
                             f"the dataset has {sorted(seq_keys)}. Give one int, or a dict of "
                             "one length per feature")
        if isinstance(self.block_length, Mapping):
            if set(self.block_length) != set(seq_keys):
                raise ValueError(f"block_length keys {sorted(self.block_length)} must be the "
                                 f"sequence features {sorted(seq_keys)}")
            blocks = [self.block_length[k] for k in seq_keys]
        else:
            blocks = [self.longest_block] * len(seq_keys)
        return PackLayout(tuple(seq_keys), tuple(spec[k].dtype for k in seq_keys),
                          tuple(blocks), tuple(scalar_keys),
                          tuple(spec[k].dtype for k in scalar_keys), self.rows, self.segments)

    def _strategy(self, layout: PackLayout):
        """The packer of this layout's parts (one per layout, built once)."""
        if layout not in self._strategies:
            if self.widths is not None:
                strategy = WidthsPacker(layout, self.widths, self.width_rows)
            elif len(layout.seq_keys) > 1:
                strategy = GreedyPacker(layout, self.window)
            elif self.long_examples != "split":
                strategy = PlannedPacker(layout)
            else:
                strategy = _PlannedUnlessSplit(layout, self.window)
            self._strategies[layout] = strategy
        return self._strategies[layout]

    def _part_tokens(self, layout: PackLayout) -> int:
        """Tokens per part: ``_PART_BATCHES`` batches' worth, and at least twice what the
        greedy pool holds before it builds (proportionally more with several row lengths,
        each of which ends a part on its own part-filled batch)."""
        block = max(layout.blocks)
        tokens = max(_PART_BATCHES * self.rows * block, 2 * self.window * self.rows * block)
        return tokens * len(self.widths) if self.widths is not None else tokens

    def _flatten_group(self, layout: PackLayout, index, group):
        """A ragged batch of examples -> (values, lengths, scalars), long-example policy applied.

        Empty examples are dropped; long ones are counted and dropped, truncated or kept whole
        (split later), per ``long_examples``; all counted in one update per group. With
        ``seed``, the group is shuffled first with the stateless seed ``(seed, index)``.

        Returns:
          ``layout.part_spec()`` tensors: per sequence feature its tokens, lengths int32
          ``[n, F]``, per scalar key ``[n]``.
        """
        ragged = [group[k] if isinstance(group[k], tf.RaggedTensor)
                  else tf.RaggedTensor.from_tensor(group[k]) for k in layout.seq_keys]
        scalars = [group[k] for k in layout.scalar_keys]
        if self.seed is not None:
            order = tf.random.experimental.stateless_shuffle(
                tf.range(ragged[0].nrows()), seed=tf.stack([tf.constant(self.seed, tf.int64),
                                                            index]))
            ragged = [tf.gather(r, order) for r in ragged]
            scalars = [tf.gather(v, order) for v in scalars]
        lengths = tf.stack([tf.cast(r.row_lengths(), tf.int32) for r in ragged], 1)
        empty = tf.reduce_all(lengths == 0, axis=1)
        is_long = tf.logical_not(empty) & tf.reduce_any(lengths > layout.blocks, axis=1)
        num_long = tf.reduce_sum(tf.cast(is_long, tf.int64))
        # Dropped long examples are drops; split or truncated ones are still emitted, so they
        # are noted under seen() and the invariant read == emitted + drops holds.
        counts = [self.counter.count("empty", tf.reduce_sum(tf.cast(empty, tf.int64))),
                  self.counter.count(self._reason, num_long) if self.long_examples == "drop"
                  else self.counter.note(self._reason, num_long)]
        keep = tf.logical_not(empty)
        if self.long_examples == "drop":
            keep &= tf.logical_not(is_long)
        if self.long_examples == "truncate":
            ragged = [r[:, :block] for r, block in zip(ragged, layout.blocks)]
        with tf.control_dependencies(counts):
            kept = tf.where(keep)[:, 0]
        ragged = [tf.gather(r, kept) for r in ragged]  # one RaggedGather per feature
        seq = tuple(r.flat_values for r in ragged)
        lengths = tf.stack([tf.cast(r.row_lengths(), tf.int32) for r in ragged], 1)
        return seq, lengths, tuple(tf.gather(v, kept) for v in scalars)


class _PlannedUnlessSplit:
    """One sequence feature, ``long_examples="split"``: a part is planned whole
    (``PlannedPacker``) unless it has an example longer than the block (``GreedyPacker``)."""

    def __init__(self, layout: PackLayout, window: int):
        self.planned, self.greedy = PlannedPacker(layout), GreedyPacker(layout, window)
        self.block = layout.blocks[0]
        self.finish = self.planned.finish

    def pack_part(self, is_last, part):
        # lazy_cond: the batch-by-batch builds are instantiated only if a part needs them,
        # not for every new iterator.
        return lazy_cond(tf.reduce_all(part[1] <= self.block),
                         lambda: self.planned.pack_part(is_last, part),
                         lambda: self.greedy.pack_part(is_last, part))


def _measure_group(group):
    """A flattened group -> (examples, tokens) it adds to a part (int64 scalars)."""
    lengths = group[1]
    return (tf.shape(lengths, out_type=tf.int64)[0],
            tf.reduce_sum(tf.cast(tf.reduce_max(lengths, axis=1), tf.int64)))


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
