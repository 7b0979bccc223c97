"""tfseq-predict (``tfseq.pipelines.predicting``): one output line per input line, in input
order, bad lines counted."""

import functools
import gzip
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tfseq.errors import InputError
from tfseq.pipelines.predicting import predict_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORDS = ["gen0", "gen1", "ps2", "rev3", "matt4", "isa1", "josh2", "stranger"]


@functools.lru_cache(maxsize=None)
def served_model(model_dir):
    """The export of ``model_dir``, loaded once for the module's tests."""
    return tf.saved_model.load(os.path.join(model_dir, "export"))


def read_output(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text.endswith("\n")
    return text[:-1].split("\n")


@pytest.mark.slow
@settings(max_examples=3, deadline=None)
@given(counts=st.lists(st.integers(0, 16), min_size=1, max_size=90),
       pool_size=st.integers(1, 40), max_tokens=st.integers(12, 80))
@example(counts=[11, 3], pool_size=1, max_tokens=12)  # found by a run: <s> + 10 + </s> = 12 cells
@example(counts=[11], pool_size=1, max_tokens=12)  # every line too long: nothing to predict
def test_lm_outputs_one_line_per_input_line_in_order(tiny_exports, tmp_path_factory, counts,
                                                     pool_size, max_tokens):
    model_dir = tiny_exports["lm"][0]
    tmp = tmp_path_factory.mktemp("predict")
    lines = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(n))
             for i, n in enumerate(counts)]
    (tmp / "in.txt").write_text("\n".join(lines) + "\n")
    if all(n > 10 for n in counts):  # no line can be predicted: refused, no output left
        with pytest.raises(InputError, match="could be predicted: .* too_long"):
            predict_files(model_dir, [str(tmp / "in.txt")], str(tmp / "out.txt"),
                          max_tokens=max_tokens, pool_size=pool_size)
        assert not (tmp / "out.txt").exists()
        return
    report = predict_files(model_dir, [str(tmp / "in.txt")], str(tmp / "out.txt"),
                           max_tokens=max_tokens, pool_size=pool_size)
    out = [line.split("\t") if line else None for line in read_output(tmp / "out.txt")]
    # The lm run's policy drops lines over max_length=10 words (an empty output line each);
    # the others get their words plus </s>: the tokens column identifies each line.
    assert [int(o[1]) if o else None for o in out] == [None if n > 10 else n + 1
                                                       for n in counts]
    served = served_model(model_dir)
    expected = served.serve(tf.constant(lines))["log_likelihood"].numpy()
    kept = [i for i, n in enumerate(counts) if n <= 10]
    np.testing.assert_allclose([float(out[i][0]) for i in kept], expected[kept], atol=1e-4,
                               rtol=1e-5)
    assert report["lines"] == len(lines) and report["too_long"] == sum(n > 10 for n in counts)


def test_tsv_gzip_header_bad_lines_get_empty_outputs_and_are_counted(tiny_exports, tmp_path):
    model_dir = tiny_exports["classify"][0]
    rows = [b"book\tchapter\tverse\ttext",  # header
            b"Gen\t1\t1\tgen0 gen1 gen2",
            b"broken line without tabs",
            b"Rev\t1\t2\trev3 rev4",
            b"Ps\t1\t3\t",  # no text
            b"Ps\t1\t4\tps1 \xff\xfe",  # invalid UTF-8
            b"Isa\t1\t5\tisa0\x00isa1",  # NUL byte
            b"Matt\t1\t6\tmatt1 matt2 matt3"]
    with gzip.open(tmp_path / "in.tsv.gz", "wb") as f:
        f.write(b"\r\n".join(rows) + b"\r\n")
    report = predict_files(model_dir, [str(tmp_path / "in.tsv.gz")], str(tmp_path / "out.txt"),
                           header=True, max_tokens=64, pool_size=4)
    out = read_output(tmp_path / "out.txt")
    assert len(out) == 7
    assert [i for i, line in enumerate(out) if line == ""] == [1, 3, 4, 5]
    served = served_model(model_dir)
    expected = served.serve(tf.constant(["gen0 gen1 gen2", "rev3 rev4", "matt1 matt2 matt3"]))
    labels = [s.decode() for s in expected["label"].numpy()]
    best = expected["probabilities"].numpy().max(axis=1)
    for line, label, p in zip([out[0], out[2], out[6]], labels, best):
        got_label, got_p = line.split("\t")
        assert got_label == label and abs(float(got_p) - p) < 1e-5
    assert (report["lines"], report["malformed"], report["empty"], report["invalid_utf8"],
            report["nul_byte"]) == (7, 1, 1, 1, 1)
    path = tmp_path / "in.tsv.gz"
    assert report["first_unusable"] == [f"{path}:3 (output line 2): malformed",
                                        f"{path}:5 (output line 4): empty",
                                        f"{path}:6 (output line 5): invalid_utf8",
                                        f"{path}:7 (output line 6): nul_byte"]


