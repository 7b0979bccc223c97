"""One translation model for padded and packed batches; the translate pack pipeline emits every
kept pair exactly once per epoch."""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfseq
from tfseq.models import translate as translate_model
from tfseq.pipelines import tasks, translate
from tfseq.pipelines.state import TaskState

VOCAB = tfseq.Vocab(list(tfseq.text.RESERVED) + [f"w{i}" for i in range(30)])

# (source, <s> target </s>) pairs; ids >= 4 are words, 2 = <s>, 3 = </s>.
PAIRS = [([5, 6, 7], [2, 8, 9, 3]),
         ([10], [2, 11, 12, 13, 14, 3]),
         ([15, 16, 17, 18, 19, 20], [2, 21, 3]),
         ([22, 23], [2, 24, 25, 3]),
         ([26, 27, 28, 29], [2, 30, 31, 32, 3]),
         ([33, 5, 6, 7, 8], [2, 9, 3])]


def _state():
    return TaskState({"source": VOCAB, "target": VOCAB})


def _model():
    keras.utils.set_random_seed(5)
    return translate_model.build_model(
        None, _state(), translate_model.ModelConfig(embedding_dim=8, hidden_dim=6))


def _words(ids):
    return " ".join(VOCAB.tokens[i] for i in ids)


def _examples(config):
    """The PAIRS as text rows, encoded by the translate task (a ragged batch)."""
    rows = {"source": tf.constant([_words(s) for s, _ in PAIRS]),
            "target": tf.constant([_words(t[1:-1]) for _, t in PAIRS])}
    return translate.TASK.encode_rows(config, _state(), rows, tfseq.DropCounter("test"))


def test_the_task_shifts_each_pair_for_teacher_forcing(as_list):
    examples = _examples(translate.Config(max_length=10))
    assert as_list([examples]) == [{
        "source": [[5, 6, 7], [10], [15, 16, 17, 18, 19, 20], [22, 23], [26, 27, 28, 29],
                   [33, 5, 6, 7, 8]],
        "target_in": [[2, 8, 9], [2, 11, 12, 13, 14], [2, 21], [2, 24, 25], [2, 30, 31, 32],
                      [2, 9]],
        "targets": [[8, 9, 3], [11, 12, 13, 14, 3], [21, 3], [24, 25, 3], [30, 31, 32, 3],
                    [9, 3]]}]


def _padded_log_probs(model):
    source = tf.ragged.constant([s for s, _ in PAIRS], tf.int32)
    target = tf.ragged.constant([t[:-1] for _, t in PAIRS], tf.int32)
    features = {"source": source.to_tensor(), "source_length": tf.cast(source.row_lengths(),
                                                                       tf.int32),
                "target_in": target.to_tensor(),
                "target_in_length": tf.cast(target.row_lengths(), tf.int32)}
    return tf.nn.log_softmax(model(features)).numpy()


def _packed_batches(block_length=12, batch_size=2):
    """The PAIRS packed as the translate pipeline packs them (targets in the cells of
    ``target_in``), before its ``ModelFeatures``."""
    config = translate.Config(max_length=10, batching="pack", block_length=block_length,
                              max_tokens=block_length * batch_size)
    ds = tf.data.Dataset.from_tensors(_examples(config))
    ds = ds.apply(translate.TASK.batching(config).transform(
        training=False, counter=tfseq.DropCounter("test")))
    return list(ds)


def test_padded_and_packed_batches_give_each_target_token_the_same_log_probabilities():
    model = _model()
    padded = _padded_log_probs(model)
    ragged = model({"source": tf.ragged.constant([s for s, _ in PAIRS], tf.int32),
                    "target_in": tf.ragged.constant([t[:-1] for _, t in PAIRS], tf.int32)})
    np.testing.assert_allclose(tf.nn.log_softmax(ragged).numpy(), padded, atol=1e-5)
    seen = []
    batches = _packed_batches()
    assert len(batches) < len(PAIRS)  # several pairs share a row
    for batch in batches:
        features, targets, weights = translate.TASK.features(batch)
        packed = tf.nn.log_softmax(model(features)).numpy()
        source, source_segments = batch["source"].numpy(), batch["source_segment_ids"].numpy()
        target_segments = batch["target_in_segment_ids"].numpy()
        for row in range(source.shape[0]):
            for segment in set(source_segments[row]) - {0}:
                pair = PAIRS.index(next(p for p in PAIRS if p[0] == source[row][
                    source_segments[row] == segment].tolist()))
                steps = np.flatnonzero(target_segments[row] == segment)
                assert targets.numpy()[row, steps].tolist() == PAIRS[pair][1][1:]
                assert weights.numpy()[row, steps].tolist() == [1.0] * len(steps)
                np.testing.assert_allclose(packed[row, steps], padded[pair, :len(steps)],
                                           atol=1e-5)
                seen.append(pair)
        assert weights.numpy().sum() == (target_segments > 0).sum()  # 0 on padding
    assert sorted(seen) == list(range(len(PAIRS)))


