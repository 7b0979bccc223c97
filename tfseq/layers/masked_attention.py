"""MaskedAttention: dot-product or additive attention that is exact on padded/packed batches.

Shapes: B = batch, Tq = query time, Tk = key/value time, Dq/Dk/Dv = feature sizes.

Which key a query may attend to is the AND of every mask given:

    source                         query side                 key side
    ragged inputs                  query row lengths          value (and key) row lengths
    query_lengths / value_lengths  steps < length             steps < length
    Keras masks (mask_zero=True)   query_mask                 value_mask, key_mask
    packed segment ids             query_segment_ids != 0     same nonzero segment id
    use_causal_mask                                           key step <= query step
    attention_mask                 bool [B, Tq, Tk], as given

Pad steps (from lengths, raggedness, Keras masks or segment id 0) are set to exactly 0 with
``tf.math.multiply_no_nan`` (0 even for ``inf``/``NaN``) before any matmul, so their features
never reach the output or the gradients, even when they are ``1e6``, ``inf`` or ``NaN``; they
also get exactly 0 attention weight. A query with no key to attend to (a pad query, or an empty
key sequence) gets an all-zero output row and zero gradients. Scores and the softmax run in
float32 when the layer computes in float16/bfloat16 (mixed precision), so ``q . k`` cannot
overflow.

This is ``masked_softmax`` fused for speed: once pads are zeroed every logit is finite, so the
mask can be an additive bias (0 or -1e30) that the matmul kernel fuses, instead of the
``tf.where`` pass ``masked_softmax`` needs to be exact for arbitrary (even NaN) pad logits; a
query with no valid key is zeroed on the output row (skipped at run time when there is none).
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from tfseq.layers import _masks
from tfseq.layers.masked_softmax import softmax_compute_dtype

SCORES = ("dot", "additive")

# Added to masked logits. Finite (a fully masked row stays finite: uniform, then zeroed), and far
# below any real float32 logit, so exp(logit + _MASK_BIAS - max) underflows to exactly 0.
_MASK_BIAS = -1e30


def _zero_rows(x, row_valid):
    """``x`` ``[B, Tq, N]`` with rows where ``row_valid`` is false set to 0; skipped at run time
    (``tf.cond``) when every row is valid, the common case."""
    if row_valid is None:
        return x
    row_valid = tf.broadcast_to(row_valid, tf.shape(x)[:2])
    return tf.cond(
        tf.reduce_all(row_valid),
        lambda: x,
        lambda: tf.where(row_valid[..., tf.newaxis], x, tf.zeros([], x.dtype)))


@keras.saving.register_keras_serializable(package="tfseq")
class MaskedAttention(keras.layers.Layer):
    """Attention of ``query`` over ``value`` with exact masking of pads and packed segments.

    ``score="dot"``: ``softmax(q k^T / sqrt(Dk))`` (scaled dot product, Luong/Vaswani; no
    weights; needs ``Dq == Dk``). ``score="additive"``: ``softmax(w . tanh(q Wq + k Wk + b))``
    (Bahdanau), with ``units`` hidden units.

    Args:
      score: ``"dot"`` or ``"additive"``.
      units: hidden size of the additive score (default: ``Dk``). Must be ``None`` for ``"dot"``.
      use_scale: for ``"dot"``, divide scores by ``sqrt(Dk)``. Ignored by ``"additive"``.
      dropout: dropout rate on the attention weights during training, in ``[0, 1)``.
      seed: seed for the dropout.
      **kwargs: forwarded to ``keras.layers.Layer`` (``name``, ``dtype``, ...).

    Call arguments:
      query: float ``[B, Tq, Dq]`` or RaggedTensor ``[B, (Tq), Dq]``.
      value: float ``[B, Tk, Dv]`` or RaggedTensor ``[B, (Tk), Dv]``.
      key: optional float ``[B, Tk, Dk]`` (or ragged); defaults to ``value``.
      query_lengths: optional int ``[B]``. value_lengths: optional int ``[B]`` (for key too).
      query_segment_ids: optional int ``[B, Tq]`` packed segment ids (0 = padding).
      value_segment_ids: optional int ``[B, Tk]``; defaults to ``query_segment_ids``
        (self-attention over a packed batch).
      attention_mask: optional bool ``[B, Tq, Tk]`` (or broadcastable); true = may attend.
      query_mask, value_mask, key_mask: optional bool ``[B, T]`` Keras masks; filled in
        automatically from masked inputs.
      use_causal_mask: if true, query step i attends only to key steps ``<= i``.
      return_attention_scores: if true, also return the weights ``[B, Tq, Tk]``.
      training: enables dropout.

    Returns:
      ``[B, Tq, Dv]`` in the layer's compute dtype (ragged ``[B, (Tq), Dv]`` if ``query`` is
      ragged), and with ``return_attention_scores`` the weights, dense ``[B, Tq, Tk]``.

    Raises:
      ValueError: unknown ``score``, ``units`` given for ``"dot"``, dropout out of range, or
        query and key feature sizes differ for ``"dot"``.

    Example:
      >>> attention = MaskedAttention(score="dot")
      >>> values = tf.ragged.constant([[[1.0], [3.0]], [[5.0]]], ragged_rank=1)
      >>> attention(tf.constant([[[0.0]], [[0.0]]]), values).numpy().tolist()
      [[[2.0]], [[5.0]]]
    """

    def __init__(self, score: str = "dot", units: int | None = None, use_scale: bool = True,
                 dropout: float = 0.0, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}; received score={score!r}")
        if units is not None:
            if score == "dot":
                raise ValueError(
                    f"units applies to score='additive' only; received units={units!r} with "
                    "score='dot'")
            if isinstance(units, bool) or not isinstance(units, int) or units <= 0:
                raise ValueError(f"units must be a positive int; received units={units!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); received dropout={dropout!r}")
        self.score = score
        self.units = units
        self.use_scale = bool(use_scale)
        self.dropout = float(dropout)
        self.seed = seed
        self.supports_masking = True
        self._dropout = keras.layers.Dropout(self.dropout, seed=seed) if self.dropout else None

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        query_dim, key_dim = query_shape[-1], key_shape[-1]
        if self.score == "dot":
            if query_dim is not None and key_dim is not None and query_dim != key_dim:
                raise ValueError(
                    "score='dot' needs query and key feature sizes to match; received "
                    f"query {query_dim} and key {key_dim}. Use score='additive' or project first.")
        else:
            if query_dim is None or key_dim is None:
                raise ValueError(
                    "score='additive' needs known feature sizes; received query shape "
                    f"{query_shape} and key shape {key_shape}")
            units = self.units or key_dim
            self.query_kernel = self.add_weight(
                name="query_kernel", shape=(query_dim, units), initializer="glorot_uniform")
            self.key_kernel = self.add_weight(
                name="key_kernel", shape=(key_dim, units), initializer="glorot_uniform")
            self.bias = self.add_weight(name="bias", shape=(units,), initializer="zeros")
            self.score_vector = self.add_weight(
                name="score_vector", shape=(units,), initializer="glorot_uniform")

    def call(self, query, value, key=None, query_lengths=None, value_lengths=None,
             query_segment_ids=None, value_segment_ids=None, attention_mask=None,
             query_mask=None, value_mask=None, key_mask=None, use_causal_mask=False,
             return_attention_scores=False, training=None):
        query, query_ragged_lengths = _masks.densify(query)
        value, value_ragged_lengths = _masks.densify(value)
        key_ragged_lengths = None
        if key is not None:
            key, key_ragged_lengths = _masks.densify(key)
        if value_segment_ids is None:
            value_segment_ids = query_segment_ids

        query_valid = _masks.all_of(
            _masks.valid_mask(query, lengths=query_lengths, mask=query_mask,
                              segment_ids=query_segment_ids),
            _masks.valid_mask(query, lengths=query_ragged_lengths))
        key_valid = _masks.all_of(
            _masks.valid_mask(value, lengths=value_lengths,
                              mask=_masks.all_of(value_mask, key_mask),
                              segment_ids=value_segment_ids),
            _masks.valid_mask(value, lengths=value_ragged_lengths),
            _masks.valid_mask(value, lengths=key_ragged_lengths))
        pair_mask = self._pair_mask(query, value, key_valid, query_segment_ids,
                                    value_segment_ids, attention_mask, use_causal_mask)

        value = _masks.zero_invalid(value, key_valid)
        key = value if key is None else _masks.zero_invalid(key, key_valid)
        logits = self._scores(query, key, query_valid)
        # Logits are finite here (pads were zeroed), so an additive bias masks exactly:
        # x + 0 == x on valid pairs, and exp(x - 1e30 - max) == 0 in float32 on masked ones.
        if pair_mask is not None:
            logits = logits + tf.where(pair_mask, tf.zeros([], logits.dtype),
                                       tf.constant(_MASK_BIAS, logits.dtype))
        weights = tf.nn.softmax(logits, axis=-1)
        row_valid = self._row_valid(query_valid, key_valid, pair_mask)
        if self._dropout is not None:
            weights = self._dropout(weights, training=training)
        weights = tf.cast(weights, value.dtype)
        outputs = _zero_rows(tf.matmul(weights, value), row_valid)
        if query_ragged_lengths is not None:
            outputs = tf.RaggedTensor.from_tensor(outputs, lengths=query_ragged_lengths)
        if return_attention_scores:
            return outputs, _zero_rows(weights, row_valid)
        return outputs

    def _scores(self, query, key, query_valid):
        """float32 (float64 for float64 inputs) logits ``[B, Tq, Tk]``; pad queries score 0."""
        dtype = softmax_compute_dtype(query.dtype)
        if self.score == "dot":
            scale = None
            if self.use_scale:
                depth = query.shape[-1]
                if depth is None:
                    raise ValueError(f"score='dot' with use_scale needs a known query feature "
                                     f"size; received query shape {query.shape}")
                scale = 1.0 / math.sqrt(depth)
            query = _masks.zero_invalid(tf.cast(query, dtype), query_valid, scale)
            return tf.matmul(query, tf.cast(key, dtype), transpose_b=True)
        query = _masks.zero_invalid(query, query_valid)
        projected_query = tf.cast(tf.matmul(query, tf.cast(self.query_kernel, query.dtype)), dtype)
        projected_key = tf.cast(tf.matmul(key, tf.cast(self.key_kernel, key.dtype)), dtype)
        hidden = tf.tanh(projected_query[:, :, tf.newaxis, :] + projected_key[:, tf.newaxis, :, :]
                         + tf.cast(self.bias, dtype))
        return tf.reduce_sum(hidden * tf.cast(self.score_vector, dtype), axis=-1)

    @staticmethod
    def _pair_mask(query, key, key_valid, query_segment_ids, value_segment_ids,
                   attention_mask, use_causal_mask):
        """bool mask broadcastable to ``[B, Tq, Tk]``, or ``None`` when everything is valid."""
        same_segment = None
        if query_segment_ids is not None:
            query_segment_ids = tf.convert_to_tensor(query_segment_ids)
            value_segment_ids = tf.cast(value_segment_ids, query_segment_ids.dtype)
            same_segment = tf.equal(query_segment_ids[:, :, tf.newaxis],
                                    value_segment_ids[:, tf.newaxis, :])
        causal = None
        if use_causal_mask:
            ones = tf.ones(tf.stack([tf.shape(query)[1], tf.shape(key)[1]]), tf.bool)
            causal = tf.linalg.band_part(ones, -1, 0)[tf.newaxis]
        key_side = None if key_valid is None else key_valid[:, tf.newaxis, :]
        return _masks.all_of(key_side, same_segment, causal, attention_mask)

    @staticmethod
    def _row_valid(query_valid, key_valid, pair_mask):
        """bool broadcastable to ``[B, Tq]``: queries with at least one key to attend to."""
        if pair_mask is None:
            return query_valid
        has_key = tf.reduce_any(pair_mask, axis=-1)  # [B, 1] for a key-side mask: cheap
        return _masks.all_of(query_valid, has_key)

    def get_config(self):
        config = super().get_config()
        config.update(score=self.score, units=self.units, use_scale=self.use_scale,
                      dropout=self.dropout, seed=self.seed)
        return config
