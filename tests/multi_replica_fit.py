"""Subprocess for test_distribute: model.fit on N logical CPU replicas vs one device.

Logical devices must be configured before TensorFlow initialises, hence a separate process.
Usage: python tests/multi_replica_fit.py OUT.json [NUM_REPLICAS]
Writes a JSON report: per-step rows per replica, fit steps, losses and weight differences.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfseq.distribute import (GlobalWeightedLoss, mirrored_strategy,  # noqa: E402
                              replica_dataset_fn)

NUM_EXAMPLES = 1003
VOCAB = 40
CLASSES = 3


def examples():
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 30, NUM_EXAMPLES)
    ids = [rng.integers(1, VOCAB, n).tolist() for n in lengths]
    labels = rng.integers(0, CLASSES, NUM_EXAMPLES)
    return {"ids": tf.ragged.constant(ids, dtype=tf.int32), "label": tf.constant(labels, tf.int32)}


def make_dataset(num_shards, shard_index):
    ds = tf.data.Dataset.from_tensor_slices(examples())
    ds = ds.shard(num_shards, shard_index)
    return ds.map(lambda ex: {**ex, "ids_length": tf.size(ex["ids"])})


def batch_fn(num_replicas):
    """Bucketed batches of uneven sizes (not multiples of anything) for num_replicas."""
    def apply(ds):
        return ds.bucket_by_sequence_length(
            lambda ex: ex["ids_length"], bucket_boundaries=[8, 16, 24],
            bucket_batch_sizes=[7 * num_replicas + 1, 5 * num_replicas + 1,
                                3 * num_replicas + 2, 2 * num_replicas + 1])
    return apply


def to_keras(part):
    return ({"ids": part["ids"], "ids_length": part["ids_length"]}, part["label"],
            part["weight"])


class MeanByLength(keras.layers.Layer):
    def call(self, embedded, lengths):
        mask = tf.sequence_mask(lengths, tf.shape(embedded)[1], dtype=embedded.dtype)
        total = tf.reduce_sum(embedded * mask[:, :, None], axis=1)
        return total / tf.cast(tf.maximum(lengths, 1), embedded.dtype)[:, None]


def make_model():
    ids = keras.Input((None,), dtype="int32", name="ids")
    lengths = keras.Input((), dtype="int32", name="ids_length")
    embedded = keras.layers.Embedding(VOCAB, 8, embeddings_initializer="glorot_uniform")(ids)
    pooled = MeanByLength()(embedded, lengths)
    logits = keras.layers.Dense(CLASSES)(pooled)
    model = keras.Model({"ids": ids, "ids_length": lengths}, logits)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=GlobalWeightedLoss(
        keras.losses.SparseCategoricalCrossentropy(from_logits=True)))
    return model


def main(out_path, num_replicas):
    strategy = mirrored_strategy(num_replicas)
    keras.utils.set_random_seed(1)
    fn = replica_dataset_fn(make_dataset, batch_fn, balance="tokens", map_fn=to_keras)

    # Every step: rows and labels per replica, straight off the distributed iterator.
    rows_per_step, labels_per_step = [], []
    for x, y, w in strategy.distribute_datasets_from_function(fn):
        ys = strategy.experimental_local_results(y)
        rows_per_step.append([int(v.shape[0]) for v in ys])
        ws = strategy.experimental_local_results(w)
        labels_per_step.append([[int(a) for a, b in zip(yv.numpy(), wv.numpy()) if b > 0]
                                for yv, wv in zip(ys, ws)])
    # The same global batches, unsplit (one device).
    global_batches = list(make_dataset(1, 0).apply(batch_fn(num_replicas)))

    with strategy.scope():
        multi = make_model()
    single = make_model()
    single.set_weights(multi.get_weights())
    initial = [w.copy() for w in multi.get_weights()]

    class CountSteps(keras.callbacks.Callback):
        steps = 0

        def on_train_batch_end(self, batch, logs=None):
            CountSteps.steps += 1

    history = multi.fit(strategy.distribute_datasets_from_function(fn), epochs=1, verbose=0,
                        callbacks=[CountSteps()])
    single_ds = make_dataset(1, 0).apply(batch_fn(num_replicas)).map(
        lambda b: ({"ids": b["ids"], "ids_length": b["ids_length"]}, b["label"],
                   tf.ones_like(b["label"], tf.float32)))
    single_history = single.fit(single_ds, epochs=1, verbose=0)
    eval_ds = single_ds
    report = {
        "rows_per_step": rows_per_step,
        "labels_per_step": labels_per_step,
        "global_batch_labels": [b["label"].numpy().tolist() for b in global_batches],
        "fit_steps": CountSteps.steps,
        "multi_loss": history.history["loss"][0],
        "single_loss": single_history.history["loss"][0],
        "multi_eval": float(single.evaluate(eval_ds, verbose=0)),
        "max_weight_change": max(float(np.max(np.abs(a - b)))
                                 for a, b in zip(initial, single.get_weights())),
        "max_weight_diff": max(float(np.max(np.abs(a - b)))
                               for a, b in zip(multi.get_weights(), single.get_weights())),
    }
    single.set_weights(multi.get_weights())
    report["multi_weights_eval"] = float(single.evaluate(eval_ds, verbose=0))
    with open(out_path, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4)
