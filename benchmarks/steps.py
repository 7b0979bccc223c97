r"""What Python costs per training step: ``Trainer`` steps/s with several steps per call.

Usage:
  python -m benchmarks.steps --steps_per_execution=1,4,16,64 --json_out=bench_out/steps.json

A small model (embedding 16, masked mean, dense) on ``bucket_by_length`` batches of synthetic
examples (lengths 1..64, ``max_tokens`` 1024): its step is short, so the loop's Python per step
(taking the batch, ``train_on_batch``, reading the logs and counts back) is what a fast device
would wait on. One epoch per value after a warm-up epoch (the traces), best of ``--repeats``;
steps/s and examples/s, and the ratio to one step per call.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from benchmarks import harness  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("steps_per_execution", ["1", "4", "16", "64"], "Values to compare.")
flags.DEFINE_integer("examples", 40_000, "Synthetic examples per epoch.")
flags.DEFINE_integer("max_tokens", 1024, "Token budget per batch.")
harness.define_repeats(2, "Timed epochs per value; the best is reported.")
flags.DEFINE_boolean("jit_compile", False, "Also compile the step with XLA (static shapes).")


def dataset(seed=0):
    import numpy as np
    import tensorflow as tf

    import tfseq

    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 65, FLAGS.examples)
    ids = tf.RaggedTensor.from_row_lengths(
        rng.integers(1, 1000, int(lengths.sum())).astype("int32"), lengths)
    labels = (lengths > 32).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices({"ids": ids, "label": labels}).ragged_batch(512)
    bucket = dict(max_tokens=FLAGS.max_tokens, max_length=64, seed=1)
    if FLAGS.jit_compile:
        bucket.update(boundaries=[8, 16, 32], pad_to_boundary=True, fill_rows=True)
    features = tfseq.ModelFeatures(("ids",), "label")
    return ds.apply(tfseq.bucket_by_length(**bucket)).map(features).prefetch(
        tf.data.AUTOTUNE)


def model():
    import keras
    import tensorflow as tf

    import tfseq

    class MaskedMean(keras.layers.Layer):
        def call(self, vectors, lengths):
            mask = tf.sequence_mask(lengths, tf.shape(vectors)[1], dtype=vectors.dtype)
            return tf.reduce_sum(vectors * mask[..., None], 1) / tf.maximum(
                tf.reduce_sum(mask, 1, keepdims=True), 1.0)

    ids = keras.Input((None,), dtype="int32", name="ids")
    length = keras.Input((), dtype="int32", name="ids_length")
    mean = MaskedMean()(keras.layers.Embedding(1000, 16)(ids), length)
    m = keras.Model({"ids": ids, "ids_length": length}, keras.layers.Dense(2)(mean))
    m.compile(optimizer="adam", loss=tfseq.GlobalWeightedLoss(
        keras.losses.SparseCategoricalCrossentropy(from_logits=True)))
    return m


def main(argv):
    del argv
    from tfseq.training import Trainer

    rows = []
    for k in [int(v) for v in FLAGS.steps_per_execution]:
        trainer = Trainer(model(), dataset(), model_dir=None, steps_per_execution=k,
                          jit_compile=FLAGS.jit_compile)
        trainer.fit(1, verbose=0)  # warm-up: traces
        best = None
        for epoch in range(2, 2 + FLAGS.repeats):
            start = time.perf_counter()
            result = trainer.fit(epoch, verbose=0)
            seconds = time.perf_counter() - start
            del result
            steps = int(trainer.last_epoch_steps.numpy())
            if best is None or seconds < best[1]:
                best = (steps, seconds)
        rows.append({"steps_per_execution": k, "steps": best[0], "seconds": round(best[1], 3),
                     "steps_per_second": best[0] / best[1],
                     "examples_per_second": FLAGS.examples / best[1]})
    harness.add_ratios(rows, rows[0], vs_first="steps_per_second")
    harness.print_table(rows, [
        ("steps per call", "steps_per_execution", "d"), ("steps/s", "steps_per_second", ".0f"),
        ("examples/s", "examples_per_second", ".0f"), ("x 1 per call", "vs_first", ".2f")])
    harness.write_json({"benchmark": "steps", "jit_compile": FLAGS.jit_compile,
                        "examples": FLAGS.examples, "max_tokens": FLAGS.max_tokens,
                        "rows": rows})


if __name__ == "__main__":
    harness.run(main)
