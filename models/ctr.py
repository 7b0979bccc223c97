"""Wide & deep click-through-rate model over ragged sparse slots (``pipelines.ctr``).

Inputs: one int64 RaggedTensor ``[B, (n)]`` per sparse slot (any number of ids per example,
0 included) and one float32 ``[B, d]`` tensor per dense slot; no padding anywhere.

* wide: per sparse slot, hashed ids (``id mod wide_buckets``) -> one weight each, summed over
  the example's ids; plus a linear function of the dense slots;
* deep: per sparse slot, hashed ids (``id mod buckets``) -> embeddings pooled over the
  example's ids (``mean`` or ``sum``; an empty slot gives zeros), concatenated with the dense
  slots -> MLP;
* output: one logit (wide + deep); loss binary cross-entropy, metric ``keras.metrics.AUC``.

Pooling works on the ragged values directly (``RaggedTensor.with_values`` + a ragged
reduction), so cost is linear in the number of real ids.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tfseq.distribute import GlobalWeightedLoss

COMBINERS = ("mean", "sum")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    buckets: int = 10007          # deep embedding rows per slot
    wide_buckets: int = 10007     # wide weights per slot
    embedding_dim: int = 8
    hidden: tuple[int, ...] = (32, 16)
    combiner: str = "mean"
    l2: float = 1e-4
    learning_rate: float = 3e-3


@keras.saving.register_keras_serializable(package="tfseq")
class PooledEmbedding(keras.layers.Layer):
    """int RaggedTensor ``[B, (n)]`` of ids -> float ``[B, dim]``: hashed embeddings, pooled.

    Args:
      buckets: table rows; id ``i`` uses row ``i mod buckets`` (ids must be >= 0).
      dim: embedding size (1 for a wide weight per id).
      combiner: ``"mean"`` or ``"sum"`` over the example's ids; no ids gives zeros.
      l2: L2 penalty on the table (0: none).
    """

    def __init__(self, buckets: int, dim: int, combiner: str = "mean", l2: float = 0.0,
                 **kwargs):
        super().__init__(**kwargs)
        if combiner not in COMBINERS:
            raise ValueError(f"combiner must be one of {COMBINERS}; received {combiner!r}")
        self.buckets = buckets
        self.dim = dim
        self.combiner = combiner
        self.l2 = l2

    def build(self, input_shape):
        self.table = self.add_weight(name="table", shape=(self.buckets, self.dim),
                                     initializer=keras.initializers.RandomNormal(stddev=0.05),
                                     regularizer=keras.regularizers.L2(self.l2) if self.l2 else None)

    def call(self, ids):
        rows = tf.math.floormod(tf.cast(ids.values, tf.int64), self.buckets)
        vectors = ids.with_values(tf.gather(self.table, rows))      # [B, (n), dim]
        total = tf.reduce_sum(vectors, axis=1)                      # [B, dim]
        if self.combiner == "sum":
            return total
        count = tf.cast(tf.maximum(ids.row_lengths(), 1), total.dtype)
        return total / count[:, None]

    def compute_output_spec(self, ids):
        return keras.KerasTensor((ids.shape[0], self.dim), dtype=self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.dim)

    def get_config(self):
        return {**super().get_config(), "buckets": self.buckets, "dim": self.dim,
                "combiner": self.combiner, "l2": self.l2}


@keras.saving.register_keras_serializable(package="tfseq")
def click_loss(labels, logits):
    """Per-example binary cross-entropy float32 ``[B]`` of click ``labels`` ``[B]`` and
    ``logits`` ``[B]`` (Keras' own reduces the last axis, here the batch)."""
    return keras.losses.binary_crossentropy(labels[:, None], logits[:, None], from_logits=True)


def build_model(config, info, model_config: ModelConfig = ModelConfig()) -> keras.Model:
    """A compiled wide & deep model over ``info["slots"]`` (minus ``info["label"]``)."""
    inputs, wide, deep = {}, [], []
    for slot in info["slots"]:
        if slot.name == info["label"]:
            continue
        if slot.kind == "sparse":
            x = keras.Input(shape=(None,), dtype="int64", ragged=True, name=slot.name)
            wide.append(PooledEmbedding(model_config.wide_buckets, 1, "sum", model_config.l2,
                                        name=f"wide_{slot.name}")(x))
            deep.append(PooledEmbedding(model_config.buckets, model_config.embedding_dim,
                                        model_config.combiner, model_config.l2,
                                        name=f"embed_{slot.name}")(x))
        else:
            x = keras.Input(shape=(slot.size,), dtype=slot.dtype.name, name=slot.name)
            dense = keras.layers.Reshape((slot.size,))(x)
            wide.append(keras.layers.Dense(1, use_bias=False, name=f"wide_{slot.name}")(dense))
            deep.append(dense)
        inputs[slot.name] = x
    h = keras.layers.Concatenate(name="deep_inputs")(deep)
    for i, units in enumerate(model_config.hidden):
        h = keras.layers.Dense(units, activation="relu", name=f"mlp_{i}")(h)
    deep_logit = keras.layers.Dense(1, name="deep_logit")(h)
    logit = keras.layers.Add(name="logit")(wide + [deep_logit])
    logit = keras.layers.Reshape((), name="click_logit")(logit)
    model = keras.Model(inputs, logit, name="wide_and_deep")
    model.compile(
        optimizer=keras.optimizers.Adam(model_config.learning_rate),
        # Normalised by the weight over all replicas: the same update on any replica count.
        loss=GlobalWeightedLoss(click_loss),
        metrics=[keras.metrics.AUC(from_logits=True, name="auc")])
    return model
