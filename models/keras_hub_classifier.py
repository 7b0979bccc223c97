"""A KerasHub text classifier on tfseq's padded batches: ``--task=classify --keras_hub=PATH``.

Shapes: B = rows, T = the longest example of the batch, C = classes.

    {"ids": int32 [B, T] (0-padded), "ids_length": int32 [B]}  -> logits float32 [B, C]

``HubClassifier`` wraps a KerasHub ``TextClassifier`` (``BertTextClassifier``, ...; built with
``preprocessor=None``) and fills the inputs its backbone declares from the ids and their
lengths (``tfseq.keras_hub.backbone_inputs``: ``token_ids``, ``padding_mask``,
``segment_ids``), so the task's batches, the training loop, the checkpoints and the export
are those of every tfseq task. Attention masks the padding, so a text's logits do not depend
on its batch (``tests/test_keras_hub.py``). Packed rows are not taken: the backbone would let
their examples attend to each other.

KerasHub is imported when a model is built (``tfseq[keras-hub]``), not with this module.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tfseq.distribute import GlobalWeightedLoss
from tfseq.keras_hub import backbone_inputs, input_specs

# Adam's rate when ModelConfig.learning_rate is None: fine-tuning pretrained weights, or
# training a model made from a config from scratch (the rate of docs/keras_hub.md's runs).
FINE_TUNING_RATE = 5e-5
FROM_SCRATCH_RATE = 2e-3


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    # None: FINE_TUNING_RATE for a preset with weights, FROM_SCRATCH_RATE for a config
    learning_rate: float | None = None


@keras.saving.register_keras_serializable(package="tfseq")
class HubClassifier(keras.Model):
    """tfseq's padded batches -> a KerasHub ``TextClassifier``'s logits.

    Args:
      classifier: a KerasHub ``TextClassifier`` built with ``preprocessor=None`` (logits out).
      **kwargs: forwarded to ``keras.Model`` (``name``).

    Call arguments:
      inputs: ``{"ids": int32 [B, T], "ids_length": int32 [B]}``.
      training: enables the classifier's dropout.

    Returns:
      float32 logits ``[B, C]``.
    """

    def __init__(self, classifier, **kwargs):
        super().__init__(**kwargs)
        self.classifier = classifier
        self.input_dtypes = input_specs(classifier)

    def call(self, inputs, training=None):
        ids = tf.cast(inputs["ids"], tf.int32)
        x = backbone_inputs(self.input_dtypes, ids, inputs["ids_length"])
        return tf.cast(self.classifier(x, training=training), tf.float32)

    def get_config(self):
        return {**super().get_config(),
                "classifier": keras.saving.serialize_keras_object(self.classifier)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["classifier"] = keras.saving.deserialize_keras_object(config["classifier"])
        return cls(**config)


def build_model(config, state, model_config: ModelConfig = ModelConfig()) -> keras.Model:
    """A compiled ``HubClassifier``: the KerasHub classifier of ``state.hub`` (the run's
    preset: its backbone with its weights, its ``TextClassifier`` class) with one output per
    label of ``state.labels["label"]``.

    The loss is normalised by the sample weight summed over all replicas
    (``tfseq.GlobalWeightedLoss``), as the plain classifier's. Build it under
    ``strategy.scope()`` for several replicas.
    """
    classifier = state.hub.classifier(len(state.labels["label"]))
    model = HubClassifier(classifier, name="keras_hub_classifier")
    model({"ids": tf.ones([1, 2], tf.int32), "ids_length": tf.fill([1], 2)})  # the weights
    rate = model_config.learning_rate or (FINE_TUNING_RATE if state.hub.pretrained
                                          else FROM_SCRATCH_RATE)
    model.compile(
        optimizer=keras.optimizers.Adam(rate),
        loss=GlobalWeightedLoss(keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
        weighted_metrics=["accuracy"])
    return model
