"""tfseq.keras_hub: KerasHub tokenizers as a pipeline step, tfseq batches as KerasHub inputs.

Tiny models built from configs and tokenizers from vocabularies written here: nothing is
downloaded.
"""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfseq

keras_hub = pytest.importorskip(
    "keras_hub", reason="KerasHub is not installed (pip install tfseq[keras-hub])")
import keras  # noqa: E402  (after the skip: the models below are KerasHub's)

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox", "café",
         "jump", "##ed", "##s", ".", ",", "!", "a", "over", "dog", "lazy"]
LINES = [
    "The quick brown fox jumped.",   # lower-cased; "jumped" in two pieces
    "",                              # empty: dropped
    "Café, CAFÉ!",                   # accents kept
    "the zebra jumps over a dog",    # unknown word -> [UNK]
    "   ",                           # only spaces: no token, dropped
    "lazy",
]
# [CLS] ... [SEP] around each non-empty line, as BertTextClassifierPreprocessor packs one text.
EXPECTED = [
    [2, 5, 6, 7, 8, 10, 11, 13, 3],
    [2, 9, 14, 9, 15, 3],
    [2, 5, 1, 10, 12, 17, 16, 18, 3],
    [2, 19, 3],
]


def as_lists(dataset):
    """Every element of a dataset of ``{"ids": ...}`` examples or ragged batches, as lists."""
    rows = []
    for element in dataset:
        ids = element["ids"]
        if isinstance(ids, tf.RaggedTensor):
            rows += ids.to_list()
        else:
            rows.append(ids.numpy().tolist())
    return rows


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return keras_hub.models.BertTokenizer(vocabulary=str(path), lowercase=True)


def test_ids_in_the_pipeline_are_the_tokenizer_and_preprocessor_ids(tokenizer):
    counter = tfseq.DropCounter()
    lines = tf.data.Dataset.from_tensor_slices(LINES)
    step = tfseq.keras_hub.tokenize(tokenizer, counter=counter)
    assert as_lists(lines.apply(step)) == EXPECTED                   # one line at a time
    assert as_lists(lines.batch(4).apply(step)) == EXPECTED          # [n] batches of lines
    rows = tf.data.Dataset.from_tensor_slices({"ids": LINES, "label": list(range(6))})
    pairs = [(e["ids"].numpy().tolist(), int(e["label"])) for e in rows.apply(step)]
    assert pairs == list(zip(EXPECTED, [0, 2, 3, 5]))                # labels stay with lines
    assert counter.drops() == {"empty": 6}                           # 2 per pass, 3 passes

    # The same ids as the tokenizer and its preprocessor called directly, outside tf.data.
    kept = [line for line in LINES if line.strip()]
    assert [[2] + ids + [3] for ids in tokenizer(kept)] == EXPECTED
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=12)
    packed = preprocessor(kept)
    assert [row[mask].tolist() for row, mask in zip(np.asarray(packed["token_ids"]),
                                                    np.asarray(packed["padding_mask"]))] == EXPECTED
    # Given the preprocessor itself, its convention; start_end=False: the bare ids.
    assert as_lists(lines.apply(tfseq.keras_hub.tokenize(preprocessor))) == EXPECTED
    assert as_lists(lines.apply(tfseq.keras_hub.tokenize(tokenizer, start_end=False))) == [
        ids[1:-1] for ids in EXPECTED]


def test_sequence_length_cuts_as_the_preprocessor_does(tokenizer):
    counter = tfseq.DropCounter()
    lines = tf.data.Dataset.from_tensor_slices(LINES)
    cut = as_lists(lines.apply(tfseq.keras_hub.tokenize(tokenizer, sequence_length=5,
                                                        counter=counter)))
    assert cut == [[2, 5, 6, 7, 3], [2, 9, 14, 9, 3], [2, 5, 1, 10, 3], [2, 19, 3]]
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=5)
    packed = preprocessor([line for line in LINES if line.strip()])
    assert [row[mask].tolist() for row, mask in zip(np.asarray(packed["token_ids"]),
                                                    np.asarray(packed["padding_mask"]))] == cut
    assert counter.seen() == {"truncated": 3} and counter.drops() == {"empty": 2}
    with pytest.raises(ValueError, match="sequence_length must leave room"):
        tfseq.keras_hub.tokenize(tokenizer, sequence_length=2)


