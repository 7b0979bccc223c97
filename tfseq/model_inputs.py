"""From a batch to what a Keras model trains on: ``(inputs, targets, weights)``, in every mode.

Shapes: B = rows, T = padded time, L = packed row length, S = segments per packed row.

``ModelFeatures`` is the one conversion between the batching seam (``tfseq.batching.Batching``)
and a model, so a task never branches on the batching mode. It reads the batch layout off the
keys (``<name>_length``: padded; ``<name>_segment_ids``: packed) and gives:

==========  ====================================  ======================================
            padded batch                          packed batch
==========  ====================================  ======================================
inputs      ``name`` [B, T], ``name_length`` [B]  ``name``, ``name_segment_ids``,
            per input feature                     ``name_resets`` (int32 0/1) [B, L]
targets     ``target`` [B] (one per example) or   ``target`` [B, S] (one per segment) or
            [B, T] (one per token)                [B, L] (one per token)
weights     1.0 per example, or per real token    1.0 per segment present, or per real
                                                  token (segment id > 0)
==========  ====================================  ======================================

times the batch's ``"weight"`` per row when it has one (``split_batch`` parts: 0 on dummy
rows), so a loss normalised by the weights (``tfseq.GlobalWeightedLoss``) ignores padding,
empty segment columns and dummy rows alike. Per-token targets are laid out like their
``token_of`` input (``Batching(aligned=...)`` packs them in the same cells).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfseq._common import LENGTH_SUFFIX

SEGMENT_IDS = "_segment_ids"
RESETS = "_resets"
WEIGHT = "weight"


@dataclasses.dataclass(frozen=True)
class ModelFeatures:
    """Which batch features a model reads and learns.

    Attributes:
      inputs: the sequence features the model reads, e.g. ``("ids",)`` or
        ``("source", "target_in")``.
      target: the feature it predicts.
      token_of: for a per-token target, the input it is aligned with (its lengths or
        segments say which tokens are real); ``None``: one target per example.

    Example:
      >>> features = ModelFeatures(("ids",), "label")
      >>> x, y, w = features({"ids": [[5, 6], [7, 0]], "ids_length": [2, 1], "label": [3, 1]})
      >>> # x == {"ids": ..., "ids_length": ...}, y == [3, 1], w == [1.0, 1.0]
    """

    inputs: tuple[str, ...]
    target: str
    token_of: str | None = None

    def packed(self, batch) -> bool:
        return self.inputs[0] + SEGMENT_IDS in batch

    def __call__(self, batch):
        """A padded or packed batch (dict) -> ``(inputs dict, targets, weights float32)``."""
        batch = {k: tf.convert_to_tensor(v) for k, v in batch.items()}
        packed = self.packed(batch)
        x = {}
        for name in self.inputs:
            x[name] = batch[name]
            if packed:
                x[name + SEGMENT_IDS] = batch[name + SEGMENT_IDS]
                # int32, not bool: Keras sums a first batch across replicas to build a model.
                x[name + RESETS] = tf.cast(batch[name + RESETS], tf.int32)
            else:
                x[name + LENGTH_SUFFIX] = batch[name + LENGTH_SUFFIX]
        y = batch[self.target]
        weights = self._weights(batch, packed, y)
        if WEIGHT in batch:
            row = tf.cast(batch[WEIGHT], tf.float32)
            weights = weights * (row[:, None] if weights.shape.rank == 2 else row)
        return x, y, weights

    def _weights(self, batch, packed: bool, y) -> tf.Tensor:
        if self.token_of is not None:
            if packed:
                return tf.cast(batch[self.token_of + SEGMENT_IDS] > 0, tf.float32)
            lengths = batch[self.token_of + LENGTH_SUFFIX]
            return tf.sequence_mask(lengths, tf.shape(y)[1], dtype=tf.float32)
        if packed:  # one target per segment column; the columns a row holds weigh 1
            segment_ids = batch[self.inputs[0] + SEGMENT_IDS]
            present = (tf.range(tf.shape(y)[1])[None, :]
                       < tf.reduce_max(segment_ids, axis=1)[:, None])
            return tf.cast(present, tf.float32)
        return tf.ones(tf.shape(y)[:1], tf.float32)
