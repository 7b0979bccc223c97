"""Rows with named columns from user files: TSV, CSV (RFC 4180), plain text, CoNLL, JSON Lines
and TFRecord of ``tf.train.Example``, in graph.

Shapes: n = records in a batch.

A *record* is what becomes one example: a line of a TSV/CSV/text file, a sentence of a CoNLL
file, or a line pair of two line-aligned files. ``read_records`` reads records in file order
as ``tf.string [n]`` batches; ``parse_rows`` cuts a batch into rows ``{column: tf.string [n]}``
and counts every record it drops (``tfseq.DropCounter``)::

    label<TAB>text           --format=tsv --columns=label,text
    "a, b",pos               --format=csv --columns=text,label   ->  text "a, b", label "pos"
    any line                 --format=text                       ->  {"text": "any line"}
    EU    B-ORG              --format=conll --columns=token,tag  ->  {"token": "EU rejects",
    rejects  O                 (one token per line, a blank          "tag": "B-ORG O"}
    <blank line>               line ends a sentence)
    {"text": "a \\u00e9", "label": "x"}   --format=jsonl --columns=label,text  (keys by name)
    Example{text: bytes, label: int64}  --format=tfrecord --columns=label,text (features)

JSON Lines (``tfseq.jsonl``): each line one JSON object; the named keys' string values decoded
as ``json.loads`` does (escapes, surrogate pairs; a JSON array of strings is joined by spaces),
keys in any order, other keys ignored. A line that is not an object, lacks a named key or has
a non-string value for it is ``malformed``. TFRecord: ``tf.train.Example`` records (``.gz``:
GZIP), each named feature a ``bytes_list`` or an ``int64_list`` (its kind read from the first
records at setup; several values joined by spaces); a record without a named feature is
``malformed``. The held-out hash of a JSON line or an Example is that of its named columns
joined by tabs, so the same rows split alike in every format.

A column named ``_`` is read and discarded. CSV follows RFC 4180 on one line: quoted fields may
hold commas and doubled quotes (``""``); a line with a stray quote or the wrong field count is
``malformed`` (records spanning lines are not supported: each half is counted as malformed).

CoNLL: each non-blank line is one token, its columns separated by tabs (or, in a line with no
tab, by runs of spaces); a blank line ends a sentence, and so does the end of the file (a last
sentence without a blank line after it still counts). A sentence's record holds each named
column as the space-joined values of its lines. Lines starting with ``#`` (CoNLL-U comments)
and ``-DOCSTART-`` lines (CoNLL-2003 document marks) are markup, not tokens, and are skipped. A
sentence with a line of the wrong field count is ``malformed`` (``drop_examples`` names the
line).

Drop reasons: ``malformed`` (wrong field count, broken quoting), ``invalid_utf8``,
``empty_text`` (a text column, ``TEXT_COLUMNS``, is blank), ``other_split`` (the record is
held out for the other split by ``eval_percent``). Parsing is vectorized ``tf.strings`` /
``tf.io.decode_csv`` on batches, no Python per record.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import tensorflow as tf

from tfseq._common import lazy_cond, mark_last
from tfseq.errors import InputError  # also tfseq.formats.InputError, as before
from tfseq.filtering import valid_utf8
from tfseq.reading import resolve_files, text_lines, verify_gzip
from tfseq.stats import DropCounter

PAIR = "pair"  # records of two line-aligned files (``read_aligned``); not a --format
TEXT_COLUMNS = ("text", "source", "target", "tokens", "token")
# 1,024 records a read batch: see docs/benchmarks.md#input-pipeline-throughput
READ_BATCH = 1024  # records per batch on the vectorized path (512: ~6-15% less throughput)
_FIELD_SEPARATOR = "\n"  # between a CoNLL sentence's or a line pair's fields (never in a line)
_CONLL_BATCH = 4096      # lines grouped into sentences per step
_END_OF_FILE = "\x00tfseq-eof\x00"  # pads the shorter of two aligned files (never in a line)

# One CSV field: quoted (doubled quotes inside) or unquoted (no quote, no comma).
_CSV_FIELD = r'(?:"(?:[^"]|"")*"|[^",]*)'
_CSV_LINE = rf"{_CSV_FIELD}(?:,{_CSV_FIELD})*"


@dataclasses.dataclass(frozen=True)
class RowFormat:
    """How to cut records into named columns.

    Attributes:
      format: one of ``FORMATS`` (``"text"``: the whole line is the ``text`` column), or
        ``PAIR`` (two aligned files, columns ``source, target``).
      columns: the fields of a line (a CoNLL token line) in order; ``"_"`` skips a field.
      header: skip the first line of every file.
      int_columns: ``tfrecord``: the columns stored as ``int64_list`` features (read as
        their decimal strings); the others are ``bytes_list``.
    """

    format: str = "tsv"
    columns: tuple[str, ...] = ("label", "text")
    header: bool = False
    int_columns: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c for c in self.columns if c != "_")


def infer_format(files: Sequence[str], format: str | None = None) -> str:
    """``format`` if given, else from the first file's extension (``.tsv``, ``.csv``,
    ``.conll``/``.conllu``, ``.jsonl``/``.ndjson``, ``.tfrecord``/``.tfrecords`` (also
    TFDS-style ``name.tfrecord-00000-of-00010``), else ``text``; a trailing ``.gz`` is ignored).

    Raises:
      InputError: an unknown ``format``.
    """
    if format:
        if format not in FORMAT_CLASSES:
            raise InputError(f"Unknown --format={format!r}; expected one of "
                             f"{tuple(FORMAT_CLASSES)}")
        return format
    name = files[0][:-3] if files and files[0].endswith(".gz") else (files[0] if files else "")
    for candidate in FORMAT_CLASSES.values():
        if candidate.matches(os.path.basename(name).lower()):
            return candidate.name
    return "text"


def row_format(files: Sequence[str], format: str | None, columns: Sequence[str] | None,
               header: bool, *, required: Sequence[str], allowed: Sequence[str]) -> RowFormat:
    """Validates the format options for a task.

    Args:
      files: resolved input files (for the extension and the messages).
      format: one of ``FORMATS`` or ``None`` (from the extension).
      columns: field names in order (default: ``required``); ``"_"`` skips a field.
      header: skip each file's first line.
      required: columns the task needs (e.g. ``("label", "text")``).
      allowed: every column name the task knows.

    Raises:
      InputError: an unknown or duplicated column name, or a required one missing.
    """
    format = infer_format(files, format)
    kind = FORMAT_CLASSES[format]
    columns = kind.columns_for(columns, required)
    unknown = [c for c in columns if c != "_" and c not in allowed]
    if unknown:
        raise InputError(f"Unknown column name(s) {unknown} in --columns={','.join(columns)}; "
                         f"this task knows {list(allowed)} (and '_' to skip a field)")
    names = [c for c in columns if c != "_"]
    if len(set(names)) != len(names):
        raise InputError(f"A column is named twice in --columns={','.join(columns)}")
    missing = [c for c in required if c not in names]
    if missing:
        raise InputError(f"--columns={','.join(columns)} has no {missing} column: name the "
                         f"fields of {files[0] if files else 'the files'} in order, e.g. "
                         f"--columns={','.join(required)}")
    return kind.row_format(files, columns, header)


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
        for n, record in enumerate(_tfrecords([path]).take(records).as_numpy_iterator(), 1):
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


def resolve(patterns: Sequence[str], flag: str = "--train_files") -> list[str]:
    """Files matched by comma-separated globs; ``InputError`` naming the flag if none match,
    or if a file is empty."""
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p]
    try:
        files = resolve_files(list(patterns))
    except (FileNotFoundError, ValueError) as e:
        raise InputError(f"{flag}: {e}") from None
    for path in files:
        if os.path.isdir(path):
            raise InputError(f"{flag}: {path} is a directory; give files or a glob like {path}/*")
        if os.path.getsize(path) == 0:
            raise InputError(f"{flag}: {path} is empty")
    return files


# ----------------------------------------------------------------------------- reading

def read_records(files: Sequence[str], fmt: RowFormat, *, batch_size: int = READ_BATCH,
                 num_shards: int = 1, shard_index: int = 0,
                 in_order: bool = False) -> tf.data.Dataset:
    """The records of ``files`` as ``tf.string [n]`` batches (``n <= batch_size``).

    Line formats read through ``tfseq.text_lines`` (gzip, BOM and CRLF handled, headers
    skipped); CoNLL files give one record per sentence (``conll_sentences``).

    Args:
      files: resolved paths.
      fmt: the ``RowFormat``.
      batch_size: records per batch.
      num_shards, shard_index: read only this shard (``text_lines``' sharding; CoNLL:
        sentences round-robin).
      in_order: file by file in the order given (otherwise line-format and TFRecord files
        are read in parallel and interleaved batch by batch, a deterministic order all the
        same).

    Raises:
      InputError: a missing file, or a corrupt or truncated gzip file (the message names it).
    """
    try:
        return format_of(fmt.format).read(files, fmt, batch_size=batch_size,
                                          num_shards=num_shards, shard_index=shard_index,
                                          in_order=in_order)
    except (ValueError, FileNotFoundError) as e:
        raise InputError(str(e)) from None


def _tfrecords(files: Sequence[str]) -> tf.data.Dataset:
    """The records of TFRecord files in order, ``tf.string`` scalars (``.gz``: GZIP)."""
    parts = [tf.data.TFRecordDataset(path, _tfrecord_compression(path)) for path in files]
    ds = parts[0]
    for more in parts[1:]:
        ds = ds.concatenate(more)
    return ds


def _tfrecord_compression(path: str) -> str:
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
    kinds = [_tfrecord_compression(path) for path in files]

    def read(path, kind):
        records = tf.data.TFRecordDataset(path, kind)
        if shard_records:
            records = records.shard(num_shards, shard_index)
        return records.batch(batch_size)

    return tf.data.Dataset.from_tensor_slices((list(files), kinds)).interleave(
        read, cycle_length=min(len(files), 16), block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE)


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
                return ended_s, s + _FIELD_SEPARATOR + t

        ds = (tf.data.Dataset.zip(tf.data.Dataset.range(1 << 62), *padded).map(join)
              .take_while(lambda ended, _: tf.logical_not(ended)).map(lambda _, pair: pair))
        pairs = ds if pairs is None else pairs.concatenate(ds)
    if num_shards > 1:
        pairs = pairs.shard(num_shards, shard_index)
    return pairs.batch(batch_size)


def conll_sentences(files: Sequence[str], fmt: RowFormat, *,
                    batch_size: int = READ_BATCH) -> tf.data.Dataset:
    """CoNLL files -> one record per sentence, ``tf.string [n]`` batches, in file order.

    A record holds the named columns of ``fmt`` joined by ``"\\n"``, each the space-joined
    values of the sentence's token lines (``"EU rejects\\nB-ORG O"``); a sentence with a line
    of the wrong field count becomes a record with one field too many, which ``parse`` calls
    ``malformed``. See the module docstring for blank lines, comments and ``-DOCSTART-``.
    """
    per_file = []
    for path in files:
        kind = "GZIP" if path.endswith(".gz") else ""
        if kind:
            verify_gzip(path)
        lines = tf.data.TextLineDataset(path, compression_type=kind)
        if fmt.header:
            lines = lines.skip(1)
        groups = mark_last(lines.batch(_CONLL_BATCH)).scan(
            tf.zeros([0], tf.string), lambda carry, step: _group_sentences(carry, step, fmt))
        per_file.append(groups.unbatch())
    ds = per_file[0]
    for more in per_file[1:]:
        ds = ds.concatenate(more)
    return ds.batch(batch_size)


def _split_fields(lines: tf.Tensor) -> tf.RaggedTensor:
    """``tf.string [m]`` CoNLL token lines -> their fields ``[m, (k)]``: split on tabs, or on
    runs of whitespace in a line without a tab."""
    tabbed = tf.strings.split(lines, "\t")
    spaced = tf.strings.split(lines)
    return _rowwise(tf.strings.regex_full_match(lines, ".*\t.*"), tabbed, spaced)


def _rowwise(choose_first: tf.Tensor, first: tf.RaggedTensor,
             second: tf.RaggedTensor) -> tf.RaggedTensor:
    """Row i of ``first`` where ``choose_first[i]``, else row i of ``second`` (``[m, (k)]``)."""
    rows = tf.range(tf.size(choose_first))
    both = tf.concat([first, second], axis=0)
    pick = tf.where(choose_first, rows, rows + tf.size(choose_first))
    return tf.gather(both, pick)


def _group_sentences(carry: tf.Tensor, step, fmt: RowFormat):
    """One ``scan`` step: lines (after the ``carry`` of an unfinished sentence) -> the records
    of the sentences they finish, and the new carry (the lines of the last, open sentence;
    nothing at the end of the file)."""
    is_last, batch = step
    lines = tf.strings.strip(tf.concat([carry, batch], 0))
    markup = tf.strings.regex_full_match(lines, r"#.*|-DOCSTART-(\s.*)?")
    lines = tf.boolean_mask(lines, tf.logical_not(markup))
    blank = tf.equal(lines, "")
    sentence = tf.cumsum(tf.cast(blank, tf.int32), exclusive=True)
    open_id = tf.reduce_sum(tf.cast(blank, tf.int32))
    finished = tf.logical_not(blank) & (is_last | (sentence < open_id))
    new_carry = tf.boolean_mask(lines, tf.logical_not(blank) & tf.logical_not(finished))
    token_lines = tf.boolean_mask(lines, finished)
    ids, index = tf.unique(tf.boolean_mask(sentence, finished))
    num = tf.size(ids)
    fields = _split_fields(token_lines)
    width = len(fmt.columns)
    ok_line = tf.equal(fields.row_lengths(), width)
    dense = fields.to_tensor("", shape=[None, width])
    ok = tf.math.unsorted_segment_min(tf.cast(ok_line, tf.int32), index, num) > 0
    columns = [tf.strings.unsorted_segment_join(dense[:, i], index, num, separator=" ")
               for i, name in enumerate(fmt.columns) if name != "_"]
    joined = tf.strings.reduce_join(tf.stack(columns, axis=1), axis=1,
                                    separator=_FIELD_SEPARATOR)
    # A malformed sentence gets one field too many: ``parse`` counts it.
    records = tf.where(ok, joined, joined + _FIELD_SEPARATOR)
    return new_carry, records


# ----------------------------------------------------------------------------- parsing

def parse(records: tf.Tensor, fmt: RowFormat) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """``tf.string [n]`` records -> ``({column: tf.string [n]}, ok bool [n])``.

    ``ok`` is false on a malformed record (its columns are then empty strings). Vectorized.
    """
    return format_of(fmt.format).parse(records, fmt)


def _parse_examples(records: tf.Tensor, fmt: RowFormat) -> tuple[dict, tf.Tensor]:
    """Serialized ``tf.train.Example`` ``[n]`` -> each named feature's values joined by a
    space (int64 as decimal strings), and ``ok``: every named feature has a value."""
    features = {name: tf.io.VarLenFeature(tf.int64 if name in fmt.int_columns else tf.string)
                for name in fmt.names}
    parsed = tf.io.parse_example(records, features)
    row, ok = {}, tf.ones_like(records, tf.bool)
    n = tf.shape(records, out_type=tf.int64)[0]
    for name in fmt.names:
        sparse = parsed[name]
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


def drop_checks(records: tf.Tensor, row: dict, ok: tf.Tensor, fmt: RowFormat | None = None
                ) -> dict[str, tf.Tensor]:
    """The ordered ``reason -> bool [n]`` checks of a parsed batch (true: drop). TFRecord
    records are binary: there the columns' values must be UTF-8, not the records."""
    bad_utf8 = format_of(fmt.format if fmt is not None else "tsv").bad_utf8(records, row, ok)
    empty = tf.zeros_like(ok)
    for name in TEXT_COLUMNS:
        if name in row:
            empty = tf.logical_or(empty, tf.strings.regex_full_match(row[name], r"\s*"))
    return {"invalid_utf8": bad_utf8, "malformed": tf.logical_not(ok),
            "empty_text": tf.logical_and(ok, empty)}


