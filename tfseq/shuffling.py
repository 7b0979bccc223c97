"""The line shuffle: records in K random shards, a new order every epoch, bounded memory.

One engine serves both users: ``text_lines(..., shuffle_lines=True)`` (``shard_shuffle``) and
the training stream (``tfseq.ResumableStream`` over a ``RecordShards``). Shapes: n = records in
a read batch, L = records in a shard.

  sizes   K = the input's bytes (gzip counted ``GZIP_RATIO`` times its size) / the bytes a
          shard should hold, rounded up, 1 to 4096 (``num_shards_for``).
  assign  record j of read batch i belongs to shard ``stateless_uniform(seed=(seed, i))[j]
          mod K`` (``shard_of``): a shard is a uniform random subset of the corpus, whatever
          the file order.
  spill   (K > 1) one pass over the input writes each shard's records to a TFRecord file of
          its own, ``shard-<k>-of-<K>.tfrecord``, in input order (one record per read batch
          and shard: a serialized ``tf.string [m]``), then ``manifest.json`` with the seed, K,
          the input's fingerprint and each shard's size (``RecordShards.spill`` or a
          ``SpillWriter`` fed by another pass). Files changed afterwards are not re-read.
  epoch   epoch ``e`` visits the shards in the order ``stateless_shuffle(0..K-1, seed=(seed,
          e))``; each shard is read whole (its file; with K = 1 the input) as one
          ``tf.string [L]`` tensor, permuted with the seed ``(seed, e, shard, 1)`` and cut into
          batches (``RecordShards.epoch_batches``). Everything comes from ``(seed, e)`` alone,
          so an epoch can be rebuilt from any position: ``(rank of the shard, offset in its
          permutation)``.

Every batch is a uniform random draw of records (a perfect shuffle's mixing), every record
appears exactly once per epoch, the order changes with the epoch and is the same for the same
seed and epoch.

Memory: one shard, held twice (its records and their permutation): about
``2 * (B_record + 32)`` bytes per record of the shard for records of mean length ``B_record``
bytes (32 bytes is a ``tf.string`` element's overhead). Disk (K > 1): the input's records once.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import random
import shutil
import tempfile
from typing import Any, Callable, Mapping

import tensorflow as tf


GZIP_RATIO = 4     # gzip input counts this many times its size
MAX_SHARDS = 4096


# ----------------------------------------------------------------------------- sizes

def input_bytes(files, kinds=None) -> int:
    """The text ``files`` hold, estimated: their bytes, gzip counted ``GZIP_RATIO`` times.

    ``kinds``: each file's compression (``"GZIP"`` or ``""``); default gzip for ``.gz``."""
    kinds = kinds or ["GZIP" if str(f).endswith(".gz") else "" for f in files]
    return sum(tf.io.gfile.stat(path).length * (GZIP_RATIO if kind == "GZIP" else 1)
               for path, kind in zip(files, kinds))


def num_shards_for(files, shard_bytes: int, kinds=None) -> int:
    """K for ``files``: ``input_bytes(files, kinds) / shard_bytes`` rounded up, 1 to 4096."""
    return max(1, min(MAX_SHARDS, math.ceil(input_bytes(files, kinds) / shard_bytes)))


def num_shuffle_shards(files: list[str], kinds: list[str], shard_bytes: int) -> int:
    """K of ``text_lines(..., shuffle_lines=True)``: ``num_shards_for`` with the files'
    compressions (``"GZIP"`` or ``""`` each)."""
    return num_shards_for(files, shard_bytes, kinds)


# ----------------------------------------------------------------------------- seeds, assignment

def stateless_seed(*parts) -> tf.Tensor:
    """int64 ``[2]`` stateless seed from int scalars (Python or tensors)."""
    parts = [tf.cast(p, tf.int64) for p in parts]
    key = parts[0]
    for p in parts[1:]:
        key = key * 1_000_003 + p
    return tf.stack([tf.constant(0x5EED, tf.int64), key])


def epoch_key(seed: int) -> tf.data.Dataset:
    """One int64 epoch number in ``[0, 2**30)``, a new one at every iteration (the same
    sequence for the same ``seed``): the epoch of a dataset iterated once per epoch
    (``model.fit``, a plain loop)."""
    keys = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
    return keys.take(1).map(lambda key: key % (1 << 30))


def shard_of(records: tf.Tensor, index: tf.Tensor, seed: int, num_shards: int) -> tf.Tensor:
    """int64 ``[n]``: the shard of each record of read batch ``index`` (stateless, seeded)."""
    return tf.random.stateless_uniform(
        tf.shape(records), seed=tf.stack([tf.constant(seed, tf.int64), index]),
        maxval=num_shards, dtype=tf.int64)


