"""``--format=tfrecord``: TFRecord files of ``tf.train.Example``, columns by feature name.

    Example{text: bytes, label: int64}  --format=tfrecord --columns=label,text (features)

Each named feature is a ``bytes_list`` or an ``int64_list`` (its kind read from the first
records at setup, ``feature_kinds``; int64 values read as their decimal strings; several values
joined by spaces); a record without a named feature is ``malformed`` (``no feature 'text'``).
``--columns=text=body`` reads the feature ``body`` as the column ``text``. ``.gz`` files are GZIP
(verified whole first). A record is named ``file: record N``. Reading checks each record's
features against the kinds found at setup, so a run reads the files once before training
(``must_check``); when that read fails, ``record_problem`` names the record.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tfseq._common import lazy_cond
from tfseq.errors import InputError
from tfseq.formats.base import Format, RowFormat, columns_utf8, mapped_keys, named_columns_key
from tfseq.reading import verify_gzip


class TfRecord(Format):
    """``tf.train.Example`` records, columns by feature name (bytes or int64)."""

    name, per_line, named_fields, maps_keys, must_check, record_noun = (
        "tfrecord", False, True, True, True, "record")

    def matches(self, basename):
        return ".tfrecord" in basename  # also TFDS-style name.tfrecord-00000-of-00010

    def row_format(self, files, columns, keys, header):
        if header:
            raise InputError("--header does not apply to --format=tfrecord (records have no "
                             "header line): leave it out")
        if "_" in columns:
            raise InputError("--format=tfrecord reads features by name: list only the ones "
                             "to read in --columns, without '_'")
        ints = feature_kinds(files, keys)
        return RowFormat(self.name, tuple(columns), False,
                         tuple(n for n, k in zip(columns, keys) if k in ints),
                         mapped_keys(columns, keys))

    def read(self, files, fmt, *, batch_size, num_shards, shard_index, in_order):
        if not in_order and len(files) > 1:
            return _tfrecord_shards(files, batch_size=batch_size, num_shards=num_shards,
                                    shard_index=shard_index)
        ds = tfrecords(files)
        if num_shards > 1:
            ds = ds.shard(num_shards, shard_index)
        return ds.batch(batch_size)

    def file_records(self, path, fmt):
        return tfrecords([path])

    def parse(self, records, fmt):
        return parse_examples(records, fmt)

    def bad_utf8(self, records, row, ok):
        return columns_utf8(row, ok)

    def text_to_check(self, records, row, field):
        return row[field]

    def hold_out_keys(self, records, row, fmt):
        return named_columns_key(row, fmt)

    def malformed_detail(self, record, fmt):
        try:
            example = tf.train.Example.FromString(record)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError
            return "not a tf.train.Example"
        for key in fmt.file_keys:
            feature = example.features.feature.get(key)
            if feature is None:
                return f"no feature {key!r}"
            kind = feature.WhichOneof("kind")
            if kind is None or not getattr(feature, kind).value:
                return f"feature {key!r} has no value"
        return None

    def diagnose(self, files, fmt):
        return record_problem(files, fmt)


def tfrecords(files: Sequence[str]) -> tf.data.Dataset:
    """The records of TFRecord files in order, ``tf.string`` scalars (``.gz``: GZIP)."""
    parts = [tf.data.TFRecordDataset(path, _compression(path)) for path in files]
    ds = parts[0]
    for more in parts[1:]:
        ds = ds.concatenate(more)
    return ds


def _compression(path: str) -> str:
    """``TFRecordDataset``'s compression for ``path``: "GZIP" for ``.gz`` (verified whole
    first: the reader would stop silently where a truncated file breaks off), else ""."""
    if path.endswith(".gz"):
        verify_gzip(path)
        return "GZIP"
    return ""


def _tfrecord_shards(files: Sequence[str], *, batch_size: int, num_shards: int,
                     shard_index: int) -> tf.data.Dataset:
    """TFRecord files read in parallel, a batch of each in turn (as ``text_lines``
    interleaves line files): the reader hands out one tf.data element per record, so one
    file at a time is one core's worth (~0.8M records/s here).

    Sharding as ``text_lines``': whole files when there are at least ``num_shards`` of
    them, else the records of each file round-robin."""
    shard_records = num_shards > 1 and len(files) < num_shards
    if num_shards > 1 and not shard_records:
        files = files[shard_index::num_shards]
    kinds = [_compression(path) for path in files]

    def read(path, kind):
        records = tf.data.TFRecordDataset(path, kind)
        if shard_records:
            records = records.shard(num_shards, shard_index)
        return records.batch(batch_size)

    return tf.data.Dataset.from_tensor_slices((list(files), kinds)).interleave(
        read, cycle_length=min(len(files), 16), block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE)


def feature_kinds(files: Sequence[str], names: Sequence[str], *, records: int = 100
                  ) -> tuple[str, ...]:
    """The ``names`` stored as ``int64_list`` in TFRecord files of ``tf.train.Example``,
    from the first ``records`` records that have each (a setup-time look, in Python).

    Raises:
      InputError: a file that is not TFRecord of ``tf.train.Example``, a feature found in none
        of those records (naming the features there), or one of another kind.
    """
    kinds: dict[str, str] = {}
    seen: set[str] = set()
    path = files[0]
    try:
        for n, record in enumerate(tfrecords([path]).take(records).as_numpy_iterator(), 1):
            example = tf.train.Example.FromString(record)
            for name, feature in example.features.feature.items():
                seen.add(name)
                if name in names and name not in kinds:
                    kinds[name] = feature.WhichOneof("kind") or "bytes_list"
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        raise InputError(f"{path} is not a TFRecord file ({str(e).splitlines()[0]}); "
                         "--format=tfrecord reads tf.train.Example records") from None
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError
        raise InputError(f"{path}: a record is not a tf.train.Example ({e}); "
                         "--format=tfrecord reads tf.train.Example records") from None
    absent = [n for n in names if n not in kinds]
    if absent:
        raise InputError(f"{path}: no feature {absent} in its first {records} records (their "
                         f"features: {sorted(seen)}); name them in --columns")
    floats = [n for n in names if kinds[n] == "float_list"]
    if floats:
        raise InputError(f"{path}: feature {floats} holds floats; --format=tfrecord reads "
                         "bytes (text) and int64 (labels) features")
    return tuple(n for n in names if kinds[n] == "int64_list")


def parse_examples(records: tf.Tensor, fmt: RowFormat) -> tuple[dict, tf.Tensor]:
    """Serialized ``tf.train.Example`` ``[n]`` -> each named feature's values joined by a
    space (int64 as decimal strings), and ``ok``: every named feature has a value."""
    features = {fmt.key_of(name): tf.io.VarLenFeature(tf.int64 if name in fmt.int_columns
                                                      else tf.string) for name in fmt.names}
    parsed = tf.io.parse_example(records, features)
    row, ok = {}, tf.ones_like(records, tf.bool)
    n = tf.shape(records, out_type=tf.int64)[0]
    for name in fmt.names:
        sparse = parsed[fmt.key_of(name)]
        values = sparse.values
        if name in fmt.int_columns:
            values = tf.strings.as_string(values)
        counts = tf.math.bincount(tf.cast(sparse.indices[:, 0], tf.int32),
                                  minlength=tf.cast(n, tf.int32), dtype=tf.int64)
        ok &= counts > 0

        def joined(values=values, counts=counts):
            return tf.strings.reduce_join(
                tf.RaggedTensor.from_row_lengths(values, counts, validate=False),
                axis=1, separator=" ")

        # One value per record (the usual case): the values are the column, no join.
        row[name] = lazy_cond(tf.reduce_all(tf.equal(counts, 1)), lambda values=values: values,
                              joined)
    return row, ok


def record_problem(files: Sequence[str], fmt: RowFormat) -> str | None:
    """Why TFRecord ``files`` cannot be parsed as ``fmt`` says, naming the file and record:
    a record that is not a ``tf.train.Example``, a feature of another kind than in the first
    records, a corrupt file. ``None`` if none is found (a diagnostic pass in Python, run
    after reading failed)."""
    for path in files:
        number = 0
        try:
            for number, record in enumerate(tfrecords([path]).as_numpy_iterator(), 1):
                try:
                    example = tf.train.Example.FromString(record)
                except Exception:  # noqa: BLE001 - protobuf's DecodeError
                    return f"{path}: record {number} is not a tf.train.Example"
                for name, key in zip(fmt.names, fmt.file_keys):
                    feature = example.features.feature.get(key)
                    kind = feature.WhichOneof("kind") if feature is not None else None
                    want = "int64_list" if name in fmt.int_columns else "bytes_list"
                    if kind not in (None, want):
                        return (f"{path}: record {number}: feature {key!r} is a {kind}, the "
                                f"first records' is a {want}: one kind per feature")
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            return (f"{path}: unreadable after record {number} ({str(e).splitlines()[0]}): "
                    "a truncated or corrupt TFRecord file")
    return None