def in_eval_split(keys: tf.Tensor, eval_percent: int) -> tf.Tensor:
    """bool, the shape of ``keys``: whether each record is held out (a stable hash of its
    key's bytes in the first ``eval_percent`` of 100 buckets; equal keys always land in the
    same split)."""
    return tf.strings.to_hash_bucket_fast(keys, 100) < eval_percent


def parse_rows(records: tf.Tensor, fmt: RowFormat, counter: DropCounter, *,
               split: str | None = None, eval_percent: int = 0) -> dict[str, tf.Tensor]:
    """``tf.string [n]`` records -> the rows kept, ``{column: tf.string [m]}``, counting
    ``lines_read`` and every drop (``other_split`` first, so a bad record counts in one split
    only). ``split``: ``"train"``/``"eval"`` keeps that side of the ``eval_percent`` hash
    hold-out; ``None`` keeps both."""
    counter.register("malformed", "invalid_utf8", "empty_text")
    if split is not None:
        counter.register("other_split")
    read = counter.note("lines_read", tf.size(records, out_type=tf.int64))
    row, ok = parse(records, fmt)
    checks = {}
    if split is not None:
        # A line pair's key is "source<TAB>target", as a TSV line of the pair would be; a
        # JSON line's or an Example's, its named columns joined by tabs: the same rows split
        # alike whatever the format.
        keys = format_of(fmt.format).hold_out_keys(records, row, fmt)
        checks["other_split"] = tf.not_equal(in_eval_split(keys, eval_percent),
                                             split == "eval")
    checks.update(drop_checks(records, row, ok, fmt))
    with tf.control_dependencies([read]):
        keep = counter.keep_if(checks)
    # Most batches keep every row: then the columns pass as they are (no copy of the text).
    return tf.cond(tf.reduce_all(keep), lambda: dict(row),
                   lambda: {k: tf.boolean_mask(v, keep) for k, v in row.items()})


