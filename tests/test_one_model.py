"""One model per task: padded, ragged and packed batches give the same per-example function,
and training metrics count real examples (segments) only."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfseq
from tfseq.layers import AttentionPooling
from tfseq.model_inputs import ModelFeatures
from tfseq.models import classifier, lm as lm_model
from tfseq.pipelines import classify
from tfseq.pipelines.state import TaskState
from tfseq.training import Trainer

VOCAB = tfseq.Vocab(list(tfseq.text.RESERVED) + [f"w{i}" for i in range(30)])

LABELS = ("a", "b", "c", "d", "e")

# 7 examples of lengths 1..9 (ids >= 4 are real words).
EXAMPLES = [[5, 6, 7], [8], [9, 10, 11, 12, 13, 14, 15, 16, 17], [18, 19], [20, 21, 22, 23],
            [24, 25, 26, 27, 28, 29], [30, 31, 32, 33, 5]]


@dataclasses.dataclass(frozen=True)
class _Config:
    max_segments: int = 4


def _packed(block_length=12, batch_size=2, max_segments=4):
    """The EXAMPLES packed by tfseq.pack, as the classify pipeline hands them to Keras (its
    ``ModelFeatures``), with label = the example's index."""
    ds = tf.data.Dataset.from_tensors({
        "ids": tf.ragged.constant(EXAMPLES, tf.int32),
        "label": tf.range(len(EXAMPLES), dtype=tf.int32)})
    ds = ds.apply(tfseq.pack(block_length, batch_size=batch_size, max_segments=max_segments,
                             long_examples="truncate"))
    return [classify.TASK.features(b) for b in ds]


def _padded():
    return tf.ragged.constant(EXAMPLES, tf.int32).to_tensor()


def _padded_features():
    """The EXAMPLES as one padded batch, as the classify pipeline hands it to Keras."""
    lengths = tf.constant([len(e) for e in EXAMPLES], tf.int32)
    features, _, _ = classify.TASK.features({"ids": _padded(), "ids_length": lengths,
                                             "label": tf.range(len(EXAMPLES))})
    return features


