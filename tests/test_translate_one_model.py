"""One translation model for padded and packed batches; the translate pack pipeline emits every
kept pair exactly once per epoch."""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfseq
from tfseq.models import translate as translate_model
from tfseq.pipelines import translate

VOCAB = tfseq.Vocab(list(tfseq.text.RESERVED) + [f"w{i}" for i in range(30)])

# (source, <s> target </s>) pairs; ids >= 4 are words, 2 = <s>, 3 = </s>.
PAIRS = [([5, 6, 7], [2, 8, 9, 3]),
         ([10], [2, 11, 12, 13, 14, 3]),
         ([15, 16, 17, 18, 19, 20], [2, 21, 3]),
         ([22, 23], [2, 24, 25, 3]),
         ([26, 27, 28, 29], [2, 30, 31, 32, 3]),
         ([33, 5, 6, 7, 8], [2, 9, 3])]


def _model():
    keras.utils.set_random_seed(5)
    return translate_model.build_model(
        None, {"source_vocab": VOCAB, "target_vocab": VOCAB},
        translate_model.ModelConfig(embedding_dim=8, hidden_dim=6))


def _padded_log_probs(model):
    source = tf.ragged.constant([s for s, _ in PAIRS], tf.int32)
    target = tf.ragged.constant([t[:-1] for _, t in PAIRS], tf.int32)
    features = {"source": source.to_tensor(), "source_length": tf.cast(source.row_lengths(),
                                                                       tf.int32),
                "target_in": target.to_tensor(),
                "target_in_length": tf.cast(target.row_lengths(), tf.int32)}
    return tf.nn.log_softmax(model(features)).numpy()


def _packed_batches(block_length=12, batch_size=2):
    ds = tf.data.Dataset.from_tensors({"source": tf.ragged.constant([s for s, _ in PAIRS]),
                                       "target": tf.ragged.constant([t for _, t in PAIRS])})
    ds = ds.map(translate._shift).apply(
        tfseq.pack(block_length, batch_size=batch_size, long_examples="drop"))
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
        features, targets, weights = translate.packed_to_model(batch)
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
    config = translate.Config(max_lines=300, min_count=1, max_vocab=500, max_length=20,
                              batching="pack", block_length=32, max_tokens=256,
                              eval_percent=0)
    train, _, info = translate.datasets(config)
    assert info["reread_each_epoch"]  # shuffled pairs, read again every epoch
    # The same pairs, unshuffled and unpacked, tokenized as the pipeline does.
    reference = translate.pairs(config, "train", tfseq.DropCounter("reference"))
    reference = reference.apply(tfseq.tokenize(info["source_vocab"], key="source",
                                               lowercase=True))
    reference = reference.apply(tfseq.tokenize(info["target_vocab"], key="target",
                                               add_bos=True, add_eos=True, lowercase=True))
    expected = collections.Counter()
    for batch in reference:
        for s, t in zip(batch["source"].to_list(), batch["target"].to_list()):
            if max(len(s), len(t)) <= config.max_length + 2:
                expected[(tuple(s), tuple(t))] += 1
    for epoch in range(2):
        batches = []
        for features, targets, _ in train:
            segments = features["target_in_segment_ids"]
            batches.append({**features, "targets": targets, "targets_segment_ids": segments,
                            "source_resets": _resets(features["source_segment_ids"]),
                            "target_in_resets": _resets(segments),
                            "targets_resets": _resets(segments)})
        got = collections.Counter(
            (tuple(e["source"]), tuple(e["target_in"][:1] + e["targets"]))
            for e in tfseq.unpack(batches))
        assert got == expected, f"epoch {epoch}"
        assert all(e["target_in"][1:] == e["targets"][:-1] for e in tfseq.unpack(batches))
        counter = info["counters"]["train"]
        assert counter.seen()["lines_read"] == 300
        assert sum(expected.values()) == 300 - sum(counter.drops().values())
        counter.reset()
    assert sum(expected.values()) == 147  # 153 of the 300 lines dropped, counted


def _resets(segment_ids):
    previous = tf.pad(segment_ids[:, :-1], [[0, 0], [1, 0]])
    return (segment_ids > 0) & (segment_ids != previous)


def test_aligned_files_are_read_as_shuffled_pairs_a_new_order_every_epoch(tmp_path):
    (tmp_path / "a.en").write_text("".join(f"s{i} x\n" for i in range(200)))
    (tmp_path / "a.es").write_text("".join(f"t{i} y\n" for i in range(200)))
    config = translate.Config(source_files=(str(tmp_path / "a.en"),),
                              target_files=(str(tmp_path / "a.es"),), eval_percent=0)
    ds = translate.pairs(config, "train", tfseq.DropCounter("test"), shuffle_lines=True)
    orders = []
    for _ in range(2):
        pairs = [(s.decode(), t.decode()) for b in ds
                 for s, t in zip(b["source"].numpy(), b["target"].numpy())]
        assert sorted(pairs) == sorted((f"s{i} x", f"t{i} y") for i in range(200))
        orders.append([int(s.split()[0][1:]) for s, _ in pairs])
    assert orders[0] != list(range(200)) and orders[1] != orders[0]
    unshuffled = translate.pairs(config, "train", tfseq.DropCounter("test"))
    assert [s.decode() for b in unshuffled for s in b["source"].numpy()][:2] == ["s0 x", "s1 x"]


def test_a_loaded_vocabulary_serves_both_sides(tmp_path):
    (tmp_path / "a.en").write_text("one two\nthree one\n" * 20)
    (tmp_path / "a.es").write_text("uno dos\ntres uno\n" * 20)
    path = str(tmp_path / "vocab.txt")
    tfseq.Vocab(list(tfseq.text.RESERVED) + ["one", "two", "uno", "dos"]).save(path)
    config = translate.Config(source_files=(str(tmp_path / "a.en"),),
                              target_files=(str(tmp_path / "a.es"),), vocab_path=path,
                              eval_percent=0, shuffle_lines=False)
    train, _, info = translate.datasets(config)
    assert info["source_vocab"] is info["target_vocab"] and len(info["source_vocab"]) == 8
    features, targets, _ = next(iter(train))
    one, two, uno, dos = (info["source_vocab"].lookup(tf.constant(w)).numpy()
                          for w in ("one", "two", "uno", "dos"))
    unk = tfseq.text.UNK_ID
    rows = {tuple(r[r > 0]) for r in features["source"].numpy()}
    assert rows == {(one, two), (unk, one)}
    assert {tuple(r[r > 0]) for r in targets.numpy()} == {(uno, dos, 3), (unk, uno, 3)}
