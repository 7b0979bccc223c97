"""Data as it comes: ``--columns FIELD=KEY``, numbers read as text, drop reasons that say what
is wrong (``file:line``), and ``--format=parquet``."""

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import cli

import tfseq
from tfseq import formats

COLUMNS = dict(required=("label", "text"), allowed=("label", "text"))
ROWS = [(2, "good film"), (0, "dull plot , slow"), (1, "fine cast"), (2, "great \u00e9t\u00e9"),
        (0, "boring"), (1, "ok ok"), (2, "loved it"), (0, "bad , comma"), (1, "meh"),
        (2, "superb")]


def rows(ds):
    out = []
    for batch in ds:
        keys = sorted(batch)
        out += [dict(zip(keys, values)) for values in
                zip(*[[v.decode() for v in batch[k].numpy().tolist()] for k in keys])]
    return out


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def write_parquet(path, columns, row_group_size=None):
    pq.write_table(pa.table(columns), str(path), row_group_size=row_group_size)
    return str(path)


def example(**features) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature={
        name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
        for name, value in features.items()})).SerializeToString()


def read(path, columns, header=False, format=None):
    fmt = formats.row_format([path], format, columns, header, **COLUMNS)
    counter = tfseq.DropCounter("t")
    return fmt, rows(formats.read_rows([path], fmt, counter)), counter.drops()["malformed"]


# ----------------------------------------------------------------------------- reasons

def test_tsv_and_csv_name_the_field_count_and_the_quoting(tmp_path):
    tsv = write(tmp_path / "a.tsv", "pos\tgood\na\tb\tc\td\te\tf\tg\nno tab\n")
    _, got, malformed = read(tsv, ["label", "text"])
    assert (got, malformed) == ([{"label": "pos", "text": "good"}], 2)
    fmt = formats.row_format([tsv], None, ["label", "text"], False, **COLUMNS)
    assert formats.drop_examples([tsv], fmt) == [f"{tsv}:2: malformed (7 fields, expected 2)",
                                                 f"{tsv}:3: malformed (1 field, expected 2)"]
    csv = write(tmp_path / "a.csv", 'pos,good\n"open,x\na"b"c,x\na,b,c\n')
    fmt = formats.row_format([csv], None, ["label", "text"], False, **COLUMNS)
    assert formats.drop_examples([csv], fmt) == [
        f"{csv}:2: malformed (a quoted field that does not close)",
        f"{csv}:3: malformed (a quote inside an unquoted field, or text after a closing quote)",
        f"{csv}:4: malformed (3 fields, expected 2)"]


def test_jsonl_names_the_key_and_what_is_wrong_with_it(tmp_path):
    path = write(tmp_path / "a.jsonl", "\n".join([
        '{"label": 2, "text": "fine"}',
        '[1, 2]',
        '{"label": "a"}',
        '{"label": ["a", {"b": 1}], "text": "x"}',
        '{"label": null, "text": "x"}',
        '{"label": "a", "text": "x"',
        '{"label": true, "text": "yes"}',
        '{"label": "a", "text": {"body": "x"}}',
    ]) + "\n")
    _, got, malformed = read(path, ["label", "text"])
    assert got == [{"label": "2", "text": "fine"}, {"label": "true", "text": "yes"}]
    assert malformed == 6
    fmt = formats.row_format([path], None, ["label", "text"], False, **COLUMNS)
    assert formats.drop_examples([path], fmt, limit=10) == [
        f"{path}:2: malformed (not a JSON object: a list)",
        f"{path}:3: malformed (missing key 'text')",
        f"{path}:4: malformed ('label' is a list holding an object, expected strings or "
        "numbers)",
        f"{path}:5: malformed ('label' is null, expected a string, a number or a list)",
        f"{path}:6: malformed (not valid JSON: Expecting ',' delimiter at column 27)",
        f"{path}:8: malformed ('text' is an object, expected a string, a number or a list)"]


def test_tfrecord_and_parquet_name_the_feature_and_the_null(tmp_path):
    path = str(tmp_path / "a.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for record in (example(label="a", text="x"), example(label="b"),
                       example(label="c", body="y")):
            w.write(record)
    fmt, got, malformed = read(path, ["label", "text"])
    assert (got, malformed) == ([{"label": "a", "text": "x"}], 2)
    assert formats.drop_examples([path], fmt) == [
        f"{path}: record 2: malformed (no feature 'text')",
        f"{path}: record 3: malformed (no feature 'text')"]
    table = write_parquet(tmp_path / "a.parquet", {"label": [1, None, 3],
                                                   "text": ["x", "y", None]})
    fmt, got, malformed = read(table, ["label", "text"])
    assert (got, malformed) == ([{"label": "1", "text": "x"}], 2)
    assert formats.drop_examples([table], fmt) == [f"{table}: row 2: malformed ('label' is null)",
                                                   f"{table}: row 3: malformed ('text' is null)"]


