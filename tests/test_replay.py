"""ReplayStream: an epoch rebuilt from its number; documents, ctr and lm_tbptt resume on it.

For each of the three tasks a run stopped mid-epoch and resumed by a new trainer (a new model
restored from the checkpoint) trains on exactly the batches of an uninterrupted run, and the
checkpoint holds no data state.
"""

import gzip

import numpy as np
import pytest
import tensorflow as tf

from tfseq import training
from tfseq.models import ctr as ctr_model
from tfseq.models import hierarchical, stateful_lm
from tfseq.pipelines import ctr, documents, lm_tbptt
from tfseq.replay import ReplayStream, epoch_shuffle


def _epochs(stream, epochs):
    epoch = tf.Variable(0, dtype=tf.int64)
    skip = tf.Variable(0, dtype=tf.int64)
    ds = stream.dataset(epoch, skip)
    out = []
    for e, s in epochs:
        epoch.assign(e)
        skip.assign(s)
        out.append([int(x) for x in ds])
    return out


def test_replay_stream_rebuilds_an_epoch_from_its_number():
    base = tf.data.Dataset.range(6)
    stream = ReplayStream(lambda epoch: epoch_shuffle(base, 6, 3, epoch))
    first, second, again, rest = _epochs(stream, [(0, 0), (1, 0), (0, 0), (1, 4)])
    assert sorted(first) == sorted(second) == [0, 1, 2, 3, 4, 5]
    assert first != second  # a new order each epoch
    assert again == first  # the same epoch, the same order
    assert rest == second[4:]  # the steps taken skipped


def test_the_epoch_order_ignores_the_global_seed():
    """Also with ``tf.random.set_seed(0)``, which TensorFlow cannot combine with a tensor op
    seed (a training script seeding Keras hit that)."""
    base = tf.data.Dataset.range(20)

    def orders():
        return _epochs(ReplayStream(lambda epoch: epoch_shuffle(base, 20, 3, epoch)),
                       [(0, 0), (1, 0)])

    before = orders()
    tf.random.set_seed(0)
    try:
        after = orders()
    finally:
        tf.random.set_seed(None)
    assert after == before and before[0] != before[1]


def test_replay_stream_meta_counts():
    stream = ReplayStream(lambda epoch: tf.data.Dataset.range(5).batch(2),
                          count=lambda b: (tf.reduce_sum(b), tf.size(b) * 2, tf.size(b)))
    ds = stream.dataset(tf.Variable(0, dtype=tf.int64), tf.Variable(1, dtype=tf.int64))
    got = [(batch.numpy().tolist(), {k: int(v) for k, v in meta.items()}) for batch, meta in ds]
    assert got == [([2, 3], {"tokens": 5, "cells": 4, "examples": 2}),
                   ([4], {"tokens": 4, "cells": 2, "examples": 1})]


def _fingerprint(batch):
    """A batch as plain lists: every feature's values and the labels."""
    features, labels = batch[0], batch[1]
    out = []
    for key in sorted(features):
        value = features[key]
        if isinstance(value, tf.RaggedTensor):
            value = value.flat_values
        out.append((key, np.asarray(value).tolist()))
    return out, np.asarray(labels).tolist()


def _resume_sees_each_batch_once(tmp_path, data, build, epochs=2, stop_at=5):
    """Enumerates the stream's ``epochs`` as an uninterrupted trainer takes them (the counters
    reset at each epoch's start), then trains stopped at ``stop_at`` steps and resumed by a
    new trainer and model; returns (uninterrupted batches, data state bytes)."""

    def run(model_dir, max_steps=None):
        seen = []
        trainer = training.Trainer(build(), data.stream, model_dir=str(model_dir),
                                   on_batch=lambda b: seen.append(_fingerprint(b)),
                                   on_epoch_start=lambda e: data.counters["train"].reset())
        trainer.fit(epochs, verbose=0, max_steps=max_steps)
        return seen, trainer

    epoch, skip = tf.Variable(0, dtype=tf.int64), tf.Variable(0, dtype=tf.int64)
    ds = data.stream.dataset(epoch, skip)
    whole = []
    for e in range(epochs):
        epoch.assign(e)
        data.counters["train"].reset()
        whole += [_fingerprint(batch) for batch, _ in ds]
    whole_drops = data.counters["train"].drops()
    data.counters["train"].reset()
    first, trainer = run(tmp_path / "cut", max_steps=stop_at)
    assert len(first) == stop_at
    state = training.data_state_bytes(training.checkpoints_newest_first(
        trainer.checkpoint_dir)[0])
    data.counters["train"].reset()  # a new process starts with no counts
    rest, _ = run(tmp_path / "cut")
    assert first + rest == whole
    assert data.counters["train"].drops() == whole_drops
    return whole, state


