"""Resumable training input: an epoch's batches rebuilt from a cursor of three integers.

Shapes: n = records in a read batch, W = examples in a pool, B = rows, T = time, C = counts.

``tf.train.Checkpoint(iterator=...)`` saves a pipeline's buffers verbatim: the line-shuffle
shard, the bucketing pools, the shuffle buffer; hundreds of MB on a large corpus, and a
changed graph (another number of replicas) cannot restore them. A ``ResumableStream`` is
checkpointed as a *position* instead, and rebuilds what it needs from it:

  records  ``RecordShards`` (``tfseq.shuffling``, the line shuffle): the training records
           split into K random shards (a uniform random subset each, written once to disk
           when K > 1); every epoch visits the shards in a new order and permutes each one
           anew, both from ``(seed, epoch)`` alone, and cuts it into read batches of
           ``read_batch`` records.
  encode   each read batch -> a ragged batch of examples, and the counts of what it dropped
           as data (``DropCounter.recording``), not as variable updates: parallel.
  pools    consecutive encoded batches of one shard, until ``pool_tokens`` tokens (or
           ``pool_examples`` examples) or the shard's end; a pool starts at a read batch.
  batches  each pool -> its batches (``batcher.pool_batches``), nothing carried to the next
           pool, so a pool depends only on its own records.

Each batch comes with its position, ``(shard rank, offset of its pool's first record, index in
the pool)``, and the counts of its pool (on the pool's first batch). A consumer that records
the position of each batch it takes and adds the counts it receives (``advance``) can be
checkpointed at any step with these integers (``variables``: a few hundred bytes, whatever the
corpus, shard or pool size). On restore the stream reads one shard, re-encodes the records of
one pool and skips the batches already taken: the rest of the epoch is exactly the batches an
uninterrupted run would have had, and the counts come back exactly too.

Element spec of ``dataset()``: ``(batch, meta)``; ``batch`` as ``batcher.finish`` (then
``map_fn``) makes it, ``meta``::

    {"shard": int64, "offset": int64, "index": int64,   # the position of this batch
     "counts": int64 [C],                                # new counts (``count_keys`` order)
     "tokens", "cells", "examples": int64}               # real tokens, cells, examples

A pool with no example left gives one element with an empty batch (0 examples) so its counts
still arrive; a training loop skips it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import tensorflow as tf

from tfseq._common import (batch_lengths, encode_calls, example_keys, parallel_calls,
                           pipeline_options, user_function)
from tfseq._pools import PoolLists
from tfseq.shuffling import (GZIP_RATIO, RecordShards, SpillWriter, epoch_key, num_shards_for,
                             stateless_seed)
from tfseq.stats import CountTape, DropCounter, batch_counts, sequence_names

# The shuffle engine's names, where the training stream's users import them.
__all__ = ["GZIP_RATIO", "RecordShards", "ResumableStream", "SpillWriter", "num_shards_for"]


class ResumableStream:
    """An epoch of batches from a cursor; see the module docstring.

    Args:
      shards: the ``RecordShards`` of the training records.
      encode: ``records tf.string [n] -> examples``, a ragged batch (sequence features int
        ``[m, (T)]``, scalars ``[m]``), counting its drops in ``counter`` (graph function).
      batcher: an object with ``pool_batches(pool, pool_seed)`` and ``finish(element)``, as
        ``tfseq.batching.Batching.pool_batcher`` gives.
      counter: the ``DropCounter`` that ``encode`` and ``batcher`` count in; the stream
        records them and ``advance`` adds them when a batch is taken.
      pool_tokens / pool_examples: when a pool closes (exactly one of them).
      seed: the pools' seeds (with the epoch and the position).
      epoch: a ``tf.Variable`` (int64) holding the epoch to read; ``None`` draws a new epoch
        key at each new iterator (for ``model.fit``, which makes one per epoch).
      map_fn: applied to each finished batch (e.g. splitting it over replicas and making the
        model's inputs), in the stream's graph.
      read_batch: records per read batch (a pool starts at one).
      token_keys: the sequence features whose real tokens and cells ``meta`` counts (the
        model's inputs); default every padded or packed sequence feature of the batch.
    """

    def __init__(self, shards: RecordShards, encode: Callable, batcher, *, counter: DropCounter,
                 pool_tokens: int | None = None, pool_examples: int | None = None,
                 seed: int = 0, epoch: tf.Variable | None = None,
                 map_fn: Callable | None = None, read_batch: int = 1024,
                 token_keys=None):
        if (pool_tokens is None) == (pool_examples is None):
            raise ValueError("Give exactly one of pool_tokens and pool_examples; received "
                             f"pool_tokens={pool_tokens!r}, pool_examples={pool_examples!r}")
        self.shards = shards
        self.encode = user_function(encode)
        self.batcher = batcher
        self.counter = counter
        self.pool_tokens = pool_tokens
        self.pool_examples = pool_examples
        self.seed = seed
        self.epoch = epoch
        self.map_fn = user_function(map_fn)
        self.read_batch = read_batch
        self.token_keys = list(token_keys) if token_keys else None
        self._encode_calls = encode_calls()  # speed only (tfseq.experimental.parallelism)
        with tf.init_scope():
            self.shard = tf.Variable(0, dtype=tf.int64, trainable=False, name="cursor_shard")
            self.offset = tf.Variable(0, dtype=tf.int64, trainable=False, name="cursor_offset")
            self.batches = tf.Variable(0, dtype=tf.int64, trainable=False, name="cursor_batches")
        self.count_keys: list[tuple[str, str]] = []

    # ----- the cursor

    def variables(self) -> dict[str, tf.Variable]:
        """The position to checkpoint (with the epoch, kept by the caller)."""
        return {"cursor_shard": self.shard, "cursor_offset": self.offset,
                "cursor_batches": self.batches}

    def position(self) -> tuple[int, int, int]:
        return int(self.shard.numpy()), int(self.offset.numpy()), int(self.batches.numpy())

    def reset(self) -> None:
        """Back to the start of an epoch."""
        for v in (self.shard, self.offset, self.batches):
            v.assign(0)

    def advance(self, meta: Mapping[str, Any]) -> None:
        """Records that the batch of ``meta`` was taken: its position, and its counts added to
        ``counter``."""
        self.shard.assign(int(meta["shard"]))
        self.offset.assign(int(meta["offset"]))
        self.batches.assign(int(meta["index"]) + 1)
        self.counter.commit(self.count_keys, meta["counts"])

    # ----- the dataset

    def dataset(self) -> tf.data.Dataset:
        """``(batch, meta)`` elements of the epoch in ``epoch`` from the cursor on (read when
        an iterator starts: set the variables, then make the iterator)."""
        epoch = self.epoch
        start = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64))
        if epoch is None:  # model.fit: a new epoch key at each iteration
            zero = tf.constant(0, tf.int64)
            start = epoch_key(self.seed).map(lambda key: (key, zero, zero, zero))
        else:
            start = start.map(lambda _: (tf.cast(epoch.read_value(), tf.int64),
                                         self.shard.read_value(), self.offset.read_value(),
                                         self.batches.read_value()))
        return (start.flat_map(self._epoch).prefetch(tf.data.AUTOTUNE)
                .with_options(pipeline_options()))

    def _epoch(self, epoch, start_shard, start_offset, skip):
        records = self.shards.epoch_batches(epoch, start_shard, start_offset, self.read_batch)
        encode_keys, pool_keys = [], []  # filled when the functions are traced

        def encode(batch, rank, offset, shard_end):
            tape = CountTape()  # one per trace: tf.data may trace a function twice
            with self.counter.recording(tape):
                examples = self.encode(batch)
            encode_keys[:] = tape.keys
            return examples, tape.vector(tape.keys), rank, offset, shard_end

        encoded = records.map(encode, num_parallel_calls=self._encode_calls,
                              deterministic=True)
        keys, _ = example_keys(encoded.element_spec[0], "ResumableStream")
        pools = self._pools(encoded, keys)

        def batch_pool(pool, counts, rank, offset):
            pool_seed = stateless_seed(self.seed, epoch, rank, offset)[1]
            tape = CountTape()
            with self.counter.recording(tape):
                batches = self.batcher.pool_batches(pool, pool_seed)
            pool_keys[:] = tape.keys
            return (_with_one_empty(batches), _num_batches(batches), counts,
                    tape.vector(tape.keys), rank, offset)

        # Pools are batched independently (nothing carried), as many at once as there are
        # cores; deterministic, so the global batches are the same at any core count.
        pooled = pools.map(batch_pool, num_parallel_calls=parallel_calls(),
                           deterministic=True)
        self.count_keys = sorted(set(encode_keys) | set(pool_keys))
        encode_index = [self.count_keys.index(k) for k in encode_keys]
        pool_index = [self.count_keys.index(k) for k in pool_keys]
        width = len(self.count_keys)

        def scatter(values, index):
            if not index:
                return tf.zeros([width], tf.int64)
            return tf.scatter_nd(tf.constant(index)[:, None], values, [width])

        def flatten(batches, num, encode_counts, pool_counts, rank, offset):
            """A pool's batches (and one empty batch when it has none) as elements, sliced by
            ``from_tensor_slices`` (one kernel, not a graph of ragged slicing per batch)."""
            counts = scatter(encode_counts, encode_index) + scatter(pool_counts, pool_index)
            n = tf.maximum(num, 1)
            index = tf.range(n)
            first = tf.cast(tf.equal(index, 0), tf.int64)[:, None]
            meta = {"shard": tf.fill([n], rank), "offset": tf.fill([n], offset),
                    "index": index, "counts": first * counts[None, :]}
            return tf.data.Dataset.from_tensor_slices(
                (tf.nest.map_structure(lambda x: x[:n], batches), meta))

        out = pooled.flat_map(flatten)
        out = out.filter(lambda batch, meta: (meta["shard"] != start_shard)
                         | (meta["offset"] != start_offset) | (meta["index"] >= skip))
        return out.map(self._finish, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def _finish(self, element, meta):
        batch = self.batcher.finish(element)
        real, cells, examples = batch_counts(batch, self.token_keys or sequence_names(
            {k: tf.TensorSpec(v.shape, v.dtype) for k, v in batch.items()}))
        meta = dict(meta, tokens=real, cells=cells, examples=examples)
        out = self.map_fn(batch) if self.map_fn is not None else batch
        return out, meta

    def _pools(self, encoded: tf.data.Dataset, keys) -> tf.data.Dataset:
        """Encoded batches -> pools ``(pool, counts [c], shard rank, offset)``: runs of one
        shard's batches closed at the pool budget or the shard's end."""
        arrays = PoolLists(encoded.element_spec[0])
        width = encoded.element_spec[1].shape[0]
        zero = tf.constant(0, tf.int64)

        def initial():
            return (arrays.empty(), zero, zero, tf.zeros([width], tf.int64),
                    -tf.ones([], tf.int64), zero)

        def gather(state, inputs):
            lists, tokens, rows, counts, pool_rank, pool_offset = state
            examples, batch_counts_, rank, offset, shard_end = inputs
            starting = pool_rank < 0
            pool_rank = tf.where(starting, rank, pool_rank)
            pool_offset = tf.where(starting, offset, pool_offset)
            lists = arrays.push(lists, examples)
            lengths = batch_lengths(examples, keys)
            rows += tf.size(lengths, out_type=tf.int64)
            tokens += tf.reduce_sum(tf.cast(tf.maximum(lengths, 1), tf.int64))
            counts += batch_counts_
            ready = shard_end
            if self.pool_tokens is not None:
                ready |= tokens >= self.pool_tokens
            else:
                ready |= rows >= self.pool_examples
            out = (ready, (lists, counts, pool_rank, pool_offset))
            state = tf.cond(ready, initial, lambda: (lists, tokens, rows, counts, pool_rank,
                                                     pool_offset))
            return state, out

        pools = (encoded.scan(initial(), gather)
                 .filter(lambda ready, pool: ready)
                 .map(lambda ready, pool: (arrays.concat(pool[0]),) + tuple(pool[1:])))
        return pools


def _num_batches(batches) -> tf.Tensor:
    """N, the leading dimension of a pool's batches (int64)."""
    first = tf.nest.flatten(batches, expand_composites=False)[0]
    n = first.nrows() if isinstance(first, tf.RaggedTensor) else tf.shape(first)[0]
    return tf.cast(n, tf.int64)


def _with_one_empty(batches):
    """Appends one empty batch (0 examples) after a pool's batches, so that element 0 exists
    even for a pool with none."""

    def append(x):
        if isinstance(x, tf.RaggedTensor):
            empty = tf.RaggedTensor.from_row_lengths(x.values[:0],
                                                     tf.zeros([1], x.row_splits.dtype))
            return tf.concat([x, empty], axis=0)
        return tf.concat([x, tf.zeros(tf.concat([[1], tf.shape(x)[1:]], 0), x.dtype)], axis=0)

    return tf.nest.map_structure(append, batches)