def temporary_directory(prefix: str, parent: str | None = None) -> str:
    """A new directory in ``parent`` (created if needed; default the system's temporary
    directory), removed when the process exits."""
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    directory = tempfile.mkdtemp(prefix=prefix, dir=parent)
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


# ----------------------------------------------------------------------------- the shards

class RecordShards:
    """Records as K random shards, in a new order every epoch (see the module docstring).

    Args:
      make_records: ``() -> Dataset`` of ``tf.string [n]`` record batches in one deterministic
        order (the input read in file order).
      num_shards: K. 1 keeps nothing on disk: each epoch reads the input and permutes it whole
        in memory. K > 1 with a ``directory``: ``spill`` (or a ``SpillWriter``) writes each
        shard to a file once; an epoch then reads one shard file at a time. K > 1 without a
        directory: nothing is spilled, each shard is read by reading the input and keeping
        its records (K reads of the input per epoch; where nothing can be written, e.g. while
        a graph is being built).
      seed: the shard assignment and every epoch's orders.
      directory: where the K > 1 shards are written; reused when its ``manifest.json``
        matches.
      keep: with K = 1, keep the records read in the first epoch (in memory: the shard the
        epoch holds anyway) and only permute them in later epochs, which read nothing.

    Memory: the shard being read, permuted (one ``tf.string`` tensor; twice while it is
    gathered and permuted), and the next one read ahead. Disk (K > 1): the input's records
    once.
    """

    def __init__(self, make_records: Callable[[], tf.data.Dataset], *, num_shards: int,
                 seed: int, directory: str | None = None, keep: bool = False):
        self.make_records = make_records
        self.num_shards = num_shards
        self.seed = seed
        self.directory = directory
        self.keep = keep
        self._kept = None
        if keep and num_shards == 1:  # read at the first use, then from the cache
            self._kept = _gather(make_records()).cache()

    @property
    def paths(self) -> list[str]:
        """The K shard files (shard k's at index k)."""
        return [os.path.join(self.directory, f"shard-{k:05d}-of-{self.num_shards:05d}.tfrecord")
                for k in range(self.num_shards)]

    # ----- the spill

    def ready(self, fingerprint: Mapping[str, Any]) -> bool:
        """Whether the shard files exist for this input (``fingerprint``), K and seed."""
        if self.num_shards == 1:
            return True
        if not self.directory:
            return False
        manifest = os.path.join(self.directory, "manifest.json")
        if not os.path.exists(manifest) or not all(os.path.exists(p) for p in self.paths):
            return False
        with open(manifest) as f:
            saved = json.load(f)
        saved.pop("sizes", None)
        return saved == self._manifest(fingerprint)

    def _manifest(self, fingerprint):
        return {"num_shards": self.num_shards, "seed": self.seed, "input": fingerprint}

    def spill_writer(self, fingerprint: Mapping[str, Any]) -> "SpillWriter":
        """A ``SpillWriter`` filling this directory from one pass over the records."""
        if self.num_shards > 1 and not self.directory:
            raise ValueError("RecordShards with num_shards > 1 needs a directory to spill to")
        return SpillWriter(self, self._manifest(fingerprint))

    def spill(self, fingerprint: Mapping[str, Any] | None = None) -> None:
        """Reads ``make_records()`` once and writes the shard files (K > 1; eager)."""
        writer = self.spill_writer(fingerprint or {})
        batches = self.make_records().enumerate().map(
            self.assign, num_parallel_calls=tf.data.AUTOTUNE)
        try:
            for ids, serialized, counts in batches.prefetch(2).as_numpy_iterator():
                writer.write(ids, serialized, counts)
        except BaseException:
            writer.abort()
            raise
        writer.close()

    def assign(self, index: tf.Tensor, records: tf.Tensor):
        """A read batch -> ``(shard ids int64 [s], serialized records tf.string [s], records
        per shard int64 [s])``: the records of each shard present, one serialized ``[m]``
        tensor per shard (graph)."""
        shard = shard_of(records, index, self.seed, self.num_shards)
        order = tf.argsort(shard, stable=True)
        ids, _, counts = tf.unique_with_counts(tf.gather(shard, order), out_idx=tf.int64)
        groups = tf.RaggedTensor.from_row_lengths(tf.gather(records, order), counts)
        return ids, tf.map_fn(tf.io.serialize_tensor, groups,
                              fn_output_signature=tf.TensorSpec([], tf.string)), counts

    def shard_sizes(self) -> list[int]:
        """Records in each shard (from the manifest the spill wrote; else by reading)."""
        if self.num_shards == 1:
            return [int(self.make_records().reduce(
                tf.constant(0, tf.int64), lambda n, b: n + tf.size(b, out_type=tf.int64)))]
        sizes = None
        if self.directory:
            with open(os.path.join(self.directory, "manifest.json")) as f:
                sizes = json.load(f).get("sizes")
        if sizes is None:
            sizes = [sum(int(tf.size(r)) for r in self.shard_dataset(tf.constant(k, tf.int64)))
                     for k in range(self.num_shards)]
        return sizes

    # ----- one epoch

    def shard_dataset(self, shard_id) -> tf.data.Dataset:
        """The records of shard ``shard_id`` in input order: one ``tf.string [L]`` element
        (none when the shard is empty)."""
        if self._kept is not None:
            return self._kept
        if self.num_shards == 1:
            return _gather(self.make_records())
        if self.directory:
            return _gather(tf.data.TFRecordDataset(
                tf.gather(tf.constant(self.paths), shard_id)).map(
                    lambda r: tf.ensure_shape(tf.io.parse_tensor(r, tf.string), [None])))

        def keep_shard(index, records):  # not spilled: the shard's records of the input
            return tf.boolean_mask(records, tf.equal(
                shard_of(records, index, self.seed, self.num_shards), shard_id))

        return _gather(self.make_records().enumerate().map(keep_shard))

    def shard_order(self, epoch) -> tf.Tensor:
        """int64 ``[K]``: the shards in the order epoch ``epoch`` visits them."""
        return tf.random.experimental.stateless_shuffle(
            tf.range(self.num_shards, dtype=tf.int64), seed=stateless_seed(self.seed, epoch))

    def permute(self, records, shard_id, epoch) -> tf.Tensor:
        """``tf.string [L]``, shard ``shard_id``'s records -> the same in epoch ``epoch``'s
        order."""
        return tf.random.experimental.stateless_shuffle(
            records, seed=stateless_seed(self.seed, epoch, shard_id, 1))

    def locate(self, epoch, position, shard_sizes) -> tuple[tf.Tensor, tf.Tensor]:
        """Record ``position`` (int64) of epoch ``epoch`` -> ``(shard rank, offset)``, its place
        in ``epoch_batches``; ``shard_sizes``: int64 ``[K]``, ``shard_sizes()``."""
        if self.num_shards == 1:
            return tf.constant(0, tf.int64), position
        order = self.shard_order(epoch)
        ends = tf.cumsum(tf.gather(shard_sizes, order))
        rank = tf.searchsorted(ends, position[None], side="right", out_type=tf.int64)[0]
        return rank, position - (ends[rank] - tf.gather(shard_sizes, tf.gather(order, rank)))

    def epoch_batches(self, epoch, start_shard, start_offset, batch_size: int) -> tf.data.Dataset:
        """The records of epoch ``epoch`` from ``(start_shard, start_offset)`` on.

        Returns:
          A dataset of ``(records tf.string [n], shard rank int64, offset int64, shard_end
          bool)``: the shards in this epoch's order (rank r is the r-th visited), each
          permuted for this epoch and cut into batches of ``batch_size`` records (the last of
          a shard may be smaller); ``offset`` is a batch's first record in its shard's
          permutation.
        """
        order = self.shard_order(epoch)
        ranks = tf.range(tf.cast(start_shard, tf.int64), self.num_shards, dtype=tf.int64)

        def shard_batches(rank):
            shard_id = tf.gather(order, rank)
            first = tf.where(tf.equal(rank, start_shard), tf.cast(start_offset, tf.int64), 0)

            def batches(records):  # permuted by the map below: one copy of the shard held
                size = tf.size(records, out_type=tf.int64)
                return tf.data.Dataset.range(first, size, batch_size).map(
                    lambda start: (records[start:start + batch_size], rank, start,
                                   start + batch_size >= size))

            return self.shard_dataset(shard_id).map(
                lambda records: self.permute(records, shard_id, epoch)).flat_map(batches)

        # cycle_length=1 keeps the shards in order; the parallel call reads the next ahead.
        return tf.data.Dataset.from_tensor_slices(ranks).interleave(
            shard_batches, cycle_length=1, num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True)


