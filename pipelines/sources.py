"""Where a split's records come from, and how they become rows: ``Source``.

Shapes: n = records in a batch, m = rows kept.

A task's examples start as records (``tfseq.formats``): lines of the user's TSV/CSV/text files,
CoNLL sentences, line pairs of two aligned files, or lines of the embedded corpus. A ``Source``
pairs the records of one split (``read``, in a deterministic order, optionally sharded) with
the function that parses them into rows ``{column: tf.string [m]}``, counting each record it
drops (``parse``). The training stream shuffles the records (``tfseq.resumable``), evaluation
reads them in order; both use the same ``parse``.

Which records belong to which split: with ``eval_files`` the training files are all training
and the eval files all evaluation; without, a stable hash of each record holds out
``eval_percent`` of the training files (counted as ``other_split`` in the split that skips it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Callable, Sequence

import tensorflow as tf

from tfseq import formats
from tfseq.errors import InputError
from tfseq.formats import RowFormat
from tfseq.stats import DropCounter

READ_BATCH = formats.READ_BATCH


@dataclasses.dataclass(frozen=True)
class Source:
    """One split's records and their parsing.

    Attributes:
      description: what it reads, for messages (``"train.tsv"``, ``"the embedded corpus"``).
      files: the files read (for the input fingerprint and the number of shuffle shards).
      read: ``(num_shards, shard_index) -> Dataset`` of ``tf.string [n]`` record batches, in
        the same order every time.
      parse: ``(records tf.string [n], counter) -> {column: tf.string [m]}``, the rows kept;
        counts ``lines_read`` and each drop in ``counter`` (a graph function).
      drop_examples: ``(limit) -> ["file:line: reason", ...]``, the first malformed records.
      must_check: reading the records checks something that must hold before training (the
        format's ``must_check``: two files line-aligned, TFRecord features of one kind), so a
        run reads them once before its first step.
      diagnose: ``() -> message or None``, naming the record that made reading fail.
    """

    description: str
    files: tuple[str, ...]
    read: Callable[[int, int], tf.data.Dataset]
    parse: Callable[[tf.Tensor, DropCounter], dict]
    drop_examples: Callable[[int], list[str]] = lambda limit: []
    must_check: bool = False
    diagnose: Callable[[], str | None] = lambda: None


def user_format(config, *, required: Sequence[str], allowed: Sequence[str]
                ) -> tuple[list[str], RowFormat]:
    """The resolved training files and their ``RowFormat``.

    Raises:
      InputError: missing or empty files, bad ``columns`` or ``format`` (message names the fix).
    """
    train = formats.resolve(config.train_files, "--train_files")
    fmt = formats.row_format(train, config.format, config.columns or None, config.header,
                             required=required, allowed=allowed)
    return train, fmt


def user_source(config, split: str, *, required: Sequence[str],
                allowed: Sequence[str]) -> Source:
    """The records of ``split`` from the user's files (``train_files``, ``eval_files``)."""
    train, fmt = user_format(config, required=required, allowed=allowed)
    if config.eval_files and split == "eval":
        files, hold_out = formats.resolve(config.eval_files, "--eval_files"), None
    elif config.eval_files:
        files, hold_out = train, None
    else:
        files, hold_out = train, split

    def read(num_shards: int = 1, shard_index: int = 0):
        return formats.read_records(files, fmt, num_shards=num_shards, shard_index=shard_index,
                                    in_order=True)

    def parse(records, counter):
        return formats.parse_rows(records, fmt, counter, split=hold_out,
                                  eval_percent=config.eval_percent)

    kind = formats.format_of(fmt.format)
    return Source(", ".join(files), tuple(files), read, parse,
                  lambda limit: formats.drop_examples(files, fmt, limit=limit),
                  must_check=kind.must_check, diagnose=lambda: kind.diagnose(files, fmt))


def aligned_source(config, split: str) -> Source:
    """The line pairs of ``source_files``/``target_files`` (``columns`` ``source, target``),
    ``eval_percent`` of them held out by a hash of the pair.

    Raises:
      InputError: one side missing, with ``train_files``, or unequal numbers of files.
    """
    if not (config.source_files and config.target_files):
        raise InputError("--source_files and --target_files go together (line-aligned plain "
                         "text); or give --train_files with --columns=source,target")
    if config.train_files or config.eval_files:
        raise InputError("--source_files/--target_files replace --train_files/--eval_files "
                         "(a hashed --eval_percent of the pairs is held out)")
    sources = formats.resolve(config.source_files, "--source_files")
    targets = formats.resolve(config.target_files, "--target_files")
    if len(sources) != len(targets):
        raise InputError(f"--source_files matches {len(sources)} files but --target_files "
                         f"{len(targets)}; they pair up in sorted order")
    fmt = RowFormat(formats.PAIR, ("source", "target"))

    def read(num_shards: int = 1, shard_index: int = 0):
        return formats.read_aligned(sources, targets, num_shards=num_shards,
                                    shard_index=shard_index)

    def parse(records, counter):
        return formats.parse_rows(records, fmt, counter, split=split,
                                  eval_percent=config.eval_percent)

    return Source(", ".join(sources + targets), tuple(sources + targets), read, parse,
                  must_check=formats.format_of(fmt.format).must_check)


def fingerprint(files: Sequence[str]) -> list[dict]:
    """Per file: path, size and a hash of its first and last MiB and of 64 blocks spread over
    it (cheap at any size; an append or an edit changes it)."""
    out = []
    for path in files:
        size = os.path.getsize(path)
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for start in sorted({0, max(0, size - (1 << 20))}):
                f.seek(start)
                digest.update(f.read(1 << 20))
            for k in range(64):
                f.seek(size * k // 64)
                digest.update(f.read(4096))
        out.append({"path": os.path.abspath(path), "bytes": size,
                    "sample_sha256": digest.hexdigest()})
    return out
