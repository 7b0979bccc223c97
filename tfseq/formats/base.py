"""What every input format shares: ``RowFormat``, the ``Format`` base class, the registry, and
the functions that dispatch on a ``RowFormat`` (read, parse, count drops, name bad records).

Shapes: n = records in a batch, m = rows kept.

A format is one ``Format`` subclass in its own module of ``tfseq.formats``, registered in
``FORMAT_CLASSES`` (``tfseq/formats/__init__.py`` fills it, in inference order). Everything a
caller needs to know about a format is asked of its class (``format_of(name)``): how its files
are read and parsed, how a bad record is named and explained, whether its files must be read
once before training, and what to do when reading them failed. Nothing outside this package
compares format names.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import tensorflow as tf

from tfseq.errors import InputError
from tfseq.filtering import valid_utf8
from tfseq.reading import resolve_files, text_lines
from tfseq.stats import DropCounter

PAIR = "pair"  # records of two line-aligned files (``read_aligned``); not a --format
TEXT_COLUMNS = ("text", "source", "target", "tokens", "token")
# 1,024 records a read batch: see docs/benchmarks.md#input-pipeline-throughput
READ_BATCH = 1024  # records per batch on the vectorized path (512: ~6-15% less throughput)
FIELD_SEPARATOR = "\n"  # between a CoNLL sentence's or a line pair's fields (never in a line)
DROP_REASONS = ("malformed", "invalid_utf8", "empty_text")  # what ``parse_rows`` counts


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
      keys: formats with named fields: the name in the file of each of ``names`` (a JSON key,
        dotted for a nested one; a feature; a Parquet column), where one differs from its
        column's name (``--columns=text=body``); ``()``: the names themselves.
    """

    format: str = "tsv"
    columns: tuple[str, ...] = ("label", "text")
    header: bool = False
    int_columns: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c for c in self.columns if c != "_")

    @property
    def file_keys(self) -> tuple[str, ...]:
        """The name in the file of each of ``names``."""
        return self.keys or self.names

    def key_of(self, name: str) -> str:
        """The name in the file of column ``name``."""
        return self.file_keys[self.names.index(name)]


