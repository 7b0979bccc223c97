"""Rows with named columns from user files: TSV, CSV (RFC 4180) and plain text, parsed in graph.

Shapes: n = lines in a batch.

``read_rows`` turns files into batches of rows, ``{column: tf.string [n]}``, every malformed
line a counted drop (``tfseq.DropCounter``)::

    label<TAB>text           --format=tsv --columns=label,text
    "a, b",pos               --format=csv --columns=text,label   ->  text "a, b", label "pos"
    any line                 --format=text                       ->  {"text": "any line"}

A column named ``_`` is read and discarded. CSV follows RFC 4180 on one line: quoted fields may
hold commas and doubled quotes (``""``); a line with a stray quote or the wrong field count is
``malformed`` (records spanning lines are not supported: each half is counted as malformed).
Parsing is vectorized ``tf.strings``/``tf.io.decode_csv`` on batches of lines, no Python.

Drop reasons: ``malformed`` (wrong field count, broken quoting), ``invalid_utf8``,
``empty_text`` (a column named ``text``, ``source`` or ``target`` is blank), ``other_split``
(the line is held out for the other split by ``eval_percent``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import tensorflow as tf

from tfseq.reading import resolve_files, text_lines
from tfseq.stats import DropCounter

FORMATS = ("tsv", "csv", "text")
TEXT_COLUMNS = ("text", "source", "target")
READ_BATCH = 1024  # lines per batch on the vectorized path (512: ~6-15% less throughput)

# One CSV field: quoted (doubled quotes inside) or unquoted (no quote, no comma).
_CSV_FIELD = r'(?:"(?:[^"]|"")*"|[^",]*)'
_CSV_LINE = rf"{_CSV_FIELD}(?:,{_CSV_FIELD})*"


class InputError(ValueError):
    """Bad input files or format options; the message names the file and the fix."""


@dataclasses.dataclass(frozen=True)
class RowFormat:
    """How to cut lines into named columns.

    Attributes:
      format: ``"tsv"``, ``"csv"`` or ``"text"`` (the whole line is the ``text`` column).
      columns: the fields of a line in order; ``"_"`` skips a field.
      header: skip the first line of every file.
    """

    format: str = "tsv"
    columns: tuple[str, ...] = ("label", "text")
    header: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c for c in self.columns if c != "_")


def infer_format(files: Sequence[str], format: str | None = None) -> str:
    """``format`` if given, else from the first file's extension (``.tsv``, ``.csv``, else
    ``text``; a trailing ``.gz`` is ignored).

    Raises:
      InputError: an unknown ``format``.
    """
    if format:
        if format not in FORMATS:
            raise InputError(f"Unknown --format={format!r}; expected one of {FORMATS}")
        return format
    name = files[0][:-3] if files and files[0].endswith(".gz") else (files[0] if files else "")
    ext = os.path.splitext(name)[1].lower()
    return {".tsv": "tsv", ".csv": "csv"}.get(ext, "text")


def row_format(files: Sequence[str], format: str | None, columns: Sequence[str] | None,
               header: bool, *, required: Sequence[str], allowed: Sequence[str]) -> RowFormat:
    """Validates the format options for a task.

    Args:
      files: resolved input files (for the extension and the messages).
      format: ``"tsv"|"csv"|"text"`` or ``None`` (from the extension).
      columns: field names in order (default: ``required``); ``"_"`` skips a field.
      header: skip each file's first line.
      required: columns the task needs (e.g. ``("label", "text")``).
      allowed: every column name the task knows.

    Raises:
      InputError: an unknown or duplicated column name, or a required one missing.
    """
    format = infer_format(files, format)
    if format == "text":
        columns = tuple(columns or ("text",))
        if columns != ("text",) or tuple(required) != ("text",):
            raise InputError(f"--format=text gives one column, 'text'; this task needs "
                             f"{list(required)}: use --format=tsv or csv with --columns="
                             + ",".join(required))
    columns = tuple(c.strip() for c in (columns or required))
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
    return RowFormat(format, columns, bool(header))


def resolve(patterns: Sequence[str], flag: str = "--train_files") -> list[str]:
    """Files matched by comma-separated globs; ``InputError`` naming the flag if none match,
    or if a file is empty."""
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p]
    try:
        files = resolve_files(list(patterns))
    except FileNotFoundError as e:
        raise InputError(f"{flag}: {e}") from None
    for path in files:
        if os.path.isdir(path):
            raise InputError(f"{flag}: {path} is a directory; give files or a glob like {path}/*")
        if os.path.getsize(path) == 0:
            raise InputError(f"{flag}: {path} is empty")
    return files


def read_lines(files, *, header: bool = False, batch_size: int | None = READ_BATCH,
               shuffle_lines: bool = False, **kwargs) -> tf.data.Dataset:
    """The single place the pipelines read lines: ``tfseq.text_lines`` (``**kwargs`` passed
    on), batched as ``tf.string [n]`` (``batch_size=None``: single lines), without each
    file's first line when ``header``; ``shuffle_lines`` gives the global line shuffle of
    ``text_lines`` (a new order every epoch; the header lines are removed first).

    Raises:
      InputError: a missing file, or a corrupt or truncated gzip file (the message names it).
    """
    from tfseq import shuffling

    try:
        if not header:
            return text_lines(files, batch_size=batch_size, shuffle_lines=shuffle_lines, **kwargs)
        files = resolve_files(files)
        seed = kwargs.pop("seed", None)
        per_file = [text_lines(f, seed=seed, **kwargs) for f in files]
    except (ValueError, FileNotFoundError) as e:
        raise InputError(str(e)) from None

    def without_headers():
        ds = per_file[0].skip(1)
        for more in per_file[1:]:
            ds = ds.concatenate(more.skip(1))
        return ds

    if not shuffle_lines:
        ds = without_headers()
        return ds if batch_size is None else ds.batch(batch_size)
    kinds = ["GZIP" if f.endswith(".gz") else "" for f in files]
    ds = shuffling.shard_shuffle(
        lambda: without_headers().batch(READ_BATCH), batch_size=batch_size or READ_BATCH,
        num_shards=shuffling.num_shuffle_shards(files, kinds, 64 << 20), seed=seed)
    return ds if batch_size else ds.unbatch()


def parse(lines: tf.Tensor, fmt: RowFormat) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """``tf.string [n]`` lines -> ``({column: tf.string [n]}, ok bool [n])``.

    ``ok`` is false on a malformed line (its columns are then empty strings). Vectorized.
    """
    k = len(fmt.columns)
    if fmt.format == "text":
        return {"text": lines}, tf.ones_like(lines, tf.bool)
    if fmt.format == "tsv":
        fields = tf.strings.split(lines, "\t")
        ok = tf.equal(fields.row_lengths(), k)
        dense = fields.to_tensor("", shape=[None, k])
        dense = tf.where(ok[:, None], dense, "")
        values = [dense[:, i] for i in range(k)]
    else:
        well_formed = tf.strings.regex_full_match(lines, _CSV_LINE)
        # Field count = commas outside quoted fields + 1.
        bare = tf.strings.regex_replace(lines, r'"(?:[^"]|"")*"', "")
        commas = tf.strings.length(bare) - tf.strings.length(
            tf.strings.regex_replace(bare, ",", ""))
        ok = tf.logical_and(well_formed, tf.equal(commas, k - 1))
        safe = tf.where(ok, lines, "," * (k - 1))
        values = tf.io.decode_csv(safe, record_defaults=[""] * k, use_quote_delim=True,
                                  na_value="__tfseq_never__")
    row = {name: values[i] for i, name in enumerate(fmt.columns) if name != "_"}
    return row, ok


def drop_checks(lines: tf.Tensor, row: dict, ok: tf.Tensor) -> dict[str, tf.Tensor]:
    """The ordered ``reason -> bool [n]`` checks of a parsed batch (true: drop)."""
    valid = tf.strings.unicode_transcode(lines, "UTF-8", "UTF-8", errors="replace",
                                         replacement_char=0xFFFD)
    bad_utf8 = tf.logical_and(tf.not_equal(valid, lines),
                              tf.logical_not(tf.strings.regex_full_match(lines, ".*\uFFFD.*")))
    empty = tf.zeros_like(ok)
    for name in TEXT_COLUMNS:
        if name in row:
            empty = tf.logical_or(empty, tf.strings.regex_full_match(row[name], r"\s*"))
    return {"invalid_utf8": bad_utf8, "malformed": tf.logical_not(ok),
            "empty_text": tf.logical_and(ok, empty)}


def in_eval_split(lines: tf.Tensor, eval_percent: int) -> tf.Tensor:
    """bool ``[n]``: whether each line is held out (a stable hash of its bytes in the first
    ``eval_percent`` of 100 buckets; equal lines always land in the same split)."""
    return tf.strings.to_hash_bucket_fast(lines, 100) < eval_percent


def read_rows(files: Sequence[str], fmt: RowFormat, counter: DropCounter, *,
              split: str | None = None, eval_percent: int = 0, batch_size: int = READ_BATCH,
              **read_kwargs) -> tf.data.Dataset:
    """Batches of rows ``{column: tf.string [n]}`` of ``files``, every drop counted.

    Args:
      files: resolved paths (``.gz`` read as gzip).
      fmt: the ``RowFormat``.
      counter: counts ``lines_read`` and the drop reasons (see the module docstring).
      split: ``"train"`` or ``"eval"`` to keep only that side of the ``eval_percent`` hash
        hold-out; ``None`` keeps every line.
      eval_percent: percent of lines held out for ``"eval"``.
      batch_size: lines per batch.
    """
    counter.register("malformed", "invalid_utf8", "empty_text")
    if split is not None:
        counter.register("other_split")
    ds = read_lines(files, header=fmt.header, batch_size=batch_size, **read_kwargs)
    ds = ds.apply(counter.tally("lines_read", rows=True))

    def parse_and_keep(lines):
        row, ok = parse(lines, fmt)
        checks = {}
        if split is not None:  # first: each bad line is counted in one split only
            checks["other_split"] = tf.not_equal(in_eval_split(lines, eval_percent),
                                                 split == "eval")
        checks.update(drop_checks(lines, row, ok))
        keep = counter.keep_if(checks)
        return {k: tf.boolean_mask(v, keep) for k, v in row.items()}

    return ds.map(parse_and_keep, num_parallel_calls=tf.data.AUTOTUNE)


def drop_examples(files: Sequence[str], fmt: RowFormat, *, limit: int = 5) -> list[str]:
    """The first ``limit`` malformed lines as ``"file:line: reason"`` (a diagnostic pass,
    in graph, reading each file until enough are found)."""
    found: list[str] = []
    for path in files:
        ds = text_lines(path)
        ds = tf.data.Dataset.zip(tf.data.Dataset.range(1, 1 << 62), ds).batch(READ_BATCH)

        def bad(numbers, lines):
            row, ok = parse(lines, fmt)
            checks = drop_checks(lines, row, ok)
            reason = tf.fill(tf.shape(lines), "")
            for name in reversed(list(checks)):
                reason = tf.where(checks[name], name, reason)
            keep = tf.not_equal(reason, "")
            return tf.boolean_mask(numbers, keep), tf.boolean_mask(reason, keep)

        offset = 1 if fmt.header else 0
        for numbers, reasons in ds.map(bad).as_numpy_iterator():
            for number, reason in zip(numbers.tolist(), reasons.tolist()):
                if offset and number == 1:
                    continue
                found.append(f"{path}:{number}: {reason.decode()}")
                if len(found) >= limit:
                    return found
    return found


def discover_labels(rows: tf.data.Dataset, key: str = "label") -> list[str]:
    """Sorted distinct values of ``key`` over batches of rows (a pass over the data)."""
    import numpy as np

    seen: set[bytes] = set()
    for values in rows.map(lambda r: tf.strings.strip(r[key])).as_numpy_iterator():
        seen.update(np.unique(values).tolist())
    return sorted(v.decode("utf-8", errors="replace") for v in seen)


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
