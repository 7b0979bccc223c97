"""AttentionPooling: a learned, masked weighted average over time, ``[B, T, D] -> [B, D]``.

Shapes: B = batch, T = time, D = features.

Each step gets the additive score ``w . tanh(x_t W + b)``; the weights are ``masked_softmax``
over the valid steps (pads get exactly 0), pad features are zeroed (``multiply_no_nan``) before
the weighted sum (so ``1e6``/``inf`` pads never reach the output) and an empty sequence pools to
an all-zero vector with zero gradients. Scores are normalised in float32 under mixed precision.
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

    Returns:
      ``[B, D]`` in the layer's compute dtype, and with ``return_attention_scores`` the
      weights ``[B, T]``. The output carries no Keras mask.

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

    def call(self, inputs, lengths=None, mask=None, return_attention_scores=False):
        if mask is None and lengths is not None:
            mask = _masks.keras_mask(inputs)
        inputs, ragged_lengths = _masks.densify(inputs)
        valid = _masks.all_of(_masks.valid_mask(inputs, lengths=lengths, mask=mask),
                              _masks.valid_mask(inputs, lengths=ragged_lengths))
        inputs = _masks.zero_invalid(inputs, valid)
        hidden = tf.tanh(tf.matmul(inputs, tf.cast(self.kernel, inputs.dtype))
                         + tf.cast(self.bias, inputs.dtype))
        dtype = softmax_compute_dtype(inputs.dtype)
        logits = tf.reduce_sum(tf.cast(hidden, dtype) * tf.cast(self.score_vector, dtype), axis=-1)
        weights = tf.cast(masked_softmax(logits, valid), inputs.dtype)
        outputs = tf.einsum("bt,btd->bd", weights, inputs)
        if return_attention_scores:
            return outputs, weights
        return outputs

    def compute_mask(self, inputs, previous_mask=None):
        return None

    def get_config(self):
        config = super().get_config()
        config.update(units=self.units)
        return config
