r"""Batch inference over files with an exported model: one output line per input line, in order.

Usage:
  python scripts/predict.py --model_dir=runs/demo --files=new_verses.txt --output=preds.tsv
  python scripts/predict.py --model_dir=runs/demo --files='data/*.tsv.gz' --format=tsv \
      --columns=_,_,_,text --output=preds.tsv --max_tokens=16384

Reads ``<model_dir>/export`` (written by ``scripts/train.py`` or ``scripts/export.py``; a
SavedModel directory itself works too). Lines are read, parsed and tokenized in ``tf.data``
(with the export's own tokenizer and vocabulary, ``encode``), numbered (``tfseq.with_index``),
batched by length under ``--max_tokens`` cells per batch (``tfseq.bucket_by_length``), run
through the model (``predict_ids``) and put back in input order (``tfseq.predict_in_order``):
memory is bounded by the bucketing pool (``--pool_size`` lines), not by the file.

Output, one line per input line (files in the order given, sorted within a glob):

  classify   ``label<TAB>probability`` (of that label)
  lm         ``log_likelihood<TAB>tokens`` (natural log, summed over the tokens and ``</s>``)
  translate  the translation

A line that cannot be used (wrong field count, invalid UTF-8, a NUL byte, no text for
classify/translate, too long under ``long_examples=drop``) gets an empty output line and is
counted by reason in the report. Loading the export runs its graph: use trusted model dirs.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402

FLAGS = flags.FLAGS
FORMATS = ("text", "tsv", "csv")
BATCHING = ("bucket", "pad")
READ_BATCH = 512
# Reason codes of an unusable line (0: usable), in report order.
REASONS = ("ok", "malformed", "invalid_utf8", "nul_byte", "empty", "too_long")

if __name__ == "__main__":
    flags.DEFINE_string("model_dir", None, "Model directory (uses its export/) or an export.",
                        required=True)
    flags.DEFINE_list("files", None, "Input files or globs (.gz allowed).", required=True)
    flags.DEFINE_enum("format", None, FORMATS, "Line format (default: tsv for *.tsv[.gz], "
                      "csv for *.csv[.gz] (RFC 4180 on one line), else text: the whole line "
                      "is the input).")
    flags.DEFINE_list("columns", None, "TSV/CSV field names in order; the input field is `text` "
                      "(translate: `source`), `_` skips (default: the training run's, else the "
                      "embedded corpus layout book,chapter,verse,text).")
    flags.DEFINE_boolean("header", False, "Skip the first line of each file (no output for it).")
    flags.DEFINE_string("output", None, "Output file, one line per input line.", required=True)
    flags.DEFINE_integer("max_tokens", 8192, "Token budget per batch (rows x padded length).")
    flags.DEFINE_enum("batching", "bucket", BATCHING, "bucket: by length under --max_tokens; "
                      "pad: plain padded batches in input order of max_tokens // max_length rows.")
    flags.DEFINE_integer("pool_size", 8192, "Lines sorted together by length (bounds memory).")
    flags.DEFINE_string("report_json", None, "Also write the report here as JSON.")
    flags.DEFINE_integer("verbose", 1, "0: quiet; 1: progress bar and report.")


def export_dir_of(model_dir: str) -> str:
    """``model_dir/export`` if it exists, else ``model_dir`` when it is a SavedModel.

    Raises:
      FileNotFoundError: neither (the message says how to export).
    """
    for path in (os.path.join(model_dir, "export"), model_dir):
        if os.path.exists(os.path.join(path, "saved_model.pb")):
            return path
    raise FileNotFoundError(f"No SavedModel in {model_dir}/export or {model_dir}: run "
                            f"scripts/export.py --model_dir={model_dir} first")


def read_lines(files, *, header: bool = False):
    """``tf.string [n]`` batches of every line of ``files`` in order (file by file, sorted
    within each glob), line endings and a leading BOM removed; with ``header`` each file's
    first line is skipped. A truncated gzip file raises before any line is read."""
    import tensorflow as tf

    from tfseq import reading

    paths = reading.resolve_files(files)
    kinds = []
    for path in paths:
        kind = reading._compression_for(path, None)
        if kind == "GZIP":
            reading.verify_gzip(path)
        kinds.append(kind)

    def read(path, kind):
        return tf.data.TextLineDataset(path, compression_type=kind).skip(1 if header else 0)

    ds = tf.data.Dataset.from_tensor_slices((paths, kinds)).flat_map(read)
    return ds.batch(READ_BATCH).map(reading._strip_bom), paths


def make_parser(fmt: str, columns, field: str):
    """The parse step: ``tf.string [n]`` lines -> ``{"text": tf.string [n], "reason": int32
    [n]}`` (``REASONS`` index, 0 for a usable line; unusable lines get ``text`` = ``""``).

    This is where other formats plug in (CSV, named columns from a run's config): anything
    that maps a batch of lines to the input field and a per-line reason keeps one output line
    per input line.

    Raises:
      ValueError: ``--format=tsv`` columns that do not name ``field``.
    """
    import tensorflow as tf

    from tfseq.filtering import line_checks

    if fmt in ("tsv", "csv"):
        if field not in columns:
            raise ValueError(f"--columns={','.join(columns)} has no {field!r} field; name the "
                             f"input column {field!r} (and `_` for the others)")
        position, width = list(columns).index(field), len(columns)

    def parse(lines):
        checks = line_checks(lines, None)
        reason = tf.zeros(tf.shape(lines), tf.int32)
        if fmt == "tsv":
            fields = tf.strings.split(lines, "\t")
            malformed = tf.not_equal(fields.row_lengths(), width)
            text = fields.to_tensor("", shape=[None, width])[:, position]
            reason = tf.where(malformed, REASONS.index("malformed"), reason)
        elif fmt == "csv":  # RFC 4180 on one line, parsed in the graph as training does
            from tfseq import formats

            row, ok = formats.parse(lines, formats.RowFormat("csv", tuple(columns)))
            text = row[field]
            reason = tf.where(ok, reason, REASONS.index("malformed"))
        else:
            text = lines
        for name in ("nul_byte", "invalid_utf8"):  # the first failing check wins
            reason = tf.where(checks[name], REASONS.index(name), reason)
        return {"text": tf.where(reason > 0, "", text), "reason": reason}

    return parse


def format_row(task: str, row: dict) -> str:
    """One output line (no newline) for a prediction row; empty for unusable lines."""
    if row["reason"] != 0:
        return ""
    if task == "classify":
        label = row["label"].decode("utf-8")
        return f"{label}\t{float(row['probabilities'].max()):.6f}"
    if task == "lm":
        return f"{float(row['log_likelihood']):.6f}\t{int(row['tokens'])}"
    return row["translation"].decode("utf-8")


def predict_files(model_dir: str, files, output: str, *, fmt: str | None = None,
                  columns=None, header: bool = False, max_tokens: int = 8192,
                  batching: str = "bucket", pool_size: int = 8192, verbose: int = 1) -> dict:
    """Runs the export of ``model_dir`` over ``files`` and writes ``output``; returns the report.

    Raises:
      FileNotFoundError: no export, or a file pattern that matches nothing.
      ValueError: bad arguments (named), a truncated gzip file.
    """
    import keras
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the export's text ops)

    import tfseq
    from tfseq import serving

    if max_tokens <= 0:
        raise ValueError(f"--max_tokens must be positive; received {max_tokens}")
    export_dir = export_dir_of(model_dir)
    info = serving.read_info(export_dir)
    task, field = info["task"], info.get("input", "text")
    names = [str(f) for f in files]
    if fmt is None:
        fmt = ("tsv" if all(n.endswith((".tsv", ".tsv.gz")) for n in names) else
               "csv" if all(n.endswith((".csv", ".csv.gz")) for n in names) else "text")
    if fmt not in FORMATS:
        raise ValueError(f"Unknown format {fmt!r}; expected one of {FORMATS}")
    if fmt == "csv" and not columns:
        columns = info.get("columns") or [field]
    if fmt == "tsv" and not columns:
        columns = info.get("columns") or ["book", "chapter", "verse", field]
    longest = (info.get("max_length") or max_tokens) + (2 if task == "lm" else 0)
    if longest > max_tokens:
        raise ValueError(f"--max_tokens={max_tokens} cannot hold one line of the model's "
                         f"max_length ({longest} ids); raise --max_tokens")
    model = tf.saved_model.load(export_dir)
    drop_long = info.get("long_examples") == "drop"
    needs_text = task != "lm"

    lines, paths = read_lines(files, header=header)
    parse = make_parser(fmt, columns, field)

    def encode(batch):
        encoded = model.encode(batch["text"])
        ids = encoded["ids"][:, :max_tokens]
        reason = batch["reason"]
        if needs_text:
            reason = tf.where((reason == 0) & (ids.row_lengths() == 0),
                              REASONS.index("empty"), reason)
        if drop_long:
            reason = tf.where((reason == 0) & encoded["truncated"],
                              REASONS.index("too_long"), reason)
        return {"ids": ids, "reason": reason, "truncated": encoded["truncated"],
                "index": batch["index"]}

    ds = lines.map(parse).apply(tfseq.with_index(batched=True))
    ds = ds.map(encode, num_parallel_calls=tf.data.AUTOTUNE)
    if batching == "bucket":
        ds = ds.apply(tfseq.bucket_by_length(max_tokens=max_tokens, max_length=longest,
                                             pool_size=pool_size, shuffle=False))
    elif batching == "pad":
        ds = tfseq.unbatch(ds).apply(tfseq.pad_batch(max(1, max_tokens // longest)))
    else:
        raise ValueError(f"Unknown batching {batching!r}; expected one of {BATCHING}")
    ds = ds.prefetch(2).with_options(tfseq.pipeline_options())

    counts = {"lines": 0, "real_tokens": 0, "truncated": 0, "batches": 0,
              **{r: 0 for r in REASONS[1:]}}
    bar = keras.utils.Progbar(None, verbose=verbose, unit_name="line")

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
        bar.update(counts["lines"])
        return out

    bad_examples = []
    start = time.perf_counter()
    with open(output, "w", encoding="utf-8") as f:
        # Held back at most: the pools in flight plus bucketing's carried tail (under 9
        # budgets of cells, so under 9 * max_tokens rows).
        for index, row in tfseq.predict_in_order(model_fn, ds, max_buffer=4 * pool_size
                                                 + 64 * READ_BATCH + 9 * max_tokens):
            if row["reason"] and len(bad_examples) < 5:
                bad_examples.append(f"line {index + 1}: {REASONS[row['reason']]}")
            f.write(format_row(task, row) + "\n")
    seconds = time.perf_counter() - start
    if verbose:
        bar.update(counts["lines"], finalize=True)
    report = {"task": task, "export": export_dir, "files": paths, "output": output,
              "batching": batching, "max_tokens": max_tokens, "seconds": seconds,
              "lines_per_second": counts["lines"] / seconds if seconds else 0.0,
              "real_tokens_per_second": counts["real_tokens"] / seconds if seconds else 0.0,
              "first_unusable": bad_examples, **counts}
    return report


def format_report(report: dict) -> str:
    unusable = {r: report[r] for r in REASONS[1:] if report[r]}
    return "\n".join([
        "", "=" * 64, f"tfseq predict: task={report['task']} ({report['batching']} batching, "
        f"max_tokens={report['max_tokens']})",
        f"  lines {report['lines']:,} -> {report['output']}, {report['batches']:,} batches, "
        f"{report['seconds']:.1f} s",
        f"  {report['lines_per_second']:,.0f} lines/s, "
        f"{report['real_tokens_per_second']:,.0f} real tokens/s",
        f"  unusable lines (empty output): {sum(unusable.values())} {unusable or ''}"
        + (f" e.g. {'; '.join(report['first_unusable'])}" if report["first_unusable"] else ""),
        f"  truncated to max_length: {report['truncated']}",
        "=" * 64])


def main(argv):
    import tensorflow as tf

    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if FLAGS.verbose < 2:
        logging.set_verbosity(logging.WARNING)
        tf.get_logger().setLevel("ERROR")
    try:
        report = predict_files(FLAGS.model_dir, FLAGS.files, FLAGS.output, fmt=FLAGS.format,
                               columns=FLAGS.columns, header=FLAGS.header,
                               max_tokens=FLAGS.max_tokens, batching=FLAGS.batching,
                               pool_size=FLAGS.pool_size, verbose=FLAGS.verbose)
    except (FileNotFoundError, ValueError) as e:
        raise app.UsageError(str(e))
    if FLAGS.report_json:
        with open(FLAGS.report_json, "w") as f:
            json.dump(report, f, indent=2)
    if FLAGS.verbose:
        print(format_report(report))


if __name__ == "__main__":
    app.run(main)