def test_csv_quoted_fields_and_a_broken_line(tiny_exports, tmp_path):
    model_dir = tiny_exports["classify"][0]
    rows = ['label,text',
            'x,"gen0, gen1 gen2"',        # a quoted comma
            'y,"rev3 ""rev4"""',          # doubled quotes
            'z,"matt1 matt2',             # unclosed quote: malformed
            'w,matt1 matt2 matt3']
    (tmp_path / "in.csv").write_text("\n".join(rows) + "\n")
    report = predict_files(model_dir, [str(tmp_path / "in.csv")], str(tmp_path / "out.txt"),
                           header=True, columns=["_", "text"], max_tokens=64, pool_size=4)
    out = read_output(tmp_path / "out.txt")
    assert len(out) == 4 and out[2] == "" and report["malformed"] == 1
    served = served_model(model_dir)
    expected = served.serve(tf.constant(["gen0, gen1 gen2", 'rev3 "rev4"',
                                         "matt1 matt2 matt3"]))
    labels = [s.decode() for s in expected["label"].numpy()]
    assert [out[0].split("\t")[0], out[1].split("\t")[0], out[3].split("\t")[0]] == labels


def test_plain_padded_batches_give_the_same_output(tiny_exports, tmp_path):
    model_dir = tiny_exports["classify"][0]
    lines = [" ".join(WORDS[j % 8] for j in range(i % 13)) for i in range(40)]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    outputs = []
    for batching in ("bucket", "pad"):
        predict_files(model_dir, [str(tmp_path / "in.txt")], str(tmp_path / batching),
                      batching=batching, max_tokens=48, pool_size=16)
        outputs.append([line.split("\t") for line in read_output(tmp_path / batching)])
    assert len(outputs[0]) == 40 and [o[0] for o in outputs[0]] == [o[0] for o in outputs[1]]
    np.testing.assert_allclose([float(o[1]) for o in outputs[0] if len(o) == 2],
                               [float(o[1]) for o in outputs[1] if len(o) == 2], atol=1e-5)


def test_bad_arguments_name_the_problem(tiny_exports, tmp_path):
    model_dir = tiny_exports["classify"][0]
    (tmp_path / "in.tsv").write_text("a\tb\n")
    with pytest.raises(ValueError, match="--columns=label,body has no 'text' field"):
        predict_files(model_dir, [str(tmp_path / "in.tsv")], str(tmp_path / "o"),
                      columns=["label", "body"])
    with pytest.raises(ValueError, match="--max_tokens=8 cannot hold one line"):
        predict_files(model_dir, [str(tmp_path / "in.tsv")], str(tmp_path / "o"),
                      max_tokens=8)
    with pytest.raises(FileNotFoundError, match="No file matches"):
        predict_files(model_dir, [str(tmp_path / "missing*.txt")], str(tmp_path / "o"))
    # tfseq-predict prints this one as its error line (the path of every error above:
    # tests/test_first_hour.py runs the command on one).
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"No SavedModel in {tmp_path}/export or {tmp_path}: run tfseq-export")):
        predict_files(str(tmp_path), [str(tmp_path / "in.tsv")], str(tmp_path / "o"))


@pytest.mark.slow
def test_binary_writes_output_and_report_and_reads_stdin(tiny_exports, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    (tmp_path / "in.txt").write_text("gen0 gen1\n\nrev3\n")
    script = os.path.join(ROOT, "scripts", "predict.py")
    out = subprocess.run(
        [sys.executable, script, f"--model_dir={tiny_exports['classify'][0]}",
         f"--files={tmp_path / 'in.txt'}", f"--output={tmp_path / 'out.txt'}",
         f"--report_json={tmp_path / 'report.json'}"],
        capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "lines/s" in out.stdout and "real tokens/s" in out.stdout
    assert len(read_output(tmp_path / "out.txt")) == 3
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["lines"], report["empty"]) == (3, 1)

    # --files=- and --output=- (the default): stdin in, predictions on stdout, the report on
    # stderr. Lines piped in have no header, even from a run trained on files with one.
    with_header = tmp_path / "with_header"
    shutil.copytree(tiny_exports["classify"][0], with_header)
    info_path = with_header / "export" / "assets" / "serving.json"
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "header": True}))
    out = subprocess.run(
        [sys.executable, script, f"--model_dir={with_header}", "--files=-"],
        input=(tmp_path / "in.txt").read_text(), capture_output=True, text=True, env=env,
        timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n") == read_output(tmp_path / "out.txt") + [""]
    assert "lines/s" in out.stderr


def test_bad_lines_are_named_in_their_own_file_across_files(tmp_path):
    from tfseq import formats
    from tfseq.pipelines.predicting import file_lines

    (tmp_path / "a.tsv").write_text("h\tx\n1\ta\n2\tb\n")
    (tmp_path / "empty.tsv").write_text("")
    (tmp_path / "c.tsv").write_text("h\tx\n3\tc\n4\td\n5\te\n")
    paths = [str(tmp_path / n) for n in ("a.tsv", "empty.tsv", "c.tsv")]
    fmt = formats.RowFormat("tsv", ("_", "text"), True)
    # Records 0-1 are a.tsv's lines 2-3, records 2-4 c.tsv's lines 2-4 (headers skipped).
    assert file_lines(paths, fmt, [1, 2, 4]) == [f"{paths[0]}:3", f"{paths[2]}:2",
                                                 f"{paths[2]}:4"]
    assert file_lines(paths, fmt, []) == []
