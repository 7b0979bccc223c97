"""Batch inference over files with an export: one output line per input line, in input order.

Lines are read (``tfseq.formats.read_records``, file by file), parsed (``formats.parse``: the
input column of a TSV/CSV line, or the whole line), tokenized with the export's own ``encode``
signature, numbered (``tfseq.with_index``), batched by length under ``max_tokens`` cells
(``tfseq.bucket_by_length``, no shuffle), run through ``predict_ids`` and put back in input
order (``tfseq.predict_in_order``): memory is bounded by the bucketing pool, not by the file.
The task of the export (``serving.json``) turns each prediction into its output line
(``TextTask.prediction_line``).

A line that cannot be used (wrong field count, invalid UTF-8, a NUL byte, no token where the
task needs one, too long under ``long_examples=drop``) gets an empty output line and is counted
by reason in the report.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import tensorflow as tf
import tensorflow_text  # noqa: F401  (the export's text ops)

import tfseq
from tfseq import formats, serving
from tfseq.batching import Batching, mode_of
from tfseq.errors import InputError
from tfseq.filtering import line_checks
from tfseq.pipelines import tasks
from tfseq.reading import resolve_files

# Reason codes of an unusable line (0: usable), in report order.
REASONS = ("ok", "malformed", "invalid_utf8", "nul_byte", "empty", "too_long")


def export_dir_of(model_dir: str) -> str:
    """``model_dir/export`` if it exists, else ``model_dir`` when it is a SavedModel.

    Raises:
      FileNotFoundError: neither (the message says how to export).
    """
    for path in (os.path.join(model_dir, "export"), model_dir):
        if os.path.exists(os.path.join(path, "saved_model.pb")):
            return path
    raise FileNotFoundError(f"No SavedModel in {model_dir}/export or {model_dir}: run "
                            f"tfseq-export --model_dir={model_dir} first")


def make_parser(fmt: formats.RowFormat, field: str):
    """The parse step: ``tf.string [n]`` lines -> ``{"text": tf.string [n], "reason": int32
    [n]}`` (``REASONS`` index, 0 for a usable line; unusable lines get ``text`` = ``""``)."""
    def parse(lines):
        row, ok = formats.parse(lines, fmt)
        # A line, or the field of a record that is not text (TFRecord), must be clean text.
        checks = line_checks(formats.format_of(fmt.format).text_to_check(lines, row, field),
                             None)
        reason = tf.where(ok, 0, REASONS.index("malformed"))
        for name in ("nul_byte", "invalid_utf8"):  # the first failing check wins
            reason = tf.where(checks[name], REASONS.index(name), reason)
        return {"text": tf.where(reason > 0, "", row[field]), "reason": reason}

    return parse


def input_format(info: dict, files, fmt: str | None, columns,
                 header: bool | None) -> formats.RowFormat:
    """The ``RowFormat`` of the files to predict on: ``fmt``/``columns``/``header`` if given,
    else the training run's (``serving.json``) when the format is the run's, else from the
    extension (a TSV's default columns: the embedded corpus' ``book,chapter,verse,<input>``;
    no header). The input is the column that fed the served input in training
    (``input_column``: ``text``; translate ``source``; tag ``tokens``, or ``token`` in CoNLL).

    Raises:
      ValueError: a format predict cannot read, or columns without the input field.
    """
    fmt = formats.infer_format([str(f) for f in files], fmt)
    kind = formats.format_of(fmt)
    same_format = info.get("format") in (None, fmt) and "columns" in info
    if header is None:
        header = bool(info.get("header")) if same_format else False
    if kind.only_column:  # the whole line is the input
        return formats.RowFormat(fmt, (kind.only_column,), header)
    field = input_field(info, fmt)
    trained = info.get("columns") if same_format else None
    columns = tuple(columns or trained or (
        [field] if kind.named_fields else ["book", "chapter", "verse", field]))
    names, _ = formats.split_columns(columns)
    if field not in names:
        what = f"{fmt} field" if kind.named_fields else "column"
        raise ValueError(f"--columns={','.join(columns)} has no {field!r} field; name the "
                         f"input {what} {field!r}" + ("" if kind.named_fields else
                                                      " (and `_` for the others)"))
    # Only the input is read (``FIELD=KEY`` as given): the other columns are skipped, or left
    # out where fields are read by name.
    entries = [c if n == field else "_" for c, n in zip(columns, names)]
    if kind.named_fields:
        entries, header = [c for c in entries if c != "_"], False
    return formats.row_format([str(f) for f in files], fmt, entries, header,
                              required=(field,), allowed=(field,))


def input_field(info: dict, fmt: str) -> str:
    """The column of ``fmt`` files that holds the served input: the training run's
    ``input_column`` (tag: ``tokens`` in rows, ``token`` in CoNLL sentences)."""
    field = info.get("input_column") or info.get("input", "text")
    if field in ("tokens", "token"):
        return "token" if formats.format_of(fmt).token_lines else "tokens"
    return field


def predict_files(model_dir: str, files, output: str, *, fmt: str | None = None,
                  columns=None, header: bool | None = None, max_tokens: int = 8192,
                  batching: str = "bucket", pool_size: int = 8192, progress=None,
                  names: dict | None = None) -> dict:
    """Runs the export of ``model_dir`` over ``files`` and writes ``output``; returns the report.

    Args:
      output: the output file (its folder made if missing), or ``-`` for stdout.
      header: skip each file's first line; ``None``: as the training run did (same format).
      progress: ``fn(lines so far)`` called after each batch (a progress bar), or ``None``.
      names: how a file is named in the report (e.g. ``{"/tmp/x/stdin.txt": "<stdin>"}``).

    Raises:
      FileNotFoundError: no export, or a file pattern that matches nothing.
      ValueError: bad arguments (named), a truncated gzip file.
      InputError: no input line could be predicted (the output file is removed).
    """
    report = _predict_files(model_dir, files, output, fmt=fmt, columns=columns, header=header,
                            max_tokens=max_tokens, batching=batching, pool_size=pool_size,
                            progress=progress)
    names = names or {}
    report["files"] = [names.get(f, f) for f in report["files"]]
    report["first_unusable"] = [_renamed(line, names) for line in report["first_unusable"]]
    unusable = sum(report[r] for r in REASONS[1:])
    if report["lines"] and unusable < report["lines"]:
        return report
    if output != "-" and os.path.exists(output):
        os.remove(output)
    files = ", ".join(report["files"])
    if not report["lines"]:
        raise InputError(f"no input line in {files}: nothing to predict")
    counts = ", ".join(f"{report[r]:,} {r}" for r in REASONS[1:] if report[r])
    example = f" (e.g. {report['first_unusable'][0]})" if report["first_unusable"] else ""
    raise InputError(f"no line of {files} could be predicted: {counts}{example}; check "
                     "--format, --columns and --header")


def _renamed(text: str, names: dict) -> str:
    for path, name in names.items():
        text = text.replace(path, name)
    return text


def _predict_files(model_dir: str, files, output: str, *, fmt, columns, header, max_tokens,
                   batching, pool_size, progress) -> dict:
    """``predict_files`` before its checks of the outcome."""
    if max_tokens <= 0:
        raise ValueError(f"--max_tokens must be positive; received {max_tokens}")
    if not mode_of(batching).predicts:
        raise ValueError(f"--batching={batching} is for training: predict batches by length "
                         "(bucket) or in input order (pad)")
    export_dir = export_dir_of(model_dir)
    info = serving.read_info(export_dir)
    task = tasks.load(info["task"])
    paths = resolve_files(files)
    if task.predicts_in_order:
        return predict_in_order(task, export_dir, info, paths, output, progress=progress)
    row_format = input_format(info, paths, fmt, columns, header)
    longest = info.get("max_ids") or max_tokens
    if longest > max_tokens:
        raise ValueError(f"--max_tokens={max_tokens} cannot hold one line of the model's "
                         f"max_length ({longest} ids); raise --max_tokens")
    model = tf.saved_model.load(export_dir)
    drop_long = info.get("long_examples") == "drop"
    needs_tokens = info.get("needs_tokens", True)

    def encode(batch):
        encoded = model.encode(batch["text"])
        ids = encoded["ids"][:, :max_tokens]
        reason = batch["reason"]
        if needs_tokens:
            reason = tf.where((reason == 0) & (ids.row_lengths() == 0),
                              REASONS.index("empty"), reason)
        if drop_long:
            reason = tf.where((reason == 0) & encoded["truncated"],
                              REASONS.index("too_long"), reason)
        return {"ids": ids, "reason": reason, "truncated": encoded["truncated"],
                "index": batch["index"]}

    lines = formats.read_records(paths, row_format, batch_size=512, in_order=True)
    # The one column read is the input (``input_format``).
    ds = lines.map(make_parser(row_format, row_format.names[0])).apply(
        tfseq.with_index(batched=True))
    ds = ds.map(encode, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.apply(Batching(batching, batch_size=max(1, max_tokens // longest),
                           max_tokens=max_tokens, max_length=longest,
                           pool_examples=pool_size).transform(training=False))
    ds = ds.prefetch(2).with_options(tfseq.pipeline_options())

    counts = {"lines": 0, "real_tokens": 0, "truncated": 0, "batches": 0,
              **{r: 0 for r in REASONS[1:]}}

    def model_fn(batch):
        out = model.predict_ids(batch["ids"], batch["ids_length"])
        out = {k: v.numpy() for k, v in out.items()}
        out["reason"] = batch["reason"].numpy()
        counts["lines"] += len(out["reason"])
        counts["batches"] += 1
        usable = out["reason"] == 0
        counts["real_tokens"] += int(batch["ids_length"].numpy()[usable].sum())
        counts["truncated"] += int((batch["truncated"].numpy() & usable).sum())
        for code in set(out["reason"].tolist()) - {0}:
            counts[REASONS[code]] += int((out["reason"] == code).sum())
        if progress is not None:
            progress(counts["lines"])
        return out

    bad_examples = []
    start = time.perf_counter()
    with _output(output) as f:
        # Held back at most: the pools in flight plus bucketing's carried tail (under 9
        # budgets of cells, so under 9 * max_tokens rows).
        for index, row in tfseq.predict_in_order(model_fn, ds, max_buffer=4 * pool_size
                                                 + 64 * 512 + 9 * max_tokens):
            if row["reason"] and len(bad_examples) < 5:
                bad_examples.append((index, REASONS[row["reason"]]))
            f.write((task.prediction_line(row) if row["reason"] == 0 else "") + "\n")
    seconds = time.perf_counter() - start
    bad_examples = [f"{where} (output line {index + 1}): {reason}" for (index, reason), where
                    in zip(bad_examples, file_lines(paths, row_format,
                                                    [i for i, _ in bad_examples]))]
    return {"task": info["task"], "export": export_dir, "files": paths, "output": output,
            "batching": batching, "max_tokens": max_tokens, "seconds": seconds,
            "lines_per_second": counts["lines"] / seconds if seconds else 0.0,
            "real_tokens_per_second": counts["real_tokens"] / seconds if seconds else 0.0,
            "first_unusable": bad_examples, **counts}


def predict_in_order(task, export_dir: str, info: dict, paths, output: str, *,
                     progress=None) -> dict:
    """``predict_files`` for a task that predicts in input order (documents, ctr, lm_tbptt):
    one output line per input (``task.prediction_inputs``: a document for documents), through
    the export's signature; unusable inputs get an empty line and are counted under
    ``task.unusable`` (ctr: a line that does not parse; documents: no sentence)."""
    model = tf.saved_model.load(export_dir)
    serve = model.signatures["serving_default"]
    name = info.get("input", "text")
    counts = {"lines": 0, "real_tokens": 0, "truncated": 0, "batches": 0,
              **{r: 0 for r in REASONS[1:]}}
    bad_examples = []
    start = time.perf_counter()
    with _output(output) as f:
        for batch in task.prediction_inputs(info, paths):
            out = {k: v.numpy() for k, v in serve(**{name: batch}).items()}
            for i in range(len(batch)):
                line = task.prediction_line({k: v[i] for k, v in out.items()})
                if not line:
                    counts[task.unusable] += 1
                    if len(bad_examples) < 5:
                        bad_examples.append(f"output line {counts['lines'] + 1}: "
                                            f"{task.unusable}")
                if "tokens" in out:
                    counts["real_tokens"] += int(out["tokens"][i])
                f.write(line + "\n")
                counts["lines"] += 1
            counts["batches"] += 1
            if progress is not None:
                progress(counts["lines"])
    seconds = time.perf_counter() - start
    return {"task": info["task"], "export": export_dir, "files": paths, "output": output,
            "batching": "in order", "max_tokens": None, "seconds": seconds,
            "lines_per_second": counts["lines"] / seconds if seconds else 0.0,
            "real_tokens_per_second": counts["real_tokens"] / seconds if seconds else 0.0,
            "first_unusable": bad_examples, **counts}


@contextlib.contextmanager
def _output(path: str):
    """The output file (its folder made if missing), or stdout for ``-``."""
    if path == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        yield f


def file_lines(paths, row_format: formats.RowFormat, indices) -> list[str]:
    """``file:line`` of the records at ``indices`` (0-based, over ``paths`` read in order as
    ``predict_files`` reads them). Counts each file's records in the graph with the same
    reader, only as far as the last index asked for (called only when lines were bad)."""
    if not indices:
        return []
    starts, total = [], 0
    for path in paths:
        if total > max(indices):
            break
        starts.append((total, path))
        total += int(formats.read_records([path], row_format, in_order=True).reduce(
            tf.constant(0, tf.int64), lambda n, batch: n + tf.size(batch, out_type=tf.int64)))
    first_line = 2 if row_format.header else 1
    sentences = formats.format_of(row_format.format).token_lines

    def where(index):
        start, path = next(s for s in reversed(starts) if s[0] <= index)  # empty files
        if sentences:
            return f"{path}: sentence {index - start + 1}"
        return f"{path}:{index - start + first_line}"

    return [where(i) for i in indices]
