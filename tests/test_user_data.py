"""Training on the user's own files: formats, labels, drops, learned vocabularies, bad input."""

import csv
import gzip
import io
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import cli
from hypothesis import given, strategies as st

import tfseq
from tfseq import formats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPICS = {"food": "bread soup spicy oven salad cheese".split(),
          "sports": "goal match team coach league ball".split(),
          "tech": "laptop code server chip robot cloud".split()}
COMMON = "the a and of with very today new old good".split()


def sentence(rng, label):
    words = [rng.choice(TOPICS[label]) for _ in range(2)] + [
        rng.choice(COMMON) for _ in range(rng.randint(2, 5))]
    rng.shuffle(words)
    return " ".join(words)


@pytest.fixture
def classify_tsv(tmp_path):
    """label<TAB>text with a header, 300 learnable rows, one short row, one empty text."""
    rng = random.Random(0)
    labels = sorted(TOPICS)
    rows = ["label\ttext"] + [f"{labels[i % 3]}\t{sentence(rng, labels[i % 3])}"
                              for i in range(300)]
    rows += ["no tab here", "food\t  "]
    train = tmp_path / "train.tsv"
    train.write_text("\n".join(rows) + "\n")
    evals = tmp_path / "eval.tsv"
    evals.write_text("label\ttext\n" + "".join(
        f"{labels[i % 3]}\t{sentence(rng, labels[i % 3])}\n" for i in range(60))
        + "weather\tsunny rain\n")
    return str(train), str(evals)


def rows_of(ds):
    out = []
    for batch in ds:
        keys = sorted(batch)
        out += list(zip(*[batch[k].numpy().tolist() for k in keys]))
    return out


def test_csv_rfc4180_quotes_commas_and_doubled_quotes_parse_in_graph():
    fmt = formats.RowFormat("csv", ("text", "label"))
    lines = tf.constant(['"a, b",pos', '"say ""hi""",neg', "plain,x", 'bad"q,x', "one",
                         "a,b,c", '"open,x'])
    row, ok = formats.parse(lines, fmt)
    assert ok.numpy().tolist() == [True, True, True, False, False, False, False]
    assert row["text"].numpy().tolist()[:3] == [b"a, b", b'say "hi"', b"plain"]
    assert row["label"].numpy().tolist()[:3] == [b"pos", b"neg", b"x"]


def test_tsv_skip_column_and_wrong_field_count():
    fmt = formats.RowFormat("tsv", ("label", "_", "text"))
    row, ok = formats.parse(tf.constant(["a\tid7\thello world", "a\thello"]), fmt)
    assert ok.numpy().tolist() == [True, False]
    assert sorted(row) == ["label", "text"]
    assert row["text"].numpy().tolist() == [b"hello world", b""]


@pytest.mark.slow
def test_read_rows_counts_every_drop_and_names_file_lines(tmp_path):
    path = tmp_path / "d.csv"
    path.write_bytes(b'text,label\n"x, y",a\nbroken,\xff\n,b\n"unterminated,a\nok,b\n')
    fmt = formats.row_format([str(path)], None, ["text", "label"], True,
                             required=("label", "text"), allowed=("label", "text"))
    assert fmt.format == "csv"
    counter = tfseq.DropCounter("t")
    rows = rows_of(formats.read_rows([str(path)], fmt, counter))
    assert rows == [(b"a", b"x, y"), (b"b", b"ok")]
    assert counter.seen()["lines_read"] == 5
    assert counter.drops() == {"malformed": 1, "invalid_utf8": 1, "empty_text": 1}
    assert formats.drop_examples([str(path)], fmt) == [
        f"{path}:3: invalid_utf8", f"{path}:4: empty_text",
        f"{path}:5: malformed (a quoted field that does not close)"]


