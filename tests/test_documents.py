"""pipelines.documents and models.hierarchical: nested [batch, (sentences), (words)] batches."""

import collections
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfseq
from conftest import to_list
from tfseq.models import hierarchical
from tfseq.pipelines import documents


def test_group_runs():
    keys = ["a", "a", "b", "a", "c", "c", "c"]
    texts = ["x", "y", "z", "w", "1", "2", "3"]
    ds = documents.group_runs(tf.data.Dataset.from_tensor_slices((keys, texts)))
    assert to_list(ds) == [("a", ["x", "y"]), ("b", ["z"]), ("a", ["w"]), ("c", ["1", "2", "3"])]
    empty = tf.data.Dataset.from_tensor_slices((tf.zeros([0], tf.string), tf.zeros([0], tf.string)))
    assert to_list(documents.group_runs(empty)) == []


def test_read_documents_literal_file(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_bytes(b"\xef\xbb\xbfFirst sentence here\r\nsecond one\r\n\r\n\n  \t\n"
                     b"Only sentence\n\nlast doc line 1\n  last doc line 2  ")
    counter = tfseq.DropCounter()
    ds = documents.read_documents(str(path), counter=counter)
    assert ds.element_spec["sentences"] == tf.TensorSpec([None], tf.string)
    assert to_list(ds) == [
        {"key": f"{path}:1", "sentences": ["First sentence here", "second one"]},
        {"key": f"{path}:6", "sentences": ["Only sentence"]},
        {"key": f"{path}:8", "sentences": ["last doc line 1", "last doc line 2"]},
    ]
    assert counter.seen() == {"lines_read": 9}


def test_read_documents_several_files(tmp_path):
    (tmp_path / "a.txt").write_text("a1\na2\n\na3\n")
    (tmp_path / "b.txt").write_text("\n\nb1\n")
    ds = documents.read_documents(str(tmp_path / "*.txt"), num_parallel_reads=2)
    assert sorted(d["sentences"] for d in to_list(ds)) == [["a1", "a2"], ["a3"], ["b1"]]


LABELLED = """Law
the law of moses
the law

Revelation
the end
amen amen amen

Nonsense
not a class

Wisdom
"""
VOCAB = ["<pad>", "<unk>", "<s>", "</s>", "the", "amen", "law", "end"]


def test_datasets_on_literal_labelled_file(tmp_path):
    (tmp_path / "docs.txt").write_text(LABELLED)
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    config = documents.Config(files=(str(tmp_path / "docs.txt"),),
                              vocab_path=str(tmp_path / "vocab.txt"), eval_percent=100,
                              batch_size=2)
    data = documents.TASK.datasets(config)
    train, evals, info = data.train, data.eval, data.state
    assert info["num_classes"] == 7 and info["class_names"][6] == "Revelation"
    assert evals.element_spec[0]["ids"] == tf.RaggedTensorSpec(
        [None, None, None], tf.int32, ragged_rank=2, row_splits_dtype=tf.int64)
    assert to_list(evals) == [({"ids": [[[4, 6, 1, 1], [4, 6]], [[4, 7], [5, 5, 5]]]}, [0, 6])]
    assert to_list(train) == []
    counters = {k: (c.seen(), c.drops()) for k, c in data.counters.items()}
    no_drops = {"too_long_sentence": 0, "too_many_sentences": 0}
    assert counters["eval"] == ({"documents": 4, "lines_read": 12},
                                {**no_drops, "other_split": 0, "unknown_label": 2})
    assert counters["train"] == ({"documents": 4, "lines_read": 12},
                                 {**no_drops, "other_split": 2, "unknown_label": 2})


def test_length_limits_are_counted(tmp_path):
    (tmp_path / "docs.txt").write_text(LABELLED)
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    config = documents.Config(files=(str(tmp_path / "docs.txt"),),
                              vocab_path=str(tmp_path / "vocab.txt"), eval_percent=100,
                              max_sentences=2, max_words=3)
    data = documents.TASK.datasets(config)
    evals, info = data.eval, data.state
    assert to_list(evals) == [({"ids": [[[4, 7], [5, 5, 5]]]}, [6])]
    assert data.counters["eval"].drops()["too_long_sentence"] == 1


TSV = ("Gen\t1\t1\tIn the beginning.\nGen\t1\t2\tAnd the earth.\nGen\t2\t1\tThus.\n"
       "Rev\t22\t21\tAmen.\nbroken line\n")


def test_write_documents_and_read_back(tmp_path):
    import gzip
    corpus = tmp_path / "tiny.tsv.gz"
    with gzip.open(corpus, "wt") as f:
        f.write(TSV)
    out = tmp_path / "docs.txt"
    assert documents.write_documents(str(out), str(corpus)) == 3
    assert out.read_text() == ("Law\nIn the beginning.\nAnd the earth.\n\nLaw\nThus.\n\n"
                               "Revelation\nAmen.\n\n")
    counter = tfseq.DropCounter()
    docs = documents.corpus_documents(str(corpus), counter=counter)
    assert to_list(docs) == [
        {"key": "Gen 1", "sentences": ["In the beginning.", "And the earth."], "label": 0},
        {"key": "Gen 2", "sentences": ["Thus."], "label": 0},
        {"key": "Rev 22", "sentences": ["Amen."], "label": 6},
    ]
    assert counter.drops() == {"malformed": 1, "unknown_book": 0}


def test_corpus_chapters():
    counter = tfseq.DropCounter()
    docs = documents.corpus_documents(counter=counter)
    ds = docs.map(lambda d: (d["key"], tf.size(d["sentences"]), d["label"]))
    chapters = to_list(ds)
    assert len(chapters) == 1189
    assert chapters[0] == ("Gen 1", 31, 0)
    assert chapters[-1] == ("Rev 22", 21, 6)
    assert chapters[1166] == ("Jude 1", 25, 5)
    per_section = collections.Counter(label for _, _, label in chapters)
    assert [per_section[i] for i in range(7)] == [187, 249, 243, 250, 117, 121, 22]
    assert sum(n for _, n, _ in chapters) == 31102
    assert counter.seen() == {"lines_read": 31102}


def _tiny_model(vocab_size=8, num_classes=7):
    info = {"vocab": tfseq.Vocab(VOCAB + [f"w{i}" for i in range(vocab_size - len(VOCAB))]),
            "num_classes": num_classes}
    return hierarchical.build_model(None, info, hierarchical.ModelConfig(
        embedding_dim=8, word_units=8, sentence_units=8, dropout=0.0))


def test_model_is_padding_invariant():
    keras_model = _tiny_model()
    short = [[4, 6], [7]]
    long = [[4, 5, 5, 5, 5, 5, 5], [6], [7, 7], [4]]
    alone = keras_model.predict({"ids": tf.ragged.constant([short], tf.int32)}, verbose=0)
    batched = keras_model.predict({"ids": tf.ragged.constant([short, long], tf.int32)}, verbose=0)
    assert batched.shape == (2, 7)
    np.testing.assert_allclose(alone[0], batched[0], rtol=1e-5, atol=1e-6)


def test_model_fit_few_steps(tmp_path):
    keras_model = _tiny_model()
    ids = tf.ragged.constant([[[4, 6], [7]], [[5, 5, 5]], [[4], [6, 6], [7, 4, 5]]], tf.int32)
    ds = tf.data.Dataset.from_tensor_slices(({"ids": ids}, [0, 6, 2])).repeat(4).ragged_batch(2)
    history = keras_model.fit(ds, epochs=2, verbose=0)
    assert all(math.isfinite(v) for v in history.history["loss"])
    assert len(history.history["loss"]) == 2
    batch = next(iter(ds))
    logs = keras_model.train_on_batch(*batch, return_dict=True)   # the path scripts/train.py uses
    assert math.isfinite(logs["loss"])
    path = str(tmp_path / "model.keras")
    keras_model.save(path)
    import keras
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded.predict(batch[0], verbose=0),
                               keras_model.predict(batch[0], verbose=0), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_trains_on_corpus_chapters():
    config = documents.Config(batch_size=16, max_vocab=4000)
    data = documents.TASK.datasets(config)
    train, info = data.train, data.state
    evals = data.eval.cache()  # evaluated and its baseline counted from one read
    keras.utils.set_random_seed(0)  # the initial weights (the data's order has its own seeds)
    keras_model = hierarchical.build_model(config, info, hierarchical.ModelConfig(
        embedding_dim=32, word_units=32, sentence_units=32))
    counters, batched, per_epoch = data.counters, tfseq.DropCounter("batched"), []
    keras_model.fit(train.apply(batched.tally("examples", rows=True)), epochs=2, verbose=0,
                    callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=lambda *_: (
                        per_epoch.append(batched.seen()["examples"]
                                         + counters["train"].drops()["other_split"])))])
    accuracy = keras_model.evaluate(evals, verbose=0, return_dict=True)["accuracy"]
    baseline = documents.majority_baseline(evals)
    assert accuracy > baseline + 0.15, (accuracy, baseline)
    # The training documents are read again each epoch (an epoch is rebuilt from its number),
    # each batched once or held out.
    assert counters["train"].seen()["documents"] == 2 * 1189
    assert per_epoch == [1189, 2 * 1189]
