"""Hierarchical document classifier over LoD-2 batches: words -> sentences -> document.

Input: ``{"ids": int32 RaggedTensor [B, (S), (W)]}`` (``pipelines.documents``).

1. Word level: all sentences of the batch are one flat batch ``[N, W_max]`` (``ids.values``,
   N = total sentences, padded only to the longest *sentence*), embedded and run through a
   masked GRU; its final state is the sentence vector ``[N, H]``.
2. The sentence vectors go back into their documents with the batch's own row splits (the
   LoD level-0 offsets): ``[B, (S), H]``, padded to ``[B, S_max, H]`` with a mask.
3. Sentence level: a masked GRU over the sentences, then ``tfseq.layers.AttentionPooling``
   (weights from ``tfseq.masked_softmax``: padding sentences get exactly 0), then a softmax
   classifier.

No step sees a padding word or sentence: padding is at most one sentence length per
sentence and one document length per document, never the product.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tfseq.distribute import GlobalWeightedLoss
from tfseq.layers import AttentionPooling


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    embedding_dim: int = 48
    word_units: int = 48
    sentence_units: int = 48
    dropout: float = 0.1
    learning_rate: float = 3e-3


@keras.saving.register_keras_serializable(package="tfseq")
class SentenceEncoder(keras.layers.Layer):
    """int32 RaggedTensor ``[B, (S), (W)]`` -> (float ``[B, S_max, H]``, bool ``[B, S_max]``)."""

    def __init__(self, vocab_size: int, embedding_dim: int, units: int, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.embedding_dim = embedding_dim
        self.units = units
        self.embedding = keras.layers.Embedding(vocab_size, embedding_dim, name="embedding")
        self.rnn = keras.layers.GRU(units, name="word_gru")

    def build(self, input_shape):
        self.embedding.build((None, None))
        self.rnn.build((None, None, self.embedding_dim))

    def call(self, ids):
        sentences = ids.values                                     # [N, (W)]
        words = sentences.to_tensor()                              # [N, W_max]
        mask = tf.sequence_mask(sentences.row_lengths(), tf.shape(words)[1])
        vectors = self.rnn(self.embedding(words), mask=mask)       # [N, H]
        documents = tf.RaggedTensor.from_row_splits(vectors, ids.row_splits, validate=False)
        sentence_mask = tf.sequence_mask(ids.row_lengths())        # [B, S_max]
        return documents.to_tensor(), sentence_mask                # same S_max: max length

    def compute_output_shape(self, input_shape):
        return (input_shape[0], None, self.units), (input_shape[0], None)

    def compute_output_spec(self, ids):
        batch = ids.shape[0]
        return (keras.KerasTensor((batch, None, self.units), dtype=self.compute_dtype),
                keras.KerasTensor((batch, None), dtype="bool"))

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size,
                "embedding_dim": self.embedding_dim, "units": self.units}


def build_model(config, info, model_config: ModelConfig = ModelConfig()) -> keras.Model:
    """A compiled hierarchical classifier over ``info["vocab"]``, ``info["num_classes"]``."""
    ids = keras.Input(shape=(None, None), dtype="int32", ragged=True, name="ids")
    sentences, mask = SentenceEncoder(info["vocab"].size, model_config.embedding_dim,
                                      model_config.word_units, name="sentences")(ids)
    x = keras.layers.Dropout(model_config.dropout)(sentences)
    x = keras.layers.GRU(model_config.sentence_units, return_sequences=True,
                         name="sentence_gru")(x, mask=mask)
    x = AttentionPooling(name="pool")(x, mask=mask)
    logits = keras.layers.Dense(info["num_classes"], dtype="float32", name="logits")(x)
    model = keras.Model({"ids": ids}, logits, name="hierarchical_classifier")
    model.compile(
        optimizer=keras.optimizers.Adam(model_config.learning_rate),
        # Normalised by the weight over all replicas: the same update on any replica count.
        loss=GlobalWeightedLoss(keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
        metrics=["accuracy"])
    return model
