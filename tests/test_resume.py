"""Resume anywhere: a data state of a few integers, exact mid-epoch resume in every batching mode,
other replica counts at the same global budget, changed runs named, SIGKILL at any moment."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import keras
import pytest

import cli
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LABELS = ("east", "north", "south", "west")
# The binary's runs share one trained run (``finished_run``): one process runs them all.
pytestmark = pytest.mark.xdist_group("test_resume")
DATA_STATE_BOUND = 1024  # bytes: the cursor (3 int64) and the train counters (int64 each)


@pytest.fixture
def as_the_runner_traces():
    """Dataset functions traced as the training binary traces them (no AutoGraph conversion:
    seconds of every stream's start)."""
    from tfseq._common import traced_as_written

    with traced_as_written():
        yield


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
def test_bounded_data_state_and_an_exact_mid_epoch_resume(tmp_path, batching,
                                                         as_the_runner_traces):
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

def elastic_run(corpus, model_dir, batching, replicas):
    """The task, config and opened run (``runs.open_run``) of the elastic runs below: a
    global budget of 192 cells over ``replicas``."""
    from tfseq.pipelines import classify, runs

    task = classify.TASK
    config = classify.Config(train_files=(corpus,), columns=("label", "text"), eval_percent=0,
                             min_count=1, batching=batching, max_tokens=192 // replicas,
                             max_length=12, block_length=(8, 16), max_segments=8,
                             shuffle_shard_bytes=4096)
    model_config = task.model_config(embedding_dim=4, hidden_dim=4)
    opened = runs.open_run(model_dir, task, config, model_config=model_config,
                           replicas=replicas)
    return task, config, model_config, opened


def elastic_child(corpus, replicas, jobs):
    """Runs on ``replicas`` logical CPUs (a process of their own, as a user's), at a global
    budget of 192 cells, one after the other: each job ``(out_path, model_dir, batching,
    max_steps)`` trains (or resumes) its run and writes its steps' example ids."""
    import tfseq

    strategy = tfseq.mirrored_strategy(replicas)
    from tfseq.training import ReplicaTrainer

    for out_path, model_dir, batching, max_steps in jobs:
        task, config, model_config, opened = elastic_run(corpus, model_dir, batching, replicas)
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
                       "lines_read": counter.seen()["lines_read"]}, f)


def epoch_steps(stream, tokens, in_order=False) -> list[list[int]]:
    """The example ids of each global batch of the stream's epoch 0 (sorted unless
    ``in_order``), enumerated without training (the batches a trainer takes:
    ``spine.committed`` skips those with no example, and counts the lines as they pass)."""
    from tfseq.pipelines.spine import committed

    stream.epoch = tf.Variable(0, dtype=tf.int64)
    return [example_ids(parts, tokens) if in_order else sorted(example_ids(parts, tokens))
            for parts in committed(stream)]


@pytest.mark.slow
def test_a_run_resumes_on_another_number_of_replicas_at_the_same_global_budget(
        tmp_path, as_the_runner_traces):
    # Runs cut after 3 steps on 2 replicas resumed on 4 (bucket, pack), and on 4 resumed on 2
    # (bucket); each replica count a process of its own, as a user's.
    import tfseq

    corpus = write_corpus(tmp_path / "sorted.tsv", lines=300)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    runs = {("bucket", 2, 4): "b2to4", ("pack", 2, 4): "p2to4", ("bucket", 4, 2): "b4to2"}

    def job(batching, change, part):
        name = runs[(batching, *change)]
        max_steps = 3 if part == "cut" else 0
        return [str(tmp_path / f"{name}-{part}.json"), str(tmp_path / name), batching, max_steps]

    def processes(replicas, jobs):
        subprocess.run([sys.executable, os.path.abspath(__file__), "elastic", corpus,
                        str(replicas), json.dumps(jobs)],
                       env=env, check=True, timeout=600, stdout=subprocess.DEVNULL)

    processes(2, [job("bucket", (2, 4), "cut"), job("pack", (2, 4), "cut")])
    processes(4, [job("bucket", (2, 4), "rest"), job("pack", (2, 4), "rest"),
                  job("bucket", (4, 2), "cut")])
    processes(2, [job("bucket", (4, 2), "rest")])

    fulls = {}
    for batching in ("bucket", "pack"):
        # The uninterrupted epoch's global batches, from the stream itself (no training).
        task, config, _, opened = elastic_run(corpus, str(tmp_path / f"full-{batching}"),
                                              batching, 2)
        fulls[batching] = epoch_steps(task.training_stream(
            config, opened.state, tfseq.DropCounter("train"), opened.shards, replicas=2,
            parts=True), opened.state.vocab.tokens)
        assert sorted(i for step in fulls[batching] for i in step) == list(range(300))
    for (batching, _, _), name in runs.items():
        full = fulls[batching]
        cut, rest = (json.loads((tmp_path / f"{name}-{part}.json").read_text())
                     for part in ("cut", "rest"))
        assert cut["interrupted"] and cut["done"] == 3 and not rest["interrupted"], name
        # Every global step holds the examples of the uninterrupted epoch's step.
        assert cut["steps"] + rest["steps"] == full, name
        assert rest["lines_read"] == 300, name  # the counts came back with the checkpoint


