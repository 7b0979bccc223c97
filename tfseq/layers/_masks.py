"""Private helpers for the layers: ragged <-> padded, and validity masks from every source.

Shapes: B = batch, T = time, D = features. A *valid mask* is bool ``[B, T]``, true on real steps.
"""

from __future__ import annotations

import tensorflow as tf
from keras.src.backend import get_keras_mask


def keras_mask(x):
    """The Keras mask attached to ``x`` (e.g. by ``Embedding(mask_zero=True)``), or ``None``."""
    return None if x is None else get_keras_mask(x)


def densify(x):
    """Returns ``(padded, lengths)``: a ragged ``[B, (T), ...]`` padded with 0 and its int32
    row lengths ``[B]``; a dense tensor is returned as is with ``lengths=None``."""
    if isinstance(x, tf.RaggedTensor):
        if x.ragged_rank != 1:
            raise ValueError(
                "Expected a RaggedTensor [batch, (time), ...] with ragged_rank=1; received "
                f"ragged_rank={x.ragged_rank} and shape {x.shape}")
        return x.to_tensor(), tf.cast(x.row_lengths(), tf.int32)
    return x, None


def all_of(*masks):
    """Logical AND (with broadcasting) of the masks that are not ``None``; ``None`` if none."""
    result = None
    for mask in masks:
        if mask is None:
            continue
        mask = tf.cast(mask, tf.bool)
        result = mask if result is None else tf.logical_and(result, mask)
    return result


def valid_mask(padded, *, lengths=None, mask=None, segment_ids=None):
    """bool ``[B, T]`` valid mask of ``padded`` ``[B, T, ...]`` from every source given.

    Args:
      padded: the padded tensor; its second dimension is T.
      lengths: int ``[B]``: steps ``< lengths[b]`` are valid.
      mask: bool (or 0/1) ``[B, T]``: true on valid steps (a Keras mask).
      segment_ids: int ``[B, T]`` packed segment ids: 0 marks padding.

    Returns:
      The AND of the masks implied by the sources, or ``None`` when none is given.
    """
    from_lengths = None
    if lengths is not None:
        lengths = tf.convert_to_tensor(lengths)
        from_lengths = tf.sequence_mask(lengths, tf.shape(padded)[1])
    from_segments = None
    if segment_ids is not None:
        segment_ids = tf.convert_to_tensor(segment_ids)
        from_segments = tf.not_equal(segment_ids, tf.zeros([], segment_ids.dtype))
    return all_of(from_lengths, mask, from_segments)


def zero_invalid(x, valid, scale=None):
    """``x`` ``[B, T, D]`` with steps where ``valid`` ``[B, T]`` is false set to exactly 0.

    Uses ``tf.math.multiply_no_nan`` (one fused pass; never ``0 * inf = NaN``), so pad values of
    ``inf``/``NaN`` cannot leak, and their gradient is exactly 0. ``scale`` (a Python float)
    multiplies the valid steps in the same pass.
    """
    if valid is None:
        return x if scale is None else x * tf.constant(scale, x.dtype)
    factor = tf.cast(valid, x.dtype)
    if scale is not None:
        factor = factor * tf.constant(scale, x.dtype)
    return tf.math.multiply_no_nan(x, factor[..., tf.newaxis])


def lengths_of(valid, time):
    """int32 ``[B]``: one past the last valid step of each row (0 for an empty row).

    For a right-padded mask this is the number of valid steps; a mask with holes keeps its
    holes inside ``[0, length)``.
    """
    if valid is None:
        return None
    steps = tf.range(1, time + 1, dtype=tf.int32)
    last = tf.reduce_max(tf.where(valid, steps, tf.zeros([], tf.int32)), axis=1)
    return tf.maximum(last, 0)  # reduce_max over zero steps is the int32 minimum