def test_model_features_of_padded_and_packed_classify_batches():
    features = classify.TASK.features
    assert features == ModelFeatures(("ids",), "label")
    x, y, w = features({"ids": [[5, 6, 7], [8, 0, 0]], "ids_length": [3, 1], "label": [3, 1]})
    assert {k: v.numpy().tolist() for k, v in x.items()} == {
        "ids": [[5, 6, 7], [8, 0, 0]], "ids_length": [3, 1]}
    assert y.numpy().tolist() == [3, 1]
    assert w.dtype == tf.float32 and w.numpy().tolist() == [1.0, 1.0]
    packed = {"ids": [[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]],
              "ids_segment_ids": [[1, 1, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1]],
              "ids_resets": [[True, False, True, True, False, False],
                             [True, False, False, False, False, False]],
              "label": [[4, 0, 2, 0], [1, 0, 0, 0]]}
    x, y, w = features(packed)
    assert {k: v.numpy().tolist() for k, v in x.items()} == {
        "ids": [[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]],
        "ids_segment_ids": [[1, 1, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1]],
        "ids_resets": [[1, 0, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]]}
    assert x["ids_resets"].dtype == tf.int32
    assert y.numpy().tolist() == [[4, 0, 2, 0], [1, 0, 0, 0]]
    assert w.numpy().tolist() == [[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    # A split_batch part's dummy rows (weight 0) weigh nothing.
    _, _, w = features({**packed, "weight": [1.0, 0.0]})
    assert w.numpy().tolist() == [[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]


def _classifier(dropout=0.1):
    keras.utils.set_random_seed(3)
    return classifier.build_model(_Config(), TaskState({"vocab": VOCAB}, {"label": LABELS}),
                                  classifier.ModelConfig(embedding_dim=8, hidden_dim=6,
                                                         dropout=dropout))


def test_classifier_gives_each_example_the_same_logits_padded_ragged_and_packed():
    model = _classifier()
    padded = model(_padded_features()).numpy()
    assert padded.shape == (7, 5)
    ragged = model({"ids": tf.ragged.constant(EXAMPLES, tf.int32)}).numpy()
    np.testing.assert_allclose(ragged, padded, atol=1e-5)
    seen = []
    batches = _packed()
    # Several examples share a row: the test exercises packing, not one example per row.
    assert len(batches) < 7 and max(int(tf.reduce_sum(w)) for _, _, w in batches) >= 3
    for features, labels, weights in batches:
        logits = model(features).numpy()
        assert logits.shape[1:] == (4, 5)
        for row, col in zip(*np.nonzero(weights.numpy())):
            example = int(labels[row, col])
            seen.append(example)
            np.testing.assert_allclose(logits[row, col], padded[example], atol=1e-5)
    assert sorted(seen) == list(range(7))


@pytest.mark.slow
def test_classifier_is_one_model_for_every_batching_and_saves(tmp_path):
    model = _classifier()
    assert [type(layer).__name__ for layer in model.layers] == [
        "Embedding", "ResettableRNN", "Dropout", "AttentionPooling", "Dense"]
    path = str(tmp_path / "clf.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    features = _packed()[0][0]
    np.testing.assert_allclose(loaded(features).numpy(), model(features).numpy(), atol=1e-6)
    np.testing.assert_allclose(loaded({"ids": _padded()}).numpy(),
                               model({"ids": _padded()}).numpy(), atol=1e-6)


def test_lm_gives_each_token_the_same_log_probabilities_padded_and_packed():
    keras.utils.set_random_seed(4)
    model = lm_model.build_model(None, TaskState({"vocab": VOCAB}),
                                 lm_model.ModelConfig(embedding_dim=8, hidden_dim=6))
    lengths = tf.constant([len(e) for e in EXAMPLES], tf.int32)
    padded = tf.nn.log_softmax(model({"ids": _padded(), "ids_length": lengths})).numpy()
    ds = tf.data.Dataset.from_tensors({"ids": tf.ragged.constant(EXAMPLES, tf.int32)})
    seen = 0
    for batch in ds.apply(tfseq.pack(12, batch_size=2, long_examples="truncate")):
        features = {"ids": batch["ids"], "ids_segment_ids": batch["ids_segment_ids"],
                    "ids_resets": tf.cast(batch["ids_resets"], tf.int32)}
        packed = tf.nn.log_softmax(model(features)).numpy()
        ids, segments = batch["ids"].numpy(), batch["ids_segment_ids"].numpy()
        for row in range(ids.shape[0]):
            for segment in set(segments[row]) - {0}:
                steps = np.nonzero(segments[row] == segment)[0]
                example = EXAMPLES.index(ids[row, steps].tolist())
                np.testing.assert_allclose(packed[row, steps],
                                           padded[example, :len(steps)], atol=1e-5)
                seen += 1
    assert seen == 7


def test_segment_pooling_in_half_precision_has_no_nan_and_zero_empty_columns():
    for dtype in ("float16", "bfloat16"):
        pool = AttentionPooling(dtype=keras.DTypePolicy(f"mixed_{dtype}"))
        values = tf.constant([[[1.0, 2.0], [3.0, 4.0], [6e4, 6e4], [5.0, 6.0]]])
        out = pool(values, segment_ids=tf.constant([[1, 1, 0, 2]]), num_segments=3)
        out = tf.cast(out, tf.float32).numpy()
        assert out.shape == (1, 3, 2) and np.isfinite(out).all()
        np.testing.assert_allclose(out[0, 1], [5.0, 6.0], rtol=1e-2)  # one step: itself
        assert 1.0 <= out[0, 0, 0] <= 3.0 and 2.0 <= out[0, 0, 1] <= 4.0  # pad 6e4 not mixed in
        assert out[0, 2].tolist() == [0.0, 0.0]  # a column the row does not hold


def _fixed_classifier():
    """A classifier that does not learn (learning rate 0, no dropout): fixed predictions."""
    model = _classifier(dropout=0.0)
    model.compile(optimizer=keras.optimizers.SGD(0.0),
                  loss=tfseq.GlobalWeightedLoss(
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
                  weighted_metrics=["accuracy"])
    return model


@pytest.mark.slow
def test_packed_training_accuracy_counts_real_segments_over_the_epoch():
    model = _fixed_classifier()
    batches = _packed(block_length=12, batch_size=2)
    # Label every real segment with the model's own prediction, except in the last batch,
    # where every real segment is labelled wrong: the epoch's accuracy is the share of real
    # segments outside the last batch. Reporting the last batch alone would give 0.0.
    labelled = []
    for index, (features, _, weights) in enumerate(batches):
        predicted = tf.argmax(model(features), axis=-1, output_type=tf.int32)
        labels = (predicted + 1) % 5 if index == len(batches) - 1 else predicted
        labelled.append((features, labels, weights))
    real = [float(tf.reduce_sum(w)) for _, _, w in labelled]
    assert real[-1] > 0 and sum(real) == 7.0
    ds = tf.data.Dataset.from_tensors(labelled[0])
    for batch in labelled[1:]:
        ds = ds.concatenate(tf.data.Dataset.from_tensors(batch))
    result = Trainer(model, ds, model_dir=None).fit(1, verbose=0)
    expected = (7.0 - real[-1]) / 7.0
    assert result.history[0]["accuracy"] == pytest.approx(expected, abs=1e-6)
    assert result.history[0]["accuracy"] > 0.0
