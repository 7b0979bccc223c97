"""tfseq.serving and tfseq-export: raw-text SavedModels equal the in-process models."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfseq
from tfseq import serving
from conftest import train_tiny, write_tiny_corpus

from tfseq.pipelines import runs, tasks
from tfseq.pipelines.classify import ServedClassifier
from tfseq.pipelines.exporting import export_run, load_run, restore_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TEXTS = ["gen0 gen1 gen2", "Rev3 rev4 rev0", "matt1 unknownword", "ps0 ps1 ps2 ps3 ps4 ps0 ps1"]

SERVE_WITHOUT_TFSEQ = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401
classify = tf.saved_model.load(sys.argv[1])
lm = tf.saved_model.load(sys.argv[2])
texts = tf.constant(json.loads(sys.argv[3]))
c = classify.signatures["serving_default"](text=texts)
l = lm.signatures["serving_default"](text=texts)
print(json.dumps({
    "tfseq_modules": [m for m in sys.modules if m == "tfseq" or m.startswith("tfseq.")],
    "label": [s.decode() for s in c["label"].numpy()],
    "probabilities": c["probabilities"].numpy().tolist(),
    "log_likelihood": l["log_likelihood"].numpy().tolist(),
    "tokens": l["tokens"].numpy().tolist()}))
"""


def padded_ids(vocab, texts, **kwargs):
    ds = tf.data.Dataset.from_tensor_slices(texts).apply(
        tfseq.tokenize(vocab, lowercase=True, **kwargs))
    ids = tf.ragged.stack([e["ids"] for e in ds])
    return ids.to_tensor(), tf.cast(ids.row_lengths(), tf.int32)


def in_process_classify(model, state, texts):
    ids, _ = padded_ids(state.vocab, texts)
    return tf.nn.softmax(model({"ids": ids}, training=False)).numpy()


def in_process_lm(model, state, texts):
    ids, lengths = padded_ids(state.vocab, texts, add_bos=True, add_eos=True)
    inputs, targets = ids[:, :-1], ids[:, 1:].numpy()
    logits = model({"ids": inputs, "ids_length": lengths - 1}, training=False)
    scores = tf.nn.log_softmax(logits).numpy()
    picked = np.take_along_axis(scores, targets[..., None], axis=-1)[..., 0]
    return (picked * (targets > 0)).sum(axis=1), (lengths - 1).numpy()


