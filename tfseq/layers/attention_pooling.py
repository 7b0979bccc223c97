"""AttentionPooling: a learned, masked weighted average over time, ``[B, T, D] -> [B, D]``.

Shapes: B = batch, T = time, D = features.

Each step gets the additive score ``w . tanh(x_t W + b)``; the weights are ``masked_softmax``
over the valid steps (pads get exactly 0), pad features are zeroed (``multiply_no_nan``) before
the weighted sum (so ``1e6``/``inf`` pads never reach the output) and an empty sequence pools to
an all-zero vector with zero gradients. Scores are normalised in float32 under mixed precision.

With ``segment_ids`` (packed rows, ``tfseq.pack``) the layer pools each segment separately,
``[B, T, D] -> [B, S, D]``: segment k's weights are ``masked_softmax`` over its own steps only,
so each packed example gets exactly the vector it would get alone in a padded batch (a padded
row is a packed row with one segment: ``segment_ids = ids != 0``, ``num_segments=1``).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tfseq.layers import _masks
from tfseq.layers.masked_softmax import masked_softmax, softmax_compute_dtype


@keras.saving.register_keras_serializable(package="tfseq")
class AttentionPooling(keras.layers.Layer):
    """Attention pooling over time (Yang et al. 2016 style), exact on padded/ragged batches.

    Args:
      units: hidden size of the score (default: D).
      **kwargs: forwarded to ``keras.layers.Layer`` (``name``, ``dtype``, ...).

    Call arguments:
      inputs: float ``[B, T, D]`` or RaggedTensor ``[B, (T), D]``.
      lengths: optional int ``[B]``: steps ``< lengths[b]`` are valid.
      mask: optional bool ``[B, T]`` (a Keras mask; filled in from masked inputs).
      return_attention_scores: if true, also return the weights ``[B, T]``.
      segment_ids: optional int ``[B, T]`` packed segment ids (1-based, 0 on padding): pool
        each segment separately. Needs a dense ``inputs``.
      num_segments: S, the number of segment columns to return with ``segment_ids`` (e.g. the
        packed batch's ``max_segments``, to line up with its ``[B, S]`` labels); default the
        batch's largest segment id. Segment ids above S are ignored.

    Returns:
      ``[B, D]`` in the layer's compute dtype, and with ``return_attention_scores`` the
      weights ``[B, T]``. With ``segment_ids``: ``[B, S, D]`` (zeros for a segment a row does
      not hold) and weights ``[B, S, T]``. The output carries no Keras mask.

    Raises:
      ValueError: ``units`` is not a positive int, or D is unknown at build time.

    Example:
      >>> pool = AttentionPooling(units=4)
      >>> pool(tf.ragged.constant([[[1.0, 2.0]], []], ragged_rank=1)).numpy().tolist()
      [[1.0, 2.0], [0.0, 0.0]]
    """

    def __init__(self, units: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if units is not None and (isinstance(units, bool) or not isinstance(units, int)
                                  or units <= 0):
            raise ValueError(f"units must be a positive int; received units={units!r}")
        self.units = units
        self.supports_masking = True

    def build(self, inputs_shape):
        depth = inputs_shape[-1]
        if depth is None:
            raise ValueError(
                f"AttentionPooling needs a known feature size; received {inputs_shape}")
        units = self.units or depth
        self.kernel = self.add_weight(name="kernel", shape=(depth, units),
                                      initializer="glorot_uniform")
        self.bias = self.add_weight(name="bias", shape=(units,), initializer="zeros")
        self.score_vector = self.add_weight(name="score_vector", shape=(units,),
                                            initializer="glorot_uniform")

    def call(self, inputs, lengths=None, mask=None, return_attention_scores=False,
             segment_ids=None, num_segments=None):
        if segment_ids is not None:
            return self._pool_segments(inputs, segment_ids, num_segments, lengths, mask,
                                       return_attention_scores)
        if mask is None and lengths is not None:
            mask = _masks.keras_mask(inputs)
        inputs, ragged_lengths = _masks.densify(inputs)
        valid = _masks.all_of(_masks.valid_mask(inputs, lengths=lengths, mask=mask),
                              _masks.valid_mask(inputs, lengths=ragged_lengths))
        inputs = _masks.zero_invalid(inputs, valid)
        logits = self._scores(inputs)
        weights = tf.cast(masked_softmax(logits, valid), inputs.dtype)
        outputs = tf.einsum("bt,btd->bd", weights, inputs)
        if return_attention_scores:
            return outputs, weights
        return outputs

    def _scores(self, inputs):
        """Unnormalised scores ``[B, T]`` in the softmax compute dtype."""
        hidden = tf.tanh(tf.matmul(inputs, tf.cast(self.kernel, inputs.dtype))
                         + tf.cast(self.bias, inputs.dtype))
        dtype = softmax_compute_dtype(inputs.dtype)
        return tf.reduce_sum(tf.cast(hidden, dtype) * tf.cast(self.score_vector, dtype), axis=-1)

    def _pool_segments(self, inputs, segment_ids, num_segments, lengths, mask,
                       return_attention_scores):
        if isinstance(inputs, tf.RaggedTensor):
            raise ValueError("AttentionPooling with segment_ids needs dense [B, T, D] inputs; "
                             f"received a RaggedTensor of shape {inputs.shape}")
        segment_ids = tf.cast(segment_ids, tf.int32)
        valid = _masks.valid_mask(inputs, lengths=lengths, mask=mask, segment_ids=segment_ids)
        inputs = _masks.zero_invalid(inputs, valid)
        logits = self._scores(inputs)
        if num_segments is None:
            num_segments = tf.reduce_max(tf.concat([tf.reshape(segment_ids, [-1]), [0]], 0))
        columns = tf.range(1, num_segments + 1, dtype=tf.int32)
        # member[b, k, t]: step t of row b belongs to segment k + 1.
        member = tf.logical_and(tf.equal(segment_ids[:, None, :], columns[None, :, None]),
                                valid[:, None, :])
        weights = tf.cast(masked_softmax(logits[:, None, :], member), inputs.dtype)
        outputs = tf.einsum("bst,btd->bsd", weights, inputs)
        if return_attention_scores:
            return outputs, weights
        return outputs

    def compute_mask(self, inputs, previous_mask=None, **kwargs):
        return None

    def get_config(self):
        config = super().get_config()
        config.update(units=self.units)
        return config
