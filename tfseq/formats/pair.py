"""Line pairs of two line-aligned file lists (``--source_files`` / ``--target_files``):
records ``source\\ntarget``, columns ``source, target``. Not a ``--format``."""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tfseq.errors import InputError
from tfseq.formats.base import FIELD_SEPARATOR, PAIR, READ_BATCH, Format, split_parse
from tfseq.reading import text_lines

_END_OF_FILE = "\x00tfseq-eof\x00"  # pads the shorter of two aligned files (never in a line)


class Pair(Format):
    """Two line-aligned files (``read_aligned``), columns ``source, target``; not a
    ``--format``: ``--source_files``/``--target_files`` give it. Reading them checks that
    they are line-aligned, so a run reads them once before training (``must_check``)."""

    name, per_line, must_check = PAIR, False, True

    def matches(self, basename):
        return False

    def read(self, files, fmt, *, batch_size, num_shards, shard_index, in_order):
        """``files``: ``(source files, target files)``."""
        source_files, target_files = files
        return read_aligned(source_files, target_files, batch_size=batch_size,
                            num_shards=num_shards, shard_index=shard_index)

    def parse(self, records, fmt):
        return split_parse(records, FIELD_SEPARATOR, fmt.names)

    def hold_out_keys(self, records, row, fmt):
        # "source<TAB>target", as a TSV line of the pair would be.
        return tf.strings.regex_replace(records, FIELD_SEPARATOR, "\t")

    def drop_examples(self, files, fmt, limit):
        return []


def read_aligned(source_files: Sequence[str], target_files: Sequence[str], *,
                 batch_size: int = READ_BATCH, num_shards: int = 1,
                 shard_index: int = 0) -> tf.data.Dataset:
    """Records of line pairs of two line-aligned file lists (``PAIR``: source and target
    joined by ``"\\n"``), as ``tf.string [n]`` batches, file pair by file pair.

    Files of unequal line counts make the dataset raise ``tf.errors.InvalidArgumentError``
    naming both files when the shorter one ends (``check_aligned`` checks before training).
    """
    if len(source_files) != len(target_files):
        raise InputError(f"{len(source_files)} source files but {len(target_files)} target "
                         "files; they pair up in sorted order")
    pairs = None
    for source, target in zip(source_files, target_files):
        padded = [text_lines(f).concatenate(tf.data.Dataset.from_tensors(
            tf.constant(_END_OF_FILE)).repeat()) for f in (source, target)]

        def join(line, s, t, source=source, target=target):
            ended_s, ended_t = tf.equal(s, _END_OF_FILE), tf.equal(t, _END_OF_FILE)
            checks = [tf.debugging.Assert(
                tf.logical_not(first & tf.logical_not(second)),
                [f"{name} ends after line", line, f"but {other} has more lines: source and "
                 "target files must be line-aligned"])
                for first, second, name, other in ((ended_s, ended_t, source, target),
                                                   (ended_t, ended_s, target, source))]
            with tf.control_dependencies(checks):
                return ended_s, s + FIELD_SEPARATOR + t

        ds = (tf.data.Dataset.zip(tf.data.Dataset.range(1 << 62), *padded).map(join)
              .take_while(lambda ended, _: tf.logical_not(ended)).map(lambda _, pair: pair))
        pairs = ds if pairs is None else pairs.concatenate(ds)
    if num_shards > 1:
        pairs = pairs.shard(num_shards, shard_index)
    return pairs.batch(batch_size)