# ----------------------------------------------------------------------------- FIELD=KEY

def test_columns_field_equals_key_reads_jsonl_of_other_names_and_numeric_labels(tmp_path):
    path = write(tmp_path / "a.jsonl", "".join(json.dumps(r) + "\n" for r in [
        {"id": 7, "category": 2, "body": "good film"},
        {"body": "dull plot", "category": 0},
        {"category": True, "body": ["pre", "tokenized"]},
        {"category": 1, "text": "no body"}]))
    fmt, got, malformed = read(path, ["label=category", "text=body"])
    assert fmt == formats.RowFormat("jsonl", ("label", "text"), keys=("category", "body"))
    assert got == [{"label": "2", "text": "good film"}, {"label": "0", "text": "dull plot"},
                   {"label": "true", "text": "pre tokenized"}]
    assert malformed == 1
    assert formats.drop_examples([path], fmt) == [f"{path}:4: malformed (missing key 'body')"]


def test_dotted_keys_read_inside_json_objects(tmp_path):
    path = write(tmp_path / "a.jsonl", "".join(json.dumps(r) + "\n" for r in [
        {"meta": {"body": "deep text", "lang": "en"}, "category": 1},
        {"category": 2, "meta": "flat"},
        {"category": 2, "meta": {"title": "no body"}}]))
    fmt, got, malformed = read(path, ["label=category", "text=meta.body"])
    assert (got, malformed) == ([{"label": "1", "text": "deep text"}], 2)
    assert formats.drop_examples([path], fmt) == [
        f"{path}:2: malformed ('meta' is a string, expected an object)",
        f"{path}:3: malformed (missing key 'meta.body')"]


def test_csv_and_tsv_with_a_header_read_columns_by_its_names(tmp_path):
    csv = write(tmp_path / "a.csv", 'id,body,category\n7,"good, film",2\n8,dull,0\n')
    fmt, got, _ = read(csv, ["label=category", "text=body"], header=True)
    assert fmt == formats.RowFormat("csv", ("_", "text", "label"), True)
    assert got == [{"label": "2", "text": "good, film"}, {"label": "0", "text": "dull"}]
    # Plain names all in the header: by name too, whatever their order in --columns.
    tsv = write(tmp_path / "a.tsv", "text\tlabel\ngood film\tpos\n")
    assert read(tsv, ["label", "text"], header=True)[1] == [{"label": "pos", "text": "good film"}]
    # A header of other names keeps reading by position.
    other = write(tmp_path / "b.tsv", "a\tb\npos\tgood film\n")
    assert read(other, ["label", "text"], header=True)[1] == [{"label": "pos",
                                                               "text": "good film"}]
    with pytest.raises(formats.InputError, match=r"FIELD=KEY reads TSV columns by the names in "
                       "the header line: add --header"):
        formats.row_format([tsv], None, ["label=category", "text"], False, **COLUMNS)
    with pytest.raises(formats.InputError, match=r"a\.csv: no column \['title'\] in its header "
                       r"\['id', 'body', 'category'\]"):
        formats.row_format([csv], None, ["label=category", "text=title"], True, **COLUMNS)
    second = write(tmp_path / "b.csv", "category,body\n1,x\n")
    with pytest.raises(formats.InputError, match=r"b\.csv: its header \['category', 'body'\] "
                       "differs"):
        formats.row_format([csv, second], None, ["label=category", "text=body"], True,
                           **COLUMNS)


def test_bad_field_equals_key_entries_name_the_fix(tmp_path):
    path = write(tmp_path / "a.jsonl", '{"a": "b"}\n')
    for entry in ("text=", "=body", "_=body"):
        with pytest.raises(formats.InputError, match=f"--columns entry '{entry}': write "
                           "FIELD=KEY"):
            formats.row_format([path], None, ["label", entry], False, **COLUMNS)
    with pytest.raises(formats.InputError, match=r"Unknown column name\(s\) \['txt'\] in "
                       r"--columns=label,txt=body"):
        formats.row_format([path], None, ["label", "txt=body"], False, **COLUMNS)
    text = write(tmp_path / "a.conll", "EU B-ORG\n")
    with pytest.raises(formats.InputError, match="--format=conll has no field names"):
        formats.row_format([text], None, ["token=word", "tag"], False,
                           required=("token", "tag"), allowed=("token", "tag"))


