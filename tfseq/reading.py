"""Reading text lines from many files: globs, gzip, parallel interleaved reads, sharding.

``text_lines(patterns)`` yields ``tf.string`` scalars, one per line, with the line ending
(``\\n`` or ``\\r\\n``) and a leading UTF-8 byte-order mark removed. Lines are otherwise passed
through byte for byte; bad lines (empty, invalid UTF-8, NUL bytes, huge) are left to
``tfseq.filter_lines``, which counts what it drops.

Everything that can be checked before a graph runs is: a pattern matching nothing raises
``FileNotFoundError`` naming it, and gzip files are verified end to end (tf.data's reader
silently stops at the point a truncated gzip file breaks off; tfseq raises instead).
"""

from __future__ import annotations

import os
import zlib
from typing import Iterable

import tensorflow as tf

from tfseq._common import check_positive_int

_GLOB_CHARS = set("*?[")
_COMPRESSIONS = {None: None, "": "", "none": "", "gzip": "GZIP", "auto": None}
_BOM = b"\xef\xbb\xbf"
_VERIFIED_GZIP: dict[tuple[str, int, float], bool] = {}


def resolve_files(patterns: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """Expands files and glob patterns to a sorted-per-pattern, de-duplicated list of paths.

    Raises:
      FileNotFoundError: a pattern matches no file (the message names the pattern).
      TypeError: ``patterns`` is not a path or an iterable of paths.
    """
    if isinstance(patterns, (str, bytes, os.PathLike)):
        patterns = [patterns]
    try:
        patterns = [os.fspath(p) for p in patterns]
    except TypeError as e:
        raise TypeError(f"patterns must be a path or a list of paths; received {patterns!r}") from e
    if not patterns:
        raise ValueError("patterns is empty: give at least one file or glob pattern")
    files: list[str] = []
    seen = set()
    for pattern in patterns:
        if isinstance(pattern, bytes):
            pattern = pattern.decode()
        if _GLOB_CHARS & set(pattern):
            matched = sorted(tf.io.gfile.glob(pattern))
        else:
            matched = [pattern] if tf.io.gfile.exists(pattern) else []
        matched = [m for m in matched if not tf.io.gfile.isdir(m)]
        if not matched:
            raise FileNotFoundError(f"No file matches the pattern {pattern!r}")
        for path in matched:
            if path not in seen:
                seen.add(path)
                files.append(path)
    return files


def verify_gzip(path: str) -> None:
    """Decompresses ``path`` fully (streaming, in C) and raises if it is truncated or corrupt.

    Raises:
      ValueError: naming the file, when the gzip stream is corrupt, truncated or followed by
        garbage.
    """
    stat = os.stat(path)
    key = (path, stat.st_size, stat.st_mtime)
    if key in _VERIFIED_GZIP:
        return
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    fed = False  # whether the current gzip member has consumed any input
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                while chunk:
                    decompressor.decompress(chunk, 1 << 22)
                    fed = True
                    chunk = decompressor.unconsumed_tail
                    if decompressor.eof:
                        # Concatenated members are valid gzip: go on with the next one.
                        chunk = decompressor.unused_data + chunk
                        decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
                        fed = False
    except zlib.error as e:
        raise ValueError(f"{path}: corrupt gzip data ({e})") from e
    if fed and not decompressor.eof:
        raise ValueError(f"{path}: truncated gzip file (the compressed stream ends early)")
    _VERIFIED_GZIP[key] = True


def _compression_for(path: str, compression: str | None) -> str:
    if compression is None:
        return "GZIP" if path.endswith(".gz") else ""
    return compression


def text_lines(patterns, *, compression: str | None = None, shuffle_files: bool = False,
               seed: int | None = None, num_parallel_reads: int | None = None,
               num_shards: int = 1, shard_index: int = 0, verify: bool = True,
               buffer_size: int = 1 << 20, batch_size: int | None = None,
               header: bool = False, shuffle_lines: bool = False,
               shuffle_shard_bytes: int = 64 << 20,
               shuffle_dir: str | None = None) -> tf.data.Dataset:
    """Dataset of the lines of every file matched by ``patterns``.

    Args:
      patterns: a path or glob, or a list of them. Files are taken in sorted order per pattern.
      compression: ``None``/``"auto"`` (gzip when the name ends in ``.gz``), ``"gzip"`` or
        ``"none"``, for every file.
      shuffle_files: shuffle the file order every epoch (seeded by ``seed``). This only
        reorders files: the lines of a sorted file stay sorted (see ``shuffle_lines``).
      seed: seed for the file shuffle and the line shuffle.
      num_parallel_reads: files read at once, interleaved line by line (default: all, at most
        16). The output order is deterministic unless ``tf.data.Options.deterministic`` is off.
      num_shards, shard_index: read only shard ``shard_index`` of ``num_shards``. With at least
        ``num_shards`` files whole files are sharded (each worker reads only its files);
        otherwise lines are sharded round-robin. The shards together cover every line once.
      verify: check gzip files end to end before building the graph (a truncated gzip file
        raises ``ValueError`` naming it). Results are cached per (path, size, mtime).
      buffer_size: read buffer per file, in bytes (the line reader's; see ``batch_size``).
      batch_size: emit ``tf.string [n]`` batches of up to ``batch_size`` consecutive lines of
        one file instead of single lines (files are then interleaved batch by batch). Every
        vectorized stage (``filter_lines``, ``tokenize``) keeps the batches, and
        ``bucket_by_length``/``pack`` take them whole: the fast path, with no tf.data call per
        line (docs/benchmarks.md#input-pipeline-throughput). Plain (uncompressed)
        files are then read in blocks of 1 MiB that are split into lines in the graph (faster
        than the line reader, the same batches); gzip files go through the line reader.
        The blocks are cut from each file's size when the dataset is built: files must not
        change while they are read.
      header: skip the first line of every file (a header row).
      shuffle_lines: a global line shuffle, every epoch a new order (the same for the same
        ``seed``), every line exactly once, checkpointable iterators: batches from a sorted
        file are mixed like a perfect shuffle. Each line belongs to one of K random shards; each
        epoch reads the shards in a random order, each permuted in memory. Memory: about
        ``2 * (mean line bytes + 32)`` bytes per line of one shard, a shard holding about
        ``shuffle_shard_bytes`` of text. Reading: with K = 1 (input up to
        ``shuffle_shard_bytes``) one pass in the first epoch, the lines kept for the next; with
        K > 1 one pass now, while this call writes each shard to a file (disk: the input's
        text once, in ``shuffle_dir``), then one pass over those files per epoch.
        ``shuffle_files`` is implied. Without ``batch_size`` the shuffled lines are unbatched.
        See ``tfseq.shuffling``.
      shuffle_shard_bytes: text per shuffle shard (gzip files count 4x their size): the memory
        bound of ``shuffle_lines``.
      shuffle_dir: where ``shuffle_lines`` writes its shards when K > 1 (a new directory in
        it, removed when the process exits); default the system's temporary directory
        (``TMPDIR``), which should be on disk, not in memory. Data service workers must be
        able to read it.

    Returns:
      ``tf.data.Dataset`` of ``tf.string`` scalars: one line each, without ``\\n``/``\\r\\n``
      and without a leading UTF-8 BOM (``[n]`` vectors of them with ``batch_size``).

    Raises:
      FileNotFoundError: a pattern matches nothing.
      ValueError: bad ``compression``/shard arguments, or a corrupt or truncated gzip file.

    Example:
      >>> ds = tfseq.text_lines(["data/*.txt.gz", "extra.txt"], shuffle_files=True, seed=1)
    """
    key = compression.lower() if isinstance(compression, str) else compression
    if key not in _COMPRESSIONS:
        raise ValueError(f"Unknown compression {compression!r}; expected one of "
                         "None, 'auto', 'gzip', 'none'")
    compression = _COMPRESSIONS[key]
    check_positive_int("num_shards", num_shards)
    if isinstance(shard_index, bool) or not isinstance(shard_index, int) or not (
            0 <= shard_index < num_shards):
        raise ValueError(f"shard_index must be an int in [0, num_shards={num_shards}); "
                         f"received shard_index={shard_index!r}")
    check_positive_int("num_parallel_reads", num_parallel_reads, allow_none=True)
    check_positive_int("batch_size", batch_size, allow_none=True)

    check_positive_int("shuffle_shard_bytes", shuffle_shard_bytes)
    if shuffle_lines:
        return _shuffled_lines(
            patterns, compression=compression, seed=seed, num_parallel_reads=num_parallel_reads,
            num_shards=num_shards, shard_index=shard_index, verify=verify,
            buffer_size=buffer_size, batch_size=batch_size,
            shuffle_shard_bytes=shuffle_shard_bytes, shuffle_dir=shuffle_dir, header=header)

    files = resolve_files(patterns)
    shard_lines = num_shards > 1 and len(files) < num_shards
    if num_shards > 1 and not shard_lines:
        files = files[shard_index::num_shards]
    kinds = [_compression_for(f, compression) for f in files]
    if verify:
        for path, kind in zip(files, kinds):
            if kind == "GZIP":
                verify_gzip(path)

    # Plain files, batched: read in blocks of bytes and split into lines in the graph (one
    # tf.data element per block, not per line); the same batches as the line reader below.
    in_blocks = batch_size is not None and all(kind == "" for kind in kinds)
    sizes = [tf.io.gfile.stat(f).length if in_blocks else 0 for f in files]
    file_ds = tf.data.Dataset.from_tensor_slices((files, kinds, tf.constant(sizes, tf.int64)))
    if shuffle_files and len(files) > 1:
        file_ds = file_ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    cycle = num_parallel_reads or min(len(files), 16)

    def read(path, kind, size):
        if in_blocks:
            return _block_lines(path, size, header=header,
                                shard=(num_shards, shard_index) if shard_lines else None
                                ).rebatch(batch_size)
        lines = tf.data.TextLineDataset(path, compression_type=kind, buffer_size=buffer_size)
        if header:
            lines = lines.skip(1)
        if batch_size is None:
            return lines
        # Batched: shard lines inside each file (the shards still cover every line once) and
        # batch before the interleave, so it hands out batches, not lines.
        if shard_lines:
            lines = lines.shard(num_shards, shard_index)
        return lines.batch(batch_size)

    if batch_size is not None:
        batches = read(files[0], kinds[0], sizes[0]) if len(files) == 1 else file_ds.interleave(
            read, cycle_length=cycle, block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE if cycle > 1 else None)
        return batches.map(_strip_bom, num_parallel_calls=tf.data.AUTOTUNE)
    if len(files) == 1:
        lines = read(files[0], kinds[0], sizes[0])
    else:
        lines = file_ds.interleave(
            read, cycle_length=cycle, block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE if cycle > 1 else None,
            deterministic=True if shard_lines else None)
    if shard_lines:
        lines = lines.shard(num_shards, shard_index)
    # Vectorized: one call per 1,024 lines costs a fraction of a per-line map.
    return lines.batch(1024).map(_strip_bom).unbatch()


def _shuffled_lines(patterns, *, compression, seed, num_parallel_reads, num_shards, shard_index,
                    verify, buffer_size, batch_size, shuffle_shard_bytes, shuffle_dir, header):
    """``text_lines(..., shuffle_lines=True)``: the unshuffled line batches, shard-shuffled."""
    from tfseq import shuffling

    files = resolve_files(patterns)
    kinds = [_compression_for(f, compression) for f in files]
    if verify:
        for path, kind in zip(files, kinds):
            if kind == "GZIP":
                verify_gzip(path)

    def make_batches():  # the unshuffled read batches, in the same order every call
        return text_lines(files, compression=compression, num_parallel_reads=num_parallel_reads,
                          num_shards=num_shards, shard_index=shard_index, verify=False,
                          buffer_size=buffer_size, batch_size=_SHUFFLE_READ_BATCH,
                          header=header)

    k = shuffling.num_shuffle_shards(files, kinds, shuffle_shard_bytes)
    out = shuffling.shard_shuffle(make_batches, batch_size=batch_size or _SHUFFLE_READ_BATCH,
                                  num_shards=k, seed=seed, spill_dir=shuffle_dir)
    return out if batch_size else out.unbatch()


_SHUFFLE_READ_BATCH = 8192  # lines per read batch inside the shuffle
_BLOCK_BYTES = 1 << 20      # bytes per read of a plain file on the batched path


def _block_lines(path: tf.Tensor, size: tf.Tensor, *, header: bool,
                 shard: tuple[int, int] | None) -> tf.data.Dataset:
    """The lines of a plain (uncompressed) file as ``tf.string [n]`` vectors, one per block of
    ``_BLOCK_BYTES`` bytes read, exactly as ``TextLineDataset`` splits them: ``\\n`` ends a
    line, every ``\\r`` is removed, no empty line after a final ``\\n``.

    A ``scan`` carries the unfinished last line of each block into the next; the block
    count (from ``size``, the file's bytes when the graph was built) marks the last one.
    ``header`` drops the file's first line; ``shard = (num_shards, index)`` keeps the lines
    ``index, index + num_shards, ...`` of the rest, as ``lines.skip(1).shard(...)`` would.
    """
    size = tf.cast(size, tf.int64)
    block_bytes = tf.constant(_BLOCK_BYTES, tf.int64)
    tail = size % block_bytes
    num_blocks = size // block_bytes + tf.cast(tail > 0, tf.int64)
    full = tf.data.FixedLengthRecordDataset(path, block_bytes, footer_bytes=tail)
    last = tf.data.FixedLengthRecordDataset(
        path, tf.maximum(tail, 1), header_bytes=tf.maximum(size - tf.maximum(tail, 1), 0)
    ).take(tf.cast(tail > 0, tf.int64))
    blocks = tf.data.Dataset.zip(tf.data.Dataset.range(num_blocks), full.concatenate(last))
    skip = 1 if header else 0

    def split(state, indexed_block):
        carry, seen = state
        index, block = indexed_block
        text = carry + tf.strings.regex_replace(block, "\r", "")
        parts = tf.strings.split(text, "\n")
        n = tf.size(parts)
        ends_line = tf.equal(tf.strings.substr(
            text, tf.maximum(tf.strings.length(text) - 1, 0), 1), "\n") | tf.equal(text, "")
        # The last part is unfinished, unless it is the file's last line without a "\n".
        done = tf.where(tf.equal(index, num_blocks - 1) & tf.logical_not(ends_line), n, n - 1)
        lines = parts[:done]
        state = (parts[n - 1], seen + tf.cast(done, tf.int64))
        if not skip and shard is None:  # every line kept: no second copy of the block
            return state, lines
        line_no = seen + tf.range(tf.cast(done, tf.int64)) - skip   # after the header
        keep = line_no >= 0
        if shard is not None:
            keep &= tf.equal(line_no % shard[0], shard[1])
        return state, tf.boolean_mask(lines, keep)

    plain = tf.autograph.experimental.do_not_convert
    return blocks.scan((tf.constant(""), tf.constant(0, tf.int64)), plain(split))


def _strip_bom(line: tf.Tensor) -> tf.Tensor:
    """tf.string of any shape -> the same without a leading UTF-8 BOM (the lines are copied
    only when one of them has one)."""
    has_bom = tf.equal(tf.strings.substr(line, 0, 3), _BOM)
    return tf.cond(tf.reduce_any(has_bom), lambda: tf.strings.substr(
        line, tf.where(has_bom, 3, 0), tf.strings.length(line)), lambda: line)
