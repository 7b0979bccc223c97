"""Trainer: resumable exactly-once training, checkpoints on signals."""

import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfseq
from tfseq.training import Trainer


def make_dataset(n=203, batch_size=8, seed=5):
    """Batches of ({"x": float [B, 1] holding the example id}, label [B]), shuffled per epoch."""
    ds = tf.data.Dataset.range(n).map(lambda i: {"ids": tf.fill([i % 7 + 1], tf.cast(i + 1, tf.int32)),
                                                 "id": i})
    counter = tfseq.DropCounter()
    ds = ds.apply(counter.tally("read"))
    ds = ds.shuffle(64, seed=seed, reshuffle_each_iteration=True)
    ds = ds.apply(tfseq.pad_batch(batch_size))
    ds = ds.map(lambda b: ({"x": tf.cast(b["id"][:, None], tf.float32)}, tf.cast(b["id"] % 2, tf.int32)))
    return ds, counter


def make_model():
    x = keras.Input((1,), name="x")
    model = keras.Model({"x": x}, keras.layers.Dense(2)(x / 100.0))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class Recorder:
    def __init__(self):
        self.epochs = [[]]

    def __call__(self, batch):
        self.epochs[-1].extend(int(v) for v in batch[0]["x"].numpy()[:, 0])

    def next_epoch(self, *_):
        self.epochs.append([])
        return {}


def run(model_dir, epochs, max_steps=None, recorder=None):
    ds, counter = make_dataset()
    recorder = recorder or Recorder()
    trainer = Trainer(make_model(), ds, model_dir=str(model_dir), checkpoint_every=5,
                      trackables=counter.variables(), on_batch=recorder)
    trainer.restore()
    result = trainer.fit(epochs, verbose=0, eval_fn=recorder.next_epoch, max_steps=max_steps)
    return result, recorder, counter


def test_interrupted_and_resumed_run_sees_exactly_the_ids_of_an_uninterrupted_one(tmp_path):
    full, full_ids, _ = run(tmp_path / "full", epochs=2)
    assert not full.interrupted and full.steps_done == 2 * 26
    epoch1, epoch2 = full_ids.epochs[0], full_ids.epochs[1]
    assert sorted(epoch1) == list(range(203)) and sorted(epoch2) == list(range(203))
    assert epoch1 != epoch2  # reshuffled

    # Stop mid-epoch 1 (step 11 of 26; not a checkpoint_every multiple), then resume.
    part, part_ids, _ = run(tmp_path / "cut", epochs=2, max_steps=11)
    assert part.interrupted and part.steps_done == 11
    rest, rest_ids, counter = run(tmp_path / "cut", epochs=2)
    assert not rest.interrupted and rest.steps_done == 52
    resumed_epoch1 = part_ids.epochs[0] + rest_ids.epochs[0]
    assert resumed_epoch1 == epoch1  # same examples, same order: nothing lost or repeated
    assert sorted(rest_ids.epochs[1]) == list(range(203))
    # The drop counter's "read" count came back with the checkpoint: two full passes.
    assert counter.seen() == {"read": 2 * 203}


def test_signal_saves_a_usable_checkpoint(tmp_path):
    # Whatever SIGINT handler the process started with (SIG_IGN under nohup and in background
    # jobs, Python's default in a terminal) must be the one in place after fit.
    handler_before = signal.getsignal(signal.SIGINT)
    ds, counter = make_dataset()
    recorder = Recorder()

    def interrupt(step, logs):
        if step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    trainer = Trainer(make_model(), ds, model_dir=str(tmp_path), on_step=interrupt,
                      on_batch=recorder)
    result = trainer.fit(1, verbose=0)
    assert result.interrupted and result.steps_done == 3
    assert tf.train.latest_checkpoint(str(tmp_path / "ckpt")).endswith("ckpt-3")
    resumed = Trainer(make_model(), ds, model_dir=str(tmp_path), on_batch=recorder)
    assert resumed.restore()
    assert int(resumed.step_in_epoch.numpy()) == 3
    np.testing.assert_allclose(resumed.model.get_weights()[0], trainer.model.get_weights()[0])
    result = resumed.fit(1, verbose=0)
    assert not result.interrupted
    assert sorted(recorder.epochs[0]) == list(range(203))
    # The handler from before the run is back after fit.
    assert signal.getsignal(signal.SIGINT) is handler_before


def _weights_after(steps_per_execution, model_dir=None, max_steps=None, checkpoint_every=0,
                   epochs=2):
    keras.utils.set_random_seed(3)
    ds, counter = make_dataset()
    model = make_model()
    trainer = Trainer(model, ds, model_dir=model_dir, checkpoint_every=checkpoint_every,
                      trackables=counter.variables(), steps_per_execution=steps_per_execution)
    trainer.restore()
    result = trainer.fit(epochs, verbose=0, max_steps=max_steps)
    return result, [w.numpy() for w in model.weights]


