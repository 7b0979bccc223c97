"""Verse classifier: embedding -> bidirectional GRU (masked) -> attention pooling -> softmax.

Input: ``{"ids": int32 [B, T]}`` padded with 0. Padding never reaches the output: the GRU
skips masked steps (Keras mask from ``Embedding(mask_zero=True)``) and the pooling gives pads
exactly zero weight through ``tfseq.masked_softmax``.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tfseq.layers.masked_softmax import masked_softmax


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    embedding_dim: int = 64
    hidden_dim: int = 64
    dropout: float = 0.1
    learning_rate: float = 3e-3


@keras.saving.register_keras_serializable(package="tfseq")
class _MaskedAttentionPooling(keras.layers.Layer):
    """``[B, T, D]`` + ids ``[B, T]`` -> ``[B, D]``: a learned query attends over real steps."""

    def build(self, input_shape):
        self.score = keras.layers.Dense(1, use_bias=False, name="score")
        self.score.build(input_shape[0])

    def call(self, inputs):
        values, ids = inputs
        logits = tf.squeeze(self.score(values), -1)                  # [B, T]
        weights = masked_softmax(logits, tf.not_equal(ids, 0))        # [B, T]
        weights = tf.cast(weights, values.dtype)
        return tf.einsum("bt,btd->bd", weights, values)

    def compute_mask(self, inputs, mask=None):
        return None


def build_model(config, info, model_config: ModelConfig = ModelConfig()) -> keras.Model:
    """A compiled classifier over ``info["vocab"]`` with ``info["num_classes"]`` outputs."""
    ids = keras.Input(shape=(None,), dtype="int32", name="ids")
    x = keras.layers.Embedding(info["vocab"].size, model_config.embedding_dim, mask_zero=True)(ids)
    x = keras.layers.Bidirectional(
        keras.layers.GRU(model_config.hidden_dim, return_sequences=True))(x)
    x = keras.layers.Dropout(model_config.dropout)(x)
    x = _MaskedAttentionPooling(name="pool")([x, ids])
    logits = keras.layers.Dense(info["num_classes"], dtype="float32", name="logits")(x)
    model = keras.Model({"ids": ids}, logits, name="verse_classifier")
    model.compile(
        optimizer=keras.optimizers.Adam(model_config.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"])
    return model
