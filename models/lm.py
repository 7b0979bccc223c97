"""Recurrent language model: embedding -> GRU or LSTM (ResettableRNN) -> next-token logits.

One model for every batching mode, with the same weights and the same per-token function:

    padded   {"ids": int32 [B, T], "ids_length": int32 [B]}            -> logits float32 [B, T, V]
    ragged   {"ids": int32 RaggedTensor [B, (T)]}                       -> logits float32 [B, T, V]
    packed   {"ids", "ids_segment_ids", "ids_resets": int32 [B, L]}     -> logits float32 [B, L, V]

(from ``pipelines.lm``). ``tfseq.layers.ResettableRNN`` starts every example from the zero state
(a padded row is a packed row with one segment), restarts it at each packed segment start, and
keeps it over padding, so a token's logits depend on its own example's earlier tokens only. A
piece of a long example split across rows (``resets`` false at its first step) continues from
the previous step of its row. The loss is averaged over real target tokens only (weights 0 on
padding; ``tfseq.GlobalWeightedLoss``), so ``exp(loss)`` is the per-token perplexity.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tfseq.distribute import GlobalWeightedLoss
from tfseq.layers import ResettableRNN

CELLS = {"gru": keras.layers.GRUCell, "lstm": keras.layers.LSTMCell}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    cell: str = "gru"                      # "gru" or "lstm"
    embedding_dim: int = 64
    hidden_dim: int = 96
    dropout: float = 0.1
    learning_rate: float = 3e-3


@keras.saving.register_keras_serializable(package="tfseq")
class LanguageModel(keras.Model):
    """Next-token logits over padded, ragged or packed batches (see the module docstring).

    Args:
      vocab_size: V.
      cell: ``"gru"`` or ``"lstm"``.
      embedding_dim, hidden_dim: sizes.
      dropout: rate after the recurrent layer.
      **kwargs: forwarded to ``keras.Model``.

    Raises:
      ValueError: unknown ``cell``.
    """

    def __init__(self, vocab_size: int, cell: str = "gru", embedding_dim: int = 64,
                 hidden_dim: int = 96, dropout: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        if cell not in CELLS:
            raise ValueError(f"Unknown cell {cell!r}; expected one of {sorted(CELLS)}")
        self.vocab_size = vocab_size
        self.cell_type = cell
        self.embedding_dim = embedding_dim
        self.hidden_dim = hidden_dim
        self.dropout_rate = dropout
        self.embedding = keras.layers.Embedding(vocab_size, embedding_dim, name="embedding")
        self.rnn = ResettableRNN(CELLS[cell](hidden_dim), name="rnn")
        self.dropout = keras.layers.Dropout(dropout, name="dropout")
        self.head = keras.layers.Dense(vocab_size, dtype="float32", name="logits")

    def call(self, inputs, training=None):
        ids = inputs["ids"]
        if isinstance(ids, tf.RaggedTensor):
            lengths = tf.cast(ids.row_lengths(), tf.int32)
            ids = ids.to_tensor()
        else:
            lengths = inputs.get("ids_length")
        ids = tf.cast(ids, tf.int32)
        x = self.embedding(ids)
        if "ids_segment_ids" in inputs:
            x = self.rnn(x, resets=inputs.get("ids_resets"),
                         segment_ids=inputs["ids_segment_ids"], training=training)
        else:
            valid = (tf.not_equal(ids, 0) if lengths is None
                     else tf.sequence_mask(lengths, tf.shape(ids)[1]))
            x = self.rnn(x, mask=valid, training=training)
        x = self.dropout(x, training=training)
        return self.head(x)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "cell": self.cell_type,
                "embedding_dim": self.embedding_dim, "hidden_dim": self.hidden_dim,
                "dropout": self.dropout_rate}


def build_model(config, state, model_config: ModelConfig = ModelConfig()) -> keras.Model:
    """A compiled ``LanguageModel`` over ``state.vocab``; the same for every batching. The loss
    is normalised by the real target tokens summed over all replicas
    (``tfseq.GlobalWeightedLoss``), so ``exp(loss)`` is the per-token perplexity.

    Raises:
      ValueError: unknown ``model_config.cell``.
    """
    model = LanguageModel(state.vocab.size, cell=model_config.cell,
                          embedding_dim=model_config.embedding_dim,
                          hidden_dim=model_config.hidden_dim, dropout=model_config.dropout,
                          name="language_model")
    model({"ids": tf.zeros([1, 1], tf.int32), "ids_length": tf.zeros([1], tf.int32)})
    model.compile(
        optimizer=keras.optimizers.Adam(model_config.learning_rate, clipnorm=1.0),
        loss=GlobalWeightedLoss(keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    return model
