"""pipelines.ctr and models.ctr: synthetic MultiSlot CTR data, wide & deep over ragged slots."""

import math

import numpy as np
import pytest
import tensorflow as tf

from conftest import to_python
from tfseq.models import ctr as ctr_model
from tfseq.pipelines import ctr


def test_auc_by_ranks():
    assert ctr.auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
    assert ctr.auc([0, 1], [0.5, 0.5]) == 0.5
    assert ctr.auc([0, 1, 1], [0.9, 0.2, 0.1]) == 0.0
    assert math.isnan(ctr.auc([1, 1], [0.1, 0.2]))


def test_generate_is_seeded_and_well_formed(tmp_path):
    a = ctr.generate(str(tmp_path / "a"), num_files=2, examples_per_file=30, eval_examples=20,
                     seed=7)
    b = ctr.generate(str(tmp_path / "b"), num_files=2, examples_per_file=30, eval_examples=20,
                     seed=7)
    assert [p.rsplit("/", 1)[1] for p in a["train_files"]] == ["train-0000.txt", "train-0001.txt"]
    for x, y in zip(a["train_files"] + a["eval_files"], b["train_files"] + b["eval_files"]):
        assert open(x).read() == open(y).read()
    assert a["oracle_auc"] == b["oracle_auc"]
    first = open(a["train_files"][0]).readline().split()
    assert first[0] == "1" and first[1] in ("0", "1")      # click: dense (1,)
    assert first[2:4][0] == "1"                             # user: one id
    assert first[-4] == "3"                                 # stats: 3 floats at the end


def test_datasets_count_bad_lines(tmp_path):
    generated = ctr.generate(str(tmp_path), num_files=2, examples_per_file=20, eval_examples=10,
                             seed=1, bad_lines_per_file=3)
    config = ctr.Config(files=tuple(generated["train_files"]),
                        eval_files=tuple(generated["eval_files"]), batch_size=8)
    data = ctr.TASK.datasets(config)
    train, evals, info = data.train, data.eval, data.state
    features, labels = train.element_spec
    assert isinstance(features["history"], tf.RaggedTensorSpec)
    assert features["stats"] == tf.TensorSpec([None, 3], tf.float32)
    assert labels == tf.TensorSpec([None], tf.float32)
    assert "click" not in features
    assert sum(int(b[1].shape[0]) for b in train) == 40
    assert sum(int(b[1].shape[0]) for b in evals) == 10
    counter = data.counters["train"]
    assert counter.seen() == {"lines_read": 46}
    assert counter.drops() == {"bad_count": 0, "count_too_large": 0, "dense_size": 2,
                               "extra_tokens": 0, "missing_slot": 2, "non_numeric": 2}
    with pytest.raises(ValueError, match=r"needs Config.eval_files"):
        ctr.TASK.datasets(ctr.Config(files=("x",)))


def test_pooled_embedding_mean_and_sum():
    ids = tf.ragged.constant([[0, 1], [], [3, 3, 4]], tf.int64)
    for combiner, want in [("sum", [[3.0, 30.0], [0.0, 0.0], [4.0, 40.0]]),
                           ("mean", [[1.5, 15.0], [0.0, 0.0], [4.0 / 3, 40.0 / 3]])]:
        layer = ctr_model.PooledEmbedding(3, 2, combiner)
        layer.build(None)
        layer.table.assign([[1.0, 10.0], [2.0, 20.0], [0.0, 0.0]])
        # rows: id mod 3 -> [0, 1], [], [0, 0, 1]
        np.testing.assert_allclose(to_python(layer(ids)), want, rtol=1e-6)
    with pytest.raises(ValueError, match=r"combiner must be one of"):
        ctr_model.PooledEmbedding(3, 2, "max")


def test_model_shapes_and_few_steps():
    info = {"slots": ctr.SLOTS, "label": "click"}
    model = ctr_model.build_model(None, info, ctr_model.ModelConfig(buckets=101, wide_buckets=101))
    features = {
        "user": tf.ragged.constant([[1], [2], [3]], tf.int64),
        "item": tf.ragged.constant([[5], [6], [7]], tf.int64),
        "category": tf.ragged.constant([[1, 2], [3], [4]], tf.int64),
        "query": tf.ragged.constant([[], [9, 8, 7], [1]], tf.int64),
        "history": tf.ragged.constant([[5, 6], [], []], tf.int64),
        "stats": tf.constant([[0.1, 0.2, 0.3], [0.0, 0.0, 0.0], [1.0, -1.0, 0.5]]),
    }
    assert model.predict(features, verbose=0).shape == (3,)
    ds = tf.data.Dataset.from_tensors((features, tf.constant([1.0, 0.0, 1.0]))).repeat(3)
    history = model.fit(ds, epochs=1, verbose=0)
    assert math.isfinite(history.history["loss"][0])
    assert 0.0 <= history.history["auc"][0] <= 1.0


@pytest.mark.slow
def test_a_few_hundred_steps_learn_the_signal(tmp_path):
    config = ctr.Config(data_dir=str(tmp_path), num_files=2, examples_per_file=5000,
                        eval_examples=3000, batch_size=64)
    data = ctr.TASK.datasets(config)
    train, evals, info = data.train, data.eval, data.state
    model = ctr_model.build_model(config, info)
    model.fit(train, epochs=2, verbose=0)             # 2 x 157 steps
    result = model.evaluate(evals, verbose=0, return_dict=True)
    assert result["auc"] > 0.65, (result, info["oracle_auc"])
    assert info["oracle_auc"] > result["auc"] - 0.02