# ----------------------------------------------------------------------------- the same rows

def same_rows_three_ways(tmp_path):
    """The rows of ``ROWS`` as TSV, as JSON Lines (other keys, numeric labels) and as
    Parquet (other column names, an int64 label column, two row groups), and the columns
    that read each."""
    tsv = write(tmp_path / "rows.tsv", "".join(f"{label}\t{text}\n" for label, text in ROWS))
    jsonl = write(tmp_path / "rows.jsonl", "".join(
        json.dumps({"body": text, "category": label, "id": i}) + "\n"
        for i, (label, text) in enumerate(ROWS)))
    parquet = write_parquet(tmp_path / "rows.parquet", {
        "id": list(range(len(ROWS))), "category": [label for label, _ in ROWS],
        "body": [text for _, text in ROWS]}, row_group_size=4)
    renamed = ("label=category", "text=body")
    return {"tsv": (tsv, ("label", "text")), "jsonl": (jsonl, renamed),
            "parquet": (parquet, renamed)}


def test_the_same_rows_as_tsv_jsonl_and_parquet_parse_alike(tmp_path):
    files = same_rows_three_ways(tmp_path)
    want = [{"label": str(label), "text": text} for label, text in ROWS]
    for kind, (path, columns) in files.items():
        fmt, got, malformed = read(path, list(columns))
        assert fmt.format == kind
        assert (got, malformed) == (want, 0), kind
        # The held-out rows: the hold-out hash is the TSV line's in every format.
        held = rows(formats.read_rows([path], fmt, tfseq.DropCounter("eval"), split="eval",
                                      eval_percent=30))
        assert held == [r for r in want if formats.in_eval_split(
            tf.constant(f"{r['label']}\t{r['text']}"), 30)], kind


def test_classify_prepares_the_same_vocabulary_and_labels_from_each(tmp_path):
    from tfseq.pipelines import classify

    states = {}
    for kind, (path, columns) in same_rows_three_ways(tmp_path).items():
        config = classify.Config(train_files=(path,), columns=columns, min_count=1,
                                 eval_percent=20)
        state, report = classify.TASK.prepare(config)
        states[kind] = (state.vocabs["vocab"].tokens, state.labels, report.records)
    assert states["tsv"][1] == {"label": ("0", "1", "2")}
    assert states["tsv"] == states["jsonl"] == states["parquet"]


def test_the_same_rows_in_each_format_train_on_the_same_batches(tmp_path, as_list):
    """The same vocabulary, labels, training batches (in order) and evaluation batches: the
    same model and the same held-out accuracy, whatever the format."""
    from tfseq.pipelines import classify

    batches = {}
    for kind, (path, columns) in same_rows_three_ways(tmp_path).items():
        config = classify.Config(train_files=(path,), columns=columns, min_count=1,
                                 eval_percent=20, max_tokens=16, max_length=8, seed=3)
        data = classify.TASK.datasets(config)
        batches[kind] = (as_list(data.train), as_list(data.eval))
    assert batches["tsv"][0] and batches["tsv"][1]
    assert batches["tsv"] == batches["jsonl"] == batches["parquet"]


# ----------------------------------------------------------------------------- Parquet