def read_rows(files: Sequence[str], fmt: RowFormat, counter: DropCounter, *,
              split: str | None = None, eval_percent: int = 0, batch_size: int = READ_BATCH,
              **read_kwargs) -> tf.data.Dataset:
    """Batches of rows ``{column: tf.string [n]}`` of ``files`` (``read_records`` then
    ``parse_rows``), every drop counted in ``counter``; ``read_kwargs`` go to
    ``read_records``."""
    ds = read_records(files, fmt, batch_size=batch_size, **read_kwargs)
    return ds.map(lambda records: parse_rows(records, fmt, counter, split=split,
                                             eval_percent=eval_percent),
                  num_parallel_calls=tf.data.AUTOTUNE)


def drop_examples(files: Sequence[str], fmt: RowFormat, *, limit: int = 5) -> list[str]:
    """The first ``limit`` malformed records as ``"file:line: reason"`` (a diagnostic pass,
    reading each file until enough are found; for CoNLL the line is the bad token line)."""
    return format_of(fmt.format).drop_examples(files, fmt, limit)


def _numbered_drop_examples(files: Sequence[str], fmt: RowFormat, limit: int, *,
                            binary: bool) -> list[str]:
    """``drop_examples`` of a format with one record per line (or per TFRecord record):
    parse and check each file's records, numbered from 1."""
    found: list[str] = []
    for path in files:
        ds = _tfrecords([path]) if binary else text_lines(path)
        ds = tf.data.Dataset.zip(tf.data.Dataset.range(1, 1 << 62), ds).batch(READ_BATCH)

        def bad(numbers, lines):
            row, ok = parse(lines, fmt)
            checks = drop_checks(lines, row, ok, fmt)
            reason = tf.fill(tf.shape(lines), "")
            for name in reversed(list(checks)):
                reason = tf.where(checks[name], name, reason)
            keep = tf.not_equal(reason, "")
            return tf.boolean_mask(numbers, keep), tf.boolean_mask(reason, keep)

        for numbers, reasons in ds.map(bad).as_numpy_iterator():
            for number, reason in zip(numbers.tolist(), reasons.tolist()):
                if fmt.header and number == 1:
                    continue
                where = f"{path}: record {number}" if binary else f"{path}:{number}"
                found.append(f"{where}: {reason.decode()}")
                if len(found) >= limit:
                    return found
    return found


