r"""Batch inference over files with an exported model: one output line per input line, in order.

Usage:
  tfseq-predict --model_dir=runs/demo --files=new_verses.txt --output=preds.tsv
  tfseq-predict --model_dir=runs/demo --files='data/*.tsv.gz' --format=tsv \
      --columns=_,_,_,text --output=preds.tsv --max_tokens=16384

Reads ``<model_dir>/export`` (written by ``tfseq-train`` or ``tfseq-export``; a SavedModel
directory itself works too). Lines are read, parsed and tokenized in ``tf.data`` (with the
export's own tokenizer and vocabulary), batched by length under ``--max_tokens`` cells per batch
and put back in input order (``tfseq.pipelines.predicting``): memory is bounded by the bucketing
pool (``--pool_size`` lines), not by the file.

Output, one line per input line (files in the order given, sorted within a glob):

  classify   ``label<TAB>probability`` (of that label)
  lm         ``log_likelihood<TAB>tokens`` (natural log, summed over the tokens and ``</s>``)
  translate  the translation
  tag        the tags, one per whitespace-separated token, space-joined

A line that cannot be used (wrong field count, invalid UTF-8, a NUL byte, no text where the
task needs some, too long under ``long_examples=drop``) gets an empty output line and is
counted by reason in the report. Loading the export runs its graph: use trusted model dirs.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

from tfseq.pipelines.predicting import REASONS  # noqa: E402
from tfseq.scripts import flag_table  # noqa: E402

COMMAND = "tfseq-predict"
FLAGS = flags.FLAGS
flag_table.define(
    ["model_dir", "files", "format", "columns", "header", "batching", "max_tokens", "verbose"],
    defaults={"model_dir": None, "files": None, "batching": "bucket", "max_tokens": 8192},
    required=["model_dir", "files"],
    helps={"model_dir": "Model directory (uses its export/) or an export.",
           "files": "Input files or globs (.gz allowed); - reads stdin.",
           "verbose": "0: quiet; 1: progress bar and report.",
           "columns": "Field names in order (JSON keys, TFRecord features, Parquet columns: by "
                      "name; FIELD=KEY reads the file's KEY as FIELD); the input "
                      "field is the one the model was trained on (`text`; translate `source`; "
                      "tag `tokens`, or `token` in CoNLL), `_` skips (default: the training "
                      "run's, else the embedded corpus layout book,chapter,verse,text).",
           "header": "Skip the first line of each file (no output for it; default: as the "
                     "training run, for files in its format; stdin: no header).",
           "batching": "bucket: by length under --max_tokens (input order restored); pad: "
                       "padded batches in input order of max_tokens // max_length rows.",
           "max_tokens": "Token budget per batch (rows x padded length)."})
flags.DEFINE_string("output", "-", "Output file, one line per input line; - (the default): "
                    "stdout, the report then goes to stderr.")
flags.DEFINE_integer("pool_size", 8192, "Lines sorted together by length (bounds memory).")
flags.DEFINE_string("report_json", None, "Also write the report here as JSON.")


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
    import keras
    import tensorflow as tf

    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if FLAGS.verbose < 2:
        logging.set_verbosity(logging.WARNING)
        tf.get_logger().setLevel("ERROR")
    to_stdout = FLAGS.output == "-"
    report_to = sys.stderr if to_stdout else sys.stdout
    show_bar = FLAGS.verbose and not to_stdout and sys.stdout.isatty()
    bar = keras.utils.Progbar(None, verbose=1 if show_bar else 0, unit_name="line")
    files, names = FLAGS.files, {}
    with tempfile.TemporaryDirectory() as scratch:
        if files == ["-"]:  # stdin: kept in a file (the input is read by tf.data, in order)
            files = [os.path.join(scratch, "stdin.txt")]
            names[files[0]] = "<stdin>"
            with open(files[0], "wb") as f:
                shutil.copyfileobj(sys.stdin.buffer, f)
        report = _predict(files, show_bar, bar, names)
    if show_bar:
        bar.update(report["lines"], finalize=True)
    unusable = sum(report[r] for r in REASONS[1:])
    if unusable:
        example = f", e.g. {report['first_unusable'][0]}" if report["first_unusable"] else ""
        print(f"{COMMAND}: warning: {unusable:,} of {report['lines']:,} lines could not be "
              f"predicted (empty output lines{example})", file=sys.stderr, flush=True)
    if FLAGS.report_json:
        with open(FLAGS.report_json, "w") as f:
            json.dump(report, f, indent=2)
    if FLAGS.verbose:
        print(format_report(report), file=report_to)


def _predict(files, show_bar, bar, names) -> dict:
    from tfseq.pipelines.predicting import predict_files

    try:
        # Lines piped in have no header unless --header says so.
        header = FLAGS.header if FLAGS["header"].present else (
            False if "<stdin>" in names.values() else None)
        return predict_files(FLAGS.model_dir, files, FLAGS.output, fmt=FLAGS.format,
                             columns=FLAGS.columns, header=header,
                             max_tokens=FLAGS.max_tokens, batching=FLAGS.batching,
                             pool_size=FLAGS.pool_size,
                             progress=bar.update if show_bar else None, names=names)
    except (FileNotFoundError, ValueError) as e:
        raise app.UsageError(str(e))


def _kept() -> str:
    if FLAGS.output == "-":
        return "the predictions so far went to stdout; run the command again for all"
    return f"{FLAGS.output} is incomplete; run the command again"


def run():
    """The ``tfseq-predict`` command."""
    from tfseq.scripts import run_command
    run_command(__name__, main, kept=_kept)


if __name__ == "__main__":
    run()