def split_columns(columns: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``--columns`` entries -> (column names, the name in the file of each): ``label`` reads
    the field ``label``, ``label=category`` the field ``category`` into the column ``label``;
    ``_`` skips a field (its key is ``_``).

    Raises:
      InputError: an entry with an empty side, or ``_=KEY``.
    """
    names, keys = [], []
    for entry in columns:
        name, _, key = (part.strip() for part in entry.partition("="))
        if "=" in entry and (not name or not key or name == "_"):
            raise InputError(f"--columns entry {entry.strip()!r}: write FIELD=KEY, FIELD the "
                             "task's column name and KEY the name in the file (e.g. "
                             "text=body)")
        names.append(name)
        keys.append(key or name)
    return tuple(names), tuple(keys)


def mapped_keys(names: Sequence[str], keys: Sequence[str]) -> tuple[str, ...]:
    """``RowFormat.keys`` for ``split_columns``' names and keys (``()`` when none differs)."""
    pairs = [(n, k) for n, k in zip(names, keys) if n != "_"]
    return tuple(k for _, k in pairs) if any(n != k for n, k in pairs) else ()


class Format:
    """One input format: the files it is inferred from, how its records are read, parsed and
    checked, the key that holds a record out, how a bad record is named and explained, and
    what a run must do about its files before training.

    Attributes:
      name: the ``--format`` value.
      extensions: file extensions it is inferred from (lower case, after a ``.gz``).
      per_line: one record per text line (``LINE_FORMATS``: predict and profile read them).
      per_example: one example per record (``RECORD_FORMATS``); CoNLL's records are sentences.
      named_fields: fields are read by name (JSON keys, Example features), not by position:
        ``--columns`` lists only the fields to read, ``_`` skips nothing.
      token_lines: a record is a sentence of token lines (CoNLL): each column holds the
        space-joined values of the sentence's tokens.
      only_column: the one column a record holds (``text``), when the format has no columns.
      maps_keys: ``--columns`` may read a field of another name (``FIELD=KEY``) without a
        header line (formats with named fields).
      must_check: reading the files checks something that must hold before training (two
        files line-aligned, TFRecord features of one kind): a run reads them once before its
        first step, and ``diagnose`` names the record when that read fails.
      record_noun: how a record is named in messages: ``None`` for ``file:line``, else
        ``file: <noun> N`` (records that are not lines).
    """

    name = ""
    extensions: tuple[str, ...] = ()
    per_line = True
    per_example = True
    named_fields = False
    token_lines = False
    only_column: str | None = None
    maps_keys = False
    must_check = False
    record_noun: str | None = None

    def matches(self, basename: str) -> bool:
        """Whether a file (its lower-case name, without ``.gz``) is inferred to be this."""
        return os.path.splitext(basename)[1] in self.extensions

    def columns_for(self, columns, required) -> tuple[str, ...]:
        """The ``--columns`` to use (default: the task's required ones)."""
        return tuple(c.strip() for c in (columns or required))

    def row_format(self, files, columns, keys, header) -> RowFormat:
        """The ``RowFormat`` once the columns are checked (a format may look at the files):
        ``columns`` the names (``"_"`` included), ``keys`` the name in the file of each."""
        if mapped_keys(columns, keys):
            raise InputError(f"--columns={_entries(columns, keys)}: --format={self.name} has no "
                             "field names for FIELD=KEY to read; name its fields in order")
        return RowFormat(self.name, tuple(columns), bool(header))

    def read(self, files, fmt: RowFormat, *, batch_size: int, num_shards: int,
             shard_index: int, in_order: bool) -> tf.data.Dataset:
        """The records as ``tf.string [n]`` batches (see ``read_records``)."""
        return text_lines(files, batch_size=batch_size, header=fmt.header,
                          num_shards=num_shards, shard_index=shard_index,
                          num_parallel_reads=1 if in_order else None)

    def file_records(self, path: str, fmt: RowFormat) -> tf.data.Dataset:
        """One file's records in order, ``tf.string`` scalars, numbered from 1 by
        ``drop_examples`` (a header line included: it is skipped by number)."""
        return text_lines(path)

    def parse(self, records, fmt: RowFormat):
        """``tf.string [n]`` -> ``({column: tf.string [n]}, ok bool [n])``."""
        raise NotImplementedError

    def bad_utf8(self, records, row, ok):
        """bool ``[n]``: records that are not valid UTF-8."""
        return tf.logical_not(valid_utf8(records))

    def text_to_check(self, records, row, field: str):
        """``tf.string [n]``: what must be clean text (UTF-8, no NUL) for ``field`` to be
        usable: the record itself (a line), or the field of a record that is not text."""
        return records

    def hold_out_keys(self, records, row, fmt: RowFormat):
        """``tf.string [n]``: what ``in_eval_split`` hashes (the record itself)."""
        return records

    def malformed_detail(self, record: bytes, fmt: RowFormat) -> str | None:
        """What is wrong with a ``malformed`` record (``missing key 'text'``, ``3 fields,
        expected 2``), for ``drop_examples``; ``None`` when there is nothing to add. Python,
        run on the few records named."""
        return None

    def where(self, path: str, number: int) -> str:
        """How record ``number`` (from 1) of ``path`` is named in messages."""
        return f"{path}: {self.record_noun} {number}" if self.record_noun else f"{path}:{number}"

    def drop_examples(self, files, fmt: RowFormat, limit: int) -> list[str]:
        """The first ``limit`` dropped records as ``"<where>: <reason>"`` (``malformed`` with
        ``malformed_detail`` after it, in parentheses): each file's records parsed and checked
        in the graph, in batches, until enough are found."""
        found: list[str] = []
        for path in files:
            ds = tf.data.Dataset.zip(tf.data.Dataset.range(1, 1 << 62),
                                     self.file_records(path, fmt)).batch(READ_BATCH)

            def bad(numbers, records):
                row, ok = self.parse(records, fmt)
                checks = drop_checks(records, row, ok, fmt)
                reason = tf.fill(tf.shape(records), "")
                for name in reversed(list(checks)):
                    reason = tf.where(checks[name], name, reason)
                keep = tf.not_equal(reason, "")
                return (tf.boolean_mask(numbers, keep), tf.boolean_mask(reason, keep),
                        tf.boolean_mask(records, keep))

            for numbers, reasons, records in ds.map(bad).as_numpy_iterator():
                for number, reason, record in zip(numbers.tolist(), reasons.tolist(),
                                                  records.tolist()):
                    if fmt.header and number == 1:
                        continue
                    reason = reason.decode()
                    detail = self.malformed_detail(record, fmt) if reason == "malformed" else None
                    found.append(f"{self.where(path, number)}: {reason}"
                                 + (f" ({detail})" if detail else ""))
                    if len(found) >= limit:
                        return found
        return found

    def diagnose(self, files, fmt: RowFormat) -> str | None:
        """Why reading ``files`` failed, naming the file and record (a diagnostic pass in
        Python, run after reading failed); ``None`` if the format has nothing to add."""
        return None


# ``--format`` -> its class, in inference order (Text, the default, matches nothing); filled
# by ``tfseq/formats/__init__.py``.
FORMAT_CLASSES: dict[str, Format] = {}
_PAIR_FORMAT: list[Format] = []  # the ``PAIR`` class, set by ``__init__``


def format_of(name: str) -> Format:
    """The ``Format`` of a ``RowFormat.format`` (``PAIR`` included)."""
    return _PAIR_FORMAT[0] if name == PAIR else FORMAT_CLASSES[name]


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
      columns: field names in order (default: ``required``); ``"_"`` skips a field;
        ``FIELD=KEY`` reads the file's field ``KEY`` as the column ``FIELD`` (formats with
        named fields, or TSV/CSV with ``header``: see ``split_columns``).
      header: skip each file's first line.
      required: columns the task needs (e.g. ``("label", "text")``).
      allowed: every column name the task knows.

    Raises:
      InputError: an unknown or duplicated column name, or a required one missing.
    """
    format = infer_format(files, format)
    kind = FORMAT_CLASSES[format]
    entries = kind.columns_for(columns, required)
    columns, keys = split_columns(entries)
    unknown = [c for c in columns if c != "_" and c not in allowed]
    if unknown:
        raise InputError(f"Unknown column name(s) {unknown} in --columns={','.join(entries)}; "
                         f"this task knows {list(allowed)} (and '_' to skip a field)")
    names = [c for c in columns if c != "_"]
    if len(set(names)) != len(names):
        raise InputError(f"A column is named twice in --columns={','.join(entries)}")
    missing = [c for c in required if c not in names]
    if missing:
        raise InputError(f"--columns={','.join(entries)} has no {missing} column: name the "
                         f"fields of {files[0] if files else 'the files'} in order, e.g. "
                         f"--columns={','.join(required)}")
    return kind.row_format(files, columns, keys, header)


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


# ----------------------------------------------------------------------------- parsing

def parse(records: tf.Tensor, fmt: RowFormat) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """``tf.string [n]`` records -> ``({column: tf.string [n]}, ok bool [n])``.

    ``ok`` is false on a malformed record (its columns are then empty strings). Vectorized.
    """
    return format_of(fmt.format).parse(records, fmt)


def drop_checks(records: tf.Tensor, row: dict, ok: tf.Tensor, fmt: RowFormat | None = None
                ) -> dict[str, tf.Tensor]:
    """The ordered ``reason -> bool [n]`` checks of a parsed batch (true: drop). Records that
    are not text (TFRecord): there the columns' values must be UTF-8, not the records."""
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
    counter.register(*DROP_REASONS)
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


