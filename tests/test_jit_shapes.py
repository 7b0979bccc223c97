"""A jit-compiled (XLA) train step over bucketed batches: the shape budget and what it costs.

``bucket_by_length(pad_to_boundary=True, fill_rows=True)`` gives every batch one of
``Bucketer.num_shapes`` shapes; ``Trainer(jit_compile=True)`` compiles one program per shape
(``compiled_shapes`` counts them), so an epoch compiles at most that many.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfseq
from tfseq.bucketing import Bucketer
from tfseq.stats import batch_counts
from tfseq.training import Trainer

N = 300
FEATURES = tfseq.ModelFeatures(("ids",), "label")


def examples(n=N, seed=0):
    """n examples of lengths 1..60 (ids 1..50) with a label that depends on the tokens."""
    rng = np.random.default_rng(seed)
    ids = [rng.integers(1, 50, int(k)).tolist() for k in rng.integers(1, 61, n)]
    labels = [int(sum(x) / len(x) > 25) for x in ids]
    return tf.data.Dataset.from_tensor_slices(
        {"ids": tf.ragged.constant(ids, dtype=tf.int32), "label": tf.constant(labels),
         "id": tf.range(n)})


def bucketer(**kw):
    return Bucketer(max_tokens=256, boundaries=[8, 16, 32], max_length=64, seed=3, **kw)


def loss():
    # Normalised by the weights, not the row count: added rows of weight 0 change nothing.
    return tfseq.GlobalWeightedLoss(
        keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class MaskedMean(keras.layers.Layer):
    """[B, T, D] vectors, int32 [B] lengths -> [B, D], the mean over each row's real steps."""

    def call(self, vectors, lengths):
        mask = tf.sequence_mask(lengths, tf.shape(vectors)[1], dtype=vectors.dtype)[..., None]
        return tf.reduce_sum(vectors * mask, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1.0)


def model():
    ids = keras.Input((None,), dtype="int32", name="ids")
    length = keras.Input((), dtype="int32", name="ids_length")
    mean = MaskedMean()(keras.layers.Embedding(50, 8)(ids), length)
    m = keras.Model({"ids": ids, "ids_length": length}, keras.layers.Dense(2)(mean))
    m.compile(optimizer=keras.optimizers.Adam(0.01), loss=loss(),
              weighted_metrics=["accuracy"])
    return m


def test_filled_batches_have_one_shape_per_padded_length_and_every_example_once():
    b = bucketer(pad_to_boundary=True, fill_rows=True)
    assert b.padded_lengths == (8, 16, 32, 64) and b.num_shapes == 4
    shapes, ids, real, examples_counted = set(), [], 0, 0
    for batch in examples().apply(b.transform):
        shapes.add(tuple(batch["ids"].shape))
        w, lengths = batch["weight"].numpy(), batch["ids_length"].numpy()
        assert ((w == 0) == (lengths == 0)).all()  # added rows: weight 0, no token
        ids += batch["id"].numpy()[w > 0].tolist()
        real += int(lengths.sum())
        examples_counted += int(batch_counts(batch, ["ids"])[2])
    assert shapes == {(32, 8), (16, 16), (8, 32), (4, 64)}  # rows = 256 // padded length
    assert sorted(ids) == list(range(N)) and examples_counted == N
    expected_tokens = sum(len(e["ids"]) for e in examples().as_numpy_iterator())
    assert real == expected_tokens


def test_fill_rows_needs_pad_to_boundary():
    with pytest.raises(ValueError, match="fill_rows needs pad_to_boundary"):
        bucketer(fill_rows=True)


def test_added_rows_weigh_nothing_in_the_loss():
    # The same rows with and without the added ones: equal weighted loss.
    batch = next(b for b in examples().apply(bucketer(pad_to_boundary=True,
                                                      fill_rows=True).transform)
                 if b["weight"].numpy().min() == 0)
    real = {k: v[batch["weight"] > 0] for k, v in batch.items()}
    assert 0 < real["ids"].shape[0] < batch["ids"].shape[0]
    m = model()
    full = [FEATURES(batch), FEATURES(real)]
    values = [float(loss()(y, m(x), sample_weight=w)) for x, y, w in full]
    assert values[0] == pytest.approx(values[1], rel=1e-5)


def _epoch_of(b):
    return examples().shuffle(N, seed=1).apply(b.transform).map(FEATURES)


