"""A line-level shuffle on the batched path: random shards, each shuffled in memory.

Sorted files (by label, date, source) come out of ``text_lines`` in file order, and shuffling
whole line batches cannot mix the lines inside them. ``shard_shuffle`` gives the batched path
a true global shuffle with bounded memory:

  assign  every line belongs to one of K shards drawn at random from its position (a
          stateless uniform draw seeded by ``(seed, line batch index)``): a shard is a
          uniform random subset of the corpus, whatever the file order.
  spill   with K > 1 the input is read once, when the dataset is built, and each shard's
          lines are written to a file of their own in a temporary directory (removed when
          the process exits; ``spill_dir`` chooses where). Files changed afterwards are not
          re-read.
  read    every epoch visits the K shards in a new random order; each shard's file is read,
          its lines held as one ``tf.string [L]`` tensor, permuted (a stateless shuffle,
          seeded per epoch and shard) and cut into ``[batch_size]`` line batches. With K = 1
          (input up to one shard's size) nothing is spilled: the lines are read in the first
          epoch and kept (``Dataset.cache`` of that one tensor, the memory the shuffle holds
          anyway); later epochs only permute them.

Every batch is therefore a uniform random draw of lines (a perfect shuffle's mixing), every line
appears exactly once per epoch, the order changes every epoch and is the same for the same seed.
Iterators checkpoint (``tf.train.Checkpoint(iterator=...)``): the state is the shard order, the
per-epoch seeds and the position in the current shard's batches.

Memory: about ``2 * (B_line + 32) * L / K`` bytes for ``L`` lines of mean length ``B_line``
bytes (one shard plus its permuted copy; 32 bytes is a ``tf.string`` element's overhead); the
checkpoint of an iterator mid-shard also holds that shard. K is chosen from the input size so
that one shard holds about ``shuffle_shard_bytes`` of text (64 MiB by default; gzip input counts
4x its size). Disk (K > 1): the input's text once, uncompressed. Reading: one pass over the input
to build the dataset, then one pass over the spilled shards per epoch. Built inside a
``tf.function`` (not eagerly) nothing can be spilled, and each epoch reads the input once per
shard instead. No end-of-stream sentinel is used: a shard ends when its input ends.
"""

from __future__ import annotations

import atexit
import math
import os
import random
import shutil
import tempfile

import tensorflow as tf

_GZIP_RATIO = 4
# Read batches gathered at once when a shard is read whole (text_lines reads 8,192 lines per
# batch here): a shard is one tensor up to 33M input lines, beyond that it is permuted in chunks
# of that many input lines. (A larger ragged_batch size costs time per epoch.)
_MAX_SHARD_ELEMENTS = 1 << 12


def num_shuffle_shards(files: list[str], kinds: list[str], shard_bytes: int) -> int:
    """K, the number of shuffle shards: input bytes (gzip counted 4x) / ``shard_bytes``, >= 1."""
    total = 0
    for path, kind in zip(files, kinds):
        size = tf.io.gfile.stat(path).length
        total += size * (_GZIP_RATIO if kind == "GZIP" else 1)
    return max(1, min(4096, math.ceil(total / shard_bytes)))


def shard_shuffle(make_batches, *, batch_size: int, num_shards: int,
                  seed: int | None, spill_dir: str | None = None) -> tf.data.Dataset:
    """Line batches -> the same lines, globally shuffled, in ``[batch_size]`` batches.

    Every line belongs to one of K shards drawn at random from its position (stateless,
    seeded), so a shard is a uniform random subset of the corpus. With K > 1 the input is
    read once now and each shard written to a file (``spill_shards``); each epoch visits the
    shards in a new random order and, for each, reads its file, holds its lines as one
    ``tf.string [L]`` tensor, permutes them and cuts them into batches.

    Args:
      make_batches: ``() -> tf.data.Dataset`` of ``tf.string [n]`` line batches, in the same
        deterministic order every call (``text_lines(..., batch_size=...)``).
      batch_size: lines per output batch (the last batch of each shard may be smaller).
      num_shards: K; memory is one shard.
      seed: seed of the shard assignment and of every epoch's order; ``None`` draws one.
      spill_dir: where the K > 1 shards are written (a new subdirectory of it); default a
        new temporary directory. Either is removed when the process exits.

    Returns:
      ``tf.data.Dataset`` of ``tf.string [n]``, ``1 <= n <= batch_size``.
    """
    if seed is None:
        seed = random.getrandbits(31)
    # Two int64 per shard per epoch: a new permutation every epoch, the same for the same seed.
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
    if num_shards == 1:
        # One shard is the whole input: it is read once and kept (the memory the shuffle holds
        # anyway), each epoch permutes it anew. Later epochs read nothing, so their batches
        # come as soon as the permutation is done instead of after a full read.
        whole = _gather_lines(make_batches()).cache()
        return tf.data.Dataset.zip((whole, seeds)).flat_map(
            lambda lines, shuffle_seed: _permuted_batches(lines, shuffle_seed, batch_size))
    shards = tf.data.Dataset.range(num_shards).shuffle(
        num_shards, seed=seed, reshuffle_each_iteration=True)
    if tf.executing_eagerly():
        paths = tf.constant(spill_shards(make_batches, num_shards, seed, spill_dir))
        read_shard = _spilled_shard_batches(paths, batch_size)
    else:  # nothing can run while a graph is being built: each shard re-reads the input
        read_shard = _shard_batches(make_batches, batch_size, num_shards, seed)
    return tf.data.Dataset.zip((shards, seeds)).interleave(
        read_shard, cycle_length=1, num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True)  # reads ahead the next shard