def record_problem(files: Sequence[str], fmt: RowFormat) -> str | None:
    """Why TFRecord ``files`` cannot be parsed as ``fmt`` says, naming the file and record:
    a record that is not a ``tf.train.Example``, a feature of another kind than in the first
    records, a corrupt file. ``None`` if none is found (a diagnostic pass in Python, run
    after reading failed)."""
    for path in files:
        number = 0
        try:
            for number, record in enumerate(_tfrecords([path]).as_numpy_iterator(), 1):
                try:
                    example = tf.train.Example.FromString(record)
                except Exception:  # noqa: BLE001 - protobuf's DecodeError
                    return f"{path}: record {number} is not a tf.train.Example"
                for name in fmt.names:
                    feature = example.features.feature.get(name)
                    kind = feature.WhichOneof("kind") if feature is not None else None
                    want = "int64_list" if name in fmt.int_columns else "bytes_list"
                    if kind not in (None, want):
                        return (f"{path}: record {number}: feature {name!r} is a {kind}, the "
                                f"first records' is a {want}: one kind per feature")
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            return (f"{path}: unreadable after record {number} ({str(e).splitlines()[0]}): "
                    "a truncated or corrupt TFRecord file")
    return None


def _conll_drop_examples(files: Sequence[str], fmt: RowFormat, limit: int) -> list[str]:
    """``drop_examples`` for CoNLL: token lines with the wrong number of fields."""
    import gzip

    found: list[str] = []
    for path in files:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if (fmt.header and number == 1) or not line or line.startswith("#") \
                        or line.split()[0] == "-DOCSTART-":
                    continue
                fields = line.split("\t") if "\t" in line else line.split()
                if len(fields) != len(fmt.columns):
                    found.append(f"{path}:{number}: malformed ({len(fields)} fields, "
                                 f"--columns names {len(fmt.columns)})")
                    if len(found) >= limit:
                        return found
    return found


