"""Losses and targets on packed batches: padding weighs nothing, no target crosses a segment.

Shapes: B = rows, T = block length.

Language-model targets on a packed row (``lm_targets``)::

    ids               7  8  5  1  8  4  9  3  1  0
    ids_segment_ids   1  1  1  1  2  2  2  2  2  0
    targets           8  5  1  0  4  9  3  1  0  0
    weights           1  1  1  0  1  1  1  1  0  0

The last token of each segment has no target (its next token belongs to another example), so
a model never learns to predict across a boundary. The last token of a piece of a split example
gets weight 0 too: its next token is in the next batch.
"""

from __future__ import annotations

from typing import Mapping

import tensorflow as tf

from tfseq.packing import SEGMENT_IDS_SUFFIX


def _segment_ids(batch: Mapping[str, tf.Tensor], key: str) -> tf.Tensor:
    name = key + SEGMENT_IDS_SUFFIX
    if key not in batch or name not in batch:
        raise ValueError(f"Expected a packed batch with {key!r} and {name!r}; "
                         f"available keys: {sorted(batch)}. Received: key={key!r}")
    return tf.convert_to_tensor(batch[name])


def packed_weights(batch: Mapping[str, tf.Tensor], key: str = "ids", *,
                   per_segment: bool = False) -> tf.Tensor:
    """Per-token loss weights of a packed batch: 0 on padding.

    Args:
      batch: a packed batch (from ``tfseq.pack``) with ``key`` and ``<key>_segment_ids``
        (int32 ``[B, T]``).
      key: the sequence feature.
      per_segment: if true, each segment's tokens share a total weight of 1 (``1 / length``),
        so a mean over tokens weighs every example (every piece of a split one) alike;
        otherwise 1.0 per real token.

    Returns:
      float32 ``[B, T]``.

    Raises:
      ValueError: ``key`` or its segment ids are missing.
    """
    segment_ids = _segment_ids(batch, key)
    real = tf.cast(segment_ids > 0, tf.float32)
    if not per_segment:
        return real
    width = tf.shape(segment_ids)[1] + 1
    rows = tf.range(tf.shape(segment_ids)[0])[:, None]
    flat = tf.reshape(segment_ids + rows * width, [-1])
    counts = tf.math.bincount(flat, minlength=tf.size(segment_ids) + width, dtype=tf.float32)
    lengths = tf.reshape(tf.gather(counts, flat), tf.shape(segment_ids))
    return real / tf.maximum(lengths, 1.0)


def lm_targets(batch: Mapping[str, tf.Tensor], key: str = "ids"):
    """Next-token targets that never cross a segment boundary, for ``model.fit``.

    Args:
      batch: a packed batch (from ``tfseq.pack``): ``key`` ``[B, T]`` and
        ``<key>_segment_ids`` int32 ``[B, T]``.
      key: the sequence feature to predict.

    Returns:
      ``(features, targets, weights)``: ``features`` is ``batch`` unchanged (the model reads
      ``key`` and its resets / segment ids / positions), ``targets`` ``[B, T]`` of ``key``'s
      dtype holds the next token of the same segment (0 where there is none), ``weights``
      float32 ``[B, T]`` is 1.0 where a target exists. See the module docstring.

    Raises:
      ValueError: ``key`` or its segment ids are missing.

    Example:
      >>> ds = ds.apply(tfseq.pack(512, max_tokens=8192)).map(tfseq.lm_targets)
    """
    segment_ids = _segment_ids(batch, key)
    ids = tf.convert_to_tensor(batch[key])
    next_ids = tf.concat([ids[:, 1:], tf.zeros_like(ids[:, :1])], axis=1)
    next_segment = tf.concat([segment_ids[:, 1:], tf.zeros_like(segment_ids[:, :1])], axis=1)
    has_target = (segment_ids > 0) & (next_segment == segment_ids)
    targets = tf.where(has_target, next_ids, tf.zeros_like(ids))
    return dict(batch), targets, tf.cast(has_target, tf.float32)
