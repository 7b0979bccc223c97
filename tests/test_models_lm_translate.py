"""Tests for the lm and translate pipelines and models: element specs, drops, training steps."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfseq
from tfseq.batching import Batching
from tfseq.models import lm as lm_model
from tfseq.models import translate as translate_model
from tfseq.pipelines import lm, tasks, translate, verses
from tfseq.pipelines.state import TaskState
from tfseq.text import BOS_ID, EOS_ID

LM_CONFIG = lm.Config(max_lines=400, min_count=1, max_vocab=500, batch_size=16, max_length=30)
TRANSLATE_CONFIG = translate.Config(max_lines=400, min_count=1, max_vocab=500, batch_size=16,
                                    max_length=30)


def _lm_examples():
    """Lines "w3 w4" and "w5" (ids 7 8 and 9) as the lm task encodes them."""
    vocab = tfseq.Vocab(list(tfseq.text.RESERVED) + [f"w{i}" for i in range(10)])
    return lm.TASK.encode_rows(lm.Config(max_length=4), TaskState({"vocab": vocab}),
                               {"text": tf.constant(["w3 w4", "w5"])}, tfseq.DropCounter("t"))


def test_lm_shifts_targets_before_batching_literal(as_list):
    examples = _lm_examples()
    assert as_list([examples]) == [{"ids": [[2, 7, 8], [2, 9]], "targets": [[7, 8, 3], [9, 3]]}]
    padded = tf.data.Dataset.from_tensors(examples).apply(
        Batching("pad", batch_size=2).transform(training=False))
    inputs, targets, weights = lm.TASK.features(next(iter(padded)))
    assert inputs["ids"].numpy().tolist() == [[2, 7, 8], [2, 9, 0]]
    assert inputs["ids_length"].numpy().tolist() == [3, 2]
    assert targets.numpy().tolist() == [[7, 8, 3], [9, 3, 0]]
    assert weights.numpy().tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def test_lm_packed_targets_ride_in_the_cells_of_their_input_literal():
    packed = tf.data.Dataset.from_tensors(_lm_examples()).apply(
        Batching("pack", max_tokens=8, block_length=8, aligned=lm.TASK.aligned).transform(
            training=False, counter=tfseq.DropCounter("t")))
    inputs, targets, weights = lm.TASK.features(next(iter(packed)))
    assert {k: v.numpy().tolist() for k, v in inputs.items()} == {
        "ids": [[2, 7, 8, 2, 9, 0, 0, 0]],
        "ids_segment_ids": [[1, 1, 1, 2, 2, 0, 0, 0]],
        "ids_resets": [[1, 0, 0, 1, 0, 0, 0, 0]]}
    assert targets.numpy().tolist() == [[7, 8, 3, 9, 3, 0, 0, 0]]
    assert weights.numpy().tolist() == [[1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]]


def test_parse_verse_line():
    parsed = verses.parse(tf.constant(["Gen\t1\t2\tAnd the earth", "Gen\t1\tno text"]))
    assert parsed["key"].numpy()[0] == b"Gen 1 2"
    assert parsed["text"].numpy()[0] == b"And the earth"
    assert parsed["ok"].numpy().tolist() == [True, False]


def test_translate_counts_and_drops_the_18_empty_targets():
    counter = tfseq.DropCounter("test")
    config = dataclasses.replace(TRANSLATE_CONFIG, max_lines=0, eval_percent=0)
    source = translate.TASK.source(config, "train")
    pairs = source.read(1, 0).map(
        lambda records: translate.TASK.clean_rows(config, source.parse(records, counter),
                                                  counter))
    assert pairs.element_spec["source"].shape.as_list() == [None]  # batches of pairs
    kept = pairs.reduce(0, lambda n, p: n + tf.shape(p["source"])[0]).numpy()
    drops = counter.drops()
    assert drops["empty_target"] == 18
    assert drops["misaligned"] == 0 and drops["malformed"] == 0
    assert counter.seen()["lines_read"] == 31102 == kept + sum(drops.values())


@pytest.fixture(scope="module")
def lm_data():
    """The lm task's datasets on LM_CONFIG, built once for the module's tests (the accounting
    test resets their counters before its pass)."""
    return lm.TASK.datasets(LM_CONFIG)


def test_lm_datasets_element_spec_and_exact_accounting(lm_data):
    assert tasks.load("lm") is lm.TASK  # the fixture's datasets are the registry's task's
    data = lm_data
    # The module's datasets are shared: count this test's one pass from zero, whatever the
    # training tests have read of them.
    for counter in (data.counters["train"], data.counters["eval"], data.stats["train"]):
        counter.reset()
    train, evaluation = data.train, data.eval
    features, targets, weights = train.element_spec
    assert sorted(features) == ["ids", "ids_length"]
    assert targets.shape.as_list() == [None, None] and weights.dtype == tf.float32
    examples = 0
    for features, targets, weights in train:
        ids, lengths = features["ids"].numpy(), features["ids_length"].numpy()
        assert (ids[:, 0] == BOS_ID).all()
        np.testing.assert_array_equal(weights.numpy().sum(1), lengths)
        np.testing.assert_array_equal(targets.numpy()[np.arange(len(ids)), lengths - 1], EOS_ID)
        examples += len(ids)
    for _ in evaluation:
        pass
    train_drops = data.counters["train"].drops()
    eval_drops = data.counters["eval"].drops()
    assert data.counters["train"].seen()["lines_read"] == 400
    assert examples + sum(train_drops.values()) == 400
    assert data.stats["train"].as_dict()["examples"] == examples
    assert train_drops["other_split"] + eval_drops["other_split"] == 400


@pytest.fixture(scope="module")
def translate_data():
    """The translate task's datasets on TRANSLATE_CONFIG, read once for the module's tests (none
    of them reads its counters)."""
    return tasks.load("translate").datasets(TRANSLATE_CONFIG)


def test_translate_datasets_element_spec(translate_data):
    data = translate_data
    features, targets, weights = next(iter(data.train))
    assert sorted(features) == ["source", "source_length", "target_in", "target_in_length"]
    assert (features["target_in"].numpy()[:, 0] == BOS_ID).all()
    np.testing.assert_array_equal(weights.numpy().sum(1), features["target_in_length"].numpy())
    vocabs = data.state.vocabs
    assert vocabs["source"].size <= 500 and vocabs["target"].size <= 500


def test_unknown_batching_raises():
    with pytest.raises(ValueError, match="batching"):
        lm.TASK.datasets(dataclasses.replace(LM_CONFIG, batching="sorted"))
    with pytest.raises(ValueError, match="cell"):
        lm_model.build_model(LM_CONFIG,
                             TaskState({"vocab": tfseq.Vocab(list(tfseq.text.RESERVED))}),
                             lm_model.ModelConfig(cell="transformer"))


def _set_policy(policy):
    keras.mixed_precision.set_global_policy(policy)


@pytest.fixture(autouse=True)
def restore_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")


def _train_steps(model, dataset, steps):
    losses = []
    for batch in dataset.take(steps):
        logs = model.train_on_batch(*batch, return_dict=True)
        losses.append(float(logs["loss"]))
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("cell,policy", [("gru", "mixed_float16"), ("lstm", "float32")])
def test_lm_trains_with_finite_loss(lm_data, cell, policy):
    _set_policy(policy)
    data = lm_data
    model = lm_model.build_model(LM_CONFIG, data.state,
                                 lm_model.ModelConfig(cell=cell, hidden_dim=32))
    losses = _train_steps(model, data.train, 6)
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0]
    results = model.evaluate(data.eval, verbose=0, return_dict=True)
    assert np.isfinite(results["loss"])
    assert all(np.isfinite(w.numpy()).all() for w in model.weights)


@pytest.mark.slow
def test_translate_trains_under_mixed_precision(translate_data):
    _set_policy("mixed_float16")
    data = translate_data
    model = translate_model.build_model(TRANSLATE_CONFIG, data.state,
                                        translate_model.ModelConfig(hidden_dim=32))
    assert model.get_layer("attention").compute_dtype == "float16"
    losses = _train_steps(model, data.train, 4)
    assert np.isfinite(losses).all()
    assert all(np.isfinite(w.numpy()).all() for w in model.weights)


@pytest.mark.slow
def test_translate_trains_decodes_and_reloads(tmp_path, translate_data):
    data = translate_data
    evaluation = data.eval
    model = translate_model.build_model(TRANSLATE_CONFIG, data.state,
                                        translate_model.ModelConfig(hidden_dim=32))
    losses = _train_steps(model, data.train, 6)
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0]
    assert all(np.isfinite(w.numpy()).all() for w in model.weights)
    features, _, _ = next(iter(evaluation))
    ids = translate_model.greedy_decode(model, features["source"][:4],
                                        features["source_length"][:4], max_length=7,
                                        bos_id=BOS_ID, eos_id=EOS_ID)
    assert ids.shape == (4, 7) and ids.dtype == np.int32
    for row in ids:  # nothing after </s>
        end = np.flatnonzero(row == EOS_ID)
        if end.size:
            assert (row[end[0] + 1:] == 0).all()
    max_length = TRANSLATE_CONFIG.max_length + 1
    lines = translate_model.decode_examples(model, evaluation, data.state,
                                            max_length=max_length, count=2)
    assert len(lines) == 6 and lines[0].startswith("source:")
    assert translate_model.decode_examples(model, evaluation.take(0), data.state,
                                           max_length=max_length) == [
        "(no held-out examples to decode)"]
    path = str(tmp_path / "translate.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded(features).numpy(), model(features).numpy())


def test_lm_on_packed_batches_targets_stay_in_segments_and_train():
    config = dataclasses.replace(LM_CONFIG, batching="pack", block_length=64, max_tokens=512)
    data = lm.TASK.datasets(config)
    segments = 0
    for features, targets, weights in data.train:
        ids, seg = features["ids"].numpy(), features["ids_segment_ids"].numpy()
        assert ids.shape[1] == 64
        w = weights.numpy() > 0
        # Every real token has a target (weight 1), padding none; a target is the next token
        # of its own segment, or </s> at the segment's last token: never the next segment's.
        np.testing.assert_array_equal(w, seg > 0)
        same = np.concatenate([(seg[:, 1:] == seg[:, :-1]) & (seg[:, :-1] > 0),
                               np.zeros((seg.shape[0], 1), bool)], axis=1)
        np.testing.assert_array_equal(targets.numpy()[:, :-1][same[:, :-1]],
                                      ids[:, 1:][same[:, :-1]])
        assert (targets.numpy()[w & ~same] == EOS_ID).all()
        assert (ids[features["ids_resets"].numpy() == 1] == BOS_ID).all()
        segments += int(features["ids_resets"].numpy().sum())
    counter = data.counters["train"]
    kept = counter.seen()["lines_read"] - sum(counter.drops().values())
    assert segments == kept
    model = lm_model.build_model(config, data.state, lm_model.ModelConfig(hidden_dim=32))
    losses = _train_steps(model, data.train, 6)
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