def text_column(patterns, *, format: str | None = None, columns: Sequence[str] | None = None,
                header: bool = False, counter: DropCounter | None = None,
                batch_size: int | None = None) -> tf.data.Dataset:
    """The ``text`` column of user files as ``tf.string`` scalars (``[n]`` batches with
    ``batch_size``): what the benchmarks and the profiler read with ``--train_files``.

    Raises:
      InputError: missing or empty files, or ``columns`` without ``text``.
    """
    files = resolve(patterns)
    names = tuple(c for c in split_columns(columns or ())[0] if c != "_") or ("text",)
    fmt = row_format(files, format, columns or None, header, required=("text",), allowed=names)
    rows = read_rows(files, fmt, counter or DropCounter("text_column"),
                     batch_size=batch_size or READ_BATCH)
    texts = rows.map(lambda row: row["text"])
    return texts if batch_size else texts.unbatch()


# ----------------------------------------------------------------------------- shared helpers

def split_parse(records, separator: str, names: Sequence[str]):
    """Records of exactly ``len(names)`` fields split on ``separator`` -> named columns
    (``"_"`` discarded) and ``ok``."""
    width = len(names)
    fields = tf.strings.split(records, separator)
    ok = tf.equal(fields.row_lengths(), width)
    dense = tf.where(ok[:, None], fields.to_tensor("", shape=[None, width]), "")
    return {name: dense[:, i] for i, name in enumerate(names) if name != "_"}, ok


