"""Verse classifier: embedding -> bidirectional GRU -> attention pooling -> logits, per example.

One model for every batching mode, with the same weights and the same per-example function:

    padded   {"ids": int32 [B, T]} (0 = pad)                         -> logits float32 [B, C]
    ragged   {"ids": int32 RaggedTensor [B, (T)]}                    -> logits float32 [B, C]
    packed   {"ids", "ids_segment_ids", "ids_resets": int32 [B, L]}  -> logits float32 [B, S, C]

A padded row is a packed row holding one segment (``segment_ids = ids != 0``). The recurrent
layer is a bidirectional ``tfseq.layers.ResettableRNN``: the forward direction restarts at each
segment start and the backward one at each segment end, so no example sees its neighbours in a
packed row; ``tfseq.layers.AttentionPooling`` with ``segment_ids`` pools each segment over its
own steps only (``masked_softmax``: pads and other segments get exactly 0 weight). A packed
batch gives one prediction per segment column, ``S = config.max_segments`` (the width of the
pipeline's ``[B, S]`` label table); columns a row does not hold are zero vectors through the
head and weigh 0 in the loss and the metrics.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tfseq.distribute import GlobalWeightedLoss
from tfseq.layers import AttentionPooling, ResettableRNN


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    embedding_dim: int = 64
    hidden_dim: int = 64
    dropout: float = 0.1
    learning_rate: float = 3e-3


def segments_of(inputs, key: str = "ids"):
    """``(ids [B, T], segment_ids [B, T], resets [B, T] or None, packed)`` of a model input.

    A packed input (it has ``"<key>_segment_ids"``) is returned as is; a padded or ragged one
    becomes one segment per row: ``segment_ids = ids != 0`` and resets at step 0 only (implied
    by the zero initial state).
    """
    ids = inputs[key]
    if isinstance(ids, tf.RaggedTensor):
        ids = ids.to_tensor()
    ids = tf.cast(ids, tf.int32)
    if f"{key}_segment_ids" in inputs:
        resets = inputs.get(f"{key}_resets")
        return ids, tf.cast(inputs[f"{key}_segment_ids"], tf.int32), resets, True
    return ids, tf.cast(tf.not_equal(ids, 0), tf.int32), None, False


@keras.saving.register_keras_serializable(package="tfseq")
class SequenceClassifier(keras.Model):
    """BiGRU + attention-pooling classifier over padded, ragged or packed batches.

    Args:
      vocab_size: embedding rows (id 0 is ``<pad>``).
      num_classes: C.
      embedding_dim, hidden_dim: sizes (the BiGRU outputs ``2 * hidden_dim``).
      dropout: rate after the recurrent layer.
      max_segments: S, segment columns returned for a packed batch.
      **kwargs: forwarded to ``keras.Model`` (``name``).

    Call arguments:
      inputs: a dict as in the module docstring.
      training: enables dropout.

    Returns:
      float32 logits ``[B, C]`` (padded or ragged input) or ``[B, S, C]`` (packed input).
    """

    def __init__(self, vocab_size: int, num_classes: int, embedding_dim: int = 64,
                 hidden_dim: int = 64, dropout: float = 0.1, max_segments: int = 32, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.num_classes = num_classes
        self.embedding_dim = embedding_dim
        self.hidden_dim = hidden_dim
        self.dropout_rate = dropout
        self.max_segments = max_segments
        self.embedding = keras.layers.Embedding(vocab_size, embedding_dim, name="embedding")
        self.rnn = ResettableRNN(keras.layers.GRUCell(hidden_dim), bidirectional=True,
                                 name="rnn")
        self.dropout = keras.layers.Dropout(dropout, name="dropout")
        self.pool = AttentionPooling(name="pool")
        self.head = keras.layers.Dense(num_classes, dtype="float32", name="logits")

    def call(self, inputs, training=None):
        ids, segment_ids, resets, packed = segments_of(inputs)
        x = self.embedding(ids)
        x = self.rnn(x, resets=resets, segment_ids=segment_ids, training=training)
        x = self.dropout(x, training=training)
        x = self.pool(x, segment_ids=segment_ids,
                      num_segments=self.max_segments if packed else 1)
        logits = self.head(x)  # [B, S, C]
        return logits if packed else logits[:, 0]

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size,
                "num_classes": self.num_classes, "embedding_dim": self.embedding_dim,
                "hidden_dim": self.hidden_dim, "dropout": self.dropout_rate,
                "max_segments": self.max_segments}


def build_model(config, state, model_config: ModelConfig = ModelConfig()) -> keras.Model:
    """A compiled ``SequenceClassifier`` over ``state.vocab`` and ``state.labels["label"]``.

    The same model (and weights) serves every ``config.batching``; a packed batch returns
    ``config.max_segments`` columns. The loss is normalised by the sample weight summed over
    all replicas (``tfseq.GlobalWeightedLoss``): on one device it is the usual weighted mean;
    under a strategy with ``split_batch`` dummy rows (weight 0) it leaves the update unchanged.
    Build it under ``strategy.scope()`` for several replicas.
    """
    model = SequenceClassifier(
        state.vocab.size, len(state.labels["label"]), embedding_dim=model_config.embedding_dim,
        hidden_dim=model_config.hidden_dim, dropout=model_config.dropout,
        max_segments=getattr(config, "max_segments", 32), name="verse_classifier")
    model({"ids": tf.zeros([1, 1], tf.int32)})  # creates the weights
    model.compile(
        optimizer=keras.optimizers.Adam(model_config.learning_rate),
        loss=GlobalWeightedLoss(keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
        weighted_metrics=["accuracy"])
    return model
