"""ReplicaTrainer: a --num_replicas=2 run stopped by SIGTERM mid-epoch resumes exactly once.

The runs need 2 logical CPU devices, which TensorFlow allows only before it initialises, so
they happen in a fresh process (this file run as a script) and report the ids they trained on.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_EXAMPLES = 120


def run_all(out_path, tmp_dir):
    """In the child: for bucket and pack, a full 2-epoch run, then a run SIGTERMed at step 3
    of epoch 1 and resumed; writes the tokens each step trained on."""
    import tfseq

    strategy = tfseq.mirrored_strategy(2)
    import keras
    import tensorflow as tf

    from tfseq.training import ReplicaTrainer

    def make_dataset(num_shards, shard_index):
        ds = tf.data.Dataset.range(NUM_EXAMPLES).map(
            lambda i: {"ids": tf.fill([tf.cast(i % 9 + 1, tf.int32)], tf.cast(i + 1, tf.int32))})
        ds = ds.shard(num_shards, shard_index)
        return ds.shuffle(64, seed=5, reshuffle_each_iteration=True)

    batch_fns = {
        "bucket": lambda n: tfseq.bucket_by_length(max_tokens=24 * n, batch_multiple=n,
                                                   pool_size=32, seed=3),
        "pack": lambda n: tfseq.pack(12, batch_size=2 * n),
    }

    def to_keras(part):
        ids = part["ids"]
        return {"ids": ids}, ids[:, 0] % 2, part["weight"]

    def make_model():
        with strategy.scope():
            inputs = keras.Input((None,), dtype="int32", name="ids")
            x = keras.layers.Embedding(NUM_EXAMPLES + 2, 4)(inputs)
            x = keras.layers.GlobalAveragePooling1D()(x)
            model = keras.Model({"ids": inputs}, keras.layers.Dense(2)(x))
            model.compile(optimizer="adam", loss=tfseq.GlobalWeightedLoss(
                keras.losses.SparseCategoricalCrossentropy(from_logits=True)))
        return model

    def run(batching, model_dir, epochs_log, kill_at=None):
        parts_ds = tfseq.replica_dataset_fn(make_dataset, batch_fns[batching], map_fn=to_keras)(
            tf.distribute.InputContext(1, 0, 2))

        shapes = set()

        def on_batch(parts):
            tokens = []
            for x, _, w in parts:
                shapes.add(tuple(x["ids"].shape))
                rows = x["ids"].numpy()[w.numpy() > 0]
                tokens.extend(int(t) for t in rows.reshape(-1) if t)
            epochs_log[-1].append(tokens)

        def on_step(step, logs):
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGTERM)

        def next_epoch(epoch):
            epochs_log.append([])
            return {}

        trainer = ReplicaTrainer(make_model(), strategy, parts_ds, model_dir=model_dir,
                                 checkpoint_every=2, on_batch=on_batch, on_step=on_step)
        trainer.restore()
        result = trainer.fit(2, verbose=0, eval_fn=next_epoch)
        return result, trainer, shapes

    out = {}
    for batching in batch_fns:
        full = [[]]
        result, trainer, shapes = run(batching, os.path.join(tmp_dir, batching, "full"), full)
        cut = [[]]
        part, _, _ = run(batching, os.path.join(tmp_dir, batching, "cut"), cut, kill_at=3)
        rest, resumed, _ = run(batching, os.path.join(tmp_dir, batching, "cut"), cut)
        out[batching] = {
            "full": full[:2], "cut": cut[:2], "full_steps": result.steps_done,
            "traces": trainer._step.experimental_get_tracing_count(),
            "shapes": len(shapes),
            "interrupted": [part.interrupted, part.steps_done, rest.interrupted,
                            rest.steps_done]}
    with open(out_path, "w") as f:
        json.dump(out, f)


@pytest.mark.slow
def test_two_replica_run_killed_mid_epoch_resumes_exactly_once(tmp_path):
    out = tmp_path / "out.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    subprocess.run([sys.executable, os.path.abspath(__file__), str(out), str(tmp_path)],
                   env=env, check=True, timeout=240, stdout=subprocess.DEVNULL)
    got = json.loads(out.read_text())
    every_token = sorted(k + 1 for k in range(NUM_EXAMPLES) for _ in range(k % 9 + 1))
    for batching in ("bucket", "pack"):
        run = got[batching]
        full_epoch1, full_epoch2 = run["full"]
        for epoch in run["full"]:
            assert sorted(t for step in epoch for t in step) == every_token, batching
        assert full_epoch1 != full_epoch2  # reshuffled
        steps = run["full_steps"] // 2
        # The step is traced once, on the stream's relaxed spec, whatever the parts' shapes.
        assert (run["traces"], run["shapes"]) == ((1, 8) if batching == "bucket" else (1, 2))
        # Stopped by SIGTERM after step 3, resumed to the end of epoch 2.
        assert run["interrupted"] == [True, 3, False, 2 * steps], batching
        # The interrupted epoch: the same parts in the same order, nothing lost or repeated.
        assert run["cut"][0] == full_epoch1, batching
        # The next epoch is reshuffled (from the seed state of this process), exactly once.
        assert sorted(t for step in run["cut"][1] for t in step) == every_token, batching


if __name__ == "__main__":
    run_all(sys.argv[1], sys.argv[2])
