"""``tfseq-train --task=classify --keras_hub=PATH`` as a user runs it: a tiny BERT from a
backbone config file and a WordPiece vocabulary written here, trained on tfseq's bucketed
batches, stopped by SIGTERM mid-epoch and finished by the same command, then served and
predicted. One trained run for the module; nothing is downloaded.

On these files tfseq's own classifier (``--epochs=3 --max_tokens=128``, no ``--keras_hub``)
reaches 0.983 held-out accuracy; the KerasHub model must reach 0.9.
"""

import importlib.util
import json
import os
import random
import re
import subprocess
import sys

import pytest

import cli

pytestmark = pytest.mark.skipif(importlib.util.find_spec("keras_hub") is None,
                                reason="KerasHub is not installed (pip install tfseq[keras-hub])")

WORDS = {"pos": ["good", "great", "fine", "nice", "happy"],
         "neg": ["bad", "awful", "poor", "sad", "ugly"]}
FILLER = ["the", "a", "day", "was", "and", "very", "it", "food", "."]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *FILLER, *WORDS["pos"], *WORDS["neg"]]
BACKBONE = {"vocabulary_size": len(VOCAB), "num_layers": 1, "num_heads": 2, "hidden_dim": 32,
            "intermediate_dim": 64, "max_sequence_length": 64}
TRAIN_LINES, EPOCHS, STOP = 200, 3, 25  # ~17 steps an epoch: step 25 is in the second


def write_lines(path, n, seed):
    """``n`` lines ``label<TAB>text``: 2-10 filler words and 1-2 words of the label's set."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            label = "pos" if i % 2 else "neg"
            words = [rng.choice(FILLER) for _ in range(rng.randint(2, 10))]
            for _ in range(rng.randint(1, 2)):
                words.insert(rng.randint(0, len(words)), rng.choice(WORDS[label]))
            f.write(f"{label}\t{' '.join(words)}\n")


def report_of(folder):
    with open(folder / "runs" / "bert" / "report.json") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run: stopped by SIGTERM at step ``STOP``, then the same command to the end."""
    folder = tmp_path_factory.mktemp("keras_hub")
    write_lines(folder / "train.tsv", TRAIN_LINES, seed=0)
    write_lines(folder / "eval.tsv", 60, seed=1)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    (folder / "bert.json").write_text(json.dumps(
        {"class_name": "BertBackbone", "config": BACKBONE, "vocabulary": "vocab.txt",
         "tokenizer": {"lowercase": True}}))
    flags = ("--task=classify", "--keras_hub=bert.json", "--train_files=train.tsv",
             "--eval_files=eval.tsv", "--columns=label,text", "--model_dir=runs/bert",
             f"--epochs={EPOCHS}", "--max_tokens=128", "--learning_rate=0.005")
    stopped = cli.run("train", *flags, fault=f"after_step:{STOP}:TERM", cwd=folder)
    first = report_of(folder)
    finished = cli.run("train", *flags, cwd=folder)
    assert finished.returncode == 0, finished.stderr[-3000:]
    return {"folder": folder, "stopped": stopped, "first": first, "finished": finished,
            "report": report_of(folder)}


def test_sigterm_mid_epoch_then_the_same_command_trains_every_example_once(run):
    stopped, first, report = run["stopped"], run["first"], run["report"]
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert stopped.stderr.splitlines()[-1] == (
        "tfseq-train: stopped by SIGTERM: the newest checkpoint in runs/bert is kept; run the "
        "same command again to resume")
    assert first["interrupted"] and first["steps"] == STOP
    resumed = re.search(r"Resuming from runs/bert: epoch (\d+), step (\d+) of that epoch",
                        run["finished"].stderr)
    assert resumed and resumed[1] == "2" and int(resumed[2]) > 0  # mid-epoch
    assert report["resumed_at_step"] == STOP and not report["interrupted"]
    assert report["task"] == "keras_hub_classify" and report["epochs"] == EPOCHS
    train = report["counters"]["train"]
    assert train["seen"]["lines_read"] == TRAIN_LINES and sum(train["drops"].values()) == 0
    # Each example once per epoch over the two commands: 3 epochs of 200.
    assert first["examples_trained"] + report["examples_trained"] == EPOCHS * TRAIN_LINES
    assert report["padding_efficiency"] > 0.9  # bucketed, not padded to 64
    for out in (stopped, run["finished"]):
        assert cli.tf_log_lines(out.stderr) == [], out.stderr[-3000:]


def test_held_out_accuracy_is_the_plain_models(run):
    report = run["report"]
    assert report["eval"]["accuracy"] >= 0.9, report["eval"]
    assert report["baselines"] == {"majority-class": 0.5}


def test_the_run_keeps_the_model_and_its_vocabulary_as_a_keras_hub_preset(run):
    model_dir = run["folder"] / "runs" / "bert"
    with open(model_dir / "run.json") as f:
        assert json.load(f)["config"]["keras_hub"] == str(run["folder"] / "bert.json")
    assert sorted(os.listdir(model_dir / "keras_hub")) == [
        "assets", "config.json", "metadata.json", "model.weights.h5", "tfseq.json",
        "tokenizer.json"]
    assert (model_dir / "keras_hub" / "assets" / "tokenizer" / "vocabulary.txt").read_text(
        ).split() == VOCAB
    assert (model_dir / "labels.txt").read_text() == "neg\npos\n"
    assert not (model_dir / "vocab.txt").exists()


