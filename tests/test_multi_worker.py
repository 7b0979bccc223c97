"""ReplicaTrainer under MultiWorkerMirroredStrategy: two worker processes on localhost.

Each worker reads its own, uneven shard (30 and 15 examples, batches of 4: 8 and 4 steps of
real data); both must step 8 times, every example must be trained on once across the workers,
and the weights must equal those of one process with 2 replicas fed the same parts.
(``tfseq-train --strategy=multi_worker``'s two workers: tests/test_resume.py's report test.)
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = [list(range(0, 30)), list(range(30, 45))]


def child(role, out_path):
    import tfseq

    strategy = (tfseq.distribute.multi_worker_strategy() if role == "worker"
                else tfseq.mirrored_strategy(2))
    import keras
    import tensorflow as tf

    from tfseq.training import ReplicaTrainer, trainer_input_context

    def make_dataset(num_shards, shard_index):
        assert num_shards == 2
        ids = tf.constant(SHARDS[shard_index], tf.int64)
        return tf.data.Dataset.from_tensor_slices(ids).map(
            lambda i: {"ids": tf.fill([tf.cast(i % 5 + 1, tf.int32)], tf.cast(i + 1, tf.int32)),
                       "ids_length": tf.cast(i % 5 + 1, tf.int32)})

    def to_keras(part):
        return {"ids": part["ids"]}, part["ids"][:, 0] % 2, part["weight"]

    dataset_fn = tfseq.replica_dataset_fn(make_dataset, lambda n: tfseq.pad_batch(4 * n),
                                          map_fn=to_keras)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        inputs = keras.Input((None,), dtype="int32", name="ids")
        x = keras.layers.Embedding(50, 4)(inputs)
        x = keras.layers.GlobalAveragePooling1D()(x)
        model = keras.Model({"ids": inputs}, keras.layers.Dense(2)(x))
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=tfseq.GlobalWeightedLoss(
            keras.losses.SparseCategoricalCrossentropy(from_logits=True)))
    seen, losses = [], []

    def on_batch(parts):
        for features, _, weight in parts:
            rows = features["ids"].numpy()[weight.numpy() > 0]
            seen.extend(int(r[0]) - 1 for r in rows)

    if role == "worker":
        trainer = ReplicaTrainer(model, strategy, dataset_fn(trainer_input_context(strategy)),
                                 model_dir=None, on_batch=on_batch,
                                 on_step=lambda step, logs: losses.append(logs["loss"]))
        result = trainer.fit(1, verbose=0)
        steps = result.steps_done
    else:  # the reference: both shards' parts side by side on 2 local replicas
        trainer = ReplicaTrainer(model, strategy, dataset_fn(
            tf.distribute.InputContext(2, 0, 2)), model_dir=None)
        shards = [list(dataset_fn(tf.distribute.InputContext(2, i, 2))) for i in range(2)]
        steps = max(len(s) for s in shards)
        for shard in shards:
            while len(shard) < steps:
                x, y, w = shard[-1]
                shard.append((x, y, tf.zeros_like(w)))
        for step in range(steps):
            parts = (shards[0][step], shards[1][step])
            on_batch(parts)
            losses.append(trainer._train_step(parts)["loss"])
    with open(out_path, "w") as f:
        json.dump({"steps": steps, "seen": seen, "losses": losses,
                   "weights": [w.tolist() for w in model.get_weights()]}, f)


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_workers_step_equally_and_match_a_two_replica_process(tmp_path):
    workers = [f"localhost:{free_port()}", f"localhost:{free_port()}"]
    processes = []
    try:
        for index in range(2):
            tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
                   "TF_CONFIG": json.dumps(tf_config)}
            processes.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "worker", str(tmp_path / f"{index}.json")],
                env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{index}.log", "w"),
                start_new_session=True))
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        env.pop("TF_CONFIG", None)
        processes.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "reference", str(tmp_path / "ref.json")],
            env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "ref.log", "w"),
            start_new_session=True))
        for i, p in enumerate(processes):
            assert p.wait(timeout=150) == 0, (tmp_path / ["0.log", "1.log", "ref.log"][i]).read_text()[-3000:]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=20)
    got = [json.loads((tmp_path / f"{name}.json").read_text()) for name in ("0", "1", "ref")]
    assert [g["steps"] for g in got] == [8, 8, 8]  # the short shard steps with dummy parts
    assert sorted(got[0]["seen"]) == SHARDS[0] and sorted(got[1]["seen"]) == SHARDS[1]
    assert sorted(got[2]["seen"]) == list(range(45))
    assert all(np.isfinite(g["losses"]).all() for g in got)
    for worker in got[:2]:
        for w, ref in zip(worker["weights"], got[2]["weights"]):
            np.testing.assert_allclose(w, ref, atol=1e-5)


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2])
