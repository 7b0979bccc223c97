"""In-graph splitting of batches across replicas, and prefetching to a device.

Shapes: B = rows in the incoming batch, S = ``num_splits``, b = rows in one part, T = time.

``split_batch(S)`` turns every batch into a tuple of ``S`` batches, one per replica, inside the
``tf.data`` graph, so the split overlaps with training through ``prefetch``. It accepts the three
batch layouts of the element contract:

* padded: sequence feature ``[B, T]`` with ``"<name>_length"`` ``[B]``;
* ragged: sequence feature ``RaggedTensor [B, (T)]``;
* packed: sequence feature ``[B, T]`` with ``"<name>_segment_ids"``, ``"<name>_positions"`` and
  ``"<name>_resets"`` ``[B, T]``;

and any other feature with a leading batch dimension (``"label"`` ``[B]``, ...). Each part keeps
the keys and adds (or keeps) ``"weight"``, float32 ``[b]``: the incoming weight (1.0 when there
is none) on real rows and 0.0 on dummy rows. Nothing is ever dropped, and no part is ever empty.

Worked example, ``balance="examples"``, 10 rows over 4 parts: sizes differ by at most one and
the remainder goes to the first parts; rows keep their order::

    row         a   b   c   d   e   f   g   h   i   j
    length      1   2   3   4   5   6   7   8   9  10
    part        0   0   0   1   1   1   2   2   3   3     -> sizes 3, 3, 2, 2
    tokens      part 0: 6   part 1: 15   part 2: 15   part 3: 19       max/mean 1.38

Worked example, ``balance="tokens"``, the same batch: rows are ranked longest first and each
goes to the part holding the fewest tokens so far (ties: fewer rows, then the lower index);
rows keep their order within a part::

    rank        0   1   2   3   4   5   6   7   8   9
    row         j   i   h   g   f   e   d   c   b   a
    length     10   9   8   7   6   5   4   3   2   1
    part        0   1   2   3   3   2   1   0   0   1     -> part 0: b c j   part 1: a d i
                                                             part 2: e h     part 3: f g
    tokens      part 0: 15   part 1: 14   part 2: 13   part 3: 13          max/mean 1.09

On a heavy tail the greedy deal gives parts different row counts, which equal counts cannot:
lengths ``[90, 10, 10, 10, 10, 10, 10, 10]`` over 4 parts give part 0 the 90 alone and the
seven tens to parts 1-3 (30, 20, 20 tokens; largest part 90, the optimum), where a snake
deal of two rows per part puts 90 + 10 = 100 in part 0. With ``equal_rows=True`` the rows are
dealt in snake order (0 1 2 3 3 2 1 0 0 1 ...) so sizes differ by at most one.

Worked example, 2 rows over 4 parts (a padded batch, ``trim=False``): parts 2 and 3 get one
dummy row each, so every replica steps and the loss is unchanged::

    part            0           1           2           3
    ids             [[5, 6]]    [[7, 0]]    [[0, 0]]    [[0, 0]]
    ids_length      [2]         [1]         [1]         [1]
    label           [3]         [4]         [0]         [0]
    weight          [1.0]       [1.0]       [0.0]       [0.0]

With ``equal_rows=True`` every part is filled up to ``ceil(B / S)`` rows, so (without
``trim``) all parts have one shape: 10 rows over 4 parts give sizes 3, 3, 3, 3 with weights
``[1, 1, 1]``, ``[1, 1, 1]``, ``[1, 1, 0]``, ``[1, 1, 0]``.

A dummy row is all padding and holds exactly one token, the pad id 0, as a one-token example:
``"<name>_length"`` is 1, a ragged row is ``[0]``, a packed row has segment ids ``[1, 0, ...]``,
positions 0 and a reset at position 0; every other feature is zero (``""`` for strings, an
empty row for other ragged features). Length 1 rather than 0 keeps models that pool or attend
by length from dividing by zero; a model that masks by ``ids != 0`` sees a fully masked row,
which ``tfseq.masked_softmax`` turns into zeros (guard mean pooling with ``maximum(count, 1)``).
Any loss weighted by ``"weight"`` ignores dummy rows, and real rows keep their own weights.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import tensorflow as tf

from tfseq._common import LENGTH_SUFFIX, Transform, check_positive_int, require_dict_spec

SEGMENT_IDS_SUFFIX = "_segment_ids"
POSITIONS_SUFFIX = "_positions"
RESETS_SUFFIX = "_resets"
WEIGHT_KEY = "weight"
BALANCES = ("examples", "tokens")


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Which features of a batch are padded, ragged and packed sequences."""

    padded: tuple[str, ...]
    ragged: tuple[str, ...]
    packed: tuple[str, ...]

    @property
    def sequences(self) -> tuple[str, ...]:
        return self.padded + self.ragged + self.packed