# ----------------------------------------------------------------------------- the formats

class Format:
    """One input format: the files it is inferred from, how its records are read, parsed and
    checked, the key that holds a record out, and how a bad record is named. A new format is
    one subclass here, registered in ``FORMAT_CLASSES`` (the module's functions dispatch on
    ``RowFormat.format``); a decoder of its own may live in its own module (``tfseq.jsonl``).

    Attributes:
      name: the ``--format`` value.
      extensions: file extensions it is inferred from (lower case, after a ``.gz``).
      per_line: one record per text line (``LINE_FORMATS``: predict and profile read them).
      per_example: one example per record (``RECORD_FORMATS``); CoNLL's records are sentences.
      binary: records are not text: UTF-8 is checked on the parsed columns, records are named
        by number (``file: record N``), and a diagnostic pass explains unreadable files.
      named_fields: fields are read by name (JSON keys, Example features), not by position:
        ``--columns`` lists only the fields to read, ``_`` skips nothing.
      token_lines: a record is a sentence of token lines (CoNLL): each column holds the
        space-joined values of the sentence's tokens.
    """

    name = ""
    extensions: tuple[str, ...] = ()
    per_line = True
    per_example = True
    binary = False
    named_fields = False
    token_lines = False

    def matches(self, basename: str) -> bool:
        """Whether a file (its lower-case name, without ``.gz``) is inferred to be this."""
        return os.path.splitext(basename)[1] in self.extensions

    def columns_for(self, columns, required) -> tuple[str, ...]:
        """The ``--columns`` to use (default: the task's required ones)."""
        return tuple(c.strip() for c in (columns or required))

    def row_format(self, files, columns, header) -> RowFormat:
        """The ``RowFormat`` once the columns are checked (a format may look at the files)."""
        return RowFormat(self.name, columns, bool(header))

    def read(self, files, fmt: RowFormat, *, batch_size: int, num_shards: int,
             shard_index: int, in_order: bool) -> tf.data.Dataset:
        """The records as ``tf.string [n]`` batches (see ``read_records``)."""
        return text_lines(files, batch_size=batch_size, header=fmt.header,
                          num_shards=num_shards, shard_index=shard_index,
                          num_parallel_reads=1 if in_order else None)

    def parse(self, records, fmt: RowFormat):
        """``tf.string [n]`` -> ``({column: tf.string [n]}, ok bool [n])``."""
        raise NotImplementedError

    def bad_utf8(self, records, row, ok):
        """bool ``[n]``: records that are not valid UTF-8."""
        return tf.logical_not(valid_utf8(records))

    def hold_out_keys(self, records, row, fmt: RowFormat):
        """``tf.string [n]``: what ``in_eval_split`` hashes (the record itself)."""
        return records

    def drop_examples(self, files, fmt: RowFormat, limit: int) -> list[str]:
        return _numbered_drop_examples(files, fmt, limit, binary=self.binary)


