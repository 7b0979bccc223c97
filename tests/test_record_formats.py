"""--format=tfrecord (tf.train.Example) and --format=jsonl: reading, parsing, counted drops."""

import glob
import json
import os
import random
import re
import subprocess
import sys

import pytest
import tensorflow as tf

import cli

import tfseq
from tfseq import formats


TOPICS = {"food": "bread soup spicy oven salad cheese".split(),
          "sports": "goal match team coach league ball".split(),
          "tech": "laptop code server chip robot cloud".split()}
COMMON = "the a and of with very today new old good".split()


def example(**features) -> bytes:
    """A serialized tf.train.Example: str/list of str -> bytes_list, int -> int64_list,
    float -> float_list."""
    out = {}
    for name, value in features.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, str, list)):
            raise TypeError(value)
        if isinstance(value, int):
            out[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        elif isinstance(value, float):
            out[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
        else:
            values = [value] if isinstance(value, str) else value
            out[name] = tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[v.encode() for v in values]))
    return tf.train.Example(features=tf.train.Features(feature=out)).SerializeToString()


def write_records(path, records, gzip_it=False):
    options = tf.io.TFRecordOptions(compression_type="GZIP" if gzip_it else "")
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for record in records:
            writer.write(record)
    return str(path)


def rows(ds):
    out = []
    for batch in ds:
        keys = sorted(batch)
        out += [dict(zip(keys, values)) for values in
                zip(*[[v.decode() for v in batch[k].numpy().tolist()] for k in keys])]
    return out


def test_tfrecord_rows_bytes_int64_and_lists_joined(tmp_path):
    path = write_records(tmp_path / "train.tfrecord", [
        example(text="hello world", label=3, extra=1.5),
        example(text=["EU", "rejects"], label=-1),
        example(label=2),                                  # no text: malformed
        example(text="   ", label=1),                      # empty_text
        example(text="caf\u00e9 \u65e5\u672c", label=0),
    ])
    fmt = formats.row_format([path], None, ["label", "text"], False,
                             required=("label", "text"), allowed=("label", "text"))
    assert fmt == formats.RowFormat("tfrecord", ("label", "text"), False, ("label",))
    counter = tfseq.DropCounter("t")
    got = rows(formats.read_rows([path], fmt, counter))
    assert got == [{"label": "3", "text": "hello world"}, {"label": "-1", "text": "EU rejects"},
                   {"label": "0", "text": "caf\u00e9 \u65e5\u672c"}]
    assert counter.drops() == {"malformed": 1, "invalid_utf8": 0, "empty_text": 1}
    assert formats.drop_examples([path], fmt) == [
        f"{path}: record 3: malformed (no feature 'text')", f"{path}: record 4: empty_text"]


def test_tfrecord_gzip_several_files_and_shards(tmp_path):
    a = write_records(tmp_path / "a.tfrecord.gz", [example(text=f"a{i}") for i in range(5)],
                      gzip_it=True)
    b = write_records(tmp_path / "b.tfrecords", [example(text=f"b{i}") for i in range(3)])
    assert formats.infer_format([a]) == "tfrecord"
    assert formats.infer_format(["train.tfrecord-00001-of-00004"]) == "tfrecord"
    texts = [t.decode() for t in formats.text_column([a, b], format="tfrecord").as_numpy_iterator()]
    assert texts == ["a0", "a1", "a2", "a3", "a4", "b0", "b1", "b2"]
    fmt = formats.RowFormat("tfrecord", ("text",))

    def shard(files, in_order):
        return [r["text"] for r in rows(formats.read_rows(
            files, fmt, tfseq.DropCounter("s"), num_shards=3, shard_index=1,
            in_order=in_order))]

    # In order: every third record of the files one after another. Otherwise each file's
    # records round-robin (fewer files than shards), or whole files (as many or more).
    assert shard([a, b], in_order=True) == ["a1", "a4", "b2"]
    assert shard([a, b], in_order=False) == ["a1", "a4", "b1"]
    c = write_records(tmp_path / "c.tfrecord", [example(text=f"c{i}") for i in range(2)])
    assert shard([a, b, c], in_order=False) == ["b0", "b1", "b2"]


