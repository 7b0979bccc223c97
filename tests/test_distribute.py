"""Tests for tfseq.distribute: replica datasets, global loss scaling, tf.data service."""

import json
import os
import subprocess
import sys

import keras
import pytest
import tensorflow as tf
from conftest import to_list

from tfseq.distribute import (GlobalWeightedLoss, global_weighted_mean, mirrored_strategy,
                              replica_dataset_fn, to_replicas, use_data_service)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_dataset(num_shards, shard_index):
    """11 examples: ids [k] * (k % 4 + 1) for k = 1..11, label k, sharded."""
    rows = [[k] * (k % 4 + 1) for k in range(1, 12)]
    ds = tf.data.Dataset.from_tensor_slices(
        {"ids": tf.ragged.constant(rows), "label": tf.range(1, 12)})
    if num_shards > 1:
        ds = ds.shard(num_shards, shard_index)
    return ds.map(
        lambda ex: {**ex, "ids_length": tf.size(ex["ids"])})


def padded_batch_fn(per_replica):
    return lambda replicas: (lambda ds: ds.padded_batch(per_replica * replicas))


def context(pipelines, pipeline_id, replicas):
    return tf.distribute.InputContext(num_input_pipelines=pipelines,
                                      input_pipeline_id=pipeline_id,
                                      num_replicas_in_sync=replicas)


def test_one_worker_two_replicas_parts_in_order():
    fn = replica_dataset_fn(make_dataset, padded_batch_fn(3), equal_rows=False)
    got = to_list(fn(context(1, 0, 2)))
    # Global batches of 6 (labels 1-6, 7-11) split 3+3 and 3+2, parts one after another.
    assert [(p["label"], p["weight"]) for p in got] == [
        ([1, 2, 3], [1.0, 1.0, 1.0]), ([4, 5, 6], [1.0, 1.0, 1.0]),
        ([7, 8, 9], [1.0, 1.0, 1.0]), ([10, 11], [1.0, 1.0])]
    assert got[3]["ids"] == [[10, 10, 10, 0], [11, 11, 11, 11]]


def test_equal_rows_default_gives_equal_shapes():
    fn = replica_dataset_fn(make_dataset, padded_batch_fn(3))
    got = to_list(fn(context(1, 0, 2)))
    assert [(p["label"], p["weight"]) for p in got[2:]] == [
        ([7, 8, 9], [1.0, 1.0, 1.0]), ([10, 11, 0], [1.0, 1.0, 0.0])]
    assert got[3]["ids"] == [[10, 10, 10, 0], [11, 11, 11, 11], [0, 0, 0, 0]]


def test_shard_by_files_two_workers_exactly_once():
    fn = replica_dataset_fn(make_dataset, padded_batch_fn(2), balance="tokens",
                            map_fn=lambda p: (p["label"], p["weight"]))
    labels = []
    for worker in range(2):
        got = to_list(fn(context(2, worker, 4)))
        assert len(got) % 2 == 0                      # whole steps for its 2 replicas
        labels += [k for y, w in got for k, wk in zip(y, w) if wk == 1.0]
    assert sorted(labels) == list(range(1, 12))


def test_shard_by_batches_equal_steps_on_every_worker():
    fn = replica_dataset_fn(make_dataset, padded_batch_fn(2), shard_by="batches",
                            equal_rows=False)
    per_worker = [to_list(fn(context(2, worker, 4))) for worker in range(2)]
    # Global batches of 8 (labels 1-8, 9-11) over 4 replicas: worker 0 keeps parts 0, 1.
    assert [p["label"] for p in per_worker[0]] == [[1, 2], [3, 4], [9], [10]]
    assert [p["label"] for p in per_worker[1]] == [[5, 6], [7, 8], [11], [0]]
    assert [p["weight"] for p in per_worker[1]] == [[1.0, 1.0], [1.0, 1.0], [1.0], [0.0]]


def test_global_weighted_mean_single_replica():
    values = tf.constant([[1.0, 3.0], [5.0, 7.0], [100.0, 100.0]])
    assert float(global_weighted_mean(values, tf.constant([1.0, 1.0, 0.0]))) == 4.0
    assert float(global_weighted_mean(values[:2])) == 4.0
    assert float(global_weighted_mean(values, tf.zeros([3]))) == 0.0


def test_global_weighted_loss_ignores_zero_weight_rows():
    loss = GlobalWeightedLoss(keras.losses.MeanSquaredError())
    y_true = tf.constant([[0.0], [0.0], [0.0]])
    y_pred = tf.constant([[1.0], [3.0], [50.0]])
    assert float(loss(y_true, y_pred, sample_weight=tf.constant([1.0, 1.0, 0.0]))) == 5.0
    assert float(loss(y_true[:2], y_pred[:2])) == 5.0


def test_global_weighted_loss_per_token_weights_and_config():
    loss = GlobalWeightedLoss("sparse_categorical_crossentropy")
    y_true = tf.constant([[0, 1], [1, 0]])
    y_pred = tf.constant([[[1.0, 0.0], [0.5, 0.5]], [[0.5, 0.5], [0.5, 0.5]]])
    # Token weights: row 0 both tokens, row 1 is a dummy: mean of -log(1), -log(0.5).
    value = loss(y_true, y_pred, sample_weight=tf.constant([1.0, 0.0]))
    assert float(value) == pytest.approx(0.34657, abs=1e-4)
    clone = GlobalWeightedLoss.from_config(loss.get_config())
    assert clone.name == loss.name == "global_sparse_categorical_crossentropy"
    assert float(clone(y_true, y_pred, sample_weight=tf.constant([1.0, 0.0]))) == float(value)


