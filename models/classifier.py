"""Verse classifier: embedding -> bidirectional GRU (masked) -> attention pooling -> softmax.

Input: ``{"ids": int32 [B, T]}`` padded with 0. Padding never reaches the output: the GRU
skips masked steps (Keras mask from ``Embedding(mask_zero=True)``) and
``tfseq.layers.AttentionPooling`` (which receives the same Keras mask) gives pads exactly zero
weight and zeroes their features before the weighted sum.
"""

from __future__ import annotations

import dataclasses

import keras

from tfseq.distribute import GlobalWeightedLoss
from tfseq.layers import AttentionPooling


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    embedding_dim: int = 64
    hidden_dim: int = 64
    dropout: float = 0.1
    learning_rate: float = 3e-3


def build_model(config, info, model_config: ModelConfig = ModelConfig()) -> keras.Model:
    """A compiled classifier over ``info["vocab"]`` with ``info["num_classes"]`` outputs.

    The loss is normalised by the sample weight summed over all replicas
    (``tfseq.GlobalWeightedLoss``): on one device it is the usual (weighted) mean; under a
    strategy with ``split_batch`` dummy rows (weight 0) it leaves the update unchanged.
    Build it under ``strategy.scope()`` for several replicas.
    """
    ids = keras.Input(shape=(None,), dtype="int32", name="ids")
    x = keras.layers.Embedding(info["vocab"].size, model_config.embedding_dim, mask_zero=True)(ids)
    x = keras.layers.Bidirectional(
        keras.layers.GRU(model_config.hidden_dim, return_sequences=True))(x)
    x = keras.layers.Dropout(model_config.dropout)(x)
    x = AttentionPooling(name="pool")(x)
    logits = keras.layers.Dense(info["num_classes"], dtype="float32", name="logits")(x)
    model = keras.Model({"ids": ids}, logits, name="verse_classifier")
    model.compile(
        optimizer=keras.optimizers.Adam(model_config.learning_rate),
        loss=GlobalWeightedLoss(keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
        weighted_metrics=["accuracy"])
    return model