SERVE = """
import json, sys
sys.modules["keras_hub"] = None   # as if not installed
import tensorflow as tf, tensorflow_text  # noqa: F401
model = tf.saved_model.load(sys.argv[1])
out = model.signatures["serving_default"](text=tf.constant(sys.argv[2:]))
print(json.dumps({"label": [v.decode() for v in out["label"].numpy()],
                  "probabilities": out["probabilities"].numpy().tolist(),
                  "tfseq": [m for m in sys.modules if m.split(".")[0] == "tfseq"]}))
"""


def test_the_export_answers_raw_text_without_tfseq_or_keras_hub(run):
    export = run["folder"] / "runs" / "bert" / "export"
    texts = ["The food was GREAT", "a sad , ugly day", "", "nice zebra"]
    done = subprocess.run([sys.executable, "-c", SERVE, str(export), *texts],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["tfseq"] == []
    assert out["label"] == ["pos", "neg", "", "pos"]  # no token: no answer
    assert out["probabilities"][2] == [0.0, 0.0]
    assert all(abs(sum(p) - 1) < 1e-5 for p in out["probabilities"][:2])
    with open(export / "assets" / "serving.json") as f:
        info = json.load(f)
    assert (info["task"], info["tokenizer"], info["max_ids"], info["keras_hub"]) == (
        "keras_hub_classify", "BertTokenizer", 64,
        {"backbone": "BertBackbone", "classifier": "BertTextClassifier", "pretrained": False,
         "tokenizer": "BertTokenizer"})


def test_predict_writes_one_line_per_input_line(run):
    folder = run["folder"]
    out = cli.run("predict", "--model_dir=runs/bert", "--files=eval.tsv",
                  "--output=predicted.tsv", cwd=folder)
    assert out.returncode == 0, out.stderr[-3000:]
    assert cli.tf_log_lines(out.stderr) == []
    predicted = (folder / "predicted.tsv").read_text().splitlines()
    gold = [line.split("\t")[0] for line in (folder / "eval.tsv").read_text().splitlines()]
    assert len(predicted) == len(gold) == 60
    labels = [line.split("\t")[0] for line in predicted]
    assert sum(p == g for p, g in zip(labels, gold)) / 60 >= 0.9


@pytest.mark.parametrize("flag, message", [
    ("--tokenizer=wordpiece", "--tokenizer does not apply with --keras_hub: the KerasHub "
     "model's own tokenizer and vocabulary encode the text"),
    ("--keras_hub=hf://google/bert", "--keras_hub=hf://google/bert is a download handle; "
     "tfseq-train reads a model from local disk and downloads nothing: save it once (e.g. "
     "keras_hub.models.BertTextClassifier.from_preset(HANDLE).save_to_preset(DIR)) and give "
     "--keras_hub=DIR"),
])
def test_a_refused_flag_is_one_line(run, flag, message):
    out = cli.run("train", "--task=classify", "--keras_hub=bert.json", "--train_files=train.tsv",
                  "--columns=label,text", "--model_dir=runs/refused", flag, cwd=run["folder"])
    assert cli.error_line(out) == f"tfseq-train: error: {message}"
    assert not (run["folder"] / "runs" / "refused").exists()


# ----------------------------------------------------------------- what --keras_hub reads

def test_a_preset_directory_is_read_as_keras_hub_saves_it(tmp_path):
    import keras_hub
    import numpy as np

    from tfseq.errors import InputError
    from tfseq.pipelines.keras_hub_classify import HubModel

    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=str(tmp_path / "vocab.txt"),
                                               lowercase=True)
    backbone = keras_hub.models.BertBackbone(**BACKBONE)
    classifier = keras_hub.models.BertTextClassifier(
        backbone, num_classes=3, dropout=0.25,
        preprocessor=keras_hub.models.BertTextClassifierPreprocessor(tokenizer))
    classifier.save_to_preset(str(tmp_path / "preset"))

    hub = HubModel.open(str(tmp_path / "preset"))
    assert (hub.classifier_class, hub.classifier_args, hub.pretrained,
            hub.max_sequence_length) == (keras_hub.models.BertTextClassifier,
                                         {"dropout": 0.25}, True, 64)
    assert hub.tokenizer()(["A good day"]) == [[6, 14, 7]]  # lower-cased
    mine = hub.classifier(2)  # the saved backbone's weights, a head for the run's labels
    for saved, loaded in zip(backbone.get_weights(), mine.backbone.get_weights()):
        np.testing.assert_array_equal(saved, loaded)
    assert mine.num_classes == 2 and mine.preprocessor is None

    (tmp_path / "preset" / "tokenizer.json").unlink()
    (tmp_path / "small.json").write_text(json.dumps(
        {"class_name": "BertBackbone", "config": dict(BACKBONE, vocabulary_size=10)}))
    (tmp_path / "typo.json").write_text(json.dumps({"class_name": "BertBackbone",
                                                    "config": BACKBONE, "vocab": "v.txt"}))
    (tmp_path / "gpt.json").write_text(json.dumps({"class_name": "GPT2Backbone", "config": {}}))
    for path, message in [
        ("preset", "no tokenizer.json: save the preset with its tokenizer (a task with its "
                   "preprocessor, or tokenizer.save_to_preset(DIR))"),
        ("small.json", "the tokenizer has 24 tokens but the backbone's vocabulary_size is "
                       "10: give a vocabulary of the backbone's size, or raise its "
                       "vocabulary_size"),
        ("typo.json", "a backbone config file has class_name (e.g. BertBackbone), config (its "
                      "arguments) and optionally vocabulary and tokenizer; unknown keys "
                      "['vocab']"),
        ("gpt.json", "KerasHub has no text classifier for GPT2Backbone (text backbones: "),
    ]:
        with pytest.raises(InputError) as raised:
            HubModel.open(str(tmp_path / path))
        assert str(raised.value).startswith(f"--keras_hub={tmp_path / path}: {message}")