@pytest.mark.slow
def test_round_trip_in_a_process_without_tfseq(tiny_exports, tmp_path):
    classify_dir, _, classify_model, classify_info = tiny_exports["classify"]
    lm_dir, _, lm_model, lm_info = tiny_exports["lm"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH="")
    out = subprocess.run(
        [sys.executable, "-c", SERVE_WITHOUT_TFSEQ, os.path.join(classify_dir, "export"),
         os.path.join(lm_dir, "export"), json.dumps(TEXTS)],
        capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    served = json.loads(out.stdout.strip().splitlines()[-1])
    assert served["tfseq_modules"] == []

    expected = in_process_classify(classify_model, classify_info, TEXTS)
    np.testing.assert_allclose(served["probabilities"], expected, atol=1e-5)
    names = classify_info.labels["label"]
    assert served["label"] == [names[i] for i in expected.argmax(axis=1)]
    with open(os.path.join(classify_dir, "export", "assets", "labels.txt")) as f:
        assert f.read().splitlines() == list(names)

    log_likelihood, tokens = in_process_lm(lm_model, lm_info, TEXTS)
    np.testing.assert_allclose(served["log_likelihood"], log_likelihood, atol=1e-5, rtol=1e-6)
    assert served["tokens"] == [4, 4, 3, 8]  # words + </s>


def test_export_layout_and_info(tiny_exports):
    export = os.path.join(tiny_exports["classify"][0], "export")
    assert sorted(os.listdir(os.path.join(export, "assets"))) == [
        "labels.txt", "serving.json", "vocab.txt"]
    info = serving.read_info(export)
    assert (info["task"], info["input"], info["tokenizer"], info["lowercase"],
            info["max_length"], info["long_examples"], info["num_labels"]) == (
        "classify", "text", "whitespace", True, 12, "truncate", 7)
    with pytest.raises(FileNotFoundError, match="is not a tfseq export"):
        serving.read_info(tiny_exports["classify"][0])


def test_long_inputs_truncate_by_default_and_drop_on_request(tiny_exports, tmp_path):
    _, config, model, state = tiny_exports["classify"]
    served = tf.saved_model.load(os.path.join(tiny_exports["classify"][0], "export"))
    words = [f"gen{i % 5}" for i in range(20)]
    out = served.serve(tf.constant([" ".join(words), " ".join(words[:12])]))
    probabilities = out["probabilities"].numpy()
    np.testing.assert_allclose(probabilities[0], probabilities[1], atol=1e-6)

    encoder = serving.TextEncoder(state.vocab, str(tmp_path), lowercase=True, max_length=12)
    dropping = ServedClassifier(serving.keras_model_fn(model), encoder,
                                list(state.labels["label"]), str(tmp_path), "drop")
    out = dropping.serve(tf.constant([" ".join(words), " ".join(words[:12]), ""]))
    labels = [s.decode() for s in out["label"].numpy()]
    assert labels[0] == "" and labels[1] != "" and labels[2] == ""
    assert out["probabilities"].numpy()[0].tolist() == [0.0] * 7
    np.testing.assert_allclose(out["probabilities"].numpy()[1], probabilities[1], atol=1e-6)


@pytest.mark.parametrize("tokenizer", ["whitespace", "unicode_script", "wordpiece"])
def test_encoder_matches_tokenize(tokenizer, tmp_path):
    vocab = tfseq.Vocab(["<pad>", "<unk>", "<s>", "</s>", "the", "un", "##aff", "##able",
                         "day", ",", "hello", "##s"])
    texts = ["The unaffable day", "hello, the days", "", "unknown THE"]
    module = tf.Module()
    module.encoder = serving.TextEncoder(vocab, str(tmp_path), tokenizer=tokenizer,
                                         lowercase=True, add_bos=True)
    module.encode = tf.function(lambda text: module.encoder(text),
                                input_signature=[tf.TensorSpec([None], tf.string)])
    if tokenizer == "wordpiece":  # its tables live in sub-objects: they must be saved too
        tf.saved_model.save(module, str(tmp_path / "saved"))
        module = tf.saved_model.load(str(tmp_path / "saved"))
    ids, truncated = module.encode(tf.constant(texts))
    ds = tf.data.Dataset.from_tensor_slices(texts).apply(
        tfseq.tokenize(vocab, tokenizer=tokenizer, lowercase=True, add_bos=True))
    assert ids.to_list() == [e["ids"].numpy().tolist() for e in ds]
    assert truncated.numpy().tolist() == [False] * 4
    if tokenizer == "wordpiece":
        assert ids.to_list() == [[2, 4, 5, 6, 7, 8], [2, 1, 4, 8, 11], [2], [2, 1, 4]]


def test_sentencepiece_vocab_is_an_asset_and_ids_match(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    import io

    corpus = [f"gen{i % 5} matt{i % 3} the beginning of verse {i}" for i in range(200)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=model, vocab_size=40, model_type="unigram",
        pad_id=0, unk_id=1, bos_id=2, eos_id=3, pad_piece="<pad>", unk_piece="<unk>",
        bos_piece="<s>", eos_piece="</s>", minloglevel=2)
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())

    vocab = tfseq.Vocab([processor.id_to_piece(i) for i in range(processor.get_piece_size())],
                        sentencepiece_model=model.getvalue())
    texts = ["gen1 matt2 the beginning", "verse 17", "zebra"]
    module = tf.Module()
    module.encoder = serving.TextEncoder(vocab, str(tmp_path), tokenizer="sentencepiece",
                                         max_length=50, add_eos=True)
    module.encode = tf.function(lambda text: module.encoder(text)[0],
                                input_signature=[tf.TensorSpec([None], tf.string)])
    tf.saved_model.save(module, str(tmp_path / "sp"))
    assert sorted(os.listdir(tmp_path / "sp" / "assets")) == ["sentencepiece.model",
                                                             "vocab.txt"]
    loaded = tf.saved_model.load(str(tmp_path / "sp"))
    expected = [processor.encode(t) + [3] for t in texts]
    assert loaded.encode(tf.constant(texts)).to_list() == expected
    assert module.encoder(tf.constant(texts))[0].to_list() == expected


@pytest.mark.slow
def test_packed_classifier_serves_each_line_as_its_own_segment(tmp_path):
    corpus = write_tiny_corpus(tmp_path / "tiny.tsv")
    # Untrained weights (steps=0) serve as well as trained ones: the export is compared with
    # the same model in process.
    task, config, model, state = train_tiny("classify", None, steps=0, files=(corpus,),
                                            min_count=1, batching="pack", block_length=16,
                                            max_tokens=64, max_segments=4, max_length=12)
    export_run(str(tmp_path / "run"), task, config, state, model)
    served = tf.saved_model.load(str(tmp_path / "run" / "export"))
    texts = ["gen0 gen1 gen2", "rev3 rev4"]
    probabilities = served.serve(tf.constant(texts))["probabilities"].numpy()
    # The same two lines packed into one row: each segment's prediction is the served one.
    a, _ = padded_ids(state.vocab, texts[:1])
    b, _ = padded_ids(state.vocab, texts[1:])
    ids = tf.concat([a, b, tf.zeros([1, 3], tf.int32)], axis=1)
    features = {"ids": ids,
                "ids_segment_ids": tf.constant([[1, 1, 1, 2, 2, 0, 0, 0]]),
                "ids_resets": tf.constant([[1, 0, 0, 1, 0, 0, 0, 0]])}
    packed = tf.nn.softmax(model(features, training=False)).numpy()[0]
    np.testing.assert_allclose(probabilities, packed[:2], atol=1e-5)


@pytest.mark.slow
def test_export_binary_restores_checkpoint_or_replica_weights(tiny_exports, tmp_path):
    model_dir, config, model, state = tiny_exports["classify"]
    loaded = tf.saved_model.load(os.path.join(model_dir, "export"))
    expected = loaded.serve(tf.constant(TEXTS))["probabilities"].numpy()
    run = tmp_path / "replica_run"
    task = tasks.load("classify")
    state.save(str(run))  # what a run keeps: its vocabulary and labels, settings, weights
    (run / "run.json").write_text(json.dumps(runs.settings(
        task, config, model_config=task.model_config(), replicas=2, workers=1)))
    model.save_weights(str(run / "weights.weights.h5"))  # what a --data_service run keeps
    restored_task, restored_config, saved = load_run(str(run))
    assert (restored_task, restored_config) == (task, config)
    restored, restored_state = restore_model(str(run), restored_task, restored_config, saved)
    assert restored_state.labels == state.labels and restored_state.vocab.tokens == \
        state.vocab.tokens
    export_run(str(run), task, restored_config, restored_state, restored)
    reloaded = tf.saved_model.load(str(run / "export"))
    served = reloaded.serve(tf.constant(TEXTS))
    np.testing.assert_allclose(served["probabilities"].numpy(), expected, atol=1e-6)

    with pytest.raises(FileNotFoundError, match="run.json"):
        load_run(str(tmp_path))


@pytest.mark.slow
def test_translate_export_matches_greedy_decode(tmp_path):
    from tfseq.models import translate as translate_model

    corpus = write_tiny_corpus(tmp_path / "tiny.tsv")
    task, config, model, state = train_tiny("translate", None, steps=0,
                                            source_files=(corpus,), target_files=(corpus,),
                                            max_lines=0, min_count=1, max_length=6)
    logits = model.get_layer("logits")
    kernel, bias = logits.get_weights()
    bias[3] = -30.0  # never </s>: decode the full bounded length
    logits.set_weights([kernel, bias])
    export_run(str(tmp_path / "run"), task, config, state, model)
    served = tf.saved_model.load(str(tmp_path / "run" / "export"))
    texts = ["gen0 gen1 gen2", "rev3", ""]
    out = served.signatures["serving_default"](source=tf.constant(texts))["translation"]
    translations = [s.decode() for s in out.numpy()]

    source, lengths = padded_ids(state.vocabs["source"], texts[:2])
    ids = translate_model.greedy_decode(model, source, lengths, max_length=7, bos_id=2,
                                        eos_id=3)
    tokens = state.vocabs["target"].to_tokens(tf.constant(ids)).numpy()
    expected = [" ".join(t.decode() for t in row) for row in tokens]
    assert translations == expected + [""]
    assert all(len(t.split()) == 7 for t in translations[:2])  # max_length + 1 steps


@pytest.mark.slow
def test_train_binary_with_two_replicas_writes_an_export_that_serves_its_weights(tmp_path):
    corpus = write_tiny_corpus(tmp_path / "tiny.tsv")
    run = tmp_path / "run"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "train.py"), f"--files={corpus}",
         "--num_replicas=2", "--epochs=3", "--max_steps=2", f"--model_dir={run}",
         "--verbose=1"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"Served model (classify, input `text`): {run / 'export'}" in out.stdout
    report = json.loads((run / "report.json").read_text())
    assert (report["steps"], report["interrupted"], report["epochs"]) == (2, True, 1)
    task, config, saved = load_run(str(run))
    # Stopped by --max_steps in epoch 2 (epoch 1 is one step): the export serves the weights
    # of step 2, its checkpoint's, not those the end-of-epoch-1 evaluation copied.
    model, state = restore_model(str(run), task, config, saved)
    served = tf.saved_model.load(str(run / "export"))
    probabilities = served.serve(tf.constant(TEXTS))["probabilities"].numpy()
    np.testing.assert_allclose(probabilities, in_process_classify(model, state, TEXTS),
                               atol=1e-5)
