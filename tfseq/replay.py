"""Resumable input by replay: an epoch rebuilt from its number, the batches taken skipped.

For a pipeline whose epoch is a function of its seed and the epoch number alone (files read in
a fixed order, shuffles seeded with ``epoch_seed``, no state carried between epochs), the
position in the input is two integers the trainer already keeps: the epoch and the steps taken
in it. A ``ReplayStream`` is checkpointed as nothing more: on restore it builds that epoch's
dataset again and skips the batches already trained on, so the rest of the epoch is exactly
what an uninterrupted run would have had. The checkpoint's data state is zero bytes, whatever
the corpus or buffer sizes (``tf.train.Checkpoint(iterator=...)`` would save the shuffle buffer
and every other buffer verbatim).

The price is time, not space: a resume re-reads the epoch up to its position (one epoch at
most). ``tfseq.resumable.ResumableStream`` jumps to its position instead; it needs the task's
records as strings and a pool batcher, which the nested-document, MultiSlot and truncated-BPTT
pipelines do not have.

Counts: the drop counters a pipeline updates while reading are not checkpointed. They restart
with each epoch (``reset`` them at the epoch start, as the trainers' ``on_epoch_start`` does)
and a resumed epoch counts its replayed part again, so at an epoch's end they hold that epoch's
exact counts, as an uninterrupted run's do.

Element spec of ``dataset()``: what ``make_epoch`` gives (one batch per training step); with
``count``, ``(batch, meta)`` with ``meta = {"tokens", "cells", "examples": int64}`` (the
batch's real tokens, padded cells and examples, for ``BatchStats`` when the batch is taken).
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from tfseq._common import pipeline_options, user_function


def epoch_seed(seed: int, epoch: tf.Tensor) -> tf.Tensor:
    """int64 scalar: the shuffle seed of ``epoch`` (a tensor) for base ``seed``."""
    return tf.constant(seed, tf.int64) * 1_000_003 + tf.cast(epoch, tf.int64)


def epoch_shuffle(dataset: tf.data.Dataset, buffer_size: int, seed: int,
                  epoch: tf.Tensor) -> tf.data.Dataset:
    """``dataset.shuffle(buffer_size)`` in the order of ``(seed, epoch)`` alone, inside a
    ``make_epoch`` (a dataset function's graph).

    The op seed is a tensor (``epoch_seed``), and the graph's global seed is left out: it
    would make the order depend on ``tf.random.set_seed`` too, and TensorFlow cannot combine a
    global seed of 0 with a tensor op seed (it compares the pair to ``(0, 0)`` in Python).
    """
    graph = tf.compat.v1.get_default_graph()
    global_seed, graph.seed = graph.seed, None
    try:
        return dataset.shuffle(buffer_size, seed=epoch_seed(seed, epoch))
    finally:
        graph.seed = global_seed


class ReplayStream:
    """An epoch of batches as a function of the epoch number; see the module docstring.

    Args:
      make_epoch: ``epoch (int64 scalar tensor) -> Dataset`` of one epoch's batches, the same
        batches in the same order every time it is called with the same epoch (seed its
        shuffles with ``epoch_seed``; read files in a fixed order).
      count: ``batch -> (tokens, cells, examples)`` int scalars, computed in the graph; the
        trainer adds them to its ``BatchStats`` when it trains on the batch.
      seed: for ``dataset()`` without variables (``model.fit``): the epoch keys drawn.
      map_fn: applied to each batch after ``count`` (e.g. ``split_rows`` into replica parts:
        the steps, and so the position, are the global batches whatever the replica count).
    """

    def __init__(self, make_epoch: Callable[[tf.Tensor], tf.data.Dataset], *,
                 count: Callable | None = None, seed: int = 0, map_fn: Callable | None = None):
        self.make_epoch = user_function(make_epoch)
        self.count = user_function(count)
        self.seed = seed
        self.map_fn = user_function(map_fn)

    def split(self, num_parts: int) -> "ReplayStream":
        """This stream with each batch split into a tuple of ``num_parts`` ``(features,
        labels, weight)`` parts (``tfseq.splitting.split_rows``), one per local replica."""
        from tfseq.splitting import split_rows

        return ReplayStream(self.make_epoch, count=self.count, seed=self.seed,
                            map_fn=lambda batch: split_rows(batch, num_parts))

    def dataset(self, epoch: tf.Variable | None = None,
                skip: tf.Variable | None = None) -> tf.data.Dataset:
        """The batches of the epoch in ``epoch`` after the first ``skip`` (both read when an
        iterator starts: set them, then make the iterator). Without ``epoch``, each iterator
        draws a new epoch key (for ``model.fit``, which makes one iterator per epoch)."""
        start = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64))
        if epoch is None:
            keys = tf.data.Dataset.random(seed=self.seed, rerandomize_each_iteration=True)
            start = keys.take(1).map(lambda key: (key % (1 << 30), tf.constant(0, tf.int64)))
        else:
            start = start.map(lambda _: (
                tf.cast(epoch.read_value(), tf.int64),
                tf.constant(0, tf.int64) if skip is None else tf.cast(skip.read_value(),
                                                                      tf.int64)))
        batches = start.flat_map(lambda e, s: self.make_epoch(e).skip(s))
        if self.count is not None and epoch is not None:
            def with_meta(*batch):
                batch = batch[0] if len(batch) == 1 else batch
                tokens, cells, examples = (tf.cast(n, tf.int64) for n in self.count(batch))
                out = self.map_fn(batch) if self.map_fn is not None else batch
                return out, {"tokens": tokens, "cells": cells, "examples": examples}

            batches = batches.map(with_meta)
        elif self.map_fn is not None:
            batches = batches.map(lambda *batch: self.map_fn(batch[0] if len(batch) == 1
                                                             else batch))
        return batches.prefetch(tf.data.AUTOTUNE).with_options(pipeline_options())


__all__ = ["ReplayStream", "epoch_seed", "epoch_shuffle"]
