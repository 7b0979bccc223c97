"""Seq2seq with attention: BiGRU encoder, GRU decoder, additive attention over the source.

Training (teacher forcing) takes the features of ``pipelines.translate``::

    source [B, S] --embedding--> RaggedRNN(Bidirectional(GRU)) --> encoder outputs [B, S, 2H]
                                               \\-- last fwd/bwd states -> bridge -> h0 [B, H]
    target_in [B, T] --embedding--> RaggedRNN(GRU, initial_state=h0) --> decoder [B, T, H]
    MaskedAttention("additive")(decoder, encoder outputs, lengths) --> context [B, T, 2H]
    [decoder, context] -> tanh projection -> float32 logits [B, T, V]

Source pads never reach the context (exact masking) and the loss is averaged over real target
tokens. ``greedy_decode`` reuses the same layers one step at a time.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from tfseq.layers import MaskedAttention, RaggedRNN
from tfseq.text import BOS_ID, PAD_ID, UNK_ID


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    embedding_dim: int = 64
    hidden_dim: int = 96
    dropout: float = 0.1
    learning_rate: float = 3e-3


def build_model(config, info, model_config: ModelConfig = ModelConfig()) -> keras.Model:
    """A compiled translation model over ``info["source_vocab"]`` -> ``info["target_vocab"]``."""
    hidden = model_config.hidden_dim
    source = keras.Input(shape=(None,), dtype="int32", name="source")
    source_length = keras.Input(shape=(), dtype="int32", name="source_length")
    target_in = keras.Input(shape=(None,), dtype="int32", name="target_in")
    target_length = keras.Input(shape=(), dtype="int32", name="target_in_length")

    x = keras.layers.Embedding(info["source_vocab"].size, model_config.embedding_dim,
                               name="source_embedding")(source)
    encoder = RaggedRNN(keras.layers.Bidirectional(
        keras.layers.GRU(hidden, return_sequences=True, return_state=True)), name="encoder")
    memory, forward_state, backward_state = encoder(x, lengths=source_length)
    states = keras.layers.Concatenate(name="encoder_states")([forward_state, backward_state])
    initial_state = keras.layers.Dense(hidden, activation="tanh", name="bridge")(states)

    y = keras.layers.Embedding(info["target_vocab"].size, model_config.embedding_dim,
                               name="target_embedding")(target_in)
    y = keras.layers.Dropout(model_config.dropout)(y)
    decoder = RaggedRNN(keras.layers.GRU(hidden, return_sequences=True, return_state=True),
                        name="decoder")
    decoded, _ = decoder(y, lengths=target_length, initial_state=[initial_state])
    context = MaskedAttention("additive", name="attention")(
        decoded, memory, query_lengths=target_length, value_lengths=source_length)
    h = keras.layers.Concatenate(name="decoder_and_context")([decoded, context])
    h = keras.layers.Dense(hidden, activation="tanh", name="projection")(h)
    h = keras.layers.Dropout(model_config.dropout)(h)
    logits = keras.layers.Dense(info["target_vocab"].size, dtype="float32", name="logits")(h)

    model = keras.Model({"source": source, "source_length": source_length,
                         "target_in": target_in, "target_in_length": target_length},
                        logits, name="translator")
    model.compile(
        optimizer=keras.optimizers.Adam(model_config.learning_rate, clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="mean_with_sample_weight"),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    return model


def greedy_decode(model: keras.Model, source, source_length, *, max_length: int,
                  bos_id: int, eos_id: int,
                  suppress_ids: tuple[int, ...] = (PAD_ID, UNK_ID, BOS_ID)) -> np.ndarray:
    """Greedy decoding with the trained layers of ``build_model``'s model.

    Args:
      model: the model returned by ``build_model`` (trained, or loaded from ``.keras``).
      source: int32 ``[B, S]`` source ids padded with 0.
      source_length: int32 ``[B]``.
      max_length: the most tokens to generate per row.
      bos_id, eos_id: the target vocabulary's ``<s>`` and ``</s>`` ids.
      suppress_ids: ids never generated (by default ``<pad>``, ``<unk>`` and ``<s>``: an
        undertrained model otherwise prefers the most frequent token, ``<unk>``).

    Returns:
      int32 ``[B, max_length]`` generated ids; after a row's ``</s>`` (kept) everything is 0.
    """
    layer = model.get_layer
    source = tf.convert_to_tensor(source, tf.int32)
    source_length = tf.convert_to_tensor(source_length, tf.int32)
    memory, forward_state, backward_state = layer("encoder")(
        layer("source_embedding")(source), lengths=source_length)
    state = layer("bridge")(layer("encoder_states")([forward_state, backward_state]))
    penalty = np.zeros([layer("logits").units], np.float32)
    penalty[list(suppress_ids)] = -np.inf
    token = tf.fill([tf.shape(source)[0], 1], tf.constant(bos_id, tf.int32))
    done = tf.zeros([tf.shape(source)[0]], tf.bool)
    outputs = []
    for _ in range(max_length):
        decoded, state = layer("decoder")(layer("target_embedding")(token), initial_state=[state])
        context = layer("attention")(decoded, memory, value_lengths=source_length)
        h = layer("projection")(layer("decoder_and_context")([decoded, context]))
        logits = tf.cast(layer("logits")(h), tf.float32) + penalty
        token = tf.argmax(logits, axis=-1, output_type=tf.int32)  # [B, 1]
        outputs.append(tf.where(done, 0, token[:, 0]))
        done = tf.logical_or(done, tf.equal(token[:, 0], eos_id))
        if bool(tf.reduce_all(done)):
            break
    ids = tf.stack(outputs, axis=1).numpy()
    return np.pad(ids, [[0, 0], [0, max_length - ids.shape[1]]])


def decode_examples(model: keras.Model, eval_ds: tf.data.Dataset, info: dict,
                    count: int = 3) -> list[str]:
    """``count`` held-out examples as text lines: source, reference and greedy hypothesis."""
    features, targets, _ = next(iter(eval_ds))
    features = {k: v[:count] for k, v in features.items()}
    hypotheses = greedy_decode(model, features["source"], features["source_length"],
                               max_length=info["max_length"], bos_id=info["bos_id"],
                               eos_id=info["eos_id"])

    def text(vocab, ids):
        words = [w.decode() for w in vocab.to_tokens(tf.constant(ids, tf.int32)).numpy()]
        return " ".join(w for w, i in zip(words, ids) if i not in (0, info["bos_id"],
                                                                   info["eos_id"]))

    lines = []
    for i in range(len(hypotheses)):
        lines.append(f"source:     {text(info['source_vocab'], features['source'][i].numpy())}")
        lines.append(f"reference:  {text(info['target_vocab'], targets[i].numpy())}")
        lines.append(f"hypothesis: {text(info['target_vocab'], hypotheses[i])}")
    return lines