def test_mirrored_strategy_after_initialisation():
    tf.constant(0)  # TensorFlow is initialised with one CPU device in this process
    assert mirrored_strategy(1).num_replicas_in_sync == 1
    with pytest.raises(RuntimeError, match="call mirrored_strategy before"):
        mirrored_strategy(3)


def test_to_replicas_one_part_per_replica():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    values = to_replicas(strategy, ({"label": tf.constant([4, 5])},))
    assert [v["label"].numpy().tolist() for v in
            strategy.experimental_local_results(values)] == [[4, 5]]
    with pytest.raises(ValueError, match="2 parts for 1 replicas"):
        to_replicas(strategy, ({"label": tf.constant([1])}, {"label": tf.constant([2])}))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"make_dataset": None}, TypeError, "make_dataset"),
    ({"batch_fn": 3}, TypeError, "batch_fn"),
    ({"shard_by": "lines"}, ValueError, "shard_by"),
    ({"balance": "rows"}, ValueError, "balance"),
    ({"map_fn": "x"}, TypeError, "map_fn"),
    ({"shard_by": "batches", "data_service": "grpc://localhost:1"}, ValueError, "data_service"),
])
def test_replica_dataset_fn_errors(kwargs, error, match):
    args = {"make_dataset": make_dataset, "batch_fn": padded_batch_fn(1), **kwargs}
    with pytest.raises(error, match=match):
        replica_dataset_fn(args.pop("make_dataset"), args.pop("batch_fn"), **args)


@pytest.mark.parametrize("service, mode, error", [
    (5050, "distributed_epoch", TypeError), ("localhost:5050", "distributed_epoch", ValueError),
    ("grpc://localhost:5050", "one_epoch", ValueError)])
def test_use_data_service_errors(service, mode, error):
    with pytest.raises(error):
        use_data_service(tf.data.Dataset.range(3), service, processing_mode=mode)


@pytest.fixture
def data_service():
    """A dispatcher and two workers on localhost (free ports), stopped afterwards."""
    service = tf.data.experimental.service
    dispatcher = service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    workers = [service.WorkerServer(service.WorkerConfig(dispatcher_address=address))
               for _ in range(2)]
    yield dispatcher.target
    for worker in workers:
        worker.stop()
    dispatcher.stop()


def test_data_service_distributed_epoch_exactly_once(data_service):
    ds = use_data_service(tf.data.Dataset.range(200).map(lambda k: k * 10), data_service)
    assert sorted(to_list(ds)) == [k * 10 for k in range(200)]


def test_replica_dataset_fn_through_data_service(data_service):
    def batch_fn(replicas):
        def apply(ds):
            # Marks each global batch (built on a service worker) by its smallest label.
            ds = ds.padded_batch(2 * replicas)
            return ds.map(lambda b: {**b, "batch": tf.fill(tf.shape(b["label"]),
                                                            tf.reduce_min(b["label"]))})
        return apply

    fn = replica_dataset_fn(make_dataset, batch_fn, balance="tokens",
                            data_service=data_service)
    got = to_list(fn(context(1, 0, 2)))
    assert len(got) % 2 == 0
    assert all(len(got[i]["weight"]) == len(got[i + 1]["weight"]) for i in range(0, len(got), 2))
    labels = [k for p in got for k, w in zip(p["label"], p["weight"]) if w == 1.0]
    assert sorted(labels) == list(range(1, 12))
    # Consecutive parts are the two halves of one global batch (aligned with the replicas).
    for i in range(0, len(got), 2):
        marks = {m for p in got[i:i + 2] for m, w in zip(p["batch"], p["weight"]) if w == 1.0}
        assert len(marks) == 1


@pytest.mark.slow
def test_model_fit_on_four_logical_cpus_matches_one_device(tmp_path):
    out = tmp_path / "report.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "multi_replica_fit.py"),
                    str(out), "4"], env=env, check=True, timeout=600,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    report = json.loads(out.read_text())
    steps = report["rows_per_step"]
    # 1,003 examples in bucketed global batches of uneven sizes: every step feeds all four
    # replicas a non-empty part of equal shape, and model.fit ran exactly those steps.
    assert len(steps) == len(report["global_batch_labels"]) == report["fit_steps"]
    assert all(len(rows) == 4 and min(rows) >= 1 and len(set(rows)) == 1 for rows in steps)
    assert min(len(b) for b in report["global_batch_labels"]) == 1  # 3 all-dummy parts
    assert sum(part == [] for parts in report["labels_per_step"] for part in parts) == 3
    # Each step's replicas hold exactly the examples of one global batch.
    for replicas, batch in zip(report["labels_per_step"], report["global_batch_labels"]):
        assert sorted(k for part in replicas for k in part) == sorted(batch)
    assert sum(len(b) for b in report["global_batch_labels"]) == 1003
    # Same updates as one device on the unsplit batches; the training moved the weights.
    assert report["max_weight_change"] > 1e-2
    assert report["max_weight_diff"] < 1e-5
    assert report["multi_weights_eval"] == pytest.approx(report["multi_eval"], rel=1e-5)
    assert report["multi_loss"] == pytest.approx(report["single_loss"], rel=2e-3)
