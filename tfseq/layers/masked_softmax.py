"""Numerically stable masked softmax.

``masked_softmax(logits, mask)`` gives exactly 0 weight to masked positions, never produces
NaN or Inf (a fully masked row is all zeros, with finite gradients), and is safe in float16 and
bfloat16: half-precision inputs are computed in float32 and cast back.
"""

from __future__ import annotations

import tensorflow as tf


def masked_softmax(logits: tf.Tensor, mask: tf.Tensor | None, axis: int = -1) -> tf.Tensor:
    """Softmax of ``logits`` over ``axis`` restricted to positions where ``mask`` is true.

    Args:
      logits: float tensor of any rank, e.g. ``[B, Tq, Tk]``.
      mask: bool (or 0/1) tensor broadcastable to ``logits``; true marks valid positions.
        ``None`` means no mask (plain softmax).
      axis: the axis to normalise over.

    Returns:
      A tensor of ``logits``' shape and dtype. Masked positions are exactly 0; a slice with no
      valid position is all zeros (not NaN).

    Example:
      >>> masked_softmax(tf.constant([[1.0, 1.0, 5.0]]), tf.constant([[True, True, False]]))
      ... # -> [[0.5, 0.5, 0.0]]
    """
    logits = tf.convert_to_tensor(logits)
    if mask is None:
        return tf.nn.softmax(logits, axis=axis)
    out_dtype = logits.dtype
    compute_dtype = tf.float32 if out_dtype in (tf.float16, tf.bfloat16) else out_dtype
    x = tf.cast(logits, compute_dtype)
    mask = tf.cast(mask, tf.bool)
    mask = tf.broadcast_to(mask, tf.shape(x))
    # Largest valid logit per slice (0 for a fully masked slice) keeps exp() in range.
    neg_inf = tf.constant(float("-inf"), compute_dtype)
    row_max = tf.reduce_max(tf.where(mask, x, neg_inf), axis=axis, keepdims=True)
    row_max = tf.where(tf.math.is_finite(row_max), row_max, tf.zeros_like(row_max))
    row_max = tf.stop_gradient(row_max)
    # Masked positions get 0 *before* exp so neither the value nor its gradient can overflow.
    shifted = tf.where(mask, x - row_max, tf.zeros_like(x))
    exps = tf.where(mask, tf.exp(shifted), tf.zeros_like(x))
    total = tf.reduce_sum(exps, axis=axis, keepdims=True)
    safe_total = tf.where(total > 0, total, tf.ones_like(total))
    return tf.cast(exps / safe_total, out_dtype)