def test_greedy_steps_match_the_teacher_forced_logits():
    model = _model()
    source = tf.constant([[5, 6, 7], [10, 0, 0]])
    lengths = tf.constant([3, 1])
    target_in = tf.constant([[2, 8, 9], [2, 11, 0]])
    forced = model({"source": source, "source_length": lengths, "target_in": target_in,
                    "target_in_length": tf.constant([3, 2])}).numpy()
    memory, state = model.encode(source, lengths)
    for step in range(2):
        logits, state = model.decode_step(target_in[:, step:step + 1], state, memory, lengths)
        np.testing.assert_allclose(logits.numpy(), forced[:, step], atol=1e-5)


@pytest.mark.slow
def test_pack_pipeline_emits_every_kept_pair_exactly_once_per_epoch():
    task = tasks.load("translate")
    config = task.Config(max_lines=300, min_count=1, max_vocab=500, max_length=20,
                         batching="pack", block_length=32, max_tokens=256, eval_percent=0)
    data = task.datasets(config)
    # The same pairs, in file order and unpacked, tokenized on their own.
    source = task.source(config, "train")
    reference_counter = tfseq.DropCounter("reference")
    reference = source.read(1, 0).map(
        lambda records: task.clean_rows(config, source.parse(records, reference_counter),
                                        reference_counter))
    reference = reference.apply(tfseq.tokenize(data.state.vocabs["source"], key="source",
                                               lowercase=True))
    reference = reference.apply(tfseq.tokenize(data.state.vocabs["target"], key="target",
                                               add_bos=True, add_eos=True, lowercase=True))
    expected = collections.Counter()
    for batch in reference:
        for s, t in zip(batch["source"].to_list(), batch["target"].to_list()):
            if len(s) <= config.max_length and len(t) <= config.max_length + 2:
                expected[(tuple(s), tuple(t))] += 1
    orders = []
    for epoch in range(2):
        batches = []
        for features, targets, weights in data.train:
            assert features["source"].shape[1] == features["target_in"].shape[1] == 32
            np.testing.assert_array_equal(weights.numpy() > 0,
                                          features["target_in_segment_ids"].numpy() > 0)
            batches.append({**features, "targets": targets,
                            "targets_segment_ids": features["target_in_segment_ids"],
                            "targets_resets": features["target_in_resets"]})
        examples = tfseq.unpack(batches)
        got = collections.Counter(
            (tuple(e["source"]), tuple(e["target_in"][:1] + e["targets"])) for e in examples)
        assert got == expected, f"epoch {epoch}"
        assert all(e["target_in"][1:] == e["targets"][:-1] for e in examples)
        orders.append([tuple(e["source"]) for e in examples])
        counter = data.counters["train"]
        assert counter.seen()["lines_read"] == 300
        assert sum(expected.values()) == 300 - sum(counter.drops().values())
        counter.reset()
    assert orders[0] != orders[1]  # shuffled pairs, a new order every epoch
    # 168 of the 300 lines dropped, counted: too long on either side (a source of at most
    # max_length words, a target of at most max_length words with <s> and </s>).
    assert sum(expected.values()) == 132


def test_aligned_files_are_read_as_shuffled_pairs_with_one_loaded_vocabulary(tmp_path):
    (tmp_path / "a.en").write_text("".join(f"s{i} x\n" for i in range(60)))
    (tmp_path / "a.es").write_text("".join(f"t{i} y\n" for i in range(60)))
    # One loaded vocabulary for both sides; it lacks "s59" and "y", which read as <unk>.
    path = str(tmp_path / "vocab.txt")
    tfseq.Vocab(list(tfseq.text.RESERVED) + [f"s{i}" for i in range(59)] + ["x"]
                + [f"t{i}" for i in range(60)]).save(path)
    task = tasks.load("translate")
    config = task.Config(source_files=(str(tmp_path / "a.en"),),
                         target_files=(str(tmp_path / "a.es"),), vocab_path=path,
                         eval_percent=0)
    data = task.datasets(config)
    vocabs = data.state.vocabs
    assert vocabs["source"] is vocabs["target"] and len(vocabs["source"]) == 4 + 59 + 1 + 60
    words = vocabs["source"].tokens
    unk = words[tfseq.text.UNK_ID]
    orders = []
    for _ in range(2):
        pairs = []
        for features, targets, _ in data.train:
            for s, t in zip(features["source"].numpy(), targets.numpy()):
                assert t[t > 0][-1] == tfseq.text.EOS_ID
                pairs.append((" ".join(words[i] for i in s if i > 0),
                              " ".join(words[i] for i in t[t > 0][:-1])))
        assert sorted(pairs) == sorted((f"s{i} x" if i < 59 else f"{unk} x", f"t{i} {unk}")
                                       for i in range(60))
        orders.append([int(t.split()[0][1:]) for _, t in pairs])
    assert orders[0] != list(range(60)) and orders[1] != orders[0]
    unshuffled = task.source(config, "train")
    rows = unshuffled.parse(next(iter(unshuffled.read(1, 0))), tfseq.DropCounter("test"))
    assert [s.decode() for s in rows["source"].numpy()][:2] == ["s0 x", "s1 x"]