def test_tfrecord_files_read_in_parallel_a_batch_of_each_in_turn(tmp_path):
    a = write_records(tmp_path / "a.tfrecord", [example(text=f"a{i}") for i in range(5)])
    b = write_records(tmp_path / "b.tfrecord.gz", [example(text=f"b{i}") for i in range(3)],
                      gzip_it=True)
    fmt = formats.RowFormat("tfrecord", ("text",))

    def texts(in_order):
        ds = formats.read_records([a, b], fmt, batch_size=2, in_order=in_order)
        return [[tf.train.Example.FromString(r).features.feature["text"].bytes_list.value[0]
                 .decode() for r in batch] for batch in ds.as_numpy_iterator()]

    assert texts(in_order=True) == [["a0", "a1"], ["a2", "a3"], ["a4", "b0"], ["b1", "b2"]]
    assert texts(in_order=False) == [["a0", "a1"], ["b0", "b1"], ["a2", "a3"], ["b2"], ["a4"]]


def test_tfrecord_setup_errors_name_the_fix(tmp_path):
    path = write_records(tmp_path / "x.tfrecord", [example(body="x", score=0.5)])
    kwargs = dict(required=("label", "text"), allowed=("label", "text", "score"))
    with pytest.raises(formats.InputError, match=r"no feature \['label', 'text'\] in its first "
                       r"100 records \(their features: \['body', 'score'\]\)"):
        formats.row_format([path], None, ["label", "text"], False, **kwargs)
    with pytest.raises(formats.InputError, match=r"feature \['score'\] holds floats"):
        formats.row_format([path], None, ["score"], False, required=("score",),
                           allowed=("score",))
    with pytest.raises(formats.InputError, match="--header does not apply"):
        formats.row_format([path], "tfrecord", ["label", "text"], True, **kwargs)
    text = tmp_path / "notes.tfrecord"
    text.write_text("just some text\n" * 5)
    with pytest.raises(formats.InputError, match="is not a TFRecord file"):
        formats.row_format([str(text)], None, ["label", "text"], False, **kwargs)


def test_tfrecord_a_feature_of_another_kind_is_named_by_record(tmp_path):
    path = write_records(tmp_path / "t.tfrecord", [example(text="a", label=1)] * 3
                         + [example(text="b", label="pos")])
    fmt = formats.row_format([path], None, ["label", "text"], False,
                             required=("label", "text"), allowed=("label", "text"))
    assert formats.record_problem([path], fmt) == (
        f"{path}: record 4: feature 'label' is a bytes_list, the first records' is a "
        "int64_list: one kind per feature")


def sentence(rng, label):
    words = [rng.choice(TOPICS[label]) for _ in range(2)] + [
        rng.choice(COMMON) for _ in range(rng.randint(2, 5))]
    rng.shuffle(words)
    return " ".join(words)


def train(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "tfseq.scripts.train", *args],
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def tfrecord_run(tmp_path_factory):
    """A classify run of the binary on a TFRecord file of 300 examples and one without a text
    feature: ``(records, run folder, the command's result)``, shared by the module's tests."""
    tmp_path = tmp_path_factory.mktemp("tfrecord_run")
    rng = random.Random(0)
    labels = sorted(TOPICS)
    records = [example(label=labels[i % 3], text=sentence(rng, labels[i % 3]))
               for i in range(300)] + [example(label="food")]
    path = write_records(tmp_path / "train.tfrecord", records)
    run = tmp_path / "run"
    out = train("--task=classify", f"--train_files={path}", "--columns=label,text",
                "--batching=pad", "--batch_size=16", "--epochs=3", f"--model_dir={run}",
                "--verbose=0")
    return records, run, out