@pytest.fixture(scope="module")
def jit_run():
    """A jit-compiled Trainer over filled batches: its first epoch's result, then two epochs'
    (the second ``fit`` goes on with epoch 2), and the batch shapes it saw."""
    b = bucketer(pad_to_boundary=True, fill_rows=True)
    seen = set()
    keras.utils.set_random_seed(7)
    trainer = Trainer(model(), _epoch_of(b), model_dir=None, jit_compile=True,
                      on_batch=lambda batch: seen.add(tuple(batch[0]["ids"].shape)))
    first = trainer.fit(1, verbose=0)
    return trainer, first, trainer.fit(2, verbose=0), seen, b


def test_jit_step_compiles_once_per_shape_over_two_epochs(jit_run):
    trainer, _, result, seen, b = jit_run
    assert result.epochs_done == 2 and result.steps_done > 2 * 8
    assert trainer.compiled_shapes == len(seen) <= b.num_shapes == 4
    assert len(seen) >= 3
    assert np.isfinite(result.history[-1]["loss"])


def test_without_filled_rows_the_shapes_are_not_bounded():
    # pad_to_boundary alone: the part-filled batches bring row counts of their own, and each
    # is one more compiled program.
    b = bucketer(pad_to_boundary=True)
    trainer = Trainer(model(), _epoch_of(b), model_dir=None, jit_compile=True)
    trainer.fit(1, verbose=0)
    assert trainer.compiled_shapes > 4


def test_jit_and_plain_steps_train_the_same_model(jit_run):
    # Same weights, same batches: the compiled step gives the plain step's losses.
    _, jit, _, _, b = jit_run
    keras.utils.set_random_seed(7)
    plain = Trainer(model(), _epoch_of(b), model_dir=None).fit(1, verbose=0)
    assert jit.steps_done == plain.steps_done
    assert jit.history[0]["loss"] == pytest.approx(plain.history[0]["loss"], rel=1e-3)


def _ragged_batches(n=N):
    """The examples as ragged batches of 64 (what ``tokenize`` gives the batching stage)."""
    return examples(n).ragged_batch(64)


@pytest.mark.parametrize("mode,budget", [("pad", 1), ("bucket", 4), ("pack", 1)])
def test_static_shapes_in_every_batching_mode(mode, budget):
    # Training batches come in at most num_shapes shapes, every example once; evaluation
    # batches are not filled.
    batching = tfseq.Batching(mode, batch_size=16, max_tokens=256, max_length=60,
                              block_length=64, static_shapes=True)
    assert batching.num_shapes == budget
    seen, ids = set(), []
    for batch in _ragged_batches().apply(batching.transform(training=True, seed=1)):
        seen.add(tuple(batch["ids"].shape))
        if mode == "pack":  # one id per segment column; segments present weigh 1
            present = np.arange(batch["id"].shape[1])[None, :] < batch[
                "ids_segment_ids"].numpy().max(axis=1)[:, None]
            ids += batch["id"].numpy()[present].tolist()
        else:
            ids += batch["id"].numpy()[batch["weight"].numpy() > 0].tolist()
    assert len(seen) <= budget and sorted(ids) == list(range(N))
    assert all(shape[0] * shape[1] <= 256 or mode == "pad" for shape in seen)
    if mode == "bucket":
        assert seen <= {(32, 8), (16, 16), (8, 32), (4, 60)}
    evaluation = [tuple(b["ids"].shape) for b in _ragged_batches().apply(
        batching.transform(training=False))]
    assert len(set(evaluation)) > budget  # not filled: rows and lengths vary
    plain = tfseq.Batching(mode, batch_size=16, max_tokens=256, max_length=60,
                           block_length=64)
    assert plain.num_shapes is None


def test_static_shapes_of_a_resumable_streams_pool_batcher():
    # The binaries' stream batches a pool with pool_batches + finish: filled too.
    pool = next(iter(examples(300).ragged_batch(300)))
    for mode, expect in [("pad", {(16, 60)}), ("pack", {(4, 64)})]:
        batcher = tfseq.Batching(mode, batch_size=16, max_tokens=256, max_length=60,
                                 block_length=64, static_shapes=True).pool_batcher()
        out = batcher.pool_batches(pool, tf.constant(0, tf.int64))
        shapes = {tuple(batcher.finish(b)["ids"].shape)
                  for b in tf.data.Dataset.from_tensor_slices(out)}
        assert shapes == expect, mode


def test_padded_lengths_of_bucket_widths_and_an_unbounded_case():
    b = Bucketer(max_tokens=256, bucket_width=16, max_length=40, pad_to_boundary=True,
                 fill_rows=True)
    assert b.padded_lengths == (16, 32, 40) and b.num_shapes == 3
    # rows by a fixed batch_size and no max_length: lengths without a bound, no budget
    unbounded = Bucketer(batch_size=8, bucket_width=16, pad_to_boundary=True, fill_rows=True)
    assert unbounded.padded_lengths is None and unbounded.num_shapes is None