def named_columns_key(row, fmt: RowFormat):
    """The named columns joined by tabs: a JSON line or an Example holds out as the TSV line
    of the same row would."""
    return tf.strings.reduce_join(tf.stack([row[n] for n in fmt.names], axis=1), axis=1,
                                  separator="\t")


def columns_utf8(row, ok):
    """bool ``[n]``: a column of the row is not valid UTF-8 (records that are not text)."""
    bad = tf.zeros_like(ok)
    for value in row.values():
        bad |= tf.logical_not(valid_utf8(value))
    return bad


def _entries(columns: Sequence[str], keys: Sequence[str]) -> str:
    """``--columns`` as given, from ``split_columns``' names and keys."""
    return ",".join(n if n == k else f"{n}={k}" for n, k in zip(columns, keys))


def fields_detail(count: int, expected: int) -> str:
    """``"3 fields, expected 2"``."""
    return f"{count} field{'' if count == 1 else 's'}, expected {expected}"


class Delimited(Format):
    """A format of delimited fields on a line (TSV, CSV): by position, or with ``header``,
    by the header's names when ``--columns`` names fields of the header (``FIELD=KEY``, or
    plain names all found in it; a header of other names keeps reading by position)."""

    def header_fields(self, line: str) -> list[str]:
        """The names in a header line."""
        raise NotImplementedError

    def count_fields(self, line: str) -> int | None:
        """The number of fields of a line; ``None`` if it does not parse at all."""
        raise NotImplementedError

    def row_format(self, files, columns, keys, header):
        mapped = bool(mapped_keys(columns, keys))
        if not header:
            if mapped:
                raise InputError(f"--columns={_entries(columns, keys)}: FIELD=KEY reads "
                                 f"{self.name.upper()} columns by the names in the header "
                                 "line: add --header")
            return RowFormat(self.name, tuple(columns), False)
        fields = self._header(files[0]) if files else None
        wanted = [k for n, k in zip(columns, keys) if n != "_"]
        if fields is None or not (mapped or set(wanted) <= set(fields)):
            return RowFormat(self.name, tuple(columns), True)
        missing = [k for k in wanted if k not in fields]
        if missing:
            raise InputError(f"{files[0]}: no column {missing} in its header {fields}: name "
                             "header columns in --columns (FIELD=KEY)")
        twice = [k for k in wanted if fields.count(k) > 1]
        if twice:
            raise InputError(f"{files[0]}: its header names {twice[0]!r} twice; read by "
                             "position instead (--columns in order, '_' for the others)")
        for path in files[1:]:
            other = self._header(path)
            if other not in (None, fields):
                raise InputError(f"{path}: its header {other} differs from {files[0]}'s "
                                 f"{fields}: files read by the header's names share one header")
        by_position = ["_"] * len(fields)
        for name, key in zip(columns, keys):
            if name != "_":
                by_position[fields.index(key)] = name
        return RowFormat(self.name, tuple(by_position), True)

    def _header(self, path: str) -> list[str] | None:
        """The header names of ``path`` (``None`` if it cannot be opened: reading says why)."""
        import gzip

        opener = gzip.open if path.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8-sig", errors="replace", newline="") as f:
                line = f.readline().rstrip("\r\n")
        except (OSError, EOFError):
            return None
        return [field.strip() for field in self.header_fields(line)]

    def malformed_detail(self, record, fmt):
        count = self.count_fields(record.decode("utf-8", errors="replace"))
        return None if count is None else fields_detail(count, len(fmt.columns))