@pytest.mark.slow
def test_binary_classify_trains_on_tfrecord_and_names_a_bad_record(tfrecord_run, tmp_path):
    records, run, out = tfrecord_run
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert report["counters"]["train"]["drops"]["malformed"] == 1
    assert report["history"][-1]["eval_accuracy"] > 0.8
    # A bad record refuses the run, in this process: the command's own path from its flags
    # (flag table -> config -> ``Runner``) to the one line it prints.
    bad = write_records(tmp_path / "bad.tfrecord", records[:50] + [example(label=1, text="x")])
    line = cli.refused("--task=classify", f"--train_files={bad}", "--columns=label,text",
                   f"--model_dir={tmp_path / 'run2'}", "--verbose=0")
    assert f"{bad}: record 51: feature 'label' is a int64_list" in line
    assert not (tmp_path / "run2").exists()


# ----------------------------------------------------------------------------- JSON Lines

def test_jsonl_rows_tricky_lines_and_four_kinds_of_bad_line_named(tmp_path):
    lines = [
        json.dumps({"text": "caf\u00e9 \"quoted\"\\path", "label": "a", "n": [1, {"x": 2}]}),
        '{"meta": {"label": "no", "text": "no"}, "label": "b", "text": "\\ud83d\\ude00 ok"}',
        '["not", "an", "object"]',                   # not an object
        '{"label": "c"}',                              # lacks text
        '{"label": {"id": 3}, "text": "object label"}',  # an object value
        '{"label": "d", "text": "cut',                 # truncated
        json.dumps({"label": "e", "text": "\u65e5\u672c\u8a9e"}, ensure_ascii=False),
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fmt = formats.row_format([str(path)], None, ["label", "text"], False,
                             required=("label", "text"), allowed=("label", "text"))
    assert fmt.format == "jsonl"
    counter = tfseq.DropCounter("j")
    got = rows(formats.read_rows([str(path)], fmt, counter))
    assert got == [{"label": "a", "text": 'caf\u00e9 "quoted"\\path'},
                   {"label": "b", "text": "\U0001F600 ok"},
                   {"label": "e", "text": "\u65e5\u672c\u8a9e"}]
    assert counter.drops()["malformed"] == 4
    assert formats.drop_examples([str(path)], fmt) == [
        f"{path}:3: malformed (not a JSON object: a list)",
        f"{path}:4: malformed (missing key 'text')",
        f"{path}:5: malformed ('label' is an object, expected a string, a number or a list)",
        f"{path}:6: malformed (not valid JSON: Unterminated string starting at column 24)"]
    texts = formats.text_column(str(path), format="jsonl", columns=["label", "text"])
    assert [t.decode() for t in texts.as_numpy_iterator()] == [
        'caf\u00e9 "quoted"\\path', "\U0001F600 ok", "\u65e5\u672c\u8a9e"]


def test_jsonl_bad_utf8_is_counted_as_invalid_utf8_and_a_raw_nul_as_malformed(tmp_path):
    # Only the lines the JSON decoder fails are checked for UTF-8 (a line it accepts is valid
    # UTF-8): the reasons stay what a check of every line gives.
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"label": "a", "text": "ok \xc3\xa9"}\n'
                     b'{"label": "b", "text": "bad \xff byte"}\n'                # invalid byte
                     b'{"label": "c", "text": "x", "meta": {"k": "\xc0\xaf"}}\n'  # overlong, nested
                     b'{"label": "d", "text": "nul \x00 here"}\n'                # raw NUL
                     b'{"label": "e", "text": "surrogate \xed\xa0\x80"}\n'      # encoded surrogate
                     b'{"label": "f", "text": "\xe6\x97\xa5"}\n')
    fmt = formats.row_format([str(path)], None, ["label", "text"], False,
                             required=("label", "text"), allowed=("label", "text"))
    counter = tfseq.DropCounter("j")
    got = rows(formats.read_rows([str(path)], fmt, counter))
    assert got == [{"label": "a", "text": "ok \u00e9"}, {"label": "f", "text": "\u65e5"}]
    assert counter.drops() == {"empty_text": 0, "invalid_utf8": 3, "malformed": 1}
    assert formats.drop_examples([str(path)], fmt) == [
        f"{path}:2: invalid_utf8", f"{path}:3: invalid_utf8",
        f"{path}:4: malformed (not valid JSON: Invalid control character at column 29)",
        f"{path}:5: invalid_utf8"]