LABELLED = "".join(f"{name}\n" + "".join(f"the {w} of {name.lower()} {i}\n" for w in range(i % 4 + 1))
                   + "\n" for i, name in enumerate(["Law", "History", "Wisdom", "Prophets",
                                                    "Gospels and Acts", "Epistles", "Revelation"] * 6))


@pytest.mark.slow
def test_documents_resume_sees_each_batch_once(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text(LABELLED + "Unknown\nthe end\n\n")
    config = documents.Config(files=(str(path),), min_count=1, batch_size=4, eval_percent=0)
    data = documents.TASK.datasets(config)
    info = data.state
    whole, state = _resume_sees_each_batch_once(
        tmp_path, data, lambda: hierarchical.build_model(config, info, hierarchical.ModelConfig(
            embedding_dim=4, word_units=4, sentence_units=4)))
    assert len(whole) == 2 * 11  # 42 documents in batches of 4, two epochs
    assert sorted(label for _, labels in whole[:11] for label in labels) == sorted(
        list(range(7)) * 6)
    assert state == 0
    assert data.counters["train"].drops()["unknown_label"] == 1


@pytest.mark.slow
def test_ctr_resume_sees_each_batch_once(tmp_path):
    data = ctr.generate(str(tmp_path / "data"), num_files=2, examples_per_file=60,
                        eval_examples=20, bad_lines_per_file=2)
    config = ctr.Config(files=tuple(data["train_files"]), eval_files=tuple(data["eval_files"]),
                        batch_size=16, shuffle_buffer=50)
    data = ctr.TASK.datasets(config)
    info = data.state
    whole, state = _resume_sees_each_batch_once(
        tmp_path, data, lambda: ctr_model.build_model(config, info, ctr_model.ModelConfig(
            buckets=101, wide_buckets=101, hidden=(8,))))
    assert len(whole) == 2 * 8  # 120 lines in batches of 16
    assert sum(len(labels) for _, labels in whole[:8]) == 120
    assert state == 0
    assert sum(data.counters["train"].drops().values()) == 4


@pytest.fixture
def tiny_corpus(tmp_path):
    lines = [f"Gen\t{i // 5 + 1}\t{i % 5 + 1}\t" + " ".join(f"w{(i * 7 + j) % 13}"
                                                           for j in range(i % 6 + 2))
             for i in range(40)]
    path = tmp_path / "tiny.tsv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\nmalformed line\n")
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stream", "sequences"])
def test_lm_tbptt_resume_sees_each_batch_once(tmp_path, tiny_corpus, mode):
    config = lm_tbptt.Config(files=(tiny_corpus,), min_count=1, mode=mode, batch_size=3,
                             tbptt=4, eval_percent=0)
    data = lm_tbptt.TASK.datasets(config)
    info = data.state
    whole, state = _resume_sees_each_batch_once(
        tmp_path, data, lambda: stateful_lm.build_model(config, info, stateful_lm.ModelConfig(
            embedding_dim=4, units=4)), stop_at=3)
    tokens = sum(sum(n for n in dict(features)["ids_length"]) for features, _ in whole)
    assert tokens == 2 * sum(i % 6 + 2 + 1 for i in range(40)) - 2 * (mode == "stream")
    assert state == 0
    assert data.counters["train"].drops()["malformed"] == 1
