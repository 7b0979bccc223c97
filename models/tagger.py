"""Sequence tagger: embedding -> bidirectional GRU -> per-token tag logits, per example.

One model for every batching mode, with the same weights and the same per-token function:

    padded   {"ids": int32 [B, T], "ids_length": int32 [B]}            -> logits [B, T, K + 1]
    ragged   {"ids": int32 RaggedTensor [B, (T)]}                       -> logits [B, T, K + 1]
    packed   {"ids", "ids_segment_ids", "ids_resets": int32 [B, L]}     -> logits [B, L, K + 1]

K tags (``pipelines.tag``: tag ids 1..K, 0 is padding). The recurrent layer is a bidirectional
``tfseq.layers.ResettableRNN``: the forward direction restarts at each segment start and the
backward one at each segment end, so a token's logits depend on its own sentence only, in a
padded row (one segment) as in a packed one.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tfseq.distribute import GlobalWeightedLoss
from tfseq.layers import ResettableRNN


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    embedding_dim: int = 64
    hidden_dim: int = 96
    dropout: float = 0.1
    learning_rate: float = 3e-3


@keras.saving.register_keras_serializable(package="tfseq")
class SequenceTagger(keras.Model):
    """Per-token tag logits over padded, ragged or packed batches (see the module docstring).

    Args:
      vocab_size: embedding rows (id 0 is ``<pad>``).
      num_tags: K; the logits have K + 1 columns (column 0: padding, never a target).
      embedding_dim, hidden_dim: sizes (the BiGRU outputs ``2 * hidden_dim``).
      dropout: rate before the output layer.
      **kwargs: forwarded to ``keras.Model``.
    """

    def __init__(self, vocab_size: int, num_tags: int, embedding_dim: int = 64,
                 hidden_dim: int = 96, dropout: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.num_tags = num_tags
        self.embedding_dim = embedding_dim
        self.hidden_dim = hidden_dim
        self.dropout_rate = dropout
        self.embedding = keras.layers.Embedding(vocab_size, embedding_dim, name="embedding")
        self.rnn = ResettableRNN(keras.layers.GRUCell(hidden_dim), bidirectional=True,
                                 name="rnn")
        self.dropout = keras.layers.Dropout(dropout, name="dropout")
        self.head = keras.layers.Dense(num_tags + 1, dtype="float32", name="logits")

    def call(self, inputs, training=None):
        ids = inputs["ids"]
        lengths = inputs.get("ids_length")
        if isinstance(ids, tf.RaggedTensor):
            lengths = tf.cast(ids.row_lengths(), tf.int32)
            ids = ids.to_tensor()
        ids = tf.cast(ids, tf.int32)
        if "ids_segment_ids" in inputs:
            segment_ids = tf.cast(inputs["ids_segment_ids"], tf.int32)
            resets = inputs.get("ids_resets")
        else:
            real = (tf.not_equal(ids, 0) if lengths is None
                    else tf.sequence_mask(lengths, tf.shape(ids)[1]))
            segment_ids, resets = tf.cast(real, tf.int32), None
        x = self.embedding(ids)
        x = self.rnn(x, resets=resets, segment_ids=segment_ids, training=training)
        return self.head(self.dropout(x, training=training))

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size,
                "num_tags": self.num_tags, "embedding_dim": self.embedding_dim,
                "hidden_dim": self.hidden_dim, "dropout": self.dropout_rate}


def build_model(config, state, model_config: ModelConfig = ModelConfig()) -> keras.Model:
    """A compiled ``SequenceTagger`` over ``state.vocab`` and ``state.labels["tags"]``; the
    loss and token accuracy count real tokens only (weights 0 on padding), normalised over all
    replicas (``tfseq.GlobalWeightedLoss``)."""
    model = SequenceTagger(state.vocab.size, len(state.labels["tags"]),
                           embedding_dim=model_config.embedding_dim,
                           hidden_dim=model_config.hidden_dim, dropout=model_config.dropout,
                           name="tagger")
    model({"ids": tf.ones([1, 1], tf.int32), "ids_length": tf.ones([1], tf.int32)})
    model.compile(
        optimizer=keras.optimizers.Adam(model_config.learning_rate, clipnorm=1.0),
        loss=GlobalWeightedLoss(keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    return model