@pytest.mark.slow
def test_classify_on_jsonl_matches_the_same_rows_as_tsv(tmp_path):
    from tfseq.pipelines import classify

    rng = random.Random(1)
    labels = sorted(TOPICS)
    data = [(labels[i % 3], sentence(rng, labels[i % 3])) for i in range(240)]
    tsv = tmp_path / "train.tsv"
    tsv.write_text("".join(f"{label}\t{text}\n" for label, text in data) + "broken line\n")
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps({"text": text, "label": label, "id": i}) + "\n"
                             for i, (label, text) in enumerate(data)) + "broken line\n")
    out = {}
    for path in (tsv, jsonl):
        config = classify.Config(train_files=(str(path),), columns=("label", "text"),
                                 batching="pad", batch_size=16)
        d = classify.TASK.datasets(config)
        n_train = sum(int(labels_.shape[0]) for _, labels_, _ in d.train)
        n_eval = sum(int(labels_.shape[0]) for _, labels_, _ in d.eval)
        out[path.suffix] = (d.state.vocab.tokens, d.state.labels, n_train, n_eval,
                            d.counters["train"].drops(), d.counters["train"].seen())
    assert out[".tsv"] == out[".jsonl"]
    assert out[".tsv"][4]["malformed"] == 1


@pytest.mark.slow
def test_predict_reads_jsonl_and_tfrecord_inputs_in_order(tfrecord_run, tmp_path):
    from tfseq.pipelines.predicting import predict_files

    _, run, trained = tfrecord_run
    assert trained.returncode == 0, trained.stderr[-3000:]
    queries = [("food", "bread soup cheese"), ("tech", "laptop code robot"),
               ("sports", "goal match coach")]
    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for _, t in queries)
                     + '{"no_text": 1}\n')
    records = write_records(tmp_path / "q.tfrecord",
                            [example(text=t) for _, t in queries] + [example(other="x")])
    # The binary on JSON Lines (predictions on stdout, the bad line named on stderr) ...
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    got = subprocess.run([sys.executable, "-m", "tfseq.scripts.predict", f"--model_dir={run}",
                          f"--files={jsonl}", "--output=-"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    assert [line.split("\t")[0] for line in got.stdout.splitlines()] == [
        "food", "tech", "sports", ""]
    assert f"{jsonl}:4 (output line 4): malformed" in got.stderr
    # ... and the same run's predict on TFRecord, in this process.
    report = predict_files(str(run), [records], str(tmp_path / "out.txt"))
    predicted = [line.split("\t")[0]
                 for line in (tmp_path / "out.txt").read_text().split("\n")[:-1]]
    assert predicted == ["food", "tech", "sports", ""]
    assert report["first_unusable"] == [f"{records}:4 (output line 4): malformed"]


@pytest.mark.slow
def test_tag_reads_jsonl_with_tags_as_arrays_or_strings(tmp_path):
    from tfseq.pipelines import tag

    rows = []
    for i in range(60):
        tokens = ["EU", "rejects", f"w{i % 5}"]
        tags = ["B-ORG", "O", "O"]
        rows.append({"tokens": tokens if i % 2 else " ".join(tokens),
                     "tags": tags if i % 3 else " ".join(tags)})
    rows.append({"tokens": "one two", "tags": ["O"]})   # unequal counts: dropped, named
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tag.Config(train_files=(str(path),), columns=("tokens", "tags"), eval_percent=0,
                        batching="pad", batch_size=8, min_count=1)
    data = tag.TASK.datasets(config)
    assert data.state.labels["tags"] == ("B-ORG", "O")
    examples = sum(int(x["ids"].shape[0]) for x, _, _ in data.train)
    assert examples == 60
    assert data.counters["train"].drops()["unequal_counts"] == 1
    assert data.drop_examples(3) == [f"{path}:61: unequal_counts (2 tokens, 1 tags)"]


def test_a_new_format_is_one_class(tmp_path, monkeypatch):
    """A pipe-separated format, written as one ``Format`` subclass and registered, is inferred
    from its extension, read, parsed and its bad lines counted and named."""

    class PipeSeparated(formats.Format):
        name, extensions = "psv", (".psv",)

        def parse(self, records, fmt):
            fields = tf.strings.split(records, "|")
            ok = tf.equal(fields.row_lengths(), len(fmt.columns))
            dense = fields.to_tensor("", shape=[None, len(fmt.columns)])
            return {c: dense[:, i] for i, c in enumerate(fmt.columns) if c != "_"}, ok

    monkeypatch.setitem(formats.FORMAT_CLASSES, "psv", PipeSeparated())
    path = tmp_path / "rows.psv"
    path.write_text("pos|good film\nneg|bad|extra\nneg|dull\n")
    fmt = formats.row_format([str(path)], None, None, False, required=("label", "text"),
                             allowed=("label", "text"))
    assert fmt == formats.RowFormat("psv", ("label", "text"))
    counter = tfseq.DropCounter("psv")
    rows = [{k: v.tolist() for k, v in r.items()}
            for r in formats.read_rows([str(path)], fmt, counter).as_numpy_iterator()]
    assert rows == [{"label": [b"pos", b"neg"], "text": [b"good film", b"dull"]}]
    assert counter.drops()["malformed"] == 1
    assert formats.drop_examples([str(path)], fmt) == [f"{path}:2: malformed"]  # no detail


# ----------------------------------------------------------------------------- one home

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NAMED = r"""["'](?:tsv|csv|conll|jsonl|tfrecord|parquet)["']"""
_AMBIGUOUS = r"""["'](?:text|pair)["']"""  # also column names: flagged beside "format"/"fmt"


def _branch(name: str) -> str:
    return rf"(?:==|!=)\s*{name}|{name}\s*(?:==|!=)|\bin\s*[(\[{{][^)\]}}\n]*{name}"


def branches_on_a_format(line: str) -> bool:
    """Whether a line of code compares a format's name, or asks ``binary``."""
    return bool(re.search(r"\.binary\b", line) or re.search(_branch(_NAMED), line)
                or (re.search(r"format|fmt", line) and re.search(_branch(_AMBIGUOUS), line)))


def test_only_tfseq_formats_branches_on_a_format_name():
    """What a format implies is asked of its class (``formats.format_of``), never decided by
    comparing its name outside ``tfseq/formats/``."""
    assert branches_on_a_format('    if fmt.format == "tfrecord":')
    assert branches_on_a_format("    if kind in ('csv', 'jsonl', 'tfrecord'):")
    assert branches_on_a_format('    field = "text" if row_format.format == "text" else x')
    assert branches_on_a_format("    must_check = formats.format_of(f).binary")
    assert not branches_on_a_format('    if name == "text":')
    found = []
    for top in ("tfseq", "pipelines", "scripts"):
        for path in sorted(glob.glob(os.path.join(ROOT, top, "**", "*.py"), recursive=True)):
            if os.sep + os.path.join("tfseq", "formats") + os.sep in path:
                continue
            with open(path, encoding="utf-8") as f:
                found += [f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}"
                          for n, line in enumerate(f, 1) if branches_on_a_format(line)]
    assert found == []