# ----------------------------------------------------------------------------- the binary

def train(*args, fault=None, timeout=600):
    return cli.run("train", *args, fault=fault, timeout=timeout)


def common(corpus, run, **changes):
    """The flags of the runs below, with ``changes`` (flag name -> value) applied."""
    flags = {"train_files": corpus, "columns": "label,text", "batching": "bucket",
             "max_tokens": 96, "max_length": 12, "eval_percent": 0, "epochs": 1,
             "model_dir": run, "verbose": 0, "export": "false", **changes}
    return [f"--{k}={v}" for k, v in flags.items()]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """``(corpus, model_dir)``: a run of the flags above trained to its end by the binary
    (``--model_dir`` holds its ``report.json``)."""
    base = tmp_path_factory.mktemp("finished")
    corpus = write_corpus(base / "sorted.tsv", lines=200)
    out = train(*common(corpus, base / "single"))
    assert out.returncode == 0, out.stderr[-3000:]
    return corpus, base / "single"


def flag_config(corpus, run, **changes):
    """``(task, flag values, config)`` of ``tfseq-train`` given the flags ``common(corpus,
    run, **changes)``, through the command's own flag table."""
    from absl import flags

    from tfseq.pipelines import tasks
    from tfseq.scripts import flag_table

    values = flags.FlagValues()
    flag_table.define(flag_table.FLAGS_TABLE, flag_values=values)
    values(["tfseq-train", *common(corpus, run, **changes)])
    task = tasks.load(flag_table.task_name(values))
    return task, values, flag_table.build_config(task, values)


def refused(corpus, run, **changes):
    """The line ``tfseq-train`` refuses a resume of ``run`` with ``changes`` with (after
    ``tfseq-train: error: ``), in this process: the command's own path from its flags
    (flag table -> config -> ``Runner``) to the ``ChangedRun`` it reports, nothing trained."""
    from tfseq.pipelines.runner import Runner, RunSettings
    from tfseq.pipelines.runs import ChangedRun
    from tfseq.scripts.flag_table import changed_run_message

    task, values, config = flag_config(corpus, run, **changes)
    settings = RunSettings(model_dir=values.model_dir, epochs=values.epochs,
                           learning_rate=values.learning_rate, verbose=0, export=False)
    with pytest.raises(ChangedRun) as e:
        Runner(task, config, settings).run()
    return changed_run_message(e.value)


@pytest.mark.slow
def test_changed_settings_stop_before_training_naming_each_change(finished_run,
                                                                  as_the_runner_traces):
    corpus, run = finished_run
    saved_vocab = (run / "vocab.txt").read_text()
    for change, expected in [
        ({"max_length": 10}, "--max_length: saved 12, now 10"),
        ({"seed": 3}, "--seed: saved 0, now 3"),
        ({"max_tokens": 48}, "--num_replicas x --max_tokens: saved 96, now 48"),
        ({"eval_percent": 20}, "--eval_percent: saved 0, now 20"),
        ({"batching": "pack", "block_length": 12}, "--batching: saved 'bucket', now 'pack'"),
        ({"learning_rate": 0.01}, "model learning_rate: saved 0.003, now 0.01"),
    ]:
        message = refused(corpus, run, **change)
        assert expected in message, message
        assert f"--flagfile={run / 'flags.txt'}" in message
    # Another replica count at the same global budget is the same run (it trains on:
    # test_a_run_resumes_on_another_number_of_replicas_at_the_same_global_budget).
    task, _, config = flag_config(corpus, run, num_replicas=2, max_tokens=48)
    assert task.open(str(run), config, model_config=task.model_config(), replicas=2).state

    # Training files that changed: named by the command (status 2, no traceback, nothing
    # trained), and never a new vocabulary.
    with open(corpus, "a") as f:
        f.write("east\tt9999 east1 brand new words\n")
    out = train(*common(corpus, run))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("tfseq-train: error: ")
    assert f"input file {corpus}: size" in out.stderr
    assert f"--vocab={run / 'vocab.txt'}" in out.stderr
    assert f"--flagfile={run / 'flags.txt'}" in out.stderr
    assert (run / "vocab.txt").read_text() == saved_vocab


