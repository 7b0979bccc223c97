"""``--format=parquet``: Parquet files, columns by name, read with pyarrow (``pip install
tfseq[parquet]``).

    category: int64, body: string    --format=parquet --columns=label=category,text=body

String columns (also dictionary-encoded ones), integer and boolean columns (read as their text:
``2`` -> ``"2"``, ``true``), and lists of those (joined by spaces) are read; a float, binary or
nested column is refused at setup, naming it, and so is a named column a file lacks. A row with
a null value is ``malformed`` (``'text' is null``); a row is named ``file: row N``.

How rows become records without Python per row: pyarrow reads ``READ_CHUNK`` rows at a time
(``ParquetFile.iter_batches``, only the named columns), its compute functions (C++, per chunk)
turn each column into bytes and join a row's values with the byte ``0xFF``, which UTF-8 never
holds (a row with a null becomes ``0xFF`` once per column, ``0xFE`` and the column's index: a
record of too many fields); one Python call per chunk hands its bytes and row offsets to
``tf.data.Dataset.from_generator``, ``tf.strings.substr`` cuts them into records and
``rebatch`` into the ``tf.string [n]`` batches every other format gives. ``parse`` splits a
record at ``0xFF`` back into its named columns in the graph (the split TSV lines get), so the
one pass before training, the shuffle shards, the resumable stream, evaluation and predict
take Parquet records as they take lines. A ``from_generator`` dataset runs in the Python
process that built it: the tf.data service cannot run it on its workers (``--data_service``
needs another format).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from tfseq.errors import InputError
from tfseq.formats.base import (Format, RowFormat, columns_utf8, mapped_keys,
                                named_columns_key, split_parse)

SEPARATOR = b"\xff"  # between a row's values in its record (never in UTF-8)
NULL = b"\xfe"       # marks a row with a null value (never in UTF-8)
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
            ).map(cut_records).rebatch(batch_size)

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
        return columns_utf8(row, ok)

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
    (tf.string scalar) and their offsets (int64 ``[n + 1]``); a record is the row's ``keys``
    values joined by ``SEPARATOR``. With ``num_shards > 1`` only rows ``i % num_shards ==
    shard_index``.

    Raises:
      ValueError: pyarrow cannot read the file (the message names it).
    """
    pa, pq, pc = pyarrow()
    separator = pa.scalar(SEPARATOR, pa.large_binary())
    start = 0
    try:
        reader = pq.ParquetFile(path)
        for batch in reader.iter_batches(batch_size=batch_size,
                                         columns=list(dict.fromkeys(keys))):
            columns = [_as_bytes(pa, pc, batch.column(key)) for key in keys]
            if num_shards > 1:
                rows = np.arange(start, start + batch.num_rows)
                take = pa.array(np.nonzero(rows % num_shards == shard_index)[0])
                columns = [column.take(take) for column in columns]
            start += batch.num_rows
            joined = (columns[0] if len(columns) == 1 else
                      pc.binary_join_element_wise(*columns, separator))
            if joined.null_count:  # a row with a null: len(keys) separators, NULL, its index
                marker = pa.nulls(len(joined), pa.large_binary())
                for i in reversed(range(len(keys))):
                    marker = pc.if_else(pc.is_null(columns[i]), pa.scalar(
                        SEPARATOR * len(keys) + NULL + str(i).encode(), pa.large_binary()),
                        marker)
                joined = pc.coalesce(joined, marker)
            _, offsets, data = joined.buffers()
            offsets = np.frombuffer(offsets, np.int64)[joined.offset:
                                                       joined.offset + len(joined) + 1]
            if len(joined):
                yield data.slice(offsets[0], offsets[-1] - offsets[0]).to_pybytes(), \
                    offsets - offsets[0]
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: {str(e).splitlines()[0]}: a truncated or corrupt Parquet "
                         "file") from None


def _as_bytes(pa, pc, column):
    """A column as ``large_binary``: strings as they are (a byte ``SEPARATOR`` in one, never
    in UTF-8, as ``NULL``: the value stays invalid UTF-8, counted so), integers and booleans as
    text, lists joined by spaces; nulls stay null."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        column = pc.binary_join(pc.cast(column, pa.list_(pa.string())), " ")
    elif pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return pc.cast(pc.cast(column, pa.string()), pa.large_binary())
    return pc.replace_substring(pc.cast(column, pa.large_binary()), SEPARATOR, NULL)


def cut_records(data: tf.Tensor, offsets: tf.Tensor) -> tf.Tensor:
    """``record_buffers``' bytes (tf.string scalar) and offsets (int64 ``[n + 1]``) -> the
    records, tf.string ``[n]`` (``substr`` of the one buffer: no copy per record in Python)."""
    return tf.strings.substr(data, offsets[:-1], offsets[1:] - offsets[:-1])