def _is_int_matrix(spec) -> bool:
    return isinstance(spec, tf.TensorSpec) and spec.shape.rank == 2 and spec.dtype.is_integer


def batch_layout(spec, where: str = "split_batch") -> _Layout:
    """Reads the batch layout off a batched ``element_spec`` and checks it.

    Raises:
      TypeError: the elements are not dicts, or a feature is a SparseTensor.
      ValueError: a feature has no batch dimension or unknown rank, or ``"weight"`` is not
        a numeric ``[B]`` vector.
    """
    spec = require_dict_spec(spec, where)
    padded, ragged, packed = [], [], []
    for key, s in spec.items():
        if isinstance(s, tf.SparseTensorSpec):
            raise TypeError(f"{where} does not support SparseTensor features; received "
                            f"{key!r}: {s}. Convert it to a RaggedTensor first.")
        if not isinstance(s, (tf.TensorSpec, tf.RaggedTensorSpec)):
            raise TypeError(f"{where} expects Tensor or RaggedTensor features; received "
                            f"{key!r}: {s!r}")
        if s.shape.rank is None:
            raise ValueError(f"{where} needs features of known rank; feature {key!r} has "
                             f"unknown rank ({s}).")
        if s.shape.rank == 0:
            raise ValueError(f"{where} expects batched elements (batch the dataset first); "
                             f"feature {key!r} is a scalar ({s}).")
        if isinstance(s, tf.RaggedTensorSpec):
            if s.shape.rank == 2 and s.ragged_rank == 1 and s.dtype.is_integer:
                ragged.append(key)
        elif _is_int_matrix(s):
            if key + SEGMENT_IDS_SUFFIX in spec:
                packed.append(key)
            elif key + LENGTH_SUFFIX in spec:
                padded.append(key)
    if WEIGHT_KEY in spec:
        w = spec[WEIGHT_KEY]
        if not (isinstance(w, tf.TensorSpec) and w.shape.rank == 1
                and (w.dtype.is_floating or w.dtype.is_integer)):
            raise ValueError(f"{where}: feature {WEIGHT_KEY!r} must be a numeric [B] vector; "
                             f"received {w}")
    return _Layout(tuple(padded), tuple(ragged), tuple(packed))


def row_tokens(batch: Mapping[str, tf.Tensor], layout: _Layout) -> tf.Tensor:
    """int32 ``[B]``: real tokens per row, summed over the sequence features."""
    counts = []
    for key in layout.padded:
        counts.append(tf.cast(batch[key + LENGTH_SUFFIX], tf.int32))
    for key in layout.ragged:
        counts.append(tf.cast(batch[key].row_lengths(), tf.int32))
    for key in layout.packed:
        counts.append(tf.math.count_nonzero(batch[key + SEGMENT_IDS_SUFFIX], axis=1,
                                            dtype=tf.int32))
    return tf.add_n(counts) if len(counts) > 1 else counts[0]


