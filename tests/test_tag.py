"""--task=tag: CoNLL and TSV input, exactly-once in every batching mode, one model for padded and
packed batches, the export and tfseq-predict."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfseq import formats
from tfseq.pipelines import tag
from tfseq.pipelines.state import TaskState

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONLL = """-DOCSTART- -X- O

EU\tNNP\tB-ORG
rejects\tVBZ\tO
German\tJJ\tB-MISC

# a comment line
Peter NNP B-PER
Blackburn NNP I-PER
bad line with five fields


last\tJJ\tO
one\tCD\tO"""


def test_conll_sentences_blank_lines_last_sentence_skips_and_a_malformed_line(tmp_path):
    path = tmp_path / "a.conll"
    path.write_text(CONLL)  # no newline after the last sentence
    fmt = formats.RowFormat("conll", ("token", "_", "tag"))
    records = [r for batch in formats.read_records([str(path)], fmt) for r in batch.numpy()]
    assert records == [b"EU rejects German\nB-ORG O B-MISC",
                       b"Peter Blackburn bad\nB-PER I-PER with\n",   # malformed: one too many
                       b"last one\nO O"]
    rows, ok = formats.parse(tf.constant(records), fmt)
    assert ok.numpy().tolist() == [True, False, True]
    assert rows["token"].numpy().tolist() == [b"EU rejects German", b"", b"last one"]
    assert rows["tag"].numpy().tolist() == [b"B-ORG O B-MISC", b"", b"O O"]
    assert formats.drop_examples([str(path)], fmt) == [
        f"{path}:10: malformed (5 fields, expected 3)"]


def write_tagged(path, sentences, conll=True):
    if conll:
        path.write_text("\n\n".join("\n".join(f"{w}\t{t}" for w, t in s) for s in sentences)
                        + "\n")
    else:
        path.write_text("".join(" ".join(w for w, _ in s) + "\t" + " ".join(t for _, t in s)
                                + "\n" for s in sentences))
    return str(path)


def sentences(n=120):
    """Sentences whose every token is unique (w<i>_<j>) and whose tags follow the word's
    position: the tag of word j is T<j % 3>."""
    return [[(f"w{i}_{j}", f"T{j % 3}") for j in range(i % 9 + 1)] for i in range(n)]


def config(path, **kwargs):
    fmt = dict(columns=("token", "tag")) if str(path).endswith(".conll") else dict(
        format="tsv", columns=("tokens", "tags"))
    return tag.Config(train_files=(path,), eval_percent=0, **fmt, **kwargs)


@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
    """The sentences' CoNLL file and what a run learns from it (the vocabulary and the tags:
    the same in every batching mode), learned once for the module."""
    path = write_tagged(tmp_path_factory.mktemp("tagged") / "train.conll", sentences())
    state = tag.TASK.datasets(config(path, batching="pad")).state
    assert state.labels["tags"] == ("T0", "T1", "T2")
    return path, state


@pytest.mark.parametrize("batching", ["pad", "bucket", "pack"])
def test_every_sentence_is_batched_once_with_its_tags(tagged, batching):
    data = sentences()
    path, state = tagged
    cfg = config(path, batching=batching, batch_size=16, max_tokens=64, block_length=(8, 16),
                 max_length=16)
    task_data = tag.TASK.datasets(cfg, state)
    vocab, tags = task_data.state.vocab, task_data.state.labels["tags"]
    assert tags == ("T0", "T1", "T2")
    seen = []
    for x, y, w in task_data.train:
        ids, labels, weights = x["ids"].numpy(), y.numpy(), w.numpy()
        segments = x["ids_segment_ids"].numpy() if batching == "pack" else (ids > 0) * 1
        for row in range(ids.shape[0]):
            for segment in sorted(set(segments[row].tolist()) - {0}):
                cells = segments[row] == segment
                assert (weights[row][cells] == 1.0).all()
                words = [t.decode() for t in vocab.to_tokens(ids[row][cells]).numpy()]
                seen.append(tuple(zip(words, [tags[t - 1] for t in labels[row][cells]])))
    assert sorted(seen) == sorted(tuple(s) for s in data)
    assert task_data.counters["train"].seen()["lines_read"] == 120


def test_tsv_unequal_counts_are_dropped_and_named(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("a b\tT0 T1\nc d e\tT0 T1\nf\tT2\n")
    cfg = tag.Config(train_files=(str(path),), columns=("tokens", "tags"), eval_percent=0,
                     batching="pad")
    data = tag.TASK.datasets(cfg)
    rows = sum(int(y.shape[0]) for _, y, _ in data.train)
    assert rows == 2
    assert data.counters["train"].drops()["unequal_counts"] == 1
    assert data.drop_examples(5) == [f"{path}:2: unequal_counts (3 tokens, 2 tags)"]


def test_padded_and_packed_batches_give_the_same_per_token_predictions():
    state = TaskState({"vocab": _vocab()}, {"tags": ("A", "B", "C")})
    model = tag.TASK.build_model(tag.Config(), state, tag.TASK.model_config(
        embedding_dim=8, hidden_dim=6))
    examples = [[4, 5, 6], [7], [8, 9, 10, 11, 12], [13, 14]]
    padded = tf.ragged.constant(examples).to_tensor()
    lengths = tf.constant([len(e) for e in examples])
    expected = model({"ids": padded, "ids_length": lengths}).numpy()
    row = tf.constant([[4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0]])
    segment_ids = tf.constant([[1, 1, 1, 2, 3, 3, 3, 3, 3, 4, 4, 0]])
    resets = tf.constant([[1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0]])
    packed = model({"ids": row, "ids_segment_ids": segment_ids, "ids_resets": resets}).numpy()
    start = 0
    for i, example in enumerate(examples):
        np.testing.assert_allclose(packed[0, start:start + len(example)],
                                   expected[i, :len(example)], atol=1e-5)
        start += len(example)


def _vocab():
    import tfseq
    return tfseq.Vocab(list(tfseq.text.RESERVED) + [f"w{i}" for i in range(12)])


@pytest.mark.slow
def test_train_export_and_predict_tags_one_line_per_input_line(tmp_path):
    data = sentences(300)
    path = write_tagged(tmp_path / "train.conll", data)
    run = tmp_path / "run"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--task=tag",
         f"--train_files={path}", "--columns=token,tag", "--batching=pack", "--epochs=3",
         "--max_tokens=256", "--block_length=16", "--max_length=16", f"--model_dir={run}",
         "--learning_rate=0.03", "--verbose=0"],
        capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run / "tags.txt").read_text() == "T0\nT1\nT2\n"
    served = tf.saved_model.load(str(run / "export"))
    lines = ["w1_0", "w5_0 w5_1 w5_2 w5_3 w5_4 w5_5", "w8_0 unknown w8_2"]
    got = [t.decode() for t in served.signatures["serving_default"](
        text=tf.constant(lines))["tags"].numpy()]
    assert got[:2] == ["T0", "T0 T1 T2 T0 T1 T2"]
    assert len(got[2].split()) == 3
    (tmp_path / "in.txt").write_text("\n".join(lines + [""]) + "\n")
    # tfseq-predict's work, in this process (the binary itself: tests/test_predict.py).
    from tfseq.pipelines.predicting import predict_files

    report = predict_files(str(run), [str(tmp_path / "in.txt")], str(tmp_path / "out.txt"))
    assert (report["lines"], report["empty"]) == (4, 1)
    assert (tmp_path / "out.txt").read_text().split("\n") == got + ["", ""]