def test_eval_percent_hold_out_is_a_stable_partition(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("".join(f"line number {i}\n" for i in range(1000)))
    fmt = formats.RowFormat("text", ("text",))
    counts = {}
    seen = set()
    for split in ("train", "eval"):
        rows = rows_of(formats.read_rows([str(path)], fmt, tfseq.DropCounter(split),
                                         split=split, eval_percent=10))
        counts[split] = len(rows)
        seen |= set(rows)
    assert counts["train"] + counts["eval"] == 1000 == len(seen)
    assert 50 < counts["eval"] < 150


@pytest.mark.parametrize("columns, message", [
    (["label", "txt"], "Unknown column name(s) ['txt']"),
    (["label", "_"], "has no ['text'] column"),
])
def test_bad_columns_name_the_fix(columns, message):
    with pytest.raises(formats.InputError, match=message.replace("[", r"\[").replace(
            "(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        formats.row_format(["x.tsv"], None, columns, False, required=("label", "text"),
                           allowed=("label", "text"))


def test_missing_and_empty_files_are_input_errors(tmp_path):
    with pytest.raises(formats.InputError, match="--train_files"):
        formats.resolve([str(tmp_path / "nope*.tsv")])
    (tmp_path / "empty.tsv").write_text("")
    with pytest.raises(formats.InputError, match="empty.tsv is empty"):
        formats.resolve([str(tmp_path / "empty.tsv")])


@pytest.mark.slow
def test_classify_datasets_on_tsv_labels_drops_and_unknown_eval_label(classify_tsv):
    from tfseq.pipelines import classify

    train, evals = classify_tsv
    config = classify.Config(train_files=(train,), eval_files=(evals,), header=True,
                             batching="pad", batch_size=32)
    data = classify.TASK.datasets(config)
    assert data.state.labels == {"label": ("food", "sports", "tech")}
    n_eval = sum(int(labels.shape[0]) for _, labels, _ in data.eval)
    n_train = sum(int(labels.shape[0]) for _, labels, _ in data.train)
    assert (n_train, n_eval) == (300, 60)
    assert data.counters["train"].drops()["malformed"] == 1
    assert data.counters["train"].drops()["empty_text"] == 1
    assert data.counters["eval"].drops()["unknown_label"] == 1
    assert data.drop_examples(5) == [f"{train}:302: malformed (1 field, expected 2)",
                                     f"{train}:303: empty_text"]


@pytest.mark.slow
def test_classify_truncates_long_examples_by_default(tmp_path):
    from tfseq.pipelines import classify

    path = tmp_path / "t.tsv"
    path.write_text("a\t" + " ".join(["w"] * 20) + "\nb\tshort one\n")
    config = classify.Config(train_files=(str(path),), eval_percent=0, max_length=5,
                             batching="pad", batch_size=4, min_count=1)
    data = classify.TASK.datasets(config)
    lengths = sorted(int(n) for f, _, _ in data.train for n in f["ids_length"])
    assert lengths == [2, 5]
    assert data.counters["train"].seen()["truncated"] == 1


def test_translate_mismatched_line_counts_name_both_files(tmp_path):
    from tfseq.pipelines import translate

    (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "a.es").write_text("uno\ndos\n")
    config = translate.Config(source_files=(str(tmp_path / "a.en"),),
                              target_files=(str(tmp_path / "a.es"),))
    with pytest.raises(formats.InputError,
                       match=r"a\.es ends after line 2 but .*a\.en has more lines: .*line-aligned"):
        translate.TASK.datasets(config)


CORPUS = ["the walker walked to the walking path", "talking and talked with the talker",
          "jumping jumped over the jumper", "playing played with the player",
          "the runner was running and ran"] * 20


def test_wordpiece_learned_vocab_splits_unknown_words_into_pieces():
    vocab = tfseq.Vocab.learn(tf.data.Dataset.from_tensor_slices(CORPUS),
                              tokenizer="wordpiece", vocab_size=60)
    assert vocab.tokens[:4] == ["<pad>", "<unk>", "<s>", "</s>"] and len(vocab) <= 60
    tok = tfseq.text.get_tokenizer("wordpiece", vocab)
    pieces = tok.tokenize(tf.constant(["walkered"])).flat_values.numpy().tolist()
    assert len(pieces) > 1 and b"<unk>" not in pieces
    assert b"".join(p.replace(b"##", b"") for p in pieces) == b"walkered"


def test_sentencepiece_learned_vocab_round_trip_and_ids_match(tmp_path):
    vocab = tfseq.Vocab.learn(tf.data.Dataset.from_tensor_slices(CORPUS),
                              tokenizer="sentencepiece", vocab_size=60)
    assert vocab.tokens[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert vocab.sentencepiece_model is not None
    tok = tfseq.text.get_tokenizer("sentencepiece", vocab)
    text = tf.constant(["the talker jumped", "playing with the walker"])
    (ids,) = [e["ids"] for e in tf.data.Dataset.from_tensor_slices(text).batch(2).apply(
        tfseq.tokenize(vocab, tokenizer="sentencepiece"))]
    assert tok.detokenize(ids).numpy().tolist() == [b"the talker jumped",
                                                    b"playing with the walker"]
    unseen = vocab.lookup(tok.tokenize(tf.constant(["walkplayer"]))).flat_values.numpy()
    assert len(unseen) > 1 and 1 not in unseen.tolist()
    vocab.save(tmp_path / "sp.model")
    loaded = tfseq.Vocab.load(tmp_path / "sp.model")
    assert loaded.tokens == vocab.tokens and loaded.sentencepiece_model == vocab.sentencepiece_model


# --- the binary -------------------------------------------------------------------------

def train(*args, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "train.py"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.slow
def test_binary_classify_tsv_end_to_end(tmp_path, classify_tsv):
    train_file, eval_file = classify_tsv
    run = tmp_path / "run"
    out = train("--task=classify", f"--train_files={train_file}", f"--eval_files={eval_file}",
                "--header", "--columns=label,text", "--batching=pad", "--batch_size=16",
                "--epochs=3", f"--model_dir={run}", "--verbose=0", "--export=false")
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run / "labels.txt").read_text() == "food\nsports\ntech\n"
    report = json.loads((run / "report.json").read_text())
    assert report["counters"]["train"]["drops"]["malformed"] == 1
    assert report["counters"]["eval"]["drops"]["unknown_label"] == 1
    assert report["drop_examples"][0] == f"{train_file}:302: malformed (1 field, expected 2)"
    majority = report["baselines"]["majority-class"]
    assert report["history"][-1]["eval_accuracy"] > 0.8 > majority + 0.4


@pytest.mark.slow
def test_binary_classify_csv_with_quotes(tmp_path):
    rng = random.Random(1)
    labels = sorted(TOPICS)
    lines = ["text,label"]
    for i in range(300):
        text = sentence(rng, labels[i % 3]).replace(" ", ", ", 1) + ' ""x""'
        lines.append(f'"{text}",{labels[i % 3]}')
    lines.append('"never closed,food')
    path = tmp_path / "d.csv"
    path.write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    out = train("--task=classify", f"--train_files={path}", "--header", "--columns=text,label",
                "--eval_percent=20", "--batching=pad", "--batch_size=16", "--epochs=3",
                f"--model_dir={run}", "--verbose=0", "--export=false")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    drops = report["counters"]["train"]["drops"]["malformed"] + report["counters"][
        "eval"]["drops"]["malformed"]
    assert drops == 1
    assert report["history"][-1]["eval_accuracy"] > 0.8


@pytest.mark.slow
def test_binary_lm_text_trains_an_epoch(tmp_path):
    # (translate on two line-aligned files trains through the binary in
    # tests/test_train_binary.py: its lines read, steps and real tokens)
    rng = random.Random(2)
    (tmp_path / "c.txt").write_text("".join(sentence(rng, "food") + "\n" for _ in range(200)))
    out = train("--task=lm", f"--train_files={tmp_path / 'c.txt'}", "--epochs=1",
                "--tokenizer=sentencepiece", "--vocab_size=40", "--export=false",
                f"--model_dir={tmp_path / 'lm'}", "--verbose=0")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "lm" / "report.json").read_text())
    assert report["counters"]["train"]["seen"]["lines_read"] == 200 and report["steps"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--columns=label,txt"], "Unknown column name(s) ['txt']"),
    (["--columns=label,_"], "has no ['text'] column"),
    (["--train_files=/nonexistent/*.tsv"], "--train_files: "),
    (["--files=/nonexistent/*.txt"], "/nonexistent/*.txt"),
    (["--max_tokens=0"], "--max_tokens must be a positive"),
    (["--batching=pad", "--max_tokens=4096"], "--max_tokens applies to --batching=bucket"),
    (["--vocab_size=100"], "--vocab_size applies to --tokenizer=wordpiece"),
])
def test_bad_input_is_refused_naming_it(tmp_path, classify_tsv, args, message):
    if args == ["--columns=label,txt"] or args == ["--columns=label,_"]:
        args = [f"--train_files={classify_tsv[0]}", "--header", *args]
    assert message in cli.refused(*args, f"--model_dir={tmp_path / 'run'}", "--epochs=1")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_binary_bad_input_is_a_message_and_nonzero_exit(tmp_path, classify_tsv):
    # The command itself on a file that breaks while it is read (a truncated gzip file):
    # its one message, no traceback; the other refusals above are the same path in-process.
    data = gzip.compress(open(classify_tsv[0], "rb").read() * 5)
    (tmp_path / "cut.tsv.gz").write_bytes(data[: len(data) // 2])
    out = train(f"--train_files={tmp_path / 'cut.tsv.gz'}", f"--model_dir={tmp_path / 'run'}",
                "--epochs=1")
    assert out.returncode != 0
    assert "truncated gzip file" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr

_FIELD = st.text(alphabet=st.sampled_from(list('ab ,"x\t')), max_size=6)


@given(st.lists(st.tuples(_FIELD, _FIELD), min_size=1, max_size=8))
def test_csv_parse_agrees_with_python_csv_writer(rows):
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    lines = buffer.getvalue().split("\n")[:-1]
    parsed, ok = formats.parse(tf.constant(lines), formats.RowFormat("csv", ("text", "label")))
    assert ok.numpy().all()
    got = list(zip([t.decode() for t in parsed["text"].numpy().tolist()],
                   [t.decode() for t in parsed["label"].numpy().tolist()]))
    assert got == [tuple(r) for r in rows]


@pytest.mark.slow
def test_training_pipeline_one_call_from_tsv_to_fit_batches(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("a\tx y z\nb\tx\nc\tunseen label\na\t" + " ".join(["w"] * 9) + "\n")
    vocab = tfseq.Vocab(["<pad>", "<unk>", "<s>", "</s>", "x", "y", "z", "w"])
    counter = tfseq.DropCounter("p")
    ds = tfseq.training_pipeline([str(path)], vocab, labels=["a", "b"], batching="pad",
                                 batch_size=8, max_length=4, training=False, counter=counter)
    ((features, labels, weights),) = list(ds)
    assert features["ids"].numpy().tolist() == [[4, 5, 6, 0], [4, 0, 0, 0], [7, 7, 7, 7]]
    assert features["ids_length"].numpy().tolist() == [3, 1, 4]
    assert labels.numpy().tolist() == [0, 1, 0]
    assert weights.numpy().tolist() == [1.0, 1.0, 1.0]
    assert counter.drops()["unknown_label"] == 1 and counter.seen()["truncated"] == 1

    # Training: the same examples, shuffled by record, through the resumable stream.
    shuffled = tfseq.training_pipeline([str(path)], vocab, labels=["a", "b"], batching="pack",
                                       max_tokens=16, block_length=8, max_length=4)
    ((features, labels, weights),) = list(shuffled)
    segment_ids = features["ids_segment_ids"].numpy()
    assert segment_ids.shape == (1, 8)  # the three examples (3, 1 and 4 tokens) in one row
    assert sorted(np.bincount(segment_ids[0])[1:].tolist()) == [1, 3, 4]
    assert sorted(labels.numpy()[weights.numpy() > 0].tolist()) == [0, 0, 1]
