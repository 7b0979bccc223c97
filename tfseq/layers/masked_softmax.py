"""Numerically stable masked softmax.

``masked_softmax(logits, mask)`` gives exactly 0 weight to masked positions whatever their
logits are (huge, ``inf`` or ``NaN``), never produces NaN or Inf from finite valid logits (a fully
masked slice is all zeros, with zero gradients), and is safe in float16 and bfloat16:
half-precision logits are normalised in float32 and the result is cast back.

How: masked logits are replaced by ``-inf`` with ``tf.where`` (a select, never arithmetic, so a
pad's value cannot leak through ``0 * inf``), and the fused ``tf.nn.softmax`` kernel normalises:
its max-subtraction keeps ``exp`` in range and ``exp(-inf) == 0`` gives pads exactly 0 for any
finite valid logits. A slice with no valid position would be ``-inf`` everywhere (NaN), so when
one exists (checked on the mask, cheap; ``tf.cond`` skips the work otherwise) those slices are
softmaxed from zeros and then zeroed. Gradients through ``tf.where`` are selected, not
multiplied, so they are exactly 0 on masked positions and finite everywhere.

Shapes: B = batch, Tq = query time, Tk = key time.
"""

from __future__ import annotations

import tensorflow as tf

_HALF_DTYPES = (tf.float16, tf.bfloat16)


def softmax_compute_dtype(dtype: tf.DType) -> tf.DType:
    """The dtype softmax is computed in for ``dtype`` logits: float32 for float16/bfloat16."""
    return tf.float32 if dtype in _HALF_DTYPES else dtype


def masked_softmax(logits, mask, axis: int = -1):
    """Softmax of ``logits`` over ``axis`` restricted to positions where ``mask`` is true.

    Args:
      logits: float tensor of any rank >= 1, e.g. float32 ``[B, Tq, Tk]``; float16, bfloat16,
        float32 or float64. A ``tf.RaggedTensor`` is accepted with ``mask=None``: the softmax
        then runs over the real entries only (ragged ``[B, (Tk)]`` with ``axis=-1``), or over a
        uniform last axis (``[B, (T), Tk]``).
      mask: bool (or 0/1 numeric) tensor broadcastable to ``logits`` (rank at most that of
        ``logits``), e.g. ``[B, 1, Tk]`` or ``[B, Tq, Tk]``; true marks valid positions. ``None``
        means every position is valid (plain softmax).
      axis: the axis to normalise over (a Python int).

    Returns:
      A tensor of ``logits``' shape (the broadcast shape of ``logits`` and ``mask``) and dtype.
      Masked positions are exactly 0; a slice with no valid position is all zeros, not NaN.
      Changing masked logits never changes the result.

    Raises:
      TypeError: ``logits`` is not floating point, or ``axis`` is not an int.
      ValueError: ``mask`` has a higher rank than ``logits``, ``axis`` is out of range, or a
        ragged ``logits`` comes with a mask or an unsupported axis.

    Example:
      >>> masked_softmax(tf.constant([[1.0, 1.0, 5.0]]), tf.constant([[True, True, False]]))
      ... # -> [[0.5, 0.5, 0.0]]
    """
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"axis must be an int; received axis={axis!r}")
    if isinstance(logits, tf.RaggedTensor):
        return _ragged_softmax(logits, mask, axis)
    logits = tf.convert_to_tensor(logits)
    if not logits.dtype.is_floating:
        raise TypeError(f"logits must be floating point; received dtype={logits.dtype.name}")
    rank = logits.shape.rank
    if rank is not None:
        if rank == 0:
            raise ValueError("logits must have rank >= 1; received a scalar")
        if not -rank <= axis < rank:
            raise ValueError(f"axis={axis} is out of range for logits of rank {rank}")
    if mask is None:
        compute = softmax_compute_dtype(logits.dtype)
        return tf.cast(tf.nn.softmax(tf.cast(logits, compute), axis=axis), logits.dtype)
    mask = tf.convert_to_tensor(mask)
    if mask.dtype != tf.bool:
        mask = tf.not_equal(mask, tf.zeros([], mask.dtype))
    if rank is not None and mask.shape.rank is not None and mask.shape.rank > rank:
        raise ValueError(
            f"mask must be broadcastable to logits; received mask of shape {mask.shape} for "
            f"logits of shape {logits.shape}")
    compute = softmax_compute_dtype(logits.dtype)
    x = tf.cast(logits, compute)
    x = tf.where(mask, x, tf.constant(float("-inf"), compute))
    has_valid = _any_valid(mask, axis, rank)
    weights = tf.cond(
        tf.reduce_all(has_valid),
        lambda: tf.nn.softmax(x, axis=axis),
        lambda: _softmax_with_empty_slices(x, mask, has_valid, axis))
    return tf.cast(weights, logits.dtype)


def _any_valid(mask, axis, rank):
    """bool, broadcastable to the logits: whether each slice along ``axis`` has a valid entry."""
    if axis >= 0 and rank is not None:
        axis -= rank  # count from the end: the mask may have a lower rank than the logits
    if axis < 0 and mask.shape.rank is not None and mask.shape.rank < -axis:
        return mask  # the mask is broadcast along `axis`: constant over each slice
    return tf.reduce_any(mask, axis=axis, keepdims=True)


def _softmax_with_empty_slices(x, mask, has_valid, axis):
    """The rare branch: slices with no valid position become 0 (finite, no NaN on the way)."""
    x = tf.where(has_valid, x, tf.zeros([], x.dtype))
    return tf.where(mask, tf.nn.softmax(x, axis=axis), tf.zeros([], x.dtype))


def _ragged_softmax(logits: tf.RaggedTensor, mask, axis: int) -> tf.RaggedTensor:
    """Softmax over the real entries of a ragged tensor (see ``masked_softmax``)."""
    if mask is not None:
        raise ValueError(
            "A ragged logits tensor carries its own mask; pass mask=None. "
            f"Received mask={mask!r}")
    rank = logits.shape.rank
    if axis not in (-1, rank - 1):
        raise ValueError(
            f"Ragged logits are normalised over the last axis only; received axis={axis} for "
            f"rank {rank}")
    if logits.flat_values.shape.rank > 1:
        return logits.with_flat_values(masked_softmax(logits.flat_values, None, axis=-1))
    if logits.ragged_rank != 1:
        raise ValueError(
            "Ragged logits with a ragged last axis must have ragged_rank 1 ([B, (Tk)]); "
            f"received ragged_rank={logits.ragged_rank}")
    dense = logits.to_tensor()
    valid = tf.sequence_mask(logits.row_lengths(), tf.shape(dense)[-1])
    weights = masked_softmax(dense, valid, axis=-1)
    return tf.RaggedTensor.from_tensor(weights, lengths=logits.row_lengths())