def _num_rows(batch: Mapping[str, tf.Tensor]) -> tf.Tensor:
    value = next(iter(batch.values()))
    if isinstance(value, tf.RaggedTensor):
        return tf.cast(value.nrows(), tf.int32)
    return tf.shape(value, out_type=tf.int32)[0]


def _dim(value: tf.Tensor, axis: int):
    """The static size of ``axis`` if known, else the dynamic one."""
    static = value.shape[axis]
    return static if static is not None else tf.shape(value)[axis]


def _roles(layout: _Layout, keys) -> dict[str, str]:
    """How each feature's dummy rows look: see the module docstring."""
    roles = {}
    for key in layout.padded:
        roles[key] = "zeros"
        roles[key + LENGTH_SUFFIX] = "one"
    for key in layout.ragged:
        roles[key] = "ragged_pad"
    for key in layout.packed:
        roles[key] = "zeros"
        roles[key + POSITIONS_SUFFIX] = "zeros"
        roles[key + SEGMENT_IDS_SUFFIX] = "first"
        roles[key + RESETS_SUFFIX] = "first"
        if key + LENGTH_SUFFIX in keys:
            roles[key + LENGTH_SUFFIX] = "one"
    return roles


def _widen(value: tf.Tensor) -> tuple[tf.Tensor, Any]:
    """``value`` ``[b, T]`` padded to at least one column, and that width."""
    width = _dim(value, 1)
    if isinstance(width, int):
        if width >= 1:
            return value, width
        return tf.zeros([tf.shape(value)[0], 1], value.dtype), 1
    wide = tf.maximum(width, 1)
    return tf.pad(value, [[0, 0], [0, wide - width]]), wide


def _append_dummy_rows(part: dict, count: tf.Tensor, roles: dict[str, str]) -> dict:
    """``part`` with ``count`` dummy rows appended: one pad token each, weight 0."""
    out = {}
    for key, value in part.items():
        role = roles.get(key)
        if isinstance(value, tf.RaggedTensor):
            splits_dtype = value.row_splits.dtype
            if role == "ragged_pad":
                dummy = tf.RaggedTensor.from_row_lengths(
                    tf.zeros([count], value.dtype), tf.ones([count], splits_dtype))
            else:
                dummy = tf.RaggedTensor.from_row_lengths(
                    value.values[:0], tf.zeros([count], splits_dtype))
        elif role == "one" and value.shape.rank == 1:
            dummy = tf.ones([count], value.dtype)
        elif role in ("zeros", "first", "one"):  # "one" of rank 2: a per-segment table (pack)
            role = "first" if role == "one" else role
            value, width = _widen(value)
            dummy = tf.zeros([count, width], value.dtype)
            if role == "first":
                first = tf.one_hot(tf.zeros([count], tf.int32), width, dtype=tf.int32)
                dummy = tf.cast(first, value.dtype)
        else:
            inner = [_dim(value, axis) for axis in range(1, value.shape.rank)]
            dummy = tf.zeros([count] + inner, value.dtype)
        out[key] = tf.concat([value, dummy], axis=0)
    return out


def _trim(part: dict, layout: _Layout) -> dict:
    """Cuts each padded sequence feature of ``part`` to the part's own longest row."""
    part = dict(part)
    for key in layout.padded:
        lengths = tf.cast(part[key + LENGTH_SUFFIX], tf.int32)
        width = tf.reduce_max(tf.concat([lengths, [0]], axis=0))
        part[key] = part[key][:, :width]
    return part


def _part_of_row(tokens: tf.Tensor, num_splits: int) -> tf.Tensor:
    """int32 ``[B]``: the part of each row, dealing rows longest first in snake order."""
    order = tf.argsort(-tokens, stable=True)
    rank = tf.math.invert_permutation(order)
    cycle = rank % (2 * num_splits)
    return tf.where(cycle < num_splits, cycle, 2 * num_splits - 1 - cycle)