def test_several_steps_per_execution_train_the_same_batches_to_the_same_weights():
    one, weights_one = _weights_after(1)
    five, weights_five = _weights_after(5)
    assert one.steps_done == five.steps_done == 2 * 26
    assert five.history == one.history  # the same epoch means, step for step
    for a, b in zip(weights_one, weights_five):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_several_steps_per_execution_stop_at_max_steps_and_checkpoints_and_resume(tmp_path):
    # 4 steps a call, checkpoints every 5 and a stop at 13: each is hit exactly, and the
    # resumed run ends with the weights of an uninterrupted one (same batches, same order).
    first, _ = _weights_after(4, str(tmp_path), max_steps=13, checkpoint_every=5)
    assert first.interrupted and first.steps_done == 13
    saved = sorted(int(p.split("-")[-1].split(".")[0]) for p in os.listdir(tmp_path / "ckpt")
                   if p.endswith(".index"))
    assert saved == [10, 13]  # max_to_keep 2: 5, 10, then the stop at 13
    resumed, weights = _weights_after(4, str(tmp_path), checkpoint_every=5)
    assert not resumed.interrupted and resumed.steps_done == 52
    _, uninterrupted = _weights_after(1)
    for a, b in zip(uninterrupted, weights):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_the_step_is_traced_once_and_trains_as_train_on_batch():
    # Batches of 8 shapes ([8, L] for L in 1..7, and [3, 1]), a model with a compiled metric:
    # one trace for the whole run (Keras' train_on_batch makes three), and the weights and
    # the epoch means of a train_on_batch loop over the same batches.
    def batches():
        ds = tf.data.Dataset.range(59).map(
            lambda i: {"ids": tf.fill([i // 8 % 7 + 1], tf.cast(i % 5 + 1, tf.int32)), "id": i})
        return ds.apply(tfseq.pad_batch(8)).map(
            lambda b: ({"ids": b["ids"]}, tf.cast(b["id"] % 2, tf.int32)))

    def model():
        keras.utils.set_random_seed(7)
        ids = keras.Input((None,), dtype="int32", name="ids")
        x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(6, 4)(ids))
        m = keras.Model({"ids": ids}, keras.layers.Dense(2)(x))
        m.compile(optimizer="adam", metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    assert len({tuple(x["ids"].shape) for x, _ in batches()}) == 8
    trained = model()
    trainer = Trainer(trained, batches(), model_dir=None)
    trainer.restore()
    result = trainer.fit(2, verbose=0)
    assert result.steps_done == 16
    assert trainer._step_fn.experimental_get_tracing_count() == 1
    reference = model()
    for _ in range(2):  # the epoch means of the second epoch, weighted by rows
        sums, rows = {}, 0
        for x, y in batches():
            logs = reference.train_on_batch(x, y, return_dict=True)
            rows += int(y.shape[0])
            for k, v in logs.items():
                sums[k] = sums.get(k, 0.0) + float(v) * int(y.shape[0])
    for a, b in zip(trained.weights, reference.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6)
    assert rows == 59
    assert result.history[-1] == pytest.approx(
        {"epoch": 2, **{k: v / rows for k, v in sums.items()}})


def test_steps_per_execution_is_checked():
    ds, _ = make_dataset()
    with pytest.raises(ValueError, match="steps_per_execution must be a positive int"):
        Trainer(make_model(), ds, model_dir=None, steps_per_execution=0)
    with pytest.raises(ValueError, match="on_batch sees every batch"):
        Trainer(make_model(), ds, model_dir=None, steps_per_execution=2, on_batch=print)


def test_model_fit_on_training_pipeline_warns_nothing(tmp_path):
    """Keras' end-of-epoch "ran out of data" and its `shuffle=True` notes are not the user's to
    act on: ``training_pipeline`` keeps them off (the dataset shuffles itself)."""
    import warnings

    path = tmp_path / "train.tsv"
    path.write_text("label\ttext\n" + "".join(
        f"{'ab'[i % 2]}\t{'x y' if i % 2 else 'z'} w{i % 5}\n" for i in range(60)))
    vocab = tfseq.Vocab.build(tfseq.formats.text_column(str(path), columns=["label", "text"],
                                                        header=True))
    ids = keras.Input((None,), dtype="int32", name="ids")
    lengths = keras.Input((), dtype="int32", name="ids_length")
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(len(vocab), 4)(ids))
    model = keras.Model({"ids": ids, "ids_length": lengths}, keras.layers.Dense(2)(x))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # as a user's `-W error::UserWarning` would see them
        ds = tfseq.training_pipeline(str(path), vocab, columns=("label", "text"), header=True,
                                     labels=["a", "b"], batching="bucket", max_tokens=256,
                                     max_length=16)
        history = model.fit(ds, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert [str(w.message) for w in caught if issubclass(w.category, UserWarning)] == []