def bert_backbone(vocabulary_size, max_sequence_length=32, seed=0, num_layers=2):
    keras.utils.set_random_seed(seed)
    return keras_hub.models.BertBackbone(
        vocabulary_size=vocabulary_size, num_layers=num_layers, num_heads=2, hidden_dim=32,
        intermediate_dim=64, max_sequence_length=max_sequence_length)


def test_backbone_on_bucketed_batches_equals_it_on_fixed_padding(tokenizer):
    backbone = bert_backbone(len(VOCAB))
    lines = ["the fox", "a quick brown fox jumped over the lazy dog .", "café !", "dog",
             "the lazy dog jumps", "over", "a fox , a dog , a café", "quick quick",
             "the brown dog jumped over a fox .", "lazy fox"]
    ds = (tf.data.Dataset.from_tensor_slices(lines).batch(4)
          .apply(tfseq.keras_hub.tokenize(tokenizer))
          .apply(tfseq.bucket_by_length(max_tokens=24, seed=3)))
    widths, bucketed = [], {}
    for batch in ds:
        x = next(iter(tf.data.Dataset.from_tensors(batch).apply(
            tfseq.keras_hub.inputs(backbone, labels=False))))
        assert sorted(x) == ["padding_mask", "segment_ids", "token_ids"]
        out = backbone(x)
        widths.append(int(tf.shape(x["token_ids"])[1]))
        for i, n in enumerate(batch["ids_length"].numpy()):
            ids = tuple(batch["ids"][i, :n].numpy().tolist())
            bucketed[ids] = (out["sequence_output"][i, :n].numpy(),
                             out["pooled_output"][i].numpy())
    assert len(bucketed) == len(lines) and max(widths) < 16   # every line, less padding

    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=16)
    x = preprocessor(lines)
    out = backbone(x)
    for i, (row, mask) in enumerate(zip(np.asarray(x["token_ids"]), np.asarray(x["padding_mask"]))):
        sequence, pooled = bucketed[tuple(row[mask].tolist())]
        np.testing.assert_allclose(sequence, out["sequence_output"][i, :mask.sum()], atol=1e-5)
        np.testing.assert_allclose(pooled, out["pooled_output"][i], atol=1e-5)


def gpt2_tokenizer():
    vocabulary = {"<|endoftext|>": 0, "a": 1, "b": 2, "Ġ": 3, "Ġa": 4, "Ġb": 5, "ab": 6,
                  "Ġab": 7, ".": 8}
    return keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary,
                                          merges=["Ġ a", "Ġ b", "a b", "Ġa b"])


def test_causal_lm_inputs_are_the_preprocessor_shifted_ids_and_weights():
    tokenizer = gpt2_tokenizer()
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=9, num_layers=1, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16,
                                             max_sequence_length=16)
    lm = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=8)
    lines = ["ab a b.", "a", "", "b ab"]
    ds = (tf.data.Dataset.from_tensor_slices({"ids": lines, "weight": [1.0, 0.5, 1.0, 2.0]})
          .apply(tfseq.keras_hub.tokenize(preprocessor))
          .apply(tfseq.pad_batch(4))
          .apply(tfseq.keras_hub.inputs(lm)))
    [(x, y, w)] = list(ds)
    # <|endoftext|> (0) starts and ends each line, as the preprocessor adds them.
    assert x["token_ids"].numpy().tolist() == [[0, 6, 4, 5, 8], [0, 1, 0, 0, 0], [0, 2, 7, 0, 0]]
    assert x["padding_mask"].numpy().tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0],
                                                  [1, 1, 1, 1, 0]]
    assert y.numpy().tolist() == [[6, 4, 5, 8, 0], [1, 0, 0, 0, 0], [2, 7, 0, 0, 0]]
    assert w.numpy().tolist() == [[1, 1, 1, 1, 1], [0.5, 0.5, 0, 0, 0], [2, 2, 2, 0, 0]]
    px, py, pw = preprocessor(["ab a b.", "a", "b ab"])
    np.testing.assert_array_equal(np.asarray(px["token_ids"])[:, :5], x["token_ids"])
    np.testing.assert_array_equal(np.asarray(px["padding_mask"])[:, :5], x["padding_mask"] == 1)
    np.testing.assert_array_equal(np.asarray(py)[:, :5], y)
    # logits at the real positions do not depend on the padding
    logits = lm(x)
    full = lm({"token_ids": px["token_ids"], "padding_mask": px["padding_mask"]})
    for i, n in enumerate([5, 3, 4]):
        np.testing.assert_allclose(logits[i, :n], full[i, :n], atol=1e-5)

    no_start = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, add_start_token=False)
    ids = as_lists(tf.data.Dataset.from_tensor_slices(["ab a b."]).apply(
        tfseq.keras_hub.tokenize(no_start)))
    assert ids == [[6, 4, 5, 8, 0]]