def kill_child(corpus, run, fault=None):
    return cli.start("train", *common(corpus, run, checkpoint_every=2), fault=fault)


@pytest.mark.slow
def test_sigkill_at_any_moment_then_the_same_command_continues(tmp_path):
    # One run, killed three times (mid-save, just after a save, from outside at a random
    # moment), each time continued by the same command, which then finishes it.
    corpus = write_corpus(tmp_path / "sorted.tsv", lines=600)
    run = tmp_path / "run"
    child = kill_child(corpus, run, "mid_save:4")  # a checkpoint index cut short, then killed
    child.wait(timeout=300)
    assert child.returncode == -signal.SIGKILL, child.stderr.read()[-2000:]
    child = kill_child(corpus, run, "after_save:6")
    child.wait(timeout=300)
    stderr = child.stderr.read()
    assert child.returncode == -signal.SIGKILL, stderr[-2000:]
    assert "ckpt-4.index" in stderr and "written only in part" in stderr

    def saved_after_6():
        return any(int(p.name[len("ckpt-"):-len(".index")]) > 6
                   for p in (run / "ckpt").glob("ckpt-*.index"))

    child = kill_child(corpus, run)  # an external kill at a random moment of training
    deadline = time.monotonic() + 300
    while not saved_after_6() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(random.Random(os.getpid()).uniform(0.0, 2.0))
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    out = train(*common(corpus, run, checkpoint_every=2))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert not report["interrupted"] and report["epochs"] == 1
    assert report["counters"]["train"]["seen"]["lines_read"] == 600


@pytest.mark.slow
def test_a_preempted_run_exits_non_zero_and_the_same_command_finishes_it(tmp_path):
    # Preempted by SIGTERM at step 3, the same command is preempted by SIGINT at step 5, and
    # the same command again finishes the run.
    corpus = write_corpus(tmp_path / "sorted.tsv", lines=300)
    run = tmp_path / "run"
    flags = common(corpus, run, export="true")
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
    out = train(*flags)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert not report["interrupted"] and report["epochs"] == 1
    assert report["counters"]["train"]["seen"]["lines_read"] == 300
    assert report["resumed_at_step"] == 5 and "continued from step 5" in out.stdout
    assert (run / "export" / "saved_model.pb").exists()


@pytest.mark.slow
def test_report_has_one_schema_single_replicated_and_two_workers(tmp_path, finished_run):
    import socket

    corpus = write_corpus(tmp_path / "sorted.tsv", lines=200)
    reports = {"single": json.loads((finished_run[1] / "report.json").read_text())}
    out = train(*common(corpus, tmp_path / "two", num_replicas=2))
    assert out.returncode == 0, out.stderr[-3000:]
    reports["replicated"] = json.loads((tmp_path / "two" / "report.json").read_text())
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("localhost", 0))
            ports.append(s.getsockname()[1])
    cluster = [f"localhost:{p}" for p in ports]
    children = [subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "scripts", "train.py"),
         *common(corpus, tmp_path / "workers", strategy="multi_worker")],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                 TF_CONFIG=json.dumps({"cluster": {"worker": cluster},
                                       "task": {"type": "worker", "index": i}})),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    for child in children:
        assert child.wait(timeout=600) == 0
    reports["multi_worker"] = json.loads((tmp_path / "workers" / "report.json").read_text())

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


if __name__ == "__main__":
    from tfseq._common import traced_as_written

    if sys.argv[1] == "elastic":
        with traced_as_written():  # as the training binary runs (no AutoGraph conversion)
            elastic_child(sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]))


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