def _shard_of(lines, index, seed: int, num_shards: int) -> tf.Tensor:
    """int64, the shape of ``lines``: the shard of each line of read batch ``index``."""
    return tf.random.stateless_uniform(
        tf.shape(lines), seed=tf.stack([tf.constant(seed, tf.int64), index]),
        maxval=num_shards, dtype=tf.int64)


def spill_shards(make_batches, num_shards: int, seed: int, spill_dir: str | None = None
                 ) -> list[str]:
    """Reads the input once and writes each shard's lines to a TFRecord file of its own.

    Each read batch's lines of shard k become one record of file k (a serialized
    ``tf.string [m]``), in input order, so a shard's file reads back the same every time.
    Files are written into a new directory (under ``spill_dir``, or the system's temporary
    directory) that is removed when the process exits.

    Returns:
      The K file paths, shard k's at index k.
    """
    if spill_dir is not None:
        os.makedirs(spill_dir, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="tfseq_shuffle_", dir=spill_dir)
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    paths = [os.path.join(directory, f"shard-{k:05d}-of-{num_shards:05d}.tfrecord")
             for k in range(num_shards)]

    def records(index, lines):
        shard = _shard_of(lines, index, seed, num_shards)
        # Shard ids in sorted order and the records of the shards present, one per shard.
        order = tf.argsort(shard, stable=True)
        ids, _, counts = tf.unique_with_counts(tf.gather(shard, order))
        groups = tf.RaggedTensor.from_row_lengths(tf.gather(lines, order), counts)
        return ids, tf.map_fn(tf.io.serialize_tensor, groups,
                              fn_output_signature=tf.TensorSpec([], tf.string))

    writers = [tf.io.TFRecordWriter(p) for p in paths]
    try:
        batches = make_batches().enumerate().map(records, num_parallel_calls=tf.data.AUTOTUNE)
        for ids, serialized in batches.prefetch(2).as_numpy_iterator():
            for k, record in zip(ids.tolist(), serialized.tolist()):
                writers[k].write(record)
    finally:
        for writer in writers:
            writer.close()
    return paths


def _spilled_shard_batches(paths: tf.Tensor, batch_size: int):
    """(int64 shard k, int64 [2] seed) -> the lines of shard k's file, permuted, in batches."""

    def shard_batches(k, shuffle_seed):
        groups = tf.data.TFRecordDataset(paths[k]).map(
            lambda record: tf.ensure_shape(tf.io.parse_tensor(record, tf.string), [None]))
        return _gather_lines(groups).flat_map(
            lambda lines: _permuted_batches(lines, shuffle_seed, batch_size))

    return shard_batches


def _gather_lines(batches: tf.data.Dataset) -> tf.data.Dataset:
    """Line batches -> the same lines as one ``tf.string [L]`` tensor (several for more than
    ``_MAX_SHARD_ELEMENTS`` batches)."""
    return batches.ragged_batch(_MAX_SHARD_ELEMENTS).map(lambda rows: rows.flat_values)


def _permuted_batches(lines, shuffle_seed, batch_size: int) -> tf.data.Dataset:
    """``tf.string [L]`` -> its lines in a seeded random order, ``[batch_size]`` at a time."""
    lines = tf.random.experimental.stateless_shuffle(lines, seed=shuffle_seed)
    n = tf.size(lines, out_type=tf.int64)
    return tf.data.Dataset.range(0, n, batch_size).map(
        lambda start: lines[start:start + batch_size])


def _shard_batches(make_batches, batch_size: int, num_shards: int, seed: int):
    """(int64 shard k, int64 [2] seed) -> shard k's lines (read from the input), permuted, in
    line batches."""

    def keep_shard(k, index, lines):
        return tf.boolean_mask(lines, tf.equal(_shard_of(lines, index, seed, num_shards), k))

    def shard_batches(k, shuffle_seed):
        batches = make_batches().enumerate().map(lambda i, lines: keep_shard(k, i, lines))
        return _gather_lines(batches).flat_map(
            lambda lines: _permuted_batches(lines, shuffle_seed, batch_size))

    return shard_batches