def test_inputs_refuses_what_it_cannot_feed(tokenizer):
    backbone = bert_backbone(len(VOCAB))
    classifier = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None)
    examples = tf.data.Dataset.from_tensor_slices(["the fox", "a dog"]).apply(
        tfseq.keras_hub.tokenize(tokenizer))
    with pytest.raises(ValueError, match="needs 'label' in the batch"):
        examples.apply(tfseq.pad_batch(2)).apply(tfseq.keras_hub.inputs(classifier))
    with pytest.raises(ValueError, match="packed batches"):
        examples.apply(tfseq.pack(8, batch_size=2)).apply(tfseq.keras_hub.inputs(classifier))
    with pytest.raises(ValueError, match="needs batches"):
        examples.apply(tfseq.keras_hub.inputs(backbone, labels=False))
    masked_lm = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
    with pytest.raises(ValueError, match=r"not \['mask_positions'\]"):
        tfseq.keras_hub.inputs(masked_lm)
    fnet = keras_hub.models.FNetBackbone(vocabulary_size=20, num_layers=1, hidden_dim=8,
                                         intermediate_dim=16, max_sequence_length=16)
    with pytest.raises(ValueError, match="FNetBackbone takes no padding_mask"):
        tfseq.keras_hub.inputs(fnet)
    with pytest.raises(TypeError, match="needs a keras_hub Tokenizer"):
        tfseq.keras_hub.tokenize("wordpiece")
    # ragged batches are taken as they are
    ragged = examples.apply(tfseq.pad_batch(2, ragged=True)).apply(
        tfseq.keras_hub.inputs(backbone, labels=False))
    x = next(iter(ragged))
    assert x["token_ids"].numpy().tolist() == [[2, 5, 8, 3], [2, 16, 18, 3]]
    assert x["padding_mask"].numpy().tolist() == [[1, 1, 1, 1], [1, 1, 1, 1]]


def test_inputs_fills_what_the_model_declares_in_its_dtypes():
    declared = {"token_ids": "int32", "padding_mask": "bool", "position_ids": "int64"}
    model_in = {name: keras.Input((None,), dtype=dtype, name=name)
                for name, dtype in declared.items()}
    model = keras.Model(model_in, keras.ops.cast(model_in["token_ids"], "float32"))
    assert tfseq.keras_hub.input_specs(model) == declared
    batch = {"ids": [[5, 6, 7], [8, 0, 0]], "ids_length": [3, 1], "label": [1, 0],
             "weight": [1.0, 0.0]}
    x, y, w = next(iter(tf.data.Dataset.from_tensors(batch).apply(tfseq.keras_hub.inputs(model))))
    assert {k: (v.dtype.name, v.numpy().tolist()) for k, v in x.items()} == {
        "token_ids": ("int32", [[5, 6, 7], [8, 0, 0]]),
        "padding_mask": ("bool", [[True, True, True], [True, False, False]]),
        "position_ids": ("int64", [[0, 1, 2], [0, 1, 2]])}
    assert y.numpy().tolist() == [1, 0] and w.numpy().tolist() == [1.0, 0.0]
    # batch_size=4: 2 rows weigh 2/4 each (times their weight), as 2 of 4 rows of a fixed batch
    ds = tf.data.Dataset.from_tensors(batch).apply(tfseq.keras_hub.inputs(model, batch_size=4))
    assert next(iter(ds))[2].numpy().tolist() == [0.5, 0.0]
    del batch["weight"]
    ds = tf.data.Dataset.from_tensors(batch).apply(tfseq.keras_hub.inputs(model, batch_size=4))
    assert next(iter(ds))[2].numpy().tolist() == [0.5, 0.5]