class Tsv(Format):
    """Tab-separated fields, exactly ``len(columns)`` per line."""

    name, extensions = "tsv", (".tsv",)

    def parse(self, records, fmt):
        return _split_parse(records, "\t", fmt.columns)


class Csv(Format):
    """RFC 4180 on one line: quoted fields may hold commas and doubled quotes."""

    name, extensions = "csv", (".csv",)

    def parse(self, records, fmt):
        k = len(fmt.columns)
        well_formed = tf.strings.regex_full_match(records, _CSV_LINE)
        # Field count = commas outside quoted fields + 1.
        bare = tf.strings.regex_replace(records, r'"(?:[^"]|"")*"', "")
        commas = (tf.strings.length(bare)
                  - tf.strings.length(tf.strings.regex_replace(bare, ",", "")))
        ok = tf.logical_and(well_formed, tf.equal(commas, k - 1))
        safe = tf.where(ok, records, "," * (k - 1))
        values = tf.io.decode_csv(safe, record_defaults=[""] * k, use_quote_delim=True,
                                  na_value="__tfseq_never__")
        return {name: values[i] for i, name in enumerate(fmt.columns) if name != "_"}, ok


class Text(Format):
    """The whole line is the one column, ``text`` (what a file of any other name is)."""

    name = "text"

    def matches(self, basename):
        return False  # the default when nothing else matches

    def columns_for(self, columns, required):
        columns = tuple(columns or ("text",))
        if columns != ("text",) or tuple(required) != ("text",):
            raise InputError(f"--format=text gives one column, 'text'; this task needs "
                             f"{list(required)}: use --format=tsv or csv with --columns="
                             + ",".join(required))
        return columns

    def parse(self, records, fmt):
        return {"text": records}, tf.ones_like(records, tf.bool)


