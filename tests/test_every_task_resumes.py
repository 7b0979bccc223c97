"""Every task, through the one interface the runner calls: a run stopped mid-epoch and resumed
from its checkpoint trains on exactly the batches of the stream's epoch, in the same order,
with a data state of a few integers in the checkpoint (the tasks replayed from the epoch's
number: in tests/test_replay.py)."""

import hashlib
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfseq
from tfseq.pipelines import tasks
from tfseq.pipelines.spine import committed
from tfseq.training import Trainer, checkpoints_newest_first, data_state_bytes

DATA_STATE_BOUND = 1024  # bytes: the cursor (3 int64) and the train counters


def words(i, n):
    return " ".join(f"w{(i * 7 + j) % 23}" for j in range(i % n + 2))


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def config_of(name, tmp_path):
    """A tiny run of task ``name`` on files written here (a few dozen steps an epoch)."""
    task = tasks.load(name)
    text = dict(eval_percent=0, min_count=1, batching="pad", batch_size=4, max_length=8)
    if name == "classify":
        path = write(tmp_path / "c.tsv", [f"L{i % 3}\t{words(i, 6)}" for i in range(36)])
        return task.Config(train_files=(path,), columns=("label", "text"), **text)
    if name == "keras_hub_classify":  # a tiny BERT from a config, vocabulary w0 .. w22
        pytest.importorskip("keras_hub", reason="KerasHub is not installed")
        path = write(tmp_path / "c.tsv", [f"L{i % 3}\t{words(i, 6)}" for i in range(36)])
        vocab = write(tmp_path / "vocab.txt", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                      + [f"w{i}" for i in range(23)])
        (tmp_path / "bert.json").write_text(json.dumps({
            "class_name": "BertBackbone", "vocabulary": vocab, "config": {
                "vocabulary_size": 28, "num_layers": 1, "num_heads": 2, "hidden_dim": 8,
                "intermediate_dim": 16, "max_sequence_length": 10}}))
        return task.Config(train_files=(path,), columns=("label", "text"),
                           keras_hub=str(tmp_path / "bert.json"), **text)
    if name == "lm":
        return task.Config(train_files=(write(tmp_path / "c.txt", [words(i, 6) for i in
                                                                    range(36)]),), **text)
    if name == "translate":
        source = write(tmp_path / "c.en", [words(i, 5) for i in range(36)])
        target = write(tmp_path / "c.es", [words(i + 3, 5) for i in range(36)])
        return task.Config(source_files=(source,), target_files=(target,), **text)
    assert name == "tag", name
    path = write(tmp_path / "c.tsv", [
        " ".join(f"w{i}_{j}" for j in range(i % 6 + 1)) + "\t"
        + " ".join(f"T{j % 3}" for j in range(i % 6 + 1)) for i in range(36)])
    return task.Config(train_files=(path,), format="tsv", columns=("tokens", "tags"), **text)


def fingerprint(batch) -> str:
    """A digest of every tensor of a batch (ragged ones by their values and row splits)."""
    digest = hashlib.sha1()
    for t in tf.nest.flatten(batch, expand_composites=True):
        digest.update(np.asarray(t).tobytes())
    return digest.hexdigest()


def epoch_batches(task, config, run) -> list[str]:
    """The digests of the training stream's epoch 0, enumerated without training (the batches
    a trainer takes: ``spine.committed`` skips a spine stream's batches with no example)."""
    stream = task.training_stream(config, run.state, tfseq.DropCounter("train"), run.shards)
    stream.epoch = tf.Variable(0, dtype=tf.int64)
    return [fingerprint(batch) for batch in committed(stream)]


def train(task, config, run, model_dir, *, max_steps=None, log=None):
    """One process' worth of training on ``run``'s stream; appends each batch's digest."""
    log = [] if log is None else log
    stream = task.training_stream(config, run.state, tfseq.DropCounter("train"), run.shards)
    keras.utils.set_random_seed(0)
    model = task.build_model(config, run.state, task.model_config())
    trainer = Trainer(model, stream, model_dir=str(model_dir), checkpoint_every=0,
                      on_batch=lambda batch: log.append(fingerprint(batch)))
    trainer.restore()
    return trainer.fit(1, verbose=0, max_steps=max_steps), log


# The tasks replayed from the epoch's number (documents, ctr, lm_tbptt) are resumed in
# tests/test_replay.py: the same stream (``task.datasets`` takes ``task.training_stream``),
# cut mid-epoch and resumed by a new trainer and model over two epochs, with their drop
# counts and no data state at all; the slow tests run them through the binary
# (test_own_tasks.py). Any other task, a new one too, is resumed here.
REPLAYED = ("documents", "ctr", "lm_tbptt")


def test_the_tasks_resumed_in_test_replay_are_the_replayed_ones():
    from tfseq.pipelines.replayed import ReplayedTask

    assert [name for name in tasks.TASKS if isinstance(tasks.load(name), ReplayedTask)] == [
        name for name in tasks.TASKS if name in REPLAYED]
    assert set(REPLAYED) <= set(tasks.TASKS)


@pytest.mark.parametrize("name", [name for name in tasks.TASKS if name not in REPLAYED])
def test_a_run_stopped_mid_epoch_resumes_with_the_same_batches(tmp_path, name):
    task = tasks.load(name)
    config = config_of(name, tmp_path)
    run = task.open(str(tmp_path / "run"), config, model_config=task.model_config())
    full = epoch_batches(task, config, run)
    assert len(full) >= 8 and len(set(full)) == len(full)  # no batch twice
    cut = len(full) // 2 + 1
    part, log = train(task, config, run, tmp_path / "cut", max_steps=cut)
    assert part.interrupted and part.steps_done == cut
    checkpoint = checkpoints_newest_first(str(tmp_path / "cut" / "ckpt"))[0]
    assert data_state_bytes(checkpoint) < DATA_STATE_BOUND
    rest, log = train(task, config, run, tmp_path / "cut", log=log)
    assert not rest.interrupted
    assert log == full  # the same batches in the same order: none lost, none twice