def test_parquet_columns_kinds_shards_and_setup_errors(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", {
        "body": pa.array(["a b", "c", "d", "e", "f"]).dictionary_encode(),
        "tags": [["B", "O"], ["O"], [], ["X"], ["Y", "Z"]],
        "flag": [True, False, True, True, False], "score": [0.5] * 5})
    assert formats.infer_format([path]) == "parquet"
    fmt = formats.row_format([path], None, ["tokens=body", "tags"], False,
                             required=("tokens", "tags"), allowed=("tokens", "tags"))
    assert rows(formats.read_rows([path], fmt, tfseq.DropCounter("p"))) == [
        {"tokens": "a b", "tags": "B O"}, {"tokens": "c", "tags": "O"},
        {"tokens": "d", "tags": ""}, {"tokens": "e", "tags": "X"}, {"tokens": "f", "tags": "Y Z"}]
    second = write_parquet(tmp_path / "b.parquet", {"body": ["g", "h"], "tags": [["P"], ["Q"]]})
    shard = rows(formats.read_rows([path, second], fmt, tfseq.DropCounter("s"), num_shards=3,
                                   shard_index=1, in_order=True))
    assert [r["tokens"] for r in shard] == ["c", "f", "h"]  # rows round-robin in each file
    kwargs = dict(required=("label",), allowed=("label",))
    with pytest.raises(formats.InputError, match=r"column 'score' is double; --format=parquet "
                       "reads string, integer and boolean columns"):
        formats.row_format([path], None, ["label=score"], False, **kwargs)
    with pytest.raises(formats.InputError, match=r"no column \['label'\] \(its columns: "
                       r"\['body', 'tags', 'flag', 'score'\]\)"):
        formats.row_format([path], None, ["label"], False, **kwargs)
    with pytest.raises(formats.InputError, match="--header does not apply"):
        formats.row_format([path], None, ["label=flag"], True, **kwargs)
    # Parquet strings are not checked for UTF-8 when read: tfseq counts them as other formats.
    raw = [b"ok", b"bad \xff byte", b"bad \xfe too"]
    offsets = pa.py_buffer(b"".join(int.to_bytes(sum(map(len, raw[:i])), 4, "little")
                                    for i in range(len(raw) + 1)))
    bad = write_parquet(tmp_path / "bad.parquet", {"text": pa.Array.from_buffers(
        pa.string(), len(raw), [None, offsets, pa.py_buffer(b"".join(raw))])})
    counter = tfseq.DropCounter("u")
    fmt = formats.row_format([bad], None, ["text"], False, required=("text",),
                             allowed=("text",))
    assert rows(formats.read_rows([bad], fmt, counter)) == [{"text": "ok"}]
    assert counter.drops() == {"invalid_utf8": 2, "malformed": 0, "empty_text": 0}
    fake = write(tmp_path / "c.parquet", "not parquet at all\n")
    with pytest.raises(formats.InputError, match="c.parquet is not a Parquet file"):
        formats.row_format([fake], None, ["label"], False, **kwargs)


def test_parquet_without_pyarrow_is_one_line(tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "a.parquet", {"text": ["x"]})
    for name in ("pyarrow", "pyarrow.parquet", "pyarrow.compute"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(formats.InputError) as error:
        formats.row_format([path], None, ["text"], False, required=("text",),
                           allowed=("text",))
    assert str(error.value) == "--format=parquet needs pyarrow: pip install tfseq[parquet]"


def test_predict_reads_parquet_by_name(tmp_path):
    from tfseq.pipelines import predicting

    path = write_parquet(tmp_path / "q.parquet", {"body": ["good film", None], "n": [1, 2]})
    info = {"task": "classify", "format": "jsonl", "columns": ["label=category", "text=body"],
            "input_column": "text"}
    with pytest.raises(formats.InputError, match=r"no column \['text'\]"):
        predicting.input_format(info, [path], None, None, None)  # another format: text
    fmt = predicting.input_format(info, [path], None, ["text=body"], None)
    assert fmt == formats.RowFormat("parquet", ("text",), keys=("body",))
    parse = predicting.make_parser(fmt, fmt.names[0])
    batches = [parse(b) for b in formats.read_records([path], fmt, in_order=True)]
    assert [b["text"].numpy().tolist() for b in batches] == [[b"good film", b""]]
    assert [b["reason"].numpy().tolist() for b in batches] == [[0, 1]]  # 1: malformed
    same = dict(info, format="parquet")
    assert predicting.input_format(same, [path], None, None, None) == fmt


@pytest.mark.slow
def test_binary_trains_on_parquet_and_says_when_pyarrow_is_missing(tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "train.parquet", {
        "category": [label for label, _ in ROWS] * 30, "body": [text for _, text in ROWS] * 30})
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    args = ["--task=classify", f"--train_files={path}", "--columns=label=category,text=body",
            "--batching=pad", "--batch_size=16", "--epochs=1", "--verbose=0"]
    out = subprocess.run([sys.executable, "-m", "tfseq.scripts.train", *args, "--export=false",
                          f"--model_dir={tmp_path / 'run'}"], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["config"]["columns"] == ["label=category", "text=body"]
    assert report["counters"]["train"]["seen"]["lines_read"] + report["counters"]["eval"][
        "seen"]["lines_read"] == 2 * 300
    # Without pyarrow the same command is refused in one line (its path from the flags, in
    # this process; the command prints it after "tfseq-train: error: ").
    for name in ("pyarrow", "pyarrow.parquet", "pyarrow.compute"):
        monkeypatch.setitem(sys.modules, name, None)
    assert cli.refused(*args, f"--model_dir={tmp_path / 'r2'}") == (
        "tfseq-train: error: --format=parquet needs pyarrow: pip install tfseq[parquet]")
    assert not (tmp_path / "r2").exists()
