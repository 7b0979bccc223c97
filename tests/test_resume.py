"""Resume anywhere: a data state of a few integers, exact mid-epoch resume in every batching mode,
other replica counts at the same global budget, changed runs named, SIGKILL at any moment."""

import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time

import keras
import pytest

import cli
from conftest import write_source
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LABELS = ("east", "north", "south", "west")
DATA_STATE_BOUND = 1024  # bytes: the cursor (3 int64) and the train counters (int64 each)


def write_corpus(path, lines=1200, seed=0):
    """``label<TAB>text`` sorted by label; every line's first word ``t<i>`` is its id."""
    rng = random.Random(seed)
    rows = []
    for i in range(lines):
        label = LABELS[i * len(LABELS) // lines]
        words = " ".join(f"{label}{rng.randrange(6)}" for _ in range(i % 11 + 1))
        rows.append(f"{label}\tt{i} {words}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def example_ids(batch, vocab_tokens):
    """The ids (``t<i>`` -> i) of the real examples of an ``(inputs, targets, weights)``
    batch, or of a tuple of such parts."""
    parts = batch if isinstance(batch[0], tuple) else (batch,)
    found = []
    for x, _, weights in parts:
        ids = x["ids"].numpy()
        real = weights.numpy().reshape(ids.shape[0], -1).max(axis=1) > 0  # dummy rows: 0
        if "ids_resets" in x:  # packed: each segment starts with a reset
            firsts = ids[real][x["ids_resets"].numpy()[real] > 0]
        else:
            firsts = ids[real, 0]
        found += [int(vocab_tokens[t][1:]) for t in firsts.tolist()]
    return found


def run_trainer(task, config, state, shards, model_dir, *, max_steps=None, epochs=1,
                steps_log=None):
    """One process' worth of training (single device): its steps' example ids."""
    import tfseq
    from tfseq.training import Trainer

    steps_log = [] if steps_log is None else steps_log
    counter = tfseq.DropCounter("train")
    stream = task.training_stream(config, state, counter, shards)
    keras.utils.set_random_seed(0)
    model = task.build_model(config, state, task.model_config(embedding_dim=4, hidden_dim=4))
    tokens = state.vocab.tokens
    trainer = Trainer(model, stream, model_dir=str(model_dir), checkpoint_every=3,
                      on_batch=lambda batch: steps_log.append(example_ids(batch, tokens)),
                      on_epoch_start=lambda epoch: counter.reset())
    trainer.restore()
    result = trainer.fit(epochs, verbose=0, max_steps=max_steps)
    return result, steps_log, counter


@pytest.mark.slow
@pytest.mark.parametrize("batching", ["pad", "bucket", "pack"])
def test_bounded_data_state_and_an_exact_mid_epoch_resume(tmp_path, batching):
    import tfseq
    from tfseq.pipelines import classify, sources
    from tfseq.training import checkpoints_newest_first, data_state_bytes

    corpus = write_corpus(tmp_path / "sorted.tsv", lines=600)
    # Shards of ~2 KB: the 29 KB corpus is spilled into 15 of them, the line shuffle on.
    config = classify.Config(train_files=(corpus,), columns=("label", "text"), eval_percent=0,
                             min_count=1, batching=batching, batch_size=16, max_tokens=96,
                             max_length=12, block_length=(8, 16), max_segments=8,
                             shuffle_shard_bytes=2048)
    task = classify.TASK
    shards = task.record_shards(config, directory=str(tmp_path / "shards"))
    state, setup = task.prepare(config, shards=shards,
                                fingerprint=sources.fingerprint([corpus]))
    assert shards.num_shards == 15 and setup.passes == 1

    # The uninterrupted epoch's batches, from the stream itself (no training).
    full_counter = tfseq.DropCounter("train")
    full_steps = epoch_steps(task.training_stream(config, state, full_counter, shards),
                             state.vocab.tokens, in_order=True)
    assert sorted(i for step in full_steps for i in step) == list(range(600))
    cut = len(full_steps) // 2 + 1
    part, cut_steps, _ = run_trainer(task, config, state, shards, tmp_path / "cut",
                                     max_steps=cut)
    assert part.interrupted and part.steps_done == cut
    checkpoint = checkpoints_newest_first(str(tmp_path / "cut" / "ckpt"))[0]
    assert data_state_bytes(checkpoint) < DATA_STATE_BOUND
    rest, cut_steps, counter = run_trainer(task, config, state, shards, tmp_path / "cut",
                                           steps_log=cut_steps)
    assert not rest.interrupted and rest.steps_done == len(full_steps)
    assert cut_steps == full_steps  # the same batches in the same order: none lost, none twice
    assert counter.seen() == full_counter.seen() == {"lines_read": 600, "truncated": 0}
    assert counter.drops() == full_counter.drops()


# ----------------------------------------------------------------------------- replicas

def elastic_run(files, model_dir, batching, replicas):
    """The task, config and opened run (``runs.open_run``) of the elastic runs below: a
    global budget of 192 cells over ``replicas``; two ``files`` are a mixture at 0.7 / 0.3."""
    from tfseq.pipelines import classify, runs

    task = classify.TASK
    weights = (0.7, 0.3) if len(files) == 2 else ()
    config = classify.Config(train_files=tuple(files), train_weights=weights,
                             columns=("label", "text"), eval_percent=0,
                             min_count=1, batching=batching, max_tokens=192 // replicas,
                             max_length=12, block_length=(8, 16), max_segments=8,
                             shuffle_shard_bytes=4096)
    model_config = task.model_config(embedding_dim=4, hidden_dim=4)
    opened = runs.open_run(model_dir, task, config, model_config=model_config,
                           replicas=replicas)
    return task, config, model_config, opened


def elastic_child(replicas, jobs):
    """Runs on ``replicas`` logical CPUs (a process of their own, as a user's), at a global
    budget of 192 cells, one after the other: each job ``(out_path, model_dir, files,
    batching, max_steps)`` trains (or resumes) its run and writes its steps' example ids and
    counts."""
    import tfseq

    strategy = tfseq.mirrored_strategy(replicas)
    from tfseq.training import ReplicaTrainer

    for out_path, model_dir, files, batching, max_steps in jobs:
        task, config, model_config, opened = elastic_run(files, model_dir, batching, replicas)
        counter = tfseq.DropCounter("train")
        stream = task.training_stream(config, opened.state, counter, opened.shards,
                                      replicas=replicas, parts=True)
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = task.build_model(config, opened.state, model_config)
        steps = []
        tokens = opened.state.vocab.tokens
        trainer = ReplicaTrainer(model, strategy, stream, model_dir=model_dir,
                                 checkpoint_every=2, on_batch=lambda parts, steps=steps:
                                 steps.append(sorted(example_ids(parts, tokens))))
        trainer.restore()
        result = trainer.fit(1, verbose=0, max_steps=max_steps or None)
        with open(out_path, "w") as f:
            json.dump({"steps": steps, "done": result.steps_done,
                       "interrupted": result.interrupted,
                       "lines_read": counter.seen()["lines_read"],
                       "by_source": counter.by_source()}, f)


def epoch_steps(stream, tokens, in_order=False) -> list[list[int]]:
    """The example ids of each global batch of the stream's epoch 0 (sorted unless
    ``in_order``), enumerated without training (the batches a trainer takes:
    ``spine.committed`` skips those with no example, and counts the lines as they pass)."""
    from tfseq.pipelines.spine import committed

    stream.epoch = tf.Variable(0, dtype=tf.int64)
    return [example_ids(parts, tokens) if in_order else sorted(example_ids(parts, tokens))
            for parts in committed(stream)]


@pytest.mark.slow
def test_a_run_resumes_on_another_number_of_replicas_at_the_same_global_budget(tmp_path):
    # Runs cut after 3 steps on 2 replicas resumed on 4 (bucket, pack), and on 4 resumed on 2
    # (bucket, a mixture of two sources at 0.7 / 0.3); each replica count a process of its
    # own, as a user's.
    import tfseq

    corpus = write_corpus(tmp_path / "sorted.tsv", lines=300)
    news = write_source(tmp_path / "news.tsv", 0, 120)
    web = write_source(tmp_path / "web.tsv", 10_000, 60)
    runs = {"b2to4": ([corpus], "bucket"), "p2to4": ([corpus], "pack"),
            "m4to2": ([news, web], "bucket")}

    def job(name, part):
        files, batching = runs[name]
        return [str(tmp_path / f"{name}-{part}.json"), str(tmp_path / name), files, batching,
                3 if part == "cut" else 0]

    def processes(replicas, jobs):
        subprocess.run([sys.executable, os.path.abspath(__file__), "elastic", str(replicas),
                        json.dumps(jobs)], env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
                       check=True, timeout=600, stdout=subprocess.DEVNULL)

    processes(2, [job("b2to4", "cut"), job("p2to4", "cut")])
    processes(4, [job("b2to4", "rest"), job("p2to4", "rest"), job("m4to2", "cut")])
    processes(2, [job("m4to2", "rest")])

    # The uninterrupted epochs' global batches and counts, from the stream itself (no
    # training; ``spine.committed`` adds the counts and skips batches with no example).
    fulls = {}
    for files, batching, lines in (([corpus], "bucket", 300), ([corpus], "pack", 300),
                                   ([news, web], "bucket", None)):
        task, config, _, opened = elastic_run(files, str(tmp_path / f"full-{len(fulls)}"),
                                              batching, 2)
        counter = tfseq.DropCounter("train")
        steps = epoch_steps(task.training_stream(config, opened.state, counter, opened.shards,
                                                 replicas=2, parts=True),
                            opened.state.vocab.tokens)
        if lines:
            assert sorted(i for step in steps for i in step) == list(range(lines))
        fulls[(len(files), batching)] = steps, counter
    for name, (files, batching) in runs.items():
        full, counter = fulls[(len(files), batching)]
        cut, rest = (json.loads((tmp_path / f"{name}-{part}.json").read_text())
                     for part in ("cut", "rest"))
        assert cut["interrupted"] and cut["done"] == 3 and not rest["interrupted"], name
        # Every global step holds the examples of the uninterrupted epoch's step.
        assert cut["steps"] + rest["steps"] == full, name
        # The counts came back with the checkpoint.
        assert rest["lines_read"] == counter.seen()["lines_read"], name
        assert rest["by_source"] == counter.by_source(), name
    assert fulls[(1, "bucket")][1].seen()["lines_read"] == 300


# ----------------------------------------------------------------------------- the binary

def train(*args, fault=None, timeout=600):
    return cli.run("train", *args, fault=fault, timeout=timeout)


def common(corpus, run, **changes):
    """The flags of the runs below, with ``changes`` (flag name -> value) applied."""
    flags = {"train_files": corpus, "columns": "label,text", "batching": "bucket",
             "max_tokens": 96, "max_length": 12, "eval_percent": 0, "epochs": 1,
             "model_dir": run, "verbose": 0, "export": "false", **changes}
    return [f"--{k}={v}" for k, v in flags.items()]


# The finished run's own flags (``finished_run``), next to ``common``'s.
FINISHED = {"eval_percent": 10}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """``(corpus, model_dir)``: a run of the flags above and ``FINISHED`` trained to its end
    by the binary (``--model_dir`` holds its ``report.json``)."""
    base = tmp_path_factory.mktemp("finished")
    corpus = write_corpus(base / "sorted.tsv", lines=200)
    out = train(*common(corpus, base / "single", **FINISHED))
    assert out.returncode == 0, out.stderr[-3000:]
    return corpus, base / "single"


def flag_config(corpus, run, **changes):
    """``cli.flag_config`` of the flags ``common(corpus, run, **changes)``."""
    return cli.flag_config(*common(corpus, run, **changes))


def refused(corpus, run, **changes):
    """The line ``tfseq-train`` refuses a resume of ``run`` with ``changes`` with, in this
    process (``cli.refused``: the command's own path from its flags), nothing trained."""
    return cli.refused(*common(corpus, run, **{**FINISHED, **changes}))


@pytest.mark.slow
def test_changed_settings_stop_before_training_naming_each_change(finished_run):
    corpus, run = finished_run
    saved_vocab = (run / "vocab.txt").read_text()
    for change, expected in [
        ({"max_length": 10}, "--max_length: saved 12, now 10"),
        ({"seed": 3}, "--seed: saved 0, now 3"),
        ({"max_tokens": 48}, "--num_replicas x --max_tokens: saved 96, now 48"),
        ({"eval_percent": 20}, "--eval_percent: saved 10, now 20"),
        ({"batching": "pack", "block_length": 12}, "--batching: saved 'bucket', now 'pack'"),
        ({"learning_rate": 0.01}, "model learning_rate: saved 0.003, now 0.01"),
    ]:
        message = refused(corpus, run, **change)
        assert expected in message, message
        assert f"--flagfile={run / 'flags.txt'}" in message
    # Another replica count at the same global budget is the same run (it trains on:
    # test_a_run_resumes_on_another_number_of_replicas_at_the_same_global_budget).
    task, _, config = flag_config(corpus, run, num_replicas=2, max_tokens=48, **FINISHED)
    assert task.open(str(run), config, model_config=task.model_config(), replicas=2).state

    # Training files that changed: named by the command (status 2, no traceback, nothing
    # trained), and never a new vocabulary.
    with open(corpus, "a") as f:
        f.write("east\tt9999 east1 brand new words\n")
    out = train(*common(corpus, run, **FINISHED))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("tfseq-train: error: ")
    assert f"input file {corpus}: size" in out.stderr
    assert f"--vocab={run / 'vocab.txt'}" in out.stderr
    assert f"--flagfile={run / 'flags.txt'}" in out.stderr
    assert (run / "vocab.txt").read_text() == saved_vocab


@pytest.mark.slow
def test_a_run_preempted_or_killed_at_any_moment_is_finished_by_the_same_command(tmp_path):
    # One run: preempted by SIGTERM at step 3, then by SIGINT at step 5, then killed three
    # times (mid-save, just after a save, from outside at a random moment), each time
    # continued by the same command, which then finishes it.
    corpus = write_corpus(tmp_path / "sorted.tsv", lines=600)
    run = tmp_path / "run"
    flags = common(corpus, run, checkpoint_every=2, export="true")
    resumed_at = None
    for sig, step in (("TERM", 3), ("INT", 5)):
        out = train(*flags, fault=f"after_step:{step}:{sig}")
        # 128 + the signal, as a shell reports it: schedulers requeue, `&&` stops.
        assert out.returncode == 128 + getattr(signal, "SIG" + sig), out.stderr[-3000:]
        report = json.loads((run / "report.json").read_text())
        assert report["interrupted"] and report["steps"] == step, (sig, report["steps"])
        assert report["resumed_at_step"] == resumed_at
        assert not (run / "export").exists()  # preempted: no export of a model in the middle
        resumed_at = step
    assert "continued from step 3" in out.stdout

    def kill_child(fault=None):
        return cli.start("train", *flags, fault=fault)

    child = kill_child("mid_save:8")  # a checkpoint index cut short, then killed
    child.wait(timeout=300)
    assert child.returncode == -signal.SIGKILL, child.stderr.read()[-2000:]
    child = kill_child("after_save:10")
    child.wait(timeout=300)
    stderr = child.stderr.read()
    assert child.returncode == -signal.SIGKILL, stderr[-2000:]
    assert "ckpt-8.index" in stderr and "written only in part" in stderr

    def saved_after_10():
        return any(int(p.name[len("ckpt-"):-len(".index")]) > 10
                   for p in (run / "ckpt").glob("ckpt-*.index"))

    child = kill_child()  # an external kill at a random moment of training
    deadline = time.monotonic() + 300
    while not saved_after_10() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(random.Random(os.getpid()).uniform(0.0, 2.0))
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    out = train(*flags)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert not report["interrupted"] and report["epochs"] == 1
    assert report["counters"]["train"]["seen"]["lines_read"] == 600
    assert report["resumed_at_step"] >= 10
    assert f"continued from step {report['resumed_at_step']}" in out.stdout
    assert (run / "export" / "saved_model.pb").exists()


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def tf_checkpoint_exists(directory):
    return (directory / "checkpoint").exists()


@pytest.mark.slow
def test_report_has_one_schema_single_replicated_and_two_workers(tmp_path, finished_run):
    # The two workers (--strategy=multi_worker, TF_CONFIG on localhost) each read their own
    # file: 120 and 80 lines of the 200.
    corpus = write_corpus(tmp_path / "sorted.tsv", lines=200)
    lines = (tmp_path / "sorted.tsv").read_text().splitlines(keepends=True)
    files = [tmp_path / "a.tsv", tmp_path / "b.tsv"]
    files[0].write_text("".join(lines[:120]))
    files[1].write_text("".join(lines[120:]))
    reports = {"single": json.loads((finished_run[1] / "report.json").read_text())}
    out = train(*common(corpus, tmp_path / "two", num_replicas=2, **FINISHED))
    assert out.returncode == 0, out.stderr[-3000:]
    reports["replicated"] = json.loads((tmp_path / "two" / "report.json").read_text())
    cluster = [f"localhost:{free_port()}", f"localhost:{free_port()}"]
    run = tmp_path / "workers"
    children = []
    try:
        for i in range(2):
            children.append(subprocess.Popen(
                [sys.executable, os.path.join(ROOT, "scripts", "train.py"),
                 *common(f"{files[0]},{files[1]}", run, strategy="multi_worker",
                         export="true", **FINISHED)],
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                         TF_CONFIG=json.dumps({"cluster": {"worker": cluster},
                                               "task": {"type": "worker", "index": i}})),
                stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{i}.log", "w"),
                start_new_session=True))
        for i, child in enumerate(children):
            assert child.wait(timeout=600) == 0, (tmp_path / f"{i}.log").read_text()[-3000:]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=20)
    chief = reports["multi_worker"] = json.loads((run / "report.json").read_text())
    other = json.loads((run / "workers" / "1" / "report.json").read_text())

    def shape(value):
        if isinstance(value, dict):
            return {k: shape(v) for k, v in value.items()
                    if not k.startswith(("eval_", "loss", "accuracy"))}
        if isinstance(value, list):
            return [shape(value[0])] if value else []
        return type(value).__name__

    schemas = {mode: shape({k: v for k, v in r.items() if k not in ("config",)})
               for mode, r in reports.items()}
    assert schemas["single"] == schemas["replicated"] == schemas["multi_worker"]
    for mode, report in reports.items():
        assert report["mode"] == mode
        assert isinstance(report["history"], list) and report["history"][0]["epoch"] == 1
        assert report["real_tokens_per_second"] > 0 and 0 < report["padding_efficiency"] <= 1
        assert 0.0 <= report["eval"]["accuracy"] <= 1.0 and math.isfinite(report["eval"]["loss"])

    # The workers: one epoch, the same steps, each its own report (one schema) and checkpoints.
    assert (chief["replicas"], chief["workers"]) == (1, 2)
    assert chief["epochs"] == 1 and chief["steps"] == other["steps"] > 0
    assert sorted(chief) == sorted(other)
    assert all(math.isfinite(e["loss"]) for r in (chief, other) for e in r["history"])
    # Each worker read its own file once: together every line exactly once.
    assert [chief["counters"]["train"]["seen"]["lines_read"],
            other["counters"]["train"]["seen"]["lines_read"]] == [120, 80]
    assert tf_checkpoint_exists(run / "ckpt")
    assert tf_checkpoint_exists(run / "workers" / "1" / "ckpt")
    # The chief evaluates and exports a single-device copy; the other worker does neither.
    assert other["eval"] == {}
    assert (run / "export" / "saved_model.pb").exists()
    assert not (run / "workers" / "1" / "export").exists()


