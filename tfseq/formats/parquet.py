"""``--format=parquet``: Parquet files, columns by name, read with pyarrow (``pip install
tfseq[parquet]``).

    category: int64, body: string    --format=parquet --columns=label=category,text=body

String columns (also dictionary-encoded ones), integer and boolean columns (read as their text:
``2`` -> ``"2"``, ``true``), and lists of those (joined by spaces) are read; a float, binary or
nested column is refused at setup, naming it, and so is a named column a file lacks. A row with
a null value is ``malformed`` (``'text' is null``); a row is named ``file: row N``.

How rows become records without Python per row: pyarrow reads ``READ_CHUNK`` rows at a time
(``ParquetFile.iter_batches``, only the named columns), checks UTF-8 per chunk, and its
compute functions (C++, per chunk) turn each column into bytes and join a row's values with
the byte ``0xFF``, which UTF-8 never holds (``chunk_records``; a row with a null or a value
that is not UTF-8 becomes a marked record of too many fields). One Python call per chunk hands
its bytes and row offsets to ``tf.data.Dataset.from_generator``, and ``tf.strings.substr``
cuts them into the ``tf.string [n]`` record batches every other format gives. ``parse`` splits
a record at ``0xFF`` back into its named columns in the graph (the split TSV lines get), so
the one pass before training, the shuffle shards, the resumable stream, evaluation and predict
take Parquet records as they take lines. A ``from_generator`` dataset runs in the Python
process that built it: the tf.data service cannot run it on its workers (``--data_service``
needs another format).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from tfseq.errors import InputError
from tfseq.formats.base import (Format, RowFormat, mapped_keys, named_columns_key,
                                split_parse)

SEPARATOR = b"\xff"  # between a row's values in its record (never in UTF-8)
NULL = b"\xfe"       # marks a row with a null value (never in UTF-8)
INVALID = b"\xfd"    # marks a row with a value that is not UTF-8 (never in UTF-8)
READ_CHUNK = 65536   # rows a Python call hands to tf.data (a call per 1,024: ~2x slower)
INSTALL = "--format=parquet needs pyarrow: pip install tfseq[parquet]"


def pyarrow():
    """``(pyarrow, pyarrow.parquet, pyarrow.compute)``.

    Raises:
      InputError: pyarrow is not installed (one line: how to install it).
    """
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(INSTALL) from None
    return pa, pq, pc


class Parquet(Format):
    """Parquet files, columns by name (string, integer, boolean, lists of those)."""

    name, extensions, per_line, named_fields, maps_keys, record_noun = (
        "parquet", (".parquet",), False, True, True, "row")

    def row_format(self, files, columns, keys, header):
        if header:
            raise InputError("--header does not apply to --format=parquet (its columns are "
                             "named in the file): leave it out")
        if "_" in columns:
            raise InputError("--format=parquet reads columns by name: list only the ones to "
                             "read in --columns, without '_'")
        for path in files:
            check_columns(path, keys)
        return RowFormat(self.name, tuple(columns), False, keys=mapped_keys(columns, keys))

    def read(self, files, fmt, *, batch_size, num_shards, shard_index, in_order):
        pyarrow()
        # As ``text_lines`` shards: whole files when there are enough, else rows round-robin.
        shard_rows = num_shards > 1 and len(files) < num_shards
        if num_shards > 1 and not shard_rows:
            files = files[shard_index::num_shards]
        shard = (num_shards, shard_index) if shard_rows else (1, 0)
        keys = fmt.file_keys

        def one_file(path):
            return tf.data.Dataset.from_generator(
                lambda path: record_buffers(path.decode(), keys, READ_CHUNK, *shard),
                args=(path,), output_signature=(tf.TensorSpec([], tf.string),
                                                tf.TensorSpec([None], tf.int64))
            ).flat_map(lambda data, offsets: cut_records(data, offsets, batch_size))

        paths = tf.data.Dataset.from_tensor_slices(tf.constant(list(files), tf.string))
        if in_order or len(files) < 2:
            ds = paths.interleave(one_file, cycle_length=1)
        else:
            ds = paths.interleave(one_file, cycle_length=min(len(files), 16), block_length=1,
                                  num_parallel_calls=tf.data.AUTOTUNE)
        return ds

    def file_records(self, path, fmt):
        return self.read([path], fmt, batch_size=1024, num_shards=1, shard_index=0,
                         in_order=True).unbatch()

    def parse(self, records, fmt):
        # A row with a null has more fields (``record_buffers``): not ok.
        return split_parse(records, SEPARATOR, fmt.names)

    def bad_utf8(self, records, row, ok):
        # Checked by pyarrow (``chunk_records``): only the records parse fails can be marked.
        marker = SEPARATOR * len(row) + INVALID
        failed = tf.where(tf.logical_not(ok))
        return tf.scatter_nd(failed, tf.equal(tf.strings.substr(
            tf.gather_nd(records, failed), 0, len(marker)), marker),
            tf.shape(ok, out_type=tf.int64))

    def text_to_check(self, records, row, field):
        return row[field]

    def hold_out_keys(self, records, row, fmt):
        return named_columns_key(row, fmt)

    def malformed_detail(self, record, fmt):
        marker = SEPARATOR * len(fmt.names) + NULL
        if record.startswith(marker) and record[len(marker):].isdigit():
            return f"{fmt.file_keys[int(record[len(marker):])]!r} is null"
        return None

    def diagnose(self, files, fmt):
        """The first file pyarrow cannot read (named, with pyarrow's reason)."""
        for path in files:
            try:
                for _ in record_buffers(path, fmt.file_keys, 65536, 1, 0):
                    pass
            except ValueError as e:
                return str(e)
        return None


def check_columns(path: str, keys: Sequence[str]) -> None:
    """Checks at setup that the Parquet file ``path`` has the columns ``keys``, of kinds this
    format reads (its footer only).

    Raises:
      InputError: pyarrow missing, not a Parquet file, a column missing or of another kind.
    """
    pa, pq, _ = pyarrow()
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{path} is not a Parquet file ({str(e).splitlines()[0]}); "
                         "--format=parquet reads Parquet files") from None
    absent = [k for k in keys if k not in schema.names]
    if absent:
        raise InputError(f"{path}: no column {absent} (its columns: {schema.names}); name "
                         "them in --columns (FIELD=KEY for another name)")
    for key in keys:
        kind = schema.field(key).type
        if not _readable(pa, kind):
            raise InputError(f"{path}: column {key!r} is {kind}; --format=parquet reads "
                             "string, integer and boolean columns, and lists of them")


