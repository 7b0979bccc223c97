"""Tests for the lm and translate pipelines and models: element specs, drops, training steps."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfseq
from tfseq.models import lm as lm_model
from tfseq.models import translate as translate_model
from tfseq.pipelines import lm, translate, verses

LM_CONFIG = lm.Config(max_lines=400, min_count=1, max_vocab=500, batch_size=16, max_length=30)
TRANSLATE_CONFIG = translate.Config(max_lines=400, min_count=1, max_vocab=500, batch_size=16,
                                    max_length=30)


def test_shift_targets_literal():
    inputs, lengths, targets, weights = verses.shift_targets(
        tf.constant([[2, 7, 8, 3], [2, 9, 3, 0]]), tf.constant([4, 3]))
    assert inputs.numpy().tolist() == [[2, 7, 8], [2, 9, 3]]
    assert lengths.numpy().tolist() == [3, 2]
    assert targets.numpy().tolist() == [[7, 8, 3], [9, 3, 0]]
    assert weights.numpy().tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def test_parse_verse_line():
    parsed = verses.parse(tf.constant("Gen\t1\t2\tAnd the earth"))
    assert parsed["key"].numpy() == b"Gen 1 2" and parsed["text"].numpy() == b"And the earth"
    assert bool(parsed["ok"])
    assert not bool(verses.parse(tf.constant("Gen\t1\tno text"))["ok"])


def test_translate_counts_and_drops_the_18_empty_targets():
    counter = tfseq.DropCounter("test")
    config = dataclasses.replace(TRANSLATE_CONFIG, max_lines=0, eval_percent=0)
    pairs = translate.verse_pairs(config, "train", counter)
    assert pairs.element_spec["source"].shape.as_list() == [None]  # batches of pairs
    kept = pairs.reduce(0, lambda n, p: n + tf.shape(p["source"])[0]).numpy()
    drops = counter.drops()
    assert drops["empty_target"] == 18
    assert drops["misaligned"] == 0 and drops["malformed"] == 0
    assert counter.seen()["lines_read"] == 31102 == kept + sum(drops.values())


def test_lm_datasets_element_spec_and_exact_accounting():
    train, evaluation, info = lm.datasets(LM_CONFIG)
    features, targets, weights = train.element_spec
    assert sorted(features) == ["ids", "ids_length"]
    assert targets.shape.as_list() == [None, None] and weights.dtype == tf.float32
    examples = 0
    for features, targets, weights in train:
        ids, lengths = features["ids"].numpy(), features["ids_length"].numpy()
        assert (ids[:, 0] == tfseq.text.BOS_ID).all()
        np.testing.assert_array_equal(weights.numpy().sum(1), lengths)
        np.testing.assert_array_equal(targets.numpy()[np.arange(len(ids)), lengths - 1],
                                      tfseq.text.EOS_ID)
        examples += len(ids)
    for _ in evaluation:
        pass
    train_drops = info["counters"]["train"].drops()
    eval_drops = info["counters"]["eval"].drops()
    assert examples + sum(train_drops.values()) == 400
    assert info["stats"]["train"].as_dict()["examples"] == examples
    assert train_drops["other_split"] + eval_drops["other_split"] == 400


def test_translate_datasets_element_spec():
    train, _, info = translate.datasets(TRANSLATE_CONFIG)
    features, targets, weights = next(iter(train))
    assert sorted(features) == ["source", "source_length", "target_in", "target_in_length"]
    assert (features["target_in"].numpy()[:, 0] == tfseq.text.BOS_ID).all()
    np.testing.assert_array_equal(weights.numpy().sum(1), features["target_in_length"].numpy())
    assert info["source_vocab"].size <= 500 and info["target_vocab"].size <= 500


def test_unknown_batching_raises():
    with pytest.raises(ValueError, match="batching"):
        lm.datasets(dataclasses.replace(LM_CONFIG, batching="sorted"))
    with pytest.raises(ValueError, match="cell"):
        lm_model.build_model(LM_CONFIG, {"vocab": tfseq.Vocab(list(tfseq.text.RESERVED))},
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
def test_lm_trains_with_finite_loss(cell, policy):
    _set_policy(policy)
    train, evaluation, info = lm.datasets(LM_CONFIG)
    model = lm_model.build_model(LM_CONFIG, info, lm_model.ModelConfig(cell=cell, hidden_dim=32))
    losses = _train_steps(model, train, 6)
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0]
    results = model.evaluate(evaluation, verbose=0, return_dict=True)
    assert np.isfinite(results["loss"])
    assert all(np.isfinite(w.numpy()).all() for w in model.weights)


@pytest.mark.slow
def test_translate_trains_under_mixed_precision():
    _set_policy("mixed_float16")
    train, _, info = translate.datasets(TRANSLATE_CONFIG)
    model = translate_model.build_model(TRANSLATE_CONFIG, info,
                                        translate_model.ModelConfig(hidden_dim=32))
    assert model.get_layer("attention").compute_dtype == "float16"
    losses = _train_steps(model, train, 4)
    assert np.isfinite(losses).all()
    assert all(np.isfinite(w.numpy()).all() for w in model.weights)


@pytest.mark.slow
def test_translate_trains_decodes_and_reloads(tmp_path):
    train, evaluation, info = translate.datasets(TRANSLATE_CONFIG)
    model = translate_model.build_model(TRANSLATE_CONFIG, info,
                                        translate_model.ModelConfig(hidden_dim=32))
    losses = _train_steps(model, train, 6)
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0]
    assert all(np.isfinite(w.numpy()).all() for w in model.weights)
    features, _, _ = next(iter(evaluation))
    ids = translate_model.greedy_decode(model, features["source"][:4],
                                        features["source_length"][:4], max_length=7,
                                        bos_id=info["bos_id"], eos_id=info["eos_id"])
    assert ids.shape == (4, 7) and ids.dtype == np.int32
    for row in ids:  # nothing after </s>
        end = np.flatnonzero(row == info["eos_id"])
        if end.size:
            assert (row[end[0] + 1:] == 0).all()
    lines = translate_model.decode_examples(model, evaluation, info, count=2)
    assert len(lines) == 6 and lines[0].startswith("source:")
    assert translate_model.decode_examples(model, evaluation.take(0), info) == [
        "(no held-out examples to decode)"]
    path = str(tmp_path / "translate.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded(features).numpy(), model(features).numpy())


def test_lm_on_packed_batches_targets_stay_in_segments_and_train():
    config = dataclasses.replace(LM_CONFIG, batching="pack", block_length=64, max_tokens=512)
    train, _, info = lm.datasets(config)
    segments = 0
    for features, targets, weights in train:
        ids, seg = features["ids"].numpy(), features["ids_segment_ids"].numpy()
        assert ids.shape[1] == 64
        w = weights.numpy() > 0
        # A target exists only where the next token is in the same segment, and equals it.
        same = np.concatenate([(seg[:, 1:] == seg[:, :-1]) & (seg[:, :-1] > 0),
                               np.zeros((seg.shape[0], 1), bool)], axis=1)
        np.testing.assert_array_equal(w, same)
        np.testing.assert_array_equal(targets.numpy()[:, :-1][w[:, :-1]], ids[:, 1:][w[:, :-1]])
        segments += int(features["ids_resets"].numpy().sum())
    counter = info["counters"]["train"]
    kept = counter.seen()["lines_read"] - sum(counter.drops().values())
    assert segments == kept
    model = lm_model.build_model(config, info, lm_model.ModelConfig(hidden_dim=32))
    losses = _train_steps(model, train, 6)
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