if __name__ == "__main__":
    if sys.argv[1] == "elastic":
        elastic_child(int(sys.argv[2]), json.loads(sys.argv[3]))


def test_checkpoints_are_listed_from_a_relative_model_dir_and_partial_ones_removed(
        tmp_path, monkeypatch):
    from tfseq.training import checkpoints_newest_first, data_state_bytes

    monkeypatch.chdir(tmp_path)
    step = tf.Variable(0, dtype=tf.int64)
    cursor_shard = tf.Variable([0, 0, 0], dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(step=step, cursor_shard=cursor_shard)
    manager = tf.train.CheckpointManager(checkpoint, "runs/demo/ckpt", max_to_keep=2)
    for value in (1, 2, 3):
        step.assign(value)
        manager.save(checkpoint_number=value)
    (tmp_path / "runs/demo/ckpt/ckpt-4.index").write_bytes(b"cut short")  # a write cut short

    listed = checkpoints_newest_first("runs/demo/ckpt")
    assert listed == ["runs/demo/ckpt/ckpt-3", "runs/demo/ckpt/ckpt-2"]
    assert not (tmp_path / "runs/demo/ckpt/ckpt-4.index").exists()
    assert sorted(p.name for p in (tmp_path / "runs/demo/ckpt").glob("ckpt-*.index")) == [
        "ckpt-2.index", "ckpt-3.index"]
    assert data_state_bytes(listed[0]) == 3 * 8  # the cursor's three int64s, not the step


def test_data_state_bytes_counts_a_saved_iterators_buffers(tmp_path):
    from tfseq.training import data_state_bytes

    def saved(dataset, name):
        iterator = iter(dataset)
        next(iterator)
        step = tf.Variable(7, dtype=tf.int64)  # not the input's: never counted
        return data_state_bytes(tf.train.Checkpoint(iterator=iterator, step=step).save(
            str(tmp_path / name)))

    # A position alone is a few hundred bytes; a shuffle buffer of 5,000 int64s (40,000 bytes
    # of values, each saved as its own tensor entry) is counted in full.
    assert saved(tf.data.Dataset.range(10_000), "plain") < 2_000
    assert saved(tf.data.Dataset.range(10_000).shuffle(5_000, seed=0), "buffer") > 40_000
