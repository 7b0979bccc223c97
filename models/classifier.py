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
from tfseq.layers import AttentionPooling, ResettableRNN, segment_mean


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    embedding_dim: int = 64
    hidden_dim: int = 64
    dropout: float = 0.1
    learning_rate: float = 3e-3


@keras.saving.register_keras_serializable(package="tfseq")
class SegmentMean(keras.layers.Layer):
    """``[B, T, D]`` + segment ids ``[B, T]`` -> ``[B, S, D]``: mean over each packed segment."""

    def __init__(self, num_segments: int, **kwargs):
        super().__init__(**kwargs)
        self.num_segments = num_segments

    def call(self, values, segment_ids):
        out = segment_mean(values, segment_ids, self.num_segments)
        out.set_shape([None, self.num_segments, values.shape[-1]])
        return out

    def compute_output_shape(self, values_shape, segment_ids_shape):
        return (values_shape[0], self.num_segments, values_shape[-1])

    def compute_mask(self, *args, **kwargs):
        return None

    def get_config(self):
        return {**super().get_config(), "num_segments": self.num_segments}


def build_packed_model(config, info, model_config: ModelConfig = ModelConfig()) -> keras.Model:
    """Classifier over packed rows: one prediction per segment (verse), ``[B, S, classes]``.

    A forward GRU whose state is reset at every segment start (``ResettableRNN``), so no verse
    sees its neighbours, then the mean over each segment's steps.
    """
    ids = keras.Input(shape=(None,), dtype="int32", name="ids")
    segment_ids = keras.Input(shape=(None,), dtype="int32", name="ids_segment_ids")
    resets = keras.Input(shape=(None,), dtype="int32", name="ids_resets")  # 1 at segment starts
    x = keras.layers.Embedding(info["vocab"].size, model_config.embedding_dim)(ids)
    x = ResettableRNN(keras.layers.GRUCell(2 * model_config.hidden_dim))(
        x, keras.ops.greater(resets, 0), mask=keras.ops.greater(segment_ids, 0))
    x = keras.layers.Dropout(model_config.dropout)(x)
    x = SegmentMean(config.max_segments, name="segment_mean")(x, segment_ids)
    logits = keras.layers.Dense(info["num_classes"], dtype="float32", name="logits")(x)
    model = keras.Model({"ids": ids, "ids_segment_ids": segment_ids, "ids_resets": resets},
                        logits, name="packed_verse_classifier")
    model.compile(
        optimizer=keras.optimizers.Adam(model_config.learning_rate),
        loss=GlobalWeightedLoss(keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
        weighted_metrics=["accuracy"])
    return model


def build_model(config, info, model_config: ModelConfig = ModelConfig()) -> keras.Model:
    """A compiled classifier over ``info["vocab"]`` with ``info["num_classes"]`` outputs.

    The loss is normalised by the sample weight summed over all replicas
    (``tfseq.GlobalWeightedLoss``): on one device it is the usual (weighted) mean; under a
    strategy with ``split_batch`` dummy rows (weight 0) it leaves the update unchanged.
    Build it under ``strategy.scope()`` for several replicas. ``config.batching == "pack"``
    gives ``build_packed_model``.
    """
    if getattr(config, "batching", None) == "pack":
        return build_packed_model(config, info, model_config)
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