# Read batches (or spilled groups) joined at once into a chunk, and chunks into a shard: at most
# 4096 * 65536 of them in a shard (beyond, a shard comes as several tensors, each permuted
# alone). Larger batch sizes make tf.data allocate for them.
_CHUNK_BATCHES = 1 << 12
_SHARD_CHUNKS = 1 << 16


def _gather(batches: tf.data.Dataset) -> tf.data.Dataset:
    """``tf.string [n]`` batches -> one ``tf.string [L]`` element, all of them in order (none
    when there are none). Dataset ops only, so iterators checkpoint, and linear in the
    batches (a ``reduce`` over a ``TensorList`` copies the list at every step)."""
    chunks = batches.ragged_batch(_CHUNK_BATCHES).map(
        lambda rows: (rows.flat_values, tf.size(rows.flat_values, out_type=tf.int64)))

    def join(values, lengths):  # [C, M] padded chunks -> their values, in order
        return tf.cond(tf.equal(tf.size(lengths), 1), lambda: values[0], lambda: tf.boolean_mask(
            values, tf.sequence_mask(lengths, tf.shape(values, tf.int64)[1])))

    return chunks.padded_batch(_SHARD_CHUNKS).map(join)


class SpillWriter:
    """Writes ``RecordShards``' files from read batches handed to it in order (one pass).

    ``write(shard_ids, serialized, counts)`` takes what ``RecordShards.assign`` gives for a
    read batch; ``close()`` writes the manifest last, so a pass cut short leaves no
    usable-looking directory behind (``abort()``: close the files, no manifest)."""

    def __init__(self, shards: RecordShards, manifest: dict):
        self.shards = shards
        self.manifest = manifest
        if shards.num_shards > 1:
            if os.path.exists(shards.directory):
                shutil.rmtree(shards.directory)
            os.makedirs(shards.directory)
        self.writers = [tf.io.TFRecordWriter(p) for p in shards.paths] \
            if shards.num_shards > 1 else []
        self.sizes = [0] * shards.num_shards

    def write(self, shard_ids, serialized, counts) -> None:
        for k, record, n in zip(shard_ids.tolist(), serialized.tolist(), counts.tolist()):
            self.writers[k].write(record)
            self.sizes[k] += n

    def abort(self) -> None:
        for writer in self.writers:
            writer.close()

    def close(self) -> None:
        self.abort()
        if self.writers:
            path = os.path.join(self.shards.directory, "manifest.json")
            with open(path + ".tmp", "w") as f:
                json.dump({**self.manifest, "sizes": self.sizes}, f, indent=1, sort_keys=True)
            os.replace(path + ".tmp", path)