def _split_rows(value, sizes: tf.Tensor, num_splits: int) -> list:
    """``value`` cut along its rows into ``num_splits`` consecutive pieces of ``sizes``."""
    if isinstance(value, tf.RaggedTensor):
        ends = tf.cumsum(sizes)
        starts = ends - sizes
        return [value[starts[i]:ends[i]] for i in range(num_splits)]
    return tf.split(value, sizes, axis=0, num=num_splits)


def _greedy_part_of_row(tokens: tf.Tensor, num_splits: int) -> tf.Tensor:
    """int32 ``[B]``: the part of each row, longest row first to the part holding the fewest
    tokens so far (ties: the fewest rows, then the lowest index), the classic longest-first
    greedy partition. Its largest part is at most 4/3 of the optimum, and it follows a heavy
    tail that equal row counts cannot. The first ``num_splits`` rows go to distinct parts, so
    no part is empty when ``B >= num_splits``."""
    order = tf.argsort(-tokens, stable=True)
    ordered = tf.cast(tf.gather(tokens, order), tf.int64)
    num_rows = tf.size(tokens)
    scale = tf.cast(num_rows, tf.int64) + 1

    def body(i, loads, counts, parts):
        part = tf.argmin(loads * scale + counts, output_type=tf.int32)
        hot = tf.one_hot(part, num_splits, dtype=tf.int64)
        return i + 1, loads + hot * ordered[i], counts + hot, parts.write(i, part)

    zeros = tf.zeros([num_splits], tf.int64)
    _, _, _, parts = tf.while_loop(
        lambda i, *_: i < num_rows, body,
        (tf.constant(0), zeros, zeros, tf.TensorArray(tf.int32, size=num_rows)))
    return tf.scatter_nd(order[:, None], parts.stack(), [num_rows])


def _real_parts(part: dict, num_rows: tf.Tensor, num_splits: int, balance: str,
                layout: _Layout, equal_rows: bool = False) -> list[dict]:
    """The rows of each part: consecutive slices, or rows dealt by tokens (greedily, or in
    snake order for equal row counts) gathered in order."""
    if balance == "tokens":
        deal = _part_of_row if equal_rows else _greedy_part_of_row
        part_of_row = deal(row_tokens(part, layout), num_splits)
        order = tf.argsort(part_of_row, stable=True)  # by part, original order within
        sizes = tf.math.bincount(part_of_row, minlength=num_splits, maxlength=num_splits,
                                 dtype=tf.int32)
        part = {k: tf.gather(v, order) for k, v in part.items()}
    else:
        base, remainder = num_rows // num_splits, num_rows % num_splits
        sizes = base + tf.cast(tf.range(num_splits) < remainder, tf.int32)
    pieces = {k: _split_rows(v, sizes, num_splits) for k, v in part.items()}
    return [{k: pieces[k][i] for k in part} for i in range(num_splits)]