def test_import_tfseq_needs_no_keras_hub_and_says_how_to_install_it(tmp_path):
    script = ("import sys\n"
              "import tfseq\n"
              "assert 'keras_hub' not in sys.modules\n"
              "sys.modules['keras_hub'] = None  # as if not installed\n"
              "try:\n"
              "    tfseq.keras_hub.tokenize(None)\n"
              "except ImportError as e:\n"
              "    print(e)\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "tfseq.keras_hub needs KerasHub: pip install tfseq[keras-hub]\n"


# ------------------------------------------------------------------------ model.fit

CLASS_WORDS = [["fox", "dog", "lazy"], ["café", "brown", "quick"]]


def synthetic_corpus(n, seed):
    """Lines of 2-13 words: filler words ("the", "."), and 1-2 words of one class' set,
    whose index is the label."""
    rng = np.random.default_rng(seed)
    lines, labels = [], []
    for _ in range(n):
        label = int(rng.integers(len(CLASS_WORDS)))
        words = list(rng.choice(["the", ".", ","], size=int(rng.integers(1, 12))))
        for _ in range(int(rng.integers(1, 3))):
            words.insert(int(rng.integers(len(words) + 1)), rng.choice(CLASS_WORDS[label]))
        lines.append(" ".join(words))
        labels.append(label)
    return lines, np.array(labels, np.int32)


def classifier(seed):
    # One transformer layer: the task (one class word in filler) needs no more.
    backbone = bert_backbone(len(VOCAB), max_sequence_length=64, seed=seed, num_layers=1)
    model = keras_hub.models.BertTextClassifier(backbone, num_classes=len(CLASS_WORDS),
                                                preprocessor=None, dropout=0.0)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


@pytest.mark.slow  # ~15 s of CPU: two models traced, trained and evaluated
def test_fit_on_bucketed_batches_reaches_the_preprocessor_fed_accuracy(tokenizer):
    lines, labels = synthetic_corpus(480, seed=1)
    test_lines, test_labels = synthetic_corpus(160, seed=2)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=64)

    def keras_hub_fed(lines, labels, shuffle):
        ds = tf.data.Dataset.from_tensor_slices((lines, labels))
        ds = ds.shuffle(len(lines), seed=0) if shuffle else ds
        return ds.batch(16).map(preprocessor)

    def tfseq_fed(model, lines, labels, training):
        return (tf.data.Dataset.from_tensor_slices({"ids": lines, "label": labels}).batch(128)
                .apply(tfseq.keras_hub.tokenize(tokenizer))
                .apply(tfseq.bucket_by_length(max_tokens=16 * 10, shuffle=training, seed=0))
                .apply(tfseq.keras_hub.inputs(model)))

    accuracies = {}
    for name in ("keras_hub", "tfseq"):
        model = classifier(seed=0)
        if name == "keras_hub":
            train = keras_hub_fed(lines, labels, shuffle=True)
            test = keras_hub_fed(test_lines, test_labels, shuffle=False)
        else:
            train = tfseq_fed(model, lines, labels, training=True)
            test = tfseq_fed(model, test_lines, test_labels, training=False)
        model.fit(train, epochs=1, verbose=0)
        accuracies[name] = model.evaluate(test, verbose=0, return_dict=True)["accuracy"]
    assert accuracies["keras_hub"] > 0.9, accuracies
    assert abs(accuracies["tfseq"] - accuracies["keras_hub"]) <= 0.01, accuracies


@pytest.mark.slow  # trains the example's classifier: ~10 s on 2 cores
def test_the_docs_example_runs(capsys):
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "keras_hub.md"),
              encoding="utf-8") as f:
        [example] = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    exec(compile(example, "docs/keras_hub.md", "exec"), {})
    assert capsys.readouterr().out == "{'empty': 16}\n"