# ----------------------------------------------------------------------------- text_lines

def shard_shuffle(make_batches, *, batch_size: int, num_shards: int,
                  seed: int | None, spill_dir: str | None = None) -> tf.data.Dataset:
    """Line batches -> the same lines, globally shuffled, in ``[batch_size]`` batches: what
    ``text_lines(..., shuffle_lines=True)`` returns.

    The lines are a ``RecordShards``. Built eagerly with K > 1, the input is read once now and
    the shards spilled to a new directory (in ``spill_dir`` or the system's temporary
    directory, removed when the process exits); built inside a ``tf.function`` nothing can be
    written, and each epoch reads the input once per shard. With K = 1 the lines read in the
    first epoch are kept for the later ones. Each iteration draws a new epoch number
    (``epoch_key``), and the epoch's batches are ``RecordShards.epoch_batches``. Iterators
    checkpoint (``tf.train.Checkpoint(iterator=...)``): the state is the epoch number and the
    position in the current shard's batches (plus the shard, when it is the kept one).

    Args:
      make_batches: ``() -> tf.data.Dataset`` of ``tf.string [n]`` line batches, in the same
        deterministic order every call (``text_lines(..., batch_size=...)``).
      batch_size: lines per output batch (the last batch of each shard may be smaller).
      num_shards: K; memory is one shard.
      seed: seed of the shard assignment and of every epoch's order; ``None`` draws one.
      spill_dir: where the K > 1 shards are written (a new subdirectory of it).

    Returns:
      ``tf.data.Dataset`` of ``tf.string [n]``, ``1 <= n <= batch_size``.
    """
    if seed is None:
        seed = random.getrandbits(31)
    spill = num_shards > 1 and tf.executing_eagerly()
    shards = RecordShards(
        make_batches, num_shards=num_shards, seed=seed, keep=True,
        directory=temporary_directory("tfseq_shuffle_", spill_dir) if spill else None)
    if spill:
        shards.spill()
    return epoch_key(seed).flat_map(lambda epoch: shards.epoch_batches(
        epoch, 0, 0, batch_size).map(lambda lines, *_: lines))
