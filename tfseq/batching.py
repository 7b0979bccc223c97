"""Plain batching: ``pad_batch`` to dense ``[B, T]`` plus lengths, or to RaggedTensor.

Shapes: B = batch, T = the longest sequence in the batch.

Padded batch of ``{"ids": [5, 6, 7]}, {"ids": [8]}`` with ``batch_size=2``::

    ids         [[5, 6, 7],
                 [8, 0, 0]]
    ids_length   [3, 1]

With ``ragged=True``: ``ids`` is ``<tf.RaggedTensor [[5, 6, 7], [8]]>`` and no length key.
"""

from __future__ import annotations

import tensorflow as tf

from tfseq._common import LENGTH_SUFFIX, Transform, check_positive_int, example_keys, unbatch


def add_lengths(keys) -> callable:
    """Map function adding ``<name>_length`` (int32 scalar) for each sequence feature in ``keys``."""

    def add(example):
        example = dict(example)
        for k in keys:
            example[k + LENGTH_SUFFIX] = tf.shape(example[k], out_type=tf.int32)[0]
        return example

    return add


def pad_batch(batch_size: int, *, ragged: bool = False, drop_remainder: bool = False,
              prefetch: bool = True) -> Transform:
    """Transformation batching examples in arrival order.

    Args:
      batch_size: examples per batch (the last batch may be smaller).
      ragged: emit ``int32 RaggedTensor [B, (T)]`` sequence features and no length keys,
        instead of dense ``[B, T]`` padded with 0 plus ``"<name>_length"`` int32 ``[B]``.
      drop_remainder: drop a last, smaller batch (off by default: nothing is lost).
      prefetch: end with ``prefetch(AUTOTUNE)``.

    Returns:
      A ``Dataset.apply`` transformation. Scalar features become ``[B]``. Ragged batches of
      examples in the input are unbatched first (one tf.data call per example: use
      ``bucket_by_length``/``pack`` for the fast path).

    Raises:
      TypeError/ValueError: bad ``batch_size``; (when applied) no sequence feature.
    """
    check_positive_int("batch_size", batch_size)

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        keys, batched = example_keys(dataset.element_spec, "pad_batch")
        if batched:  # ragged batches of examples: re-batch their examples to batch_size
            dataset = unbatch(dataset)
        if ragged:
            out = dataset.ragged_batch(batch_size, drop_remainder=drop_remainder)
        else:
            out = dataset.map(add_lengths(keys), num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=None)
            out = out.padded_batch(batch_size, drop_remainder=drop_remainder)
        return out.prefetch(tf.data.AUTOTUNE) if prefetch else out

    return apply
