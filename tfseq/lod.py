"""PaddlePaddle LoD (level-of-detail) tensors as nested ``tf.RaggedTensor``.

A LoD tensor is a flat tensor of values plus, per nesting level, the segment lengths
(Paddle's ``recursive_sequence_lengths``) or their offsets. A nested RaggedTensor is the same
structure: its ``nested_row_lengths()`` are the LoD lengths and its ``nested_row_splits`` the
LoD offsets, outermost level first. This module converts between the two and checks the levels.

Shapes: N = number of values, L = number of levels (``ragged_rank``).

Worked example (Paddle's LoD document): 3 articles of 3, 1 and 2 sentences holding 3, 2, 4, 1,
2 and 3 words, the words being the values 0..14::

    lengths  level 0   [3,          1,    2        ]
             level 1   [3,  2,  4,  1,    2,   3   ]
    offsets  level 0   [0, 3, 4, 6]
             level 1   [0, 3, 5, 9, 10, 12, 15]
    ragged   [[[0, 1, 2], [3, 4], [5, 6, 7, 8]], [[9]], [[10, 11], [12, 13, 14]]]

    slice_branch(rt, (2,))    -> [[10, 11], [12, 13, 14]]   (words 10..15)
    slice_branch(rt, (2, 0))  -> [10, 11]                   (words 10..12)

Validation: Python lists, numpy arrays and eager tensors are checked in Python and raise
``ValueError``; symbolic tensors (inside ``tf.function`` or ``Dataset.map``) are checked with
``tf.debugging`` assertions carrying the same messages (``tf.errors.InvalidArgumentError`` when
the graph runs).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

__all__ = ["from_lengths", "from_offsets", "to_lengths", "to_offsets", "slice_branch"]


def _static(x):
    """``x`` as a numpy array when its value is known now (Python, numpy, eager), else None."""
    if isinstance(x, tf.RaggedTensor):
        return None
    if isinstance(x, tf.Tensor):
        if tf.executing_eagerly() and hasattr(x, "numpy"):
            return x.numpy()
        value = tf.get_static_value(x)
        return value
    return np.asarray(x)


def _check_level_type(kind: str, levels) -> list:
    if isinstance(levels, (tf.Tensor, tf.RaggedTensor, np.ndarray, str, bytes)) or not isinstance(
            levels, Sequence):
        raise TypeError(
            f"{kind} must be a list of levels (one 1-D vector per level, outermost first), "
            f"e.g. [[3, 1, 2], [3, 2, 4, 1, 2, 3]]; received {kind}={levels!r}")
    return list(levels)


def _num_values(values: tf.Tensor):
    """Number of rows of ``values``: a Python int if static, else an int64 scalar tensor."""
    if values.shape.rank == 0:
        raise ValueError(f"values must have rank >= 1 (a flat tensor of N values); "
                         f"received a scalar {values!r}")
    n = values.shape[0]
    if n is not None:
        return int(n)
    return tf.shape(values, out_type=tf.int64)[0]


def _vector(kind: str, k: int, level, dtype):
    """Level ``k`` as a 1-D tensor of ``dtype``; rank checked in Python."""
    if isinstance(level, tf.RaggedTensor):
        raise TypeError(f"{kind} level {k} must be a 1-D integer vector; received a RaggedTensor")
    static = _static(level)
    if static is not None:
        static = np.asarray(static)
        if static.ndim != 1:
            raise ValueError(f"{kind} level {k} must be 1-D; received shape {static.shape}: "
                             f"{static.tolist()}")
        if static.size and not np.issubdtype(static.dtype, np.integer):
            raise TypeError(f"{kind} level {k} must hold integers; received {static.tolist()}")
        return tf.constant(static.astype(dtype.as_numpy_dtype), dtype=dtype), static.astype(np.int64)
    tensor = tf.convert_to_tensor(level)
    if not tensor.dtype.is_integer:
        raise TypeError(f"{kind} level {k} must be an integer tensor; received {tensor.dtype}")
    if tensor.shape.rank is not None and tensor.shape.rank != 1:
        raise ValueError(f"{kind} level {k} must be 1-D; received shape {tensor.shape}")
    return tf.cast(tensor, dtype), None


class _Checks:
    """Collects checks: raises ``ValueError`` now when static, else builds graph assertions."""

    def __init__(self):
        self.asserts = []

    def check(self, ok, message_parts):
        """``message_parts``: strings and values; values may be numpy (static) or tensors."""
        if isinstance(ok, (bool, np.bool_)):
            if not ok:
                raise ValueError("".join(
                    p if isinstance(p, str) else _format_static(p) for p in message_parts))
            return
        template = "".join(p if isinstance(p, str) else "{}" for p in message_parts)
        template = template.replace("{}", "\x00").replace("{", "{{").replace("}", "}}")
        template = template.replace("\x00", "{}")
        tensors = [p for p in message_parts if not isinstance(p, str)]
        message = tf.strings.format(template, tensors, summarize=-1)
        self.asserts.append(tf.debugging.Assert(ok, [message]))

    def guard(self, tensor):
        if not self.asserts:
            return tensor
        with tf.control_dependencies(self.asserts):
            return tf.identity(tensor)


def _format_static(value) -> str:
    value = np.asarray(value)
    return str(value.tolist())


def _level_checks(kind: str, checks: _Checks, k: int, level_np, level_t):
    """Non-negative lengths (kind == 'lengths') or offsets starting at 0, non-decreasing."""
    if level_np is not None:
        if kind == "lengths":
            checks.check(bool(np.all(level_np >= 0)),
                         [f"LoD lengths level {k} has a negative length: level {k} = ", level_np])
        else:
            checks.check(level_np.size > 0,
                         [f"LoD offsets level {k} is empty; it needs at least the leading 0"])
            checks.check(bool(level_np[0] == 0),
                         [f"LoD offsets level {k} does not start at 0: level {k} = ", level_np])
            checks.check(bool(np.all(np.diff(level_np) >= 0)),
                         [f"LoD offsets level {k} is not non-decreasing (monotonic): "
                          f"level {k} = ", level_np])
        return
    if kind == "lengths":
        checks.check(tf.reduce_all(level_t >= 0),
                     [f"LoD lengths level {k} has a negative length: level {k} = ", level_t])
    else:
        checks.check(tf.size(level_t) > 0,
                     [f"LoD offsets level {k} is empty; it needs at least the leading 0"])
        first = tf.concat([level_t, tf.zeros([1], level_t.dtype)], 0)[0]
        checks.check(tf.equal(first, 0),
                     [f"LoD offsets level {k} does not start at 0: level {k} = ", level_t])
        checks.check(tf.reduce_all(level_t[1:] >= level_t[:-1]),
                     [f"LoD offsets level {k} is not non-decreasing (monotonic): "
                      f"level {k} = ", level_t])


def _total(kind, level_np, level_t):
    """What level k describes in the next level: the sum of lengths or the last offset."""
    if level_np is not None:
        if kind == "lengths":
            return int(level_np.sum())
        return int(level_np[-1]) if level_np.size else 0
    if kind == "lengths":
        return tf.reduce_sum(tf.cast(level_t, tf.int64))
    return tf.cast(tf.concat([tf.zeros([1], level_t.dtype), level_t], 0)[-1], tf.int64)


def _size(kind, level_np, level_t):
    """How many entries of level k there are (offsets: rows = len - 1)."""
    minus = 0 if kind == "lengths" else 1
    if level_np is not None:
        return int(level_np.size) - minus
    return tf.size(level_t, out_type=tf.int64) - minus


def _build(kind: str, values, levels, row_splits_dtype, validate: bool):
    levels = _check_level_type(kind, levels)
    row_splits_dtype = tf.as_dtype(row_splits_dtype)
    if row_splits_dtype not in (tf.int32, tf.int64):
        raise ValueError(f"row_splits_dtype must be int32 or int64; received {row_splits_dtype}")
    values = tf.convert_to_tensor(values)
    if not levels:
        return values
    pairs = [_vector(kind, k, level, row_splits_dtype) for k, level in enumerate(levels)]
    checks = _Checks()
    if validate:
        n_values = _num_values(values)
        verb = "sums to" if kind == "lengths" else "ends at"
        for k, (level_t, level_np) in enumerate(pairs):
            _level_checks(kind, checks, k, level_np, level_t)
            total = _total(kind, level_np, level_t)
            if k + 1 < len(pairs):
                nxt_t, nxt_np = pairs[k + 1]
                size = _size(kind, nxt_np, nxt_t)
                what = f"level {k + 1} has "
                unit = " entries" if kind == "lengths" else " sequences"
            else:
                size = n_values
                what = "there are "
                unit = " values"
            static = isinstance(total, int) and isinstance(size, int)
            ok = (total == size) if static else tf.equal(
                tf.cast(total, tf.int64), tf.cast(size, tf.int64))
            checks.check(ok, [f"LoD {kind} level {k} {verb} ", _as_part(total), " but " + what,
                              _as_part(size), f"{unit}: level {k} = ",
                              level_np if level_np is not None else level_t])
    tensors = [checks.guard(t) for t, _ in pairs]
    if kind == "lengths":
        return tf.RaggedTensor.from_nested_row_lengths(values, tensors, validate=False)
    return tf.RaggedTensor.from_nested_row_splits(values, tensors, validate=False)


def _as_part(x):
    return np.asarray(x) if isinstance(x, int) else x


def from_lengths(values, lengths, *, row_splits_dtype=tf.int64, validate: bool = True):
    """Nested RaggedTensor from flat values and LoD lengths (``recursive_sequence_lengths``).

    Args:
      values: tensor ``[N, ...]`` of any dtype (or anything ``tf.convert_to_tensor`` takes).
      lengths: list of L 1-D integer vectors, outermost level first. Level k has one entry per
        sequence of level k; its sum is the number of entries of level k + 1 (the number of
        values for the last level). ``[]`` returns ``values`` unchanged.
      row_splits_dtype: ``tf.int64`` (default) or ``tf.int32``.
      validate: check the levels (see the module docstring).

    Returns:
      RaggedTensor ``[lengths[0].size, (.), ..., (.), ...]`` with ``ragged_rank`` L.

    Raises:
      TypeError: ``lengths`` is not a list of integer vectors.
      ValueError: a level is not 1-D, has a negative length, or sums to a different number than
        the next level's entries (or the number of values).

    Example:
      >>> from_lengths([0, 1, 2, 3, 4, 5], [[3, 1, 2]]).to_list()
      [[0, 1, 2], [3], [4, 5]]
    """
    return _build("lengths", values, lengths, row_splits_dtype, validate)


def from_offsets(values, offsets, *, row_splits_dtype=tf.int64, validate: bool = True):
    """Nested RaggedTensor from flat values and LoD offsets (``row_splits`` per level).

    Args:
      values: tensor ``[N, ...]``.
      offsets: list of L 1-D integer vectors, outermost first. Level k starts at 0, never
        decreases, and ends at the number of sequences of level k + 1 (``len(offsets[k+1]) - 1``;
        the number of values for the last level).
      row_splits_dtype: ``tf.int64`` (default) or ``tf.int32``.
      validate: check the levels (see the module docstring).

    Returns:
      RaggedTensor ``[len(offsets[0]) - 1, (.), ..., (.), ...]`` with ``ragged_rank`` L.

    Raises:
      TypeError: ``offsets`` is not a list of integer vectors.
      ValueError: a level is not 1-D, is empty, does not start at 0, decreases, or ends at a
        different number than the next level's sequences (or the number of values).

    Example:
      >>> from_offsets([0, 1, 2, 3, 4, 5], [[0, 3, 4, 6]]).to_list()
      [[0, 1, 2], [3], [4, 5]]
    """
    return _build("offsets", values, offsets, row_splits_dtype, validate)


def _check_ragged(rt, where: str):
    if isinstance(rt, tf.RaggedTensor):
        return rt
    if isinstance(rt, (tf.Tensor, np.ndarray)):
        return None
    raise TypeError(f"{where} expects a tf.RaggedTensor (or a dense tensor, which has no LoD "
                    f"levels); received {type(rt).__name__}: {rt!r}")


def to_lengths(rt) -> list:
    """LoD lengths of a nested RaggedTensor, outermost level first.

    Args:
      rt: RaggedTensor ``[B, (.), ..., ...]`` with any ``ragged_rank`` (a dense tensor has none).

    Returns:
      List of ``ragged_rank`` 1-D tensors of ``rt.row_splits.dtype``; ``[v.numpy().tolist() for
      v in to_lengths(rt)]`` is Paddle's ``recursive_sequence_lengths()``.
    """
    rt = _check_ragged(rt, "to_lengths")
    return [] if rt is None else list(rt.nested_row_lengths())


def to_offsets(rt) -> list:
    """LoD offsets (``nested_row_splits``) of a nested RaggedTensor, outermost level first.

    Args:
      rt: RaggedTensor ``[B, (.), ..., ...]`` with any ``ragged_rank`` (a dense tensor has none).

    Returns:
      List of ``ragged_rank`` 1-D tensors; level k has ``nrows + 1`` entries starting at 0.
    """
    rt = _check_ragged(rt, "to_offsets")
    return [] if rt is None else list(rt.nested_row_splits)


def slice_branch(rt: tf.RaggedTensor, branch):
    """The sub-sequence of ``rt`` addressed by a LoD branch, e.g. ``(2,)`` or ``(2, 0)``.

    A branch is a path of indices from the outermost level in: ``(2,)`` is the third top-level
    sequence with its nested levels, ``(2, 0)`` the first sequence inside that. With the tree of
    the module docstring, ``(2,)`` gives words 10..15 as ``[[10, 11], [12, 13, 14]]`` and
    ``(2, 0)`` words 10..12 as ``[10, 11]``.

    Args:
      rt: RaggedTensor with ``ragged_rank`` L.
      branch: tuple of at most L non-negative Python ints (``()`` returns ``rt``).

    Returns:
      ``rt[branch[0]][branch[1]]...``: a RaggedTensor with ``ragged_rank`` L - len(branch), or
      a dense tensor ``[(n), ...]`` when ``len(branch) == L``.

    Raises:
      TypeError: ``rt`` is not a RaggedTensor or ``branch`` is not a tuple/list of ints.
      ValueError: ``branch`` is longer than L, has a negative index, or (checked in Python when
        the size is known, else by a graph assertion) an index past the end of its level.
    """
    if not isinstance(rt, tf.RaggedTensor):
        raise TypeError(f"slice_branch expects a tf.RaggedTensor; received {type(rt).__name__}")
    if not isinstance(branch, (tuple, list)) or any(
            isinstance(i, bool) or not isinstance(i, (int, np.integer)) for i in branch):
        raise TypeError(f"branch must be a tuple of ints such as (2,) or (2, 0); "
                        f"received branch={branch!r}")
    if len(branch) > rt.ragged_rank:
        raise ValueError(f"branch {tuple(branch)} has {len(branch)} indices but the tensor has "
                         f"only {rt.ragged_rank} LoD level(s)")
    if any(i < 0 for i in branch):
        raise ValueError(f"branch indices must be non-negative; received branch={tuple(branch)}")
    out = rt
    for depth, index in enumerate(branch):
        index = int(index)
        where = f"branch {tuple(branch)}: index {index} at level {depth} is out of range; "
        nrows = _static(out.nrows())
        if nrows is not None and index >= int(nrows):
            raise ValueError(f"{where}the sequence {tuple(branch[:depth])} has {int(nrows)} "
                             f"sub-sequences")
        checks = []
        if nrows is None:
            checks.append(tf.debugging.Assert(index < out.nrows(), [tf.strings.format(
                where + "the sequence " + str(tuple(branch[:depth])) + " has {} sub-sequences",
                out.nrows())]))
        with tf.control_dependencies(checks):
            out = out[index]
    return out
