"""documents, ctr and lm_tbptt exports: they load without tfseq and answer raw input as the
trained model does in process; the binary resumes them mid-epoch and exports."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import cli
import tensorflow as tf

from tfseq import training
from tfseq.models import ctr as ctr_model
from tfseq.models import hierarchical, stateful_lm
from tfseq.pipelines import ctr, documents, exporting, lm_tbptt, predicting, tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SERVE_WITHOUT_TFSEQ = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401
answers = []
for export_dir, input_name, inputs in json.loads(sys.argv[1]):
    model = tf.saved_model.load(export_dir)
    out = model.signatures["serving_default"](**{input_name: tf.constant(inputs)})
    answers.append({k: [x.decode() if isinstance(x, bytes) else x for x in v.numpy().tolist()]
                    for k, v in out.items()})
print(json.dumps({
    "tfseq_modules": [m for m in sys.modules if m == "tfseq" or m.startswith("tfseq.")],
    "answers": answers}))
"""


def serve_plain(*requests):
    """The answers of exports from one plain interpreter (no tfseq on the path): a request is
    ``(export_dir, input_name, inputs)``; returns (tfseq modules loaded, [answers])."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONPATH", None)
    out = subprocess.run([sys.executable, "-S", "-c", "import site; site.main()\n"
                          + SERVE_WITHOUT_TFSEQ, json.dumps([list(r) for r in requests])],
                         capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    served = json.loads(out.stdout.strip().splitlines()[-1])
    return served["tfseq_modules"], served["answers"]


def train_binary(task, model_dir, *flags, fault=None):
    """``tfseq-train --task=TASK`` for one epoch in its own process (``fault``: a fault point,
    e.g. ``after_step:8:TERM``: ``tests/faults``)."""
    return cli.run("train", f"--task={task}", "--epochs=1", f"--model_dir={model_dir}",
                   "--checkpoint_every=0", "--verbose=0", *flags, fault=fault)


def train_a_little(model, data, steps=3):
    training.Trainer(model, data.stream, model_dir=None).fit(1, verbose=0, max_steps=steps)


def documents_export(tmp_path):
    names = documents.Config().class_names
    text = "".join(f"{names[i % 7]}\nthe word{i % 5} of {i % 3}\nand more words\n\n"
                   for i in range(30))
    (tmp_path / "docs.txt").write_text(text)
    config = documents.Config(files=(str(tmp_path / "docs.txt"),), min_count=1, batch_size=4)
    data = documents.TASK.datasets(config)
    info = data.state
    model = hierarchical.build_model(config, info, hierarchical.ModelConfig(
        embedding_dim=8, word_units=8, sentence_units=8))
    export = exporting.export_run(str(tmp_path), tasks.load("documents"), config, info, model)
    docs = ["The word1 of 2\n\n  and MORE words \n", "unseen words here", "\n \n"]
    return {"dir": tmp_path, "info": info, "model": model, "names": names,
            "request": (export, "text", docs)}


def ctr_export(tmp_path):
    files = ctr.generate(str(tmp_path / "data"), num_files=1, examples_per_file=100,
                         eval_examples=10)
    config = ctr.Config(files=tuple(files["train_files"]), eval_files=tuple(files["eval_files"]),
                        batch_size=16)
    data = ctr.TASK.datasets(config)
    info = data.state
    model = ctr_model.build_model(config, info, ctr_model.ModelConfig(
        buckets=101, wide_buckets=101, hidden=(8,)))
    export = exporting.export_run(str(tmp_path), tasks.load("ctr"), config, info, model)
    with open(files["eval_files"][0]) as f:
        lines = [line.rstrip("\n") for line in f][:10]
    bare = [line.split(" ", 2)[2] for line in lines[:3]]  # "1 <click> " left out
    return {"eval": data.eval, "model": model,
            "request": (export, "line", lines + bare + ["1 1 1 x"])}


def lm_tbptt_export(tmp_path, mode):
    lines = [f"Gen\t1\t{i}\tw{i % 4} w{i % 3} w{i % 5}" for i in range(30)]
    (tmp_path / "c.tsv").write_text("\n".join(lines) + "\n")
    config = lm_tbptt.Config(files=(str(tmp_path / "c.tsv"),), min_count=1, mode=mode,
                             batch_size=2, tbptt=4, eval_percent=0)
    data = lm_tbptt.TASK.datasets(config)
    info = data.state
    model = stateful_lm.build_model(config, info, stateful_lm.ModelConfig(embedding_dim=4,
                                                                          units=4))
    train_a_little(model, data)
    export = exporting.export_run(str(tmp_path), tasks.load("lm_tbptt"), config, info, model)
    return {"dir": tmp_path, "info": info, "model": model,
            "request": (export, "text", ["W1 w2 w0", "w3 unknown"])}


CTR_LINES = ["1 1 1 5 1 7 1 3 2 4 5 3 1 2 3 3 0.5 -0.2 1.0", "1 1 1 5"]


def ctr_binary_run(tmp_path):
    """``tfseq-train --task=ctr`` stopped by SIGTERM after step 4, then the same command to the
    end; tfseq-predict on ``CTR_LINES``; the run exported again from its directory in this
    process (tfseq-export's work; the command itself: tests/test_first_hour.py)."""
    data = ctr.generate(str(tmp_path / "data"), num_files=2, examples_per_file=150,
                        eval_examples=50, bad_lines_per_file=2)
    files = [f"--files={','.join(data['train_files'])}",
             f"--eval_files={data['eval_files'][0]}", "--batch_size=32"]
    run = tmp_path / "cut"
    cut = train_binary("ctr", run, *files, fault="after_step:4:TERM")
    made = {"dir": run, "cut": cut, "export_after_cut": os.path.exists(run / "export")}
    made["first"] = json.loads((run / "report.json").read_text())
    rest = train_binary("ctr", run, *files)
    assert rest.returncode == 0, rest.stderr[-2000:]
    made["report"] = json.loads((run / "report.json").read_text())
    (tmp_path / "in.txt").write_text("\n".join(CTR_LINES) + "\n")
    made["predicted"] = subprocess.run(
        [sys.executable, "-m", "tfseq.scripts.predict", f"--model_dir={run}",
         f"--files={tmp_path / 'in.txt'}", f"--output={tmp_path / 'out.txt'}"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert made["predicted"].returncode == 0, made["predicted"].stderr[-2000:]
    made["output"] = (tmp_path / "out.txt").read_text()
    task, config, saved = exporting.load_run(str(run))
    model, state = exporting.restore_model(str(run), task, config, saved)
    exporting.export_run(str(run), task, config, state, model, str(tmp_path / "again"))
    made["requests"] = [(str(run / "export"), "line", CTR_LINES),
                        (str(tmp_path / "again"), "line", CTR_LINES)]
    return made


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """documents and ctr models built in process (untrained: each export is compared with its
    model), lm_tbptt (both modes) models trained a few steps in process (built by training), all
    exported; the ctr run of the binary (``ctr_binary_run``); the answers of every export from
    one plain interpreter (no tfseq)."""
    made = {"documents": documents_export(tmp_path_factory.mktemp("documents")),
            "ctr": ctr_export(tmp_path_factory.mktemp("ctr"))}
    for mode in ("stream", "sequences"):
        made[mode] = lm_tbptt_export(tmp_path_factory.mktemp(mode), mode)
    ctr_run = ctr_binary_run(tmp_path_factory.mktemp("ctr_run"))
    modules, answers = serve_plain(*(made[name]["request"] for name in made),
                                   *ctr_run["requests"])
    for name, served in zip(made, answers):
        made[name]["served"] = served
    ctr_run["served"] = answers[len(made):]
    made["ctr_run"] = ctr_run
    made["tfseq_modules"] = modules
    return made


@pytest.mark.slow
def test_documents_export_answers_text(exports):
    made = exports["documents"]
    tmp_path, info, model, names, served = (made[k] for k in ("dir", "info", "model", "names",
                                                              "served"))
    assert exports["tfseq_modules"] == []
    to_ids = documents.encode(info["vocab"], lowercase=True)
    sentences = [["the word1 of 2", "and more words"], ["unseen words here"]]
    ids = tf.ragged.stack([to_ids(tf.constant(s)) for s in sentences])
    expected = tf.nn.softmax(model({"ids": ids}, training=False)).numpy()
    np.testing.assert_allclose(served["probabilities"][:2], expected, atol=1e-5)
    assert served["probabilities"][2] == [0.0] * 7 and served["label"][2] == ""
    assert served["label"][:2] == [names[i] for i in expected.argmax(-1)]
    # tfseq-predict's path: a blank-line-separated file (no label lines), a line per document.
    (tmp_path / "in.txt").write_text("The word1 of 2\n  and MORE words \n\n\nunseen words here\n")
    report = predicting.predict_files(str(tmp_path), [str(tmp_path / "in.txt")],
                                      str(tmp_path / "out.txt"))
    assert (tmp_path / "out.txt").read_text().splitlines() == [
        f"{served['label'][i]}\t{max(served['probabilities'][i]):.6f}" for i in range(2)]
    assert report["lines"] == 2 and report["empty"] == 0


@pytest.mark.slow
def test_ctr_export_answers_multislot_lines(exports):
    made = exports["ctr"]
    served = made["served"]
    assert exports["tfseq_modules"] == []
    features, _ = next(iter(made["eval"]))
    expected = tf.sigmoid(made["model"](features, training=False)).numpy()[:10]
    np.testing.assert_allclose(served["probability"][:10], expected, atol=1e-5)
    np.testing.assert_allclose(served["probability"][10:13], expected[:3], atol=1e-5)
    assert served["valid"] == [True] * 13 + [False] and served["probability"][13] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stream", "sequences"])
def test_lm_tbptt_export_scores_text(exports, mode):
    made = exports[mode]
    tmp_path, info, model, served = (made[k] for k in ("dir", "info", "model", "served"))
    assert exports["tfseq_modules"] == []
    vocab = info["vocab"]
    start = 2 if mode == "sequences" else 3  # <s> / </s>
    expected = []
    for text in ["w1 w2 w0", "w3 unknown"]:
        ids = vocab.lookup(tf.constant(text.split())).numpy().tolist() + [3]
        inputs = tf.constant([[start] + ids[:-1]], tf.int32)
        logits, _ = model.run({"ids": inputs, "ids_length": tf.constant([len(ids)])})
        scores = tf.nn.log_softmax(logits[0]).numpy()
        expected.append(sum(scores[t, i] for t, i in enumerate(ids)))
    np.testing.assert_allclose(served["log_likelihood"], expected, rtol=1e-5)
    assert served["tokens"] == [4, 3]
    (tmp_path / "in.tsv").write_text("Gen\t9\t1\tW1 w2 w0\nGen\t9\t2\tw3 unknown\n")
    predicting.predict_files(str(tmp_path), [str(tmp_path / "in.tsv")], str(tmp_path / "o.txt"))
    assert (tmp_path / "o.txt").read_text().splitlines() == [
        f"{ll:.6f}\t{n}" for ll, n in zip(served["log_likelihood"], [4, 3])]


# One whole pass of the ctr files below: 2 files of 150 good lines and 2 bad ones each
# ("1 1 1 5": a slot missing; "1 0 1 x ...": not a number).
CTR_WHOLE_PASS = {"seen": {"lines_read": 304}, "drops": {
    "bad_count": 0, "count_too_large": 0, "dense_size": 0, "extra_tokens": 0, "missing_slot": 2,
    "non_numeric": 2}}
# One whole pass of the documents file below: 42 documents of 4 lines, then one of 3 lines
# whose label is unknown.
DOCUMENTS_WHOLE_PASS = {"seen": {"documents": 43, "lines_read": 42 * 4 + 3}, "drops": {
    "other_split": 0, "too_long_sentence": 0, "too_many_sentences": 0, "unknown_label": 1}}


@pytest.mark.slow
def test_ctr_binary_resumes_mid_epoch_and_exports(exports):
    run = exports["ctr_run"]
    cut, first, report, predicted = (run[k] for k in ("cut", "first", "report", "predicted"))
    answers, again = run["served"]
    assert cut.returncode == 128 + signal.SIGTERM, cut.stderr[-2000:]
    assert run["export_after_cut"] is False
    assert (first["steps"], report["steps"]) == (4, 10)  # 300 good lines in batches of 32
    assert report["resumed_at_step"] == 4
    assert [r["data_state_bytes"] for r in (first, report)] == [0, 0]
    # The resumed epoch recounted its replayed part: the counts of one whole pass (2 files of
    # 150 lines and 2 bad lines each), and each good line trained once over the two commands.
    assert report["counters"]["train"] == CTR_WHOLE_PASS
    assert first["examples_trained"] + report["examples_trained"] == 300
    with open(run["dir"] / "export" / "assets" / "serving.json") as f:
        assert json.load(f)["task"] == "ctr"
    assert exports["tfseq_modules"] == []
    assert answers["valid"] == [True, False]
    assert 0.0 < answers["probability"][0] < 1.0 and answers["probability"][1] == 0.0
    assert run["output"] == f"{answers['probability'][0]:.6f}\n\n"
    assert "unusable lines (empty output): 1 {'malformed': 1}" in predicted.stdout
    # The export made again from the run directory: the same model as the one at the end.
    np.testing.assert_allclose(again["probability"], answers["probability"], atol=1e-6)


@pytest.mark.slow
def test_documents_binary_resumes_on_another_number_of_replicas(tmp_path):
    names = documents.Config().class_names
    text = "".join(f"{names[i % 7]}\nthe word{i % 5} of {i % 3}\nmore words {i}\n\n"
                   for i in range(42))
    (tmp_path / "docs.txt").write_text(text + "Nothing\nunknown label\n\n")
    files = [f"--files={tmp_path / 'docs.txt'}", "--batch_size=4", "--eval_percent=0"]

    def train(model_dir, *flags, fault=None):
        return train_binary("documents", model_dir, "--noexport", *files, *flags, fault=fault)

    cut = train(tmp_path / "cut", "--num_replicas=2", fault="after_step:4:TERM")
    assert cut.returncode == 128 + signal.SIGTERM, cut.stderr[-2000:]
    first = json.load(open(tmp_path / "cut" / "report.json"))
    assert first["mode"] == "replicated" and first["replicas"] == 2
    rest = train(tmp_path / "cut", "--num_replicas=1")
    assert rest.returncode == 0, rest.stderr[-2000:]
    report = json.load(open(tmp_path / "cut" / "report.json"))
    assert report["steps"] == 11  # 42 documents in batches of 4
    assert report["resumed_at_step"] == 4
    # Each document trained once over the two commands: 4 batches of 4, then the other 26.
    assert first["examples_trained"] == 16 and report["examples_trained"] == 26
    # The resumed epoch recounted its replayed part: the counts of one whole pass.
    assert report["counters"]["train"] == DOCUMENTS_WHOLE_PASS
    assert [r["data_state_bytes"] for r in (first, report)] == [0, 0]
    # The position is replayed from the settings: a resume that changes them stops first, with
    # the message tfseq-train prints (the command prints it: tests/test_resume.py).
    from tfseq.pipelines import runs
    from tfseq.scripts.flag_table import changed_run_message

    task = tasks.load("documents")
    with pytest.raises(runs.ChangedRun) as changed:
        task.open(str(tmp_path / "cut"), documents.Config(
            files=(str(tmp_path / "docs.txt"),), batch_size=8, eval_percent=0),
            model_config=task.model_config())
    assert "--batch_size: saved 4, now 8" in changed_run_message(changed.value)


def test_every_task_answers_the_one_interface_the_runner_calls():
    interface = ("open", "training_stream", "eval_dataset", "build_model", "model_config",
                 "baselines", "sample_lines", "drop_examples", "export_module", "saved_state",
                 "built", "prediction_line", "batching")
    for name in tasks.TASKS:
        task = tasks.load(name)
        assert task.name == name
        assert [m for m in interface if not callable(getattr(task, m, None))] == []
    assert {name: (tasks.load(name).modes, tasks.load(name).predicts_in_order)
            for name in tasks.TASKS} == {
        "classify": (("single", "replicated", "multi_worker", "data_service"), False),
        "lm": (("single", "replicated", "multi_worker", "data_service"), False),
        "tag": (("single", "replicated", "multi_worker", "data_service"), False),
        "translate": (("single", "replicated", "multi_worker", "data_service"), False),
        "documents": (("single", "replicated"), True),
        "ctr": (("single", "replicated"), True),
        "lm_tbptt": (("single",), True),
        "keras_hub_classify": (("single", "replicated"), False)}


def test_a_replayed_task_opens_a_run_and_refuses_a_changed_resume(tmp_path):
    from tfseq.pipelines import runs

    names = documents.Config().class_names
    (tmp_path / "docs.txt").write_text("".join(
        f"{names[i % 7]}\nword{i % 5} and word{i % 3}\n\n" for i in range(20)))
    config = documents.Config(files=(str(tmp_path / "docs.txt"),), min_count=1, batch_size=4)
    task = tasks.load("documents")
    model_config = task.model_config()
    run = task.open(str(tmp_path / "run"), config, model_config=model_config)
    assert (run.resumed, run.shards, run.setup.passes) == (False, None, 1)
    assert run.state["class_names"] == names and "word1" in run.state["vocab"].tokens
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    assert saved["task"] == "documents" and saved["config"]["batch_size"] == 4
    assert [f["path"] for f in saved["input"]] == [str(tmp_path / "docs.txt")]
    again = task.open(str(tmp_path / "run"), config, model_config=model_config)
    assert again.resumed and again.state["vocab"].tokens == run.state["vocab"].tokens
    with pytest.raises(runs.ChangedRun, match=r"config.batch_size \(saved 4, new 8\)"):
        task.open(str(tmp_path / "run"), documents.Config(
            files=config.files, min_count=1, batch_size=8), model_config=model_config)
