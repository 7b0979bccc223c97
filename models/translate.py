"""Seq2seq with attention: one model for padded and packed batches, with the same weights.

Shapes: B = rows, S = source time, T = target time, E = embedding, H = hidden units,
V = target vocabulary.

    source [B, S] --embedding--> ResettableRNN(GRU, bidirectional) --> memory [B, S, 2H]
    memory --mean over the example's source--> bridge (tanh Dense) --> summary [B, T, H]
    [target_in embedding, summary] [B, T, E+H] --> ResettableRNN(GRU) --> decoded [B, T, H]
    MaskedAttention("additive")(decoded, memory, same example only) --> context [B, T, 2H]
    [decoded, context] -> tanh projection -> float32 logits [B, T, V]

Inputs (``pipelines.translate``)::

    padded  {"source": int32 [B, S], "source_length": int32 [B],
             "target_in": int32 [B, T], "target_in_length": int32 [B]}
    packed  {"source", "source_segment_ids": int32 [B, S],
             "target_in", "target_in_segment_ids": int32 [B, T]}

A padded batch is a packed batch with one segment per row (segment id 1 on real steps, 0 on
padding), so both take the same path: the encoder runs each source segment alone in both
directions (``ResettableRNN`` restarts at each segment start, and backwards at each segment
end), the decoder restarts from the zero state at each target segment, and the attention and the
source summary see only the source segment with the target segment's id. Segment k of a source
row pairs with segment k of the same target row (``tfseq.pack`` packs both features together).

The bridge: instead of an initial decoder state (which a packed row would need to inject at
every segment start, inside the recurrence), each example's source summary is fed to the decoder
at every step, next to the target embedding (Cho et al., 2014). It conditions the decoder's
recurrence on the source from the first step, in every batching mode.

Source pads never reach the outputs and the loss is averaged over real target tokens (weights 0
on padding). ``greedy_decode`` and the export (``tfseq-export``) use ``encode`` and
``decode_step``, the same layers one step at a time.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from tfseq import decoding
from tfseq.distribute import GlobalWeightedLoss
from tfseq.layers import MaskedAttention, ResettableRNN
from tfseq.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    embedding_dim: int = 64
    hidden_dim: int = 96
    dropout: float = 0.1
    learning_rate: float = 3e-3


def _segment_ids(ids, lengths, segment_ids):
    """int32 ``[B, T]``: the packed segment ids, or 1 on the real steps of a padded row."""
    if segment_ids is not None:
        return tf.cast(segment_ids, tf.int32)
    if lengths is None:
        return tf.cast(tf.not_equal(ids, 0), tf.int32)
    return tf.sequence_mask(lengths, tf.shape(ids)[1], dtype=tf.int32)


def _dense(ids):
    """``(int32 [B, T], lengths int32 [B] or None)`` from a dense or ragged batch."""
    if isinstance(ids, tf.RaggedTensor):
        return tf.cast(ids.to_tensor(), tf.int32), tf.cast(ids.row_lengths(), tf.int32)
    return tf.cast(ids, tf.int32), None


@keras.saving.register_keras_serializable(package="tfseq")
class Translator(keras.Model):
    """Target logits for padded, ragged or packed source/target batches (see the module).

    Args:
      source_vocab_size, target_vocab_size: vocabulary sizes (V is the target's).
      embedding_dim, hidden_dim: E and H.
      dropout: rate on the target embeddings and before the output layer.
      **kwargs: forwarded to ``keras.Model``.
    """

    def __init__(self, source_vocab_size: int, target_vocab_size: int, embedding_dim: int = 64,
                 hidden_dim: int = 96, dropout: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.source_vocab_size = source_vocab_size
        self.target_vocab_size = target_vocab_size
        self.embedding_dim = embedding_dim
        self.hidden_dim = hidden_dim
        self.dropout_rate = dropout
        self.source_embedding = keras.layers.Embedding(source_vocab_size, embedding_dim,
                                                       name="source_embedding")
        self.encoder = ResettableRNN(keras.layers.GRUCell(hidden_dim), bidirectional=True,
                                     name="encoder")
        self.bridge = keras.layers.Dense(hidden_dim, activation="tanh", name="bridge")
        self.target_embedding = keras.layers.Embedding(target_vocab_size, embedding_dim,
                                                       name="target_embedding")
        self.embedding_dropout = keras.layers.Dropout(dropout, name="embedding_dropout")
        self.decoder = ResettableRNN(keras.layers.GRUCell(hidden_dim), return_state=True,
                                     name="decoder")
        self.attention = MaskedAttention("additive", name="attention")
        self.projection = keras.layers.Dense(hidden_dim, activation="tanh", name="projection")
        self.output_dropout = keras.layers.Dropout(dropout, name="output_dropout")
        self.logits = keras.layers.Dense(target_vocab_size, dtype="float32", name="logits")

    def call(self, inputs, training=None):
        source, source_lengths = _dense(inputs["source"])
        target, target_lengths = _dense(inputs["target_in"])
        source_lengths = inputs.get("source_length", source_lengths)
        target_lengths = inputs.get("target_in_length", target_lengths)
        source_segments = _segment_ids(source, source_lengths,
                                       inputs.get("source_segment_ids"))
        target_segments = _segment_ids(target, target_lengths,
                                       inputs.get("target_in_segment_ids"))
        memory = self.encoder(self.source_embedding(source), segment_ids=source_segments,
                              training=training)
        # same[b, t, s]: source step s is in target step t's example.
        same = tf.logical_and(
            tf.equal(target_segments[:, :, None], source_segments[:, None, :]),
            source_segments[:, None, :] > 0)
        same = tf.cast(same, memory.dtype)
        count = tf.maximum(tf.reduce_sum(same, axis=-1, keepdims=True), 1)
        summary = self.bridge(tf.matmul(same, memory) / count)  # [B, T, H]
        y = self.embedding_dropout(self.target_embedding(target), training=training)
        decoded, _ = self.decoder(tf.concat([y, tf.cast(summary, y.dtype)], axis=-1),
                                  segment_ids=target_segments, training=training)
        context = self.attention(decoded, memory, query_segment_ids=target_segments,
                                 value_segment_ids=source_segments)
        return self._head(decoded, context, training)

    def _head(self, decoded, context, training=None):
        h = self.projection(tf.concat([decoded, tf.cast(context, decoded.dtype)], axis=-1))
        return self.logits(self.output_dropout(h, training=training))

    def encode(self, source, lengths):
        """The source side of decoding, for ``decode_step``.

        Args:
          source: int32 ``[B, S]`` padded with 0. lengths: int32 ``[B]``.

        Returns:
          ``(memory [B, S, 2H], state)``; ``state`` is ``(decoder state [B, H] (zeros),
          summary [B, H])``.
        """
        valid = tf.sequence_mask(lengths, tf.shape(source)[1], dtype=tf.int32)
        memory = self.encoder(self.source_embedding(source), segment_ids=valid)
        weights = tf.cast(valid, memory.dtype)[:, :, None]
        count = tf.maximum(tf.reduce_sum(weights, axis=1), 1)
        summary = self.bridge(tf.reduce_sum(memory * weights, axis=1) / count)
        h = tf.zeros([tf.shape(source)[0], self.hidden_dim], summary.dtype)
        return memory, (h, summary)

    def decode_step(self, token, state, memory, lengths):
        """One greedy step: ``token`` int32 ``[B, 1]`` -> ``(logits float32 [B, V], state)``."""
        h, summary = state
        y = self.target_embedding(token)
        x = tf.concat([y, tf.cast(summary, y.dtype)[:, None, :]], axis=-1)
        decoded, h = self.decoder(x, initial_state=[h])
        context = self.attention(decoded, memory, value_lengths=lengths)
        return tf.cast(self._head(decoded, context), tf.float32)[:, 0, :], (h, summary)

    def get_config(self):
        return {**super().get_config(), "source_vocab_size": self.source_vocab_size,
                "target_vocab_size": self.target_vocab_size,
                "embedding_dim": self.embedding_dim, "hidden_dim": self.hidden_dim,
                "dropout": self.dropout_rate}


def build_model(config, state, model_config: ModelConfig = ModelConfig()) -> keras.Model:
    """A compiled ``Translator`` over ``state.vocabs["source"]`` -> ``state.vocabs["target"]``;
    the same model for every batching. The loss is normalised by the real target tokens summed
    over all replicas (``tfseq.GlobalWeightedLoss``)."""
    model = Translator(state.vocabs["source"].size, state.vocabs["target"].size,
                       embedding_dim=model_config.embedding_dim,
                       hidden_dim=model_config.hidden_dim, dropout=model_config.dropout,
                       name="translator")
    model({"source": tf.ones([1, 1], tf.int32), "source_length": tf.ones([1], tf.int32),
           "target_in": tf.ones([1, 1], tf.int32), "target_in_length": tf.ones([1], tf.int32)})
    model.compile(
        optimizer=keras.optimizers.Adam(model_config.learning_rate, clipnorm=1.0),
        loss=GlobalWeightedLoss(keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
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
    source = tf.convert_to_tensor(source, tf.int32)
    source_length = tf.convert_to_tensor(source_length, tf.int32)
    memory, state = model.encode(source, source_length)
    ids = decoding.greedy_decode(model.decode_step, memory, state, source_length,
                                 max_length=max_length, bos_id=bos_id, eos_id=eos_id,
                                 suppress_ids=suppress_ids).numpy()
    return np.pad(ids, [[0, 0], [0, max_length - ids.shape[1]]])


def decode_examples(model: keras.Model, eval_ds: tf.data.Dataset, state, *, max_length: int,
                    count: int = 3) -> list[str]:
    """``count`` held-out examples as text lines: source, reference and greedy hypothesis.

    ``eval_ds`` holds padded batches (evaluation is bucketed in every mode). An empty held-out
    set gives one line saying so."""
    first = list(eval_ds.take(1))
    if not first:
        return ["(no held-out examples to decode)"]
    features, targets, _ = first[0]
    features = {k: v[:count] for k, v in features.items()}
    hypotheses = greedy_decode(model, features["source"], features["source_length"],
                               max_length=max_length, bos_id=BOS_ID, eos_id=EOS_ID)

    def text(vocab, ids):
        words = [w.decode() for w in vocab.to_tokens(tf.constant(ids, tf.int32)).numpy()]
        return " ".join(w for w, i in zip(words, ids) if i not in (0, BOS_ID, EOS_ID))

    lines = []
    for i in range(len(hypotheses)):
        lines.append(f"source:     {text(state.vocabs['source'], features['source'][i].numpy())}")
        lines.append(f"reference:  {text(state.vocabs['target'], targets[i].numpy())}")
        lines.append(f"hypothesis: {text(state.vocabs['target'], hypotheses[i])}")
    return lines
