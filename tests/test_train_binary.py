"""scripts/train.py: flags, flagfile, conflicting flags, a short run, resume."""

import json
import os
import re
import subprocess
import sys

import pytest

import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOKS = ["Gen", "Ps", "Isa", "Matt", "Rom", "Rev", "Josh"]


def write_tiny_corpus(path):
    lines = []
    for i in range(280):
        book = BOOKS[i % len(BOOKS)]
        words = " ".join(f"{book.lower()}{j % 5}" for j in range(i % 9 + 2))
        lines.append(f"{book}\t{i // 30 + 1}\t{i % 30 + 1}\t{words}")
    lines.append("broken line without tabs")
    lines.append("Gen\t1\t99\t")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def tiny_corpus(tmp_path):
    return write_tiny_corpus(tmp_path / "tiny.tsv")


def train(*args, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "train.py"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def error_line(out) -> str:
    """The one line a failed command prints (TensorFlow's own start-up lines aside); asserts
    it is one line, status 2, no usage dump and no traceback."""
    lines = [line for line in out.stderr.splitlines() if line.strip()
             and not re.match(r"[IWE]\d{4} |WARNING: All log messages before", line)]
    assert out.returncode == 2, out.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("tfseq-train: error: "), out.stderr[-3000:]
    return lines[0]


def test_unknown_flag_fails_naming_it():
    assert "no_such_flag" in error_line(train("--no_such_flag=3"))


def epoch_of(*args) -> tuple[int, dict]:
    """``(steps, train counters)`` of the epoch 0 of ``tfseq-train args...``'s training stream,
    enumerated in this process without training (the batches a trainer takes:
    ``spine.committed`` skips those with no example, and counts the lines as they pass)."""
    import tensorflow as tf

    import tfseq
    from tfseq.pipelines.spine import committed

    task, values, config = cli.flag_config(*args)
    run = task.open(values.model_dir, config, model_config=task.model_config())
    counter = tfseq.DropCounter("train")
    stream = task.training_stream(config, run.state, counter, run.shards)
    stream.epoch = tf.Variable(0, dtype=tf.int64)
    steps = sum(1 for _ in committed(stream))
    return steps, {"seen": counter.seen(), "drops": counter.drops()}


def test_a_learning_rate_that_is_not_positive_fails_naming_it():
    assert "--learning_rate must be > 0" in cli.refused("--learning_rate=0")


def test_a_block_length_that_is_not_a_positive_int_fails_naming_it():
    assert "--block_length takes positive ints" in cli.refused("--block_length=32,x")


def test_conflicting_flags_fail_naming_them(tmp_path, tiny_corpus):
    line = cli.refused(f"--files={tiny_corpus}", "--batching=bucket", "--batch_size=8",
                   f"--model_dir={tmp_path / 'run'}")
    assert "--batch_size applies to --batching=pad" in line
    assert not (tmp_path / "run").exists()


def test_a_run_evaluates_once_per_epoch_and_not_at_all_without_held_out_records(
        tmp_path, tiny_corpus, monkeypatch):
    import keras

    steps = []  # the optimizer step of each evaluation pass
    evaluate = keras.Model.evaluate

    def counted(model, *args, **kwargs):
        steps.append(int(model.optimizer.iterations.numpy()))
        return evaluate(model, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "evaluate", counted)
    cli.train_in_process(f"--files={tiny_corpus}", "--batching=pad",
                         "--batch_size=128", "--epochs=2", f"--model_dir={tmp_path / 'run'}")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["steps"] == 6 and len(steps) == 2  # after epoch 1 and 2; none after
    assert 0 < report["setup"]["first_step_seconds"] < 600  # from this run's start
    last = report["history"][-1]
    assert report["eval"] == {k[len("eval_"):]: v for k, v in last.items()
                              if k.startswith("eval_")}
    # The eval counts are one pass over the file (also after the baseline's own pass).
    assert report["counters"]["eval"]["seen"]["lines_read"] == 282
    # Nothing held out: no evaluation, and no pass over the training file to find nothing.
    steps.clear()
    cli.train_in_process(f"--files={tiny_corpus}", "--batching=pad", "--batch_size=128",
                         "--epochs=1", "--eval_percent=0", f"--model_dir={tmp_path / 'all'}")
    report = json.loads((tmp_path / "all" / "report.json").read_text())
    assert steps == [] and report["eval"] == {} and report["baselines"] == {}
    assert report["counters"]["eval"] == {"seen": {}, "drops": {}}
    assert report["counters"]["train"]["seen"]["lines_read"] == 282


def test_help_exits_0_with_the_commands_flags():
    out = train("--help")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tfseq-train --task=classify" in out.stdout and "--max_tokens" in out.stdout


@pytest.fixture(scope="module")
def bucket_run(tmp_path_factory):
    """A bucketed run (buckets 8 and 16) first refused for a budget that cannot hold one
    example, then trained for an epoch with ``--jit_compile`` and exported:
    ``{"run", "refused", "written_by_refused", "out"}``."""
    base = tmp_path_factory.mktemp("bucket")
    corpus = write_tiny_corpus(base / "tiny.tsv")
    run = base / "jit"
    common = (f"--files={corpus}", "--batching=bucket", f"--model_dir={run}", "--verbose=0",
              "--epochs=1")
    refused = error_line(train(*common, "--max_tokens=20", "--max_length=32"))
    written = run.exists()
    # The corrected command (a lower max_length) is a new run.
    out = train(*common, "--jit_compile", "--max_tokens=64", "--max_length=16")
    assert out.returncode == 0, out.stderr[-3000:]
    return {"run": run, "refused": refused, "written_by_refused": written, "out": out}


@pytest.mark.slow
def test_a_refused_setting_writes_nothing_and_another_tasks_dir_is_one_line(bucket_run):
    run = bucket_run["run"]
    assert bucket_run["refused"] == (
        "tfseq-train: error: max_tokens=20 cannot hold one example of 32 tokens "
        "(max_length); raise max_tokens or lower max_length")
    assert not bucket_run["written_by_refused"]  # the corrected command is a new run
    line = error_line(train("--task=lm", f"--model_dir={run}", "--verbose=0"))
    assert line == (f"tfseq-train: error: {run} holds a --task=classify run, not --task=lm: "
                    f"give this run its own --model_dir (--flagfile={run / 'flags.txt'} "
                    "resumes that one)")


@pytest.mark.slow
def test_a_stopped_run_reports_exports_and_resumes_from_its_flagfile_exactly_once(
        tmp_path, tiny_corpus):
    # The resumable stream consumed in the graph, 4 steps a call: a run stopped by --max_steps
    # at step 6 (in a call) and resumed from its flagfile trains the steps and counts the
    # lines of its stream's epoch, enumerated here (the steps of one step a call).
    run = tmp_path / "run"
    common = (f"--files={tiny_corpus}", "--batching=bucket", "--max_tokens=64",
              "--max_length=16", "--epochs=1")
    out = train(*common, "--steps_per_execution=4", "--max_steps=6", f"--model_dir={run}",
                "--verbose=0", "--learning_rate=0.004")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "interrupted: run the same command again to resume" in out.stdout
    report = json.loads((run / "report.json").read_text())
    assert report["steps"] == 6 and report["interrupted"]
    assert report["learning_rate"] == pytest.approx(0.004)
    assert (run / "flags.txt").exists() and json.loads((run / "argv.json").read_text())[1:3] == [
        f"--files={tiny_corpus}", "--batching=bucket"]
    assert (run / "export" / "saved_model.pb").exists()  # stopped by --max_steps: exported

    # The flagfile reproduces the config and resumes the interrupted run to the end.
    out = train(f"--flagfile={run / 'flags.txt'}", "--max_steps=1000")
    assert out.returncode == 0, out.stderr[-3000:]
    resumed = json.loads((run / "report.json").read_text())
    assert resumed["config"] == report["config"]
    assert not resumed["interrupted"]
    steps, counters = epoch_of(*common, f"--model_dir={tmp_path / 'reference'}")
    assert resumed["steps"] == steps and resumed["counters"]["train"] == counters
    assert report["examples_trained"] + resumed["examples_trained"] == 260
    train_counts = resumed["counters"]["train"]
    assert train_counts["seen"]["lines_read"] == 282
    assert train_counts["drops"]["malformed"] == 1
    read_eval = resumed["counters"]["eval"]["seen"]["lines_read"]
    assert read_eval == 282
    # Every line is either a training example, routed to eval, or dropped with a reason.
    kept_train = 282 - sum(train_counts["drops"].values())
    kept_eval = 282 - sum(resumed["counters"]["eval"]["drops"].values())
    assert kept_train + kept_eval == 282 - 2  # the malformed and the empty line
    assert "held-out accuracy" in out.stdout

    # Once more on the finished run: nothing to train, the saved report is shown unchanged
    # (not an empty epoch at 0 tokens/s written over it), and no warning per optimizer slot.
    out = train(f"--flagfile={run / 'flags.txt'}", "--max_steps=1000")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"{run} holds a finished run (1 epochs, --epochs=1): nothing to train" in out.stdout
    assert "held-out accuracy" in out.stdout
    assert json.loads((run / "report.json").read_text()) == resumed
    assert "unrestored values" not in out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("batching", ["bucket", "pack"])
def test_two_replicas_train_an_epoch_with_split_batches(tmp_path, tiny_corpus, batching):
    run = tmp_path / "replicas"
    out = train(f"--files={tiny_corpus}", "--num_replicas=2", "--epochs=1", "--max_tokens=64",
                "--max_length=16", f"--batching={batching}",
                *(["--block_length=8,16"] if batching == "pack" else []),
                f"--model_dir={run}", "--verbose=0")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert report["replicas"] == 2 and report["epochs"] == 1
    assert all(record["loss"] == record["loss"] for record in report["history"])  # not NaN
    assert report["counters"]["train"]["seen"]["lines_read"] == 282
    assert report["real_tokens"] > 0 and 0.0 < report["padding_efficiency"] <= 1.0
    assert (run / "export" / "saved_model.pb").exists()


@pytest.mark.slow
def test_jit_compile_trains_an_epoch_within_its_shape_budget(bucket_run):
    # Buckets 8 and 16 (max_length 16): at most 2 training batch shapes, so at most 2 XLA
    # programs; every training example is trained once.
    run = bucket_run["run"]
    report = json.loads((run / "report.json").read_text())
    assert report["jit"]["shape_budget"] == 2
    assert 1 <= report["jit"]["compiled_shapes"] <= 2
    assert "XLA (--jit_compile): " in bucket_run["out"].stdout
    # Every kept training line trained once; the rows added to fill batches are not counted.
    drops = sum(report["counters"]["train"]["drops"].values())  # 20 held out, 2 bad lines
    assert report["examples_trained"] == 282 - drops == 260
    assert (run / "export" / "saved_model.pb").exists()


def test_jit_compile_with_replicas_fails_naming_it(tmp_path, tiny_corpus):
    # A SetupError printed by the command itself (it sets up the replicas' devices first: a
    # process of its own); the other refused modes are checked in this process (``refused``).
    out = train(f"--files={tiny_corpus}", "--jit_compile", "--num_replicas=2",
                f"--model_dir={tmp_path / 'x'}")
    assert "--jit_compile trains on one replica" in error_line(out)


def test_replicas_on_a_task_without_support_fail_clearly(tmp_path):
    for task in (["--task=lm", "--tbptt=8"], ["--task=lm_tbptt"]):  # the same task
        line = cli.refused(*task, "--num_replicas=2", f"--model_dir={tmp_path / 'x'}")
        assert line == ("tfseq-train: error: --num_replicas is not supported by "
                        "--task=lm_tbptt (it trains in: single); drop --num_replicas")
        assert not (tmp_path / "x").exists()
    line = cli.refused("--task=documents", "--data_service=localhost:1",
                   f"--model_dir={tmp_path / 'y'}")
    assert line.endswith("--data_service is not supported by --task=documents (it "
                         "trains in: single, replicated); drop --data_service")
    assert not (tmp_path / "y").exists()


@pytest.mark.slow
def test_translate_trains_on_packed_batches_and_reports_real_tokens(tmp_path):
    import tensorflow as tf

    from tfseq import formats

    en, es = "one two three four".split(), "uno dos tres cuatro".split()
    pairs = [[(i >> (2 * j)) % 4 for j in range(2 + i % 3)] for i in range(120)]  # distinct
    lines = [(" ".join(en[k] for k in p), " ".join(es[k] for k in p)) for p in pairs]
    (tmp_path / "t.en").write_text("".join(s + "\n" for s, _ in lines))
    (tmp_path / "t.es").write_text("".join(t + "\n" for _, t in lines))
    run = tmp_path / "run"
    out = train("--task=translate", f"--source_files={tmp_path / 't.en'}",
                f"--target_files={tmp_path / 't.es'}", "--batching=pack", "--block_length=16",
                "--max_tokens=128", "--max_length=8", "--epochs=1", "--export=false",
                f"--model_dir={run}", "--verbose=0")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert report["config"]["batching"] == "pack" and report["steps"] > 0
    train_counts = report["counters"]["train"]
    assert train_counts["seen"]["lines_read"] == 120
    held_out = formats.in_eval_split(tf.constant([f"{s}\t{t}" for s, t in lines]), 5).numpy()
    assert train_counts["drops"] == {**{k: 0 for k in train_counts["drops"]},
                                     "other_split": int(held_out.sum())}
    # The training batches hold exactly the real tokens of the training pairs: n source words
    # and n + 1 targets (w1 .. wn </s>) per pair, no padding counted.
    assert report["real_tokens"] == sum(2 * len(p) + 1 for p, out_ in zip(pairs, held_out)
                                        if not out_)
    assert 0.0 < report["eval"]["accuracy"] <= 1.0 and report["eval"]["loss"] > 0.0


@pytest.mark.parametrize("how", ["module", "file"])
def test_a_command_prints_no_tensorflow_start_up_lines(tmp_path, how):
    # TensorFlow's C++ lines at import and device discovery (oneDNN, cuda drivers, cuInit,
    # "All log messages before absl::InitializeLog()") are kept off: the error is all there is.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TFSEQ_TF_LOGS", None)
    command = (["-m", "tfseq.scripts.export"] if how == "module"
               else [os.path.join(ROOT, "scripts", "export.py")])
    out = subprocess.run([sys.executable, *command, f"--model_dir={tmp_path / 'none'}"],
                         capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"tfseq-export: error: No {tmp_path / 'none'}/run.json: export needs a directory "
        "written by tfseq-train"]
    if how == "module":
        return  # TFSEQ_TF_LOGS=1 asked through the file alone: one process fewer
    shown = subprocess.run([sys.executable, *command, f"--model_dir={tmp_path / 'none'}"],
                           capture_output=True, text=True, env={**env, "TFSEQ_TF_LOGS": "1"},
                           timeout=120, cwd=tmp_path)
    assert len(shown.stderr.splitlines()) > 1  # asked for: TensorFlow's lines are there
