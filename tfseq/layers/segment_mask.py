"""Attention masks for packed rows: a token attends only to tokens of its own segment.

Shapes: B = rows, T = time.

For segment ids ``[1, 1, 2, 0]`` the mask (query rows, key columns) is::

    1 1 0 0
    1 1 0 0
    0 0 1 0
    0 0 0 0

A padding query has no valid key; ``masked_softmax`` turns such a row into zeros.
"""

from __future__ import annotations

import tensorflow as tf


def segment_attention_mask(segment_ids: tf.Tensor, *, causal: bool = False) -> tf.Tensor:
    """bool ``[B, T, T]``: query t may attend to key s iff both lie in the same segment.

    Args:
      segment_ids: int ``[B, T]``, 1-based segment ids, 0 on padding (``"<name>_segment_ids"``
        of a packed batch).
      causal: also require ``s <= t`` (decoder self-attention).

    Returns:
      bool ``[B, T, T]``, indexed ``[batch, query, key]``; false wherever either is padding.

    Raises:
      ValueError: ``segment_ids`` is not of rank 2.
    """
    segment_ids = tf.convert_to_tensor(segment_ids)
    if segment_ids.shape.rank != 2:
        raise ValueError("segment_ids must be [batch, time] (rank 2); received shape "
                         f"{segment_ids.shape}")
    query = segment_ids[:, :, None]
    key = segment_ids[:, None, :]
    mask = (query == key) & (query > 0)
    if causal:
        steps = tf.range(tf.shape(segment_ids)[1])
        mask &= (steps[None, :] <= steps[:, None])[None]
    return mask
