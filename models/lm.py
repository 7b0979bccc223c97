"""Recurrent language model: embedding -> GRU or LSTM (RaggedRNN) -> next-token logits.

Input ``{"ids": int32 [B, T], "ids_length": int32 [B]}`` from ``pipelines.lm``; output float32
logits ``[B, T, V]``. The RNN skips pad steps (``tfseq.layers.RaggedRNN`` with the lengths)
and the loss is averaged over real target tokens only (weights 0 on padding, reduction
``mean_with_sample_weight``), so ``exp(loss)`` is the per-token perplexity.
"""

from __future__ import annotations

import dataclasses

import keras

from tfseq.layers import RaggedRNN, ResettableRNN

CELLS = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM}
PACKED_CELLS = {"gru": keras.layers.GRUCell, "lstm": keras.layers.LSTMCell}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    cell: str = "gru"                      # "gru" or "lstm"
    embedding_dim: int = 64
    hidden_dim: int = 96
    dropout: float = 0.1
    learning_rate: float = 3e-3


def build_model(config, info, model_config: ModelConfig = ModelConfig()) -> keras.Model:
    """A compiled language model over ``info["vocab"]``.

    Raises:
      ValueError: unknown ``model_config.cell``.
    """
    if model_config.cell not in CELLS:
        raise ValueError(f"Unknown cell {model_config.cell!r}; expected one of {sorted(CELLS)}")
    vocab_size = info["vocab"].size
    ids = keras.Input(shape=(None,), dtype="int32", name="ids")
    x = keras.layers.Embedding(vocab_size, model_config.embedding_dim, name="embedding")(ids)
    if getattr(config, "batching", None) == "pack":
        # Packed rows: the state is reset at every segment start, padding keeps it.
        segment_ids = keras.Input(shape=(None,), dtype="int32", name="ids_segment_ids")
        resets = keras.Input(shape=(None,), dtype="int32", name="ids_resets")
        inputs = {"ids": ids, "ids_segment_ids": segment_ids, "ids_resets": resets}
        cell = PACKED_CELLS[model_config.cell](model_config.hidden_dim)
        x = ResettableRNN(cell, name="rnn")(x, keras.ops.greater(resets, 0),
                                            mask=keras.ops.greater(segment_ids, 0))
    else:
        lengths = keras.Input(shape=(), dtype="int32", name="ids_length")
        inputs = {"ids": ids, "ids_length": lengths}
        rnn = CELLS[model_config.cell](model_config.hidden_dim, return_sequences=True)
        x = RaggedRNN(rnn, name="rnn")(x, lengths=lengths)
    x = keras.layers.Dropout(model_config.dropout)(x)
    logits = keras.layers.Dense(vocab_size, dtype="float32", name="logits")(x)
    model = keras.Model(inputs, logits, name="language_model")
    model.compile(
        optimizer=keras.optimizers.Adam(model_config.learning_rate, clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="mean_with_sample_weight"),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    return model
