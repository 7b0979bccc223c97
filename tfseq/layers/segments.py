"""Segment helpers for packed rows: attention masks and per-segment pooling.

Shapes: B = rows, T = time, D = features, S = segments per row.

A token attends only to tokens of its own segment (``segment_attention_mask``).
For segment ids ``[1, 1, 2, 0]`` the mask (query rows, key columns) is::

    1 1 0 0
    1 1 0 0
    0 0 1 0
    0 0 0 0

A padding query has no valid key; ``masked_softmax`` turns such a row into zeros.
"""

from __future__ import annotations

import keras
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


def segment_mean(values: tf.Tensor, segment_ids: tf.Tensor, num_segments: int) -> tf.Tensor:
    """Mean of ``values`` over each segment of each row: one vector per packed example.

    Args:
      values: float ``[B, T, D]``.
      segment_ids: int ``[B, T]``, 1-based, 0 on padding, at most ``num_segments``.
      num_segments: S, e.g. the width of the packed batch's scalar tables (its
        ``max_segments``), so the result lines up with per-segment labels ``[B, S]``.

    Returns:
      ``[B, S, D]``: row b, column k-1 is the mean over segment k of row b; zeros where the
      row has no segment k (``tf.range(S) < tf.reduce_max(segment_ids, 1)[:, None]`` marks
      the present ones).
    """
    values = tf.convert_to_tensor(values)
    segment_ids = tf.cast(segment_ids, tf.int32)
    batch = tf.shape(values)[0]
    width = num_segments + 1
    flat_ids = tf.reshape(segment_ids + tf.range(batch)[:, None] * width, [-1])
    flat_values = tf.reshape(values, [-1, tf.shape(values)[2]])
    means = tf.math.unsorted_segment_mean(flat_values, flat_ids, batch * width)
    return tf.reshape(means, [batch, width, -1])[:, 1:]


POOLING_MODES = ("mean", "max", "sum")


@keras.saving.register_keras_serializable(package="tfseq")
class SegmentPooling(keras.layers.Layer):
    """Pools each packed segment: ``[B, T, D]`` + segment ids ``[B, T]`` -> ``[B, S, D]``.

    A padded batch is a packed batch with one segment per row (``segment_ids = ids != 0``,
    ``num_segments=1``), so the same layer pools both, with the same result per example.

    Args:
      num_segments: S, e.g. the packed batch's ``max_segments`` (the width of its ``[B, S]``
        label table).
      mode: ``"mean"``, ``"max"`` or ``"sum"`` over the segment's steps.
      **kwargs: forwarded to ``keras.layers.Layer``.

    Call arguments:
      values: float ``[B, T, D]``.
      segment_ids: int ``[B, T]``, 1-based, 0 on padding; ids above S are ignored.

    Returns:
      ``[B, S, D]``; all zeros for a segment the row does not hold (also for ``"max"``).

    Raises:
      ValueError: ``num_segments`` is not a positive int or ``mode`` is unknown.
    """

    def __init__(self, num_segments: int, mode: str = "mean", **kwargs):
        super().__init__(**kwargs)
        if isinstance(num_segments, bool) or not isinstance(num_segments, int) \
                or num_segments <= 0:
            raise ValueError(f"num_segments must be a positive int; received {num_segments!r}")
        if mode not in POOLING_MODES:
            raise ValueError(f"mode must be one of {POOLING_MODES}; received mode={mode!r}")
        self.num_segments = num_segments
        self.mode = mode

    def call(self, values, segment_ids):
        values = tf.convert_to_tensor(values)
        segment_ids = tf.cast(segment_ids, tf.int32)
        width = self.num_segments + 1
        segment_ids = tf.where(segment_ids > self.num_segments, 0, segment_ids)
        batch = tf.shape(values)[0]
        flat_ids = tf.reshape(segment_ids + tf.range(batch)[:, None] * width, [-1])
        flat_values = tf.reshape(values, [-1, tf.shape(values)[2]])
        reduce = {"mean": tf.math.unsorted_segment_mean, "max": tf.math.unsorted_segment_max,
                  "sum": tf.math.unsorted_segment_sum}[self.mode]
        pooled = reduce(flat_values, flat_ids, batch * width)
        counts = tf.math.unsorted_segment_sum(tf.ones_like(flat_ids), flat_ids, batch * width)
        # unsorted_segment_max gives the dtype's lowest value for an empty segment: zero it.
        pooled = tf.where((counts > 0)[:, None], pooled, tf.zeros([], pooled.dtype))
        out = tf.reshape(pooled, [batch, width, -1])[:, 1:]
        out.set_shape([values.shape[0], self.num_segments, values.shape[-1]])
        return out

    def compute_output_shape(self, values_shape, segment_ids_shape):
        return (values_shape[0], self.num_segments, values_shape[-1])

    def compute_mask(self, *args, **kwargs):
        return None

    def get_config(self):
        return {**super().get_config(), "num_segments": self.num_segments, "mode": self.mode}