class JsonLines(Format):
    """One JSON object per line, columns by key (``tfseq.jsonl``)."""

    name, extensions, named_fields = "jsonl", (".jsonl", ".ndjson"), True

    def parse(self, records, fmt):
        from tfseq.jsonl import decode_fields

        return decode_fields(records, fmt.names, array_keys=fmt.names)

    def bad_utf8(self, records, row, ok):
        # A line decode_fields accepts is valid UTF-8 (its string literals admit only valid
        # UTF-8, the rest of it only ASCII): only the lines it fails are checked, so the one
        # full pass over every line is the decoder's own.
        failed = tf.where(tf.logical_not(ok))
        return tf.scatter_nd(failed, tf.logical_not(valid_utf8(tf.gather_nd(records, failed))),
                             tf.shape(ok, out_type=tf.int64))

    def hold_out_keys(self, records, row, fmt):
        return _named_columns_key(row, fmt)


class TfRecord(Format):
    """``tf.train.Example`` records, columns by feature name (bytes or int64)."""

    name, per_line, binary, named_fields = "tfrecord", False, True, True

    def matches(self, basename):
        return ".tfrecord" in basename  # also TFDS-style name.tfrecord-00000-of-00010

    def row_format(self, files, columns, header):
        if header:
            raise InputError("--header does not apply to --format=tfrecord (records have no "
                             "header line): leave it out")
        if "_" in columns:
            raise InputError("--format=tfrecord reads features by name: list only the ones "
                             "to read in --columns, without '_'")
        names = [c for c in columns if c != "_"]
        return RowFormat(self.name, columns, False, feature_kinds(files, names))

    def read(self, files, fmt, *, batch_size, num_shards, shard_index, in_order):
        if not in_order and len(files) > 1:
            return _tfrecord_shards(files, batch_size=batch_size, num_shards=num_shards,
                                    shard_index=shard_index)
        ds = _tfrecords(files)
        if num_shards > 1:
            ds = ds.shard(num_shards, shard_index)
        return ds.batch(batch_size)

    def parse(self, records, fmt):
        return _parse_examples(records, fmt)

    def bad_utf8(self, records, row, ok):
        bad = tf.zeros_like(ok)
        for value in row.values():
            bad |= tf.logical_not(valid_utf8(value))
        return bad

    def hold_out_keys(self, records, row, fmt):
        return _named_columns_key(row, fmt)