def _readable(pa, kind) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        kind = kind.value_type
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_integer(kind) or pa.types.is_boolean(kind))


def record_buffers(path: str, keys: Sequence[str], batch_size: int, num_shards: int,
                   shard_index: int):
    """Yields, per ``batch_size`` rows of ``path``: the records' bytes one after another
    (tf.string scalar) and their offsets (int64 ``[n + 1]``), see ``chunk_records``. With
    ``num_shards > 1`` only rows ``i % num_shards == shard_index``.

    Raises:
      ValueError: pyarrow cannot read the file (the message names it).
    """
    pa, pq, _ = pyarrow()
    start = 0
    try:
        reader = pq.ParquetFile(path)
        for batch in reader.iter_batches(batch_size=batch_size,
                                         columns=list(dict.fromkeys(keys))):
            columns = [batch.column(key) for key in keys]
            if num_shards > 1:
                rows = np.arange(start, start + batch.num_rows)
                take = pa.array(np.nonzero(rows % num_shards == shard_index)[0])
                columns = [column.take(take) for column in columns]
            start += batch.num_rows
            records = chunk_records(columns)
            if len(records):
                _, offsets, data = records.buffers()
                offsets = np.frombuffer(offsets, np.int64)[records.offset:
                                                           records.offset + len(records) + 1]
                # A 0-d object array: tf.data takes it as a string scalar about twice as fast
                # as the bytes themselves (and keeps trailing NUL bytes).
                yield (np.array(data.slice(offsets[0], offsets[-1] - offsets[0]).to_pybytes(),
                                dtype=object), offsets - offsets[0])
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: {str(e).splitlines()[0]}: a truncated or corrupt Parquet "
                         "file") from None


def chunk_records(columns):
    """The records (pyarrow ``large_binary``) of a chunk's rows, from the values of its named
    ``columns`` (pyarrow arrays): the values joined by ``SEPARATOR``; a row with a value that
    is not UTF-8: ``SEPARATOR`` once per column then ``INVALID``; else with a null in column
    ``i``: ``SEPARATOR`` once per column, ``NULL``, ``i``. (A marked record has more fields
    than a row's: ``parse`` fails it, ``bad_utf8`` and ``malformed_detail`` read the mark.)"""
    pa, _, pc = pyarrow()
    k = len(columns)
    values, invalid = zip(*(_as_bytes(pa, pc, column) for column in columns))
    records = (values[0] if k == 1 else pc.binary_join_element_wise(
        *values, pa.scalar(SEPARATOR, pa.large_binary())))
    marked = [(pc.is_null(values[i]), SEPARATOR * k + NULL + str(i).encode())
              for i in reversed(range(k)) if values[i].null_count]
    marked += [(rows, SEPARATOR * k + INVALID) for rows in invalid if rows is not None]
    if not marked:
        return records
    mark = pa.nulls(len(records), pa.large_binary())
    for rows, text in marked:
        mark = pc.if_else(rows, pa.scalar(text, pa.large_binary()), mark)
    return pc.coalesce(mark, records)


def _as_bytes(pa, pc, column):
    """A column as (``large_binary`` values, bool rows that are not UTF-8 or ``None``):
    strings as they are, integers and booleans as text, lists joined by spaces; nulls stay
    null. pyarrow does not check UTF-8 when it reads a file: it is checked here, for a whole
    chunk at once (``validate``), and value by value in Python only in a chunk that fails."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        column = pc.binary_join(pc.cast(column, pa.list_(pa.string())), " ")
    elif pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return pc.cast(pc.cast(column, pa.string()), pa.large_binary()), None
    values = pc.cast(column, pa.large_binary())
    try:
        column.validate(full=True)
        return values, None
    except pa.ArrowInvalid:
        return values, pa.array([v is not None and not _utf8(v) for v in values.to_pylist()])


def _utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def cut_records(data: tf.Tensor, offsets: tf.Tensor, batch_size: int) -> tf.data.Dataset:
    """``record_buffers``' bytes (tf.string scalar) and offsets (int64 ``[n + 1]``) -> the
    records, tf.string ``[batch_size]`` batches (the last one shorter): ``substr`` of the one
    buffer, the only copy of the records in the graph."""
    n = tf.size(offsets, out_type=tf.int64) - 1

    def batch(i):
        cut = offsets[i * batch_size:tf.minimum((i + 1) * batch_size, n) + 1]
        return tf.strings.substr(data, cut[:-1], cut[1:] - cut[:-1])

    return tf.data.Dataset.range((n + batch_size - 1) // batch_size).map(batch)