def _split(batch: dict, num_splits: int, balance: str, trim: bool, equal_rows: bool,
           layout: _Layout) -> tuple:
    num_rows = _num_rows(batch)
    part = dict(batch)
    part[WEIGHT_KEY] = (tf.ones([num_rows], tf.float32) if WEIGHT_KEY not in batch
                        else tf.cast(batch[WEIGHT_KEY], tf.float32))
    parts = _real_parts(part, num_rows, num_splits, balance, layout, equal_rows)
    if trim:
        parts = [_trim(p, layout) for p in parts]
    if equal_rows:
        rows_per_part = tf.maximum((num_rows + num_splits - 1) // num_splits, 1)
        needs_dummies = tf.logical_or(num_rows % num_splits > 0, num_rows == 0)
    else:
        rows_per_part = 1
        needs_dummies = num_rows < num_splits
    roles = _roles(layout, part)

    def with_dummy_rows():
        return tuple(_append_dummy_rows(p, tf.maximum(rows_per_part - _num_rows(p), 0), roles)
                     for p in parts)

    # Both balances fill parts 0, 1, ... first, so only a batch with fewer rows than parts
    # (or, with equal_rows, a remainder) needs dummy rows: the rare branch.
    return tf.cond(needs_dummies, with_dummy_rows, lambda: tuple(parts))


def split_batch(num_splits: int, *, balance: str = "examples", trim: bool = False,
                equal_rows: bool = False) -> Transform:
    """Transformation that splits every batch into a tuple of ``num_splits`` batches.

    See the module docstring for the worked examples and the dummy-row convention.

    Args:
      num_splits: number of parts (replicas), a positive int.
      balance: ``"examples"``: part sizes differ by at most one, remainder rows on the first
        parts, rows in order (contiguous slices). ``"tokens"``: near-equal real-token counts
        per part (tokens summed over the sequence features): rows ranked by length, longest
        first, each to the part with the fewest tokens so far (parts may differ in rows);
        with ``equal_rows`` dealt in snake order instead, so sizes differ by at most one.
      trim: if true, each part's padded sequence features are cut to the part's own longest
        row (less padding per replica). Leave false to keep the incoming width, e.g. after
        ``pad_to_boundary``. Packed and ragged features are never changed.
      equal_rows: if true, every part is filled up with dummy rows to ``ceil(B / S)`` rows,
        so with ``trim=False`` all parts of a dense batch have the same shape (Keras
        ``model.fit`` under a strategy and XLA need that). Otherwise dummy rows are added
        only to parts that would be empty.

    Returns:
      A ``Dataset.apply`` transformation from batches (dicts of ``[B, ...]`` tensors, see the
      module docstring) to tuples of ``num_splits`` batches with the same keys plus
      ``"weight"``, float32 ``[b]``, every part having ``b >= 1`` rows.

    Raises:
      TypeError: ``trim`` or ``equal_rows`` is not a bool, ``num_splits`` not an int, or the
        elements are not dicts of Tensors/RaggedTensors.
      ValueError: ``num_splits`` is not positive, ``balance`` is unknown, a feature is not
        batched, or ``balance="tokens"`` with no sequence feature to count tokens in.

    Example:
      >>> ds = tf.data.Dataset.from_tensor_slices({"label": tf.range(10)}).batch(10)
      >>> [[p["label"].numpy().tolist() for p in parts]
      ...  for parts in ds.apply(split_batch(4))]
      [[[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]]
    """
    check_positive_int("num_splits", num_splits)
    if balance not in BALANCES:
        raise ValueError(f"Unknown balance {balance!r}. Options: {list(BALANCES)}. "
                         f"Received: balance={balance!r}")
    for name, value in (("trim", trim), ("equal_rows", equal_rows)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool; received {name}={value!r}")

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        layout = batch_layout(dataset.element_spec)
        if balance == "tokens" and not layout.sequences:
            raise ValueError(
                "split_batch(balance='tokens') found no sequence feature to count tokens in "
                "(a padded [B, T] feature with '<name>_length', a ragged [B, (T)] or a packed "
                f"feature with '<name>_segment_ids'). Features: {sorted(dataset.element_spec)}")
        return dataset.map(
            lambda batch: _split(batch, num_splits, balance, trim, equal_rows, layout),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    return apply


def split(batch: Mapping[str, Any], num_splits: int, *, balance: str = "examples",
          trim: bool = False, equal_rows: bool = False) -> tuple:
    """``split_batch`` on one batch, inside a graph function (a ``Dataset.map``, a stream's
    own function): ``batch`` -> a tuple of ``num_splits`` parts, each with ``"weight"``.

    Raises:
      ValueError/TypeError: as ``split_batch``.
    """
    split_batch(num_splits, balance=balance, trim=trim, equal_rows=equal_rows)  # checks
    layout = batch_layout({k: tf.type_spec_from_value(v) for k, v in batch.items()})
    return _split(dict(batch), num_splits, balance, trim, equal_rows, layout)


def split_rows(batch, num_splits: int) -> tuple:
    """Any ``(features, labels)`` batch -> a tuple of ``num_splits`` ``(features, labels,
    weight)`` parts, inside a graph function.

    For batches that ``split`` does not read (nested ragged documents ``[B, (S), (W)]``,
    MultiSlot slots, dense features): every tensor, dense or ragged, is cut along its leading
    batch dimension into contiguous parts whose sizes differ by at most one (the remainder on
    the first parts), rows in order. A part that would be empty (``B < num_splits``) gets a copy
    of the batch's first row with weight 0, so every replica steps and, with a loss normalised
    by the global weight (``GlobalWeightedLoss``), the update is unchanged. ``weight`` is
    float32 ``[b]``: the incoming weight (1.0 when there is none) on real rows.

    Args:
      batch: ``(features, labels)`` or ``(features, labels, weight)``; every tensor ``[B, ...]``.
      num_splits: number of parts (replicas), a positive int.

    Example (10 rows over 4 parts: rows 0-2, 3-5, 6-7, 8-9; 2 rows over 4: rows 0, 1, then
    row 0 twice with weight 0).
    """
    check_positive_int("num_splits", num_splits)
    features, labels = batch[0], batch[1]
    rows = tf.shape(tf.nest.flatten(labels, expand_composites=False)[0])[0]
    rows = tf.cast(rows, tf.int64)
    weight = (tf.cast(batch[2], tf.float32) if len(batch) > 2 and batch[2] is not None
              else tf.ones([rows], tf.float32))
    base, extra = rows // num_splits, rows % num_splits
    parts, start = [], tf.constant(0, tf.int64)
    for i in range(num_splits):
        size = base + tf.cast(i < extra, tf.int64)
        empty = tf.equal(size, 0)
        index = tf.cond(empty, lambda: tf.zeros([1], tf.int64),
                        lambda start=start, size=size: tf.range(start, start + size))
        part_weight = tf.cond(empty, lambda: tf.zeros([1], tf.float32),
                              lambda index=index: tf.gather(weight, index))
        take = lambda x, index=index: tf.gather(x, index)  # noqa: E731 (dense or ragged)
        parts.append((tf.nest.map_structure(take, features), tf.nest.map_structure(take, labels),
                      part_weight))
        start += size
    return tuple(parts)


def prefetch_to_device(device: str, buffer_size: int | None = None) -> Transform:
    """Transformation that prefetches elements into ``device`` memory (e.g. ``"/gpu:0"``).

    Wraps ``tf.data.experimental.prefetch_to_device``. It must be the LAST transformation:
    the elements it produces live on ``device``, and any step applied after it (``map``,
    ``batch``, even ``prefetch``) fails or silently copies back to the host. Under a
    ``tf.distribute`` strategy, do not use it: the strategy's distributed dataset already
    prefetches each replica's batch onto that replica's device.

    Args:
      device: a device name, e.g. ``"/gpu:0"`` or ``"/cpu:0"``.
      buffer_size: elements to keep on the device; ``None`` lets tf.data choose.

    Returns:
      A ``Dataset.apply`` transformation; the elements are unchanged.

    Raises:
      TypeError: ``device`` is not a str, or ``buffer_size`` not an int.
      ValueError: ``device`` is empty, or ``buffer_size`` is not positive.
    """
    if not isinstance(device, str):
        raise TypeError(f"device must be a str such as '/gpu:0'; received device={device!r}")
    if not device:
        raise ValueError("device must be a non-empty device name such as '/gpu:0'; "
                         f"received device={device!r}")
    check_positive_int("buffer_size", buffer_size, allow_none=True)
    return tf.data.experimental.prefetch_to_device(device, buffer_size)