class Conll(Format):
    """One token per line, a blank line ends a sentence: a record per sentence."""

    name, extensions, per_line, per_example = "conll", (".conll", ".conllu"), False, False
    token_lines = True

    def read(self, files, fmt, *, batch_size, num_shards, shard_index, in_order):
        ds = conll_sentences(files, fmt, batch_size=batch_size)
        if num_shards > 1:
            ds = ds.unbatch().shard(num_shards, shard_index).batch(batch_size)
        return ds

    def parse(self, records, fmt):
        return _split_parse(records, _FIELD_SEPARATOR, fmt.names)

    def drop_examples(self, files, fmt, limit):
        return _conll_drop_examples(files, fmt, limit)


class Pair(Format):
    """Two line-aligned files (``read_aligned``), columns ``source, target``; not a
    ``--format``: ``--source_files``/``--target_files`` give it."""

    name, per_line = PAIR, False

    def matches(self, basename):
        return False

    def read(self, files, fmt, *, batch_size, num_shards, shard_index, in_order):
        """``files``: ``(source files, target files)``."""
        source_files, target_files = files
        return read_aligned(source_files, target_files, batch_size=batch_size,
                            num_shards=num_shards, shard_index=shard_index)

    def parse(self, records, fmt):
        return _split_parse(records, _FIELD_SEPARATOR, fmt.names)

    def hold_out_keys(self, records, row, fmt):
        # "source<TAB>target", as a TSV line of the pair would be.
        return tf.strings.regex_replace(records, _FIELD_SEPARATOR, "\t")


def _split_parse(records, separator: str, names: Sequence[str]):
    """Records of exactly ``len(names)`` fields split on ``separator`` -> named columns
    (``"_"`` discarded) and ``ok``."""
    width = len(names)
    fields = tf.strings.split(records, separator)
    ok = tf.equal(fields.row_lengths(), width)
    dense = tf.where(ok[:, None], fields.to_tensor("", shape=[None, width]), "")
    return {name: dense[:, i] for i, name in enumerate(names) if name != "_"}, ok


def _named_columns_key(row, fmt: RowFormat):
    """The named columns joined by tabs: a JSON line or an Example holds out as the TSV line
    of the same row would."""
    return tf.strings.reduce_join(tf.stack([row[n] for n in fmt.names], axis=1), axis=1,
                                  separator="\t")


# ``--format`` -> its class, in inference order (Text, the default, matches nothing).
FORMAT_CLASSES: dict[str, Format] = {f.name: f for f in (
    Tsv(), Csv(), Text(), JsonLines(), TfRecord(), Conll())}
_PAIR_FORMAT = Pair()
LINE_FORMATS = tuple(n for n, f in FORMAT_CLASSES.items() if f.per_line)  # a record per line
RECORD_FORMATS = tuple(n for n, f in FORMAT_CLASSES.items() if f.per_example)
FORMATS = tuple(FORMAT_CLASSES)


def format_of(name: str) -> Format:
    """The ``Format`` of a ``RowFormat.format`` (``PAIR`` included)."""
    return _PAIR_FORMAT if name == PAIR else FORMAT_CLASSES[name]


def text_column(patterns, *, format: str | None = None, columns: Sequence[str] | None = None,
                header: bool = False, counter: DropCounter | None = None,
                batch_size: int | None = None) -> tf.data.Dataset:
    """The ``text`` column of user files as ``tf.string`` scalars (``[n]`` batches with
    ``batch_size``): what the benchmarks and the profiler read with ``--train_files``.

    Raises:
      InputError: missing or empty files, or ``columns`` without ``text``.
    """
    files = resolve(patterns)
    names = tuple(c for c in (columns or ()) if c != "_") or ("text",)
    fmt = row_format(files, format, columns or None, header, required=("text",), allowed=names)
    rows = read_rows(files, fmt, counter or DropCounter("text_column"),
                     batch_size=batch_size or READ_BATCH)
    texts = rows.map(lambda row: row["text"])
    return texts if batch_size else texts.unbatch()
