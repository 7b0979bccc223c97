"""Truncated BPTT: in-order chunks, stream mode, order assertion, and the stateful LM."""

import gzip

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import to_list
from hypothesis import given, settings
from hypothesis import strategies as st

import tfseq
from tfseq.models.stateful_lm import ModelConfig, StatefulLM, build_model
from tfseq.pipelines import lm_tbptt

T, F = True, False


def lines(rows, **features):
    """Examples ``{"ids": int32 [(T)], **features}`` from the int lists ``rows``."""
    ds = tf.data.Dataset.from_tensor_slices(
        {"ids": tf.ragged.constant(rows, dtype=tf.int32, ragged_rank=1), **features})
    return ds.map(dict)  # ragged slices of rank 1 -> dense 1-D tensors


def padded(rows, batch_size, **features):
    """Padded batches (the element contract) of the int lists ``rows``, plus scalar features."""
    return lines(rows, **features).apply(tfseq.pad_batch(batch_size))


# -- tbptt_chunks ------------------------------------------------------------------------


def test_worked_example_lengths_7_3_5_chunk_3():
    rows = [[1, 2, 3, 4, 5, 6, 7], [11, 12, 13], [21, 22, 23, 24, 25]]
    chunks = to_list(padded(rows, 3, label=tf.constant([7, 8, 9])).apply(tfseq.tbptt_chunks(3)))
    assert chunks == [
        {"ids": [[1, 2, 3], [11, 12, 13], [21, 22, 23]], "ids_length": [3, 3, 3],
         "resets": [T, T, T], "label": [7, 8, 9], "chunk_index": [0, 0, 0]},
        {"ids": [[4, 5, 6], [0, 0, 0], [24, 25, 0]], "ids_length": [3, 0, 2],
         "resets": [F, F, F], "label": [7, 8, 9], "chunk_index": [1, 1, 1]},
        {"ids": [[7, 0, 0], [0, 0, 0], [0, 0, 0]], "ids_length": [1, 0, 0],
         "resets": [F, F, F], "label": [7, 8, 9], "chunk_index": [2, 2, 2]},
    ]


def test_every_sequence_feature_is_cut_on_the_same_grid():
    batch = {"ids": tf.constant([[5, 6, 7, 8], [9, 0, 0, 0]]), "ids_length": tf.constant([4, 1]),
             "targets": tf.constant([[6, 7, 8, 3], [3, 0, 0, 0]]),
             "targets_length": tf.constant([4, 1])}
    chunks = to_list(tf.data.Dataset.from_tensors(batch).apply(tfseq.tbptt_chunks(3)))
    assert [c["ids"] for c in chunks] == [[[5, 6, 7], [9, 0, 0]], [[8, 0, 0], [0, 0, 0]]]
    assert [c["targets"] for c in chunks] == [[[6, 7, 8], [3, 0, 0]], [[3, 0, 0], [0, 0, 0]]]
    assert [c["targets_length"] for c in chunks] == [[3, 1], [1, 0]]


def test_smaller_last_batch_and_chunk_index_across_batches():
    rows = [[1, 2, 3, 4], [5], [6, 7], [8, 9, 10, 11, 12]]
    chunks = to_list(padded(rows, 3).apply(tfseq.tbptt_chunks(2)))
    assert [c["ids"] for c in chunks] == [
        [[1, 2], [5, 0], [6, 7]], [[3, 4], [0, 0], [0, 0]],
        [[8, 9]], [[10, 11]], [[12, 0]]]
    assert [c["ids_length"] for c in chunks] == [[2, 1, 2], [2, 0, 0], [2], [2], [1]]
    assert [c["resets"] for c in chunks] == [[T, T, T], [F, F, F], [T], [F], [F]]
    assert [c["chunk_index"] for c in chunks] == [[0, 0, 0], [1, 1, 1], [2], [3], [4]]


def test_padding_beyond_the_longest_row_and_junk_past_length_are_dropped():
    batch = {"ids": tf.constant([[1, 2, 9, 9, 9, 9, 9]]), "ids_length": tf.constant([2])}
    chunks = to_list(tf.data.Dataset.from_tensors(batch).apply(tfseq.tbptt_chunks(3)))
    assert chunks == [{"ids": [[1, 2, 0]], "ids_length": [2], "resets": [T], "chunk_index": [0]}]


def test_a_batch_of_empty_rows_still_gives_one_chunk():
    batch = {"ids": tf.zeros([2, 0], tf.int32), "ids_length": tf.constant([0, 0])}
    chunks = to_list(tf.data.Dataset.from_tensors(batch).apply(tfseq.tbptt_chunks(2)))
    assert chunks == [{"ids": [[0, 0], [0, 0]], "ids_length": [0, 0], "resets": [T, T],
                       "chunk_index": [0, 0]}]


def test_chunk_shape_is_static():
    spec = padded([[1, 2, 3]], 2).apply(tfseq.tbptt_chunks(4)).element_spec
    assert spec["ids"].shape.as_list() == [None, 4]


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (2.0, TypeError),
                                        (True, TypeError)])
def test_bad_chunk_length(bad, error):
    with pytest.raises(error, match="chunk_length"):
        tfseq.tbptt_chunks(bad)


def test_ragged_batches_are_refused():
    ds = lines([[1, 2]]).apply(tfseq.pad_batch(2, ragged=True))
    with pytest.raises(TypeError, match="padded batches"):
        ds.apply(tfseq.tbptt_chunks(2))


def test_missing_key_and_reserved_names():
    with pytest.raises(ValueError, match="'tokens'"):
        padded([[1]], 1).apply(tfseq.tbptt_chunks(2, key="tokens"))
    with pytest.raises(ValueError, match="resets"):
        padded([[1]], 1, resets=tf.constant([True])).apply(tfseq.tbptt_chunks(2))


# 12 draws: each builds and runs its own pipeline (~0.15 s of CPU).
@settings(max_examples=12, deadline=None)
@given(lengths=st.lists(st.integers(0, 12), min_size=1, max_size=9),
       batch_size=st.integers(1, 4), chunk_length=st.integers(1, 5))
def test_chunks_restore_every_row_exactly_once(lengths, batch_size, chunk_length):
    rows = [[100 * (r + 1) + t for t in range(n)] for r, n in enumerate(lengths)]
    chunks = to_list(padded(rows, batch_size).apply(tfseq.tbptt_chunks(chunk_length)))
    restored, pending, ended, index = [], None, None, 0
    for chunk in chunks:
        assert chunk["chunk_index"] == [index] * len(chunk["ids"])
        index += 1
        assert all(len(r) == chunk_length for r in chunk["ids"])
        if chunk["resets"][0]:
            assert all(chunk["resets"])
            restored.extend(pending or [])
            pending = [[] for _ in chunk["ids"]]
            ended = [False for _ in chunk["ids"]]
        else:
            assert not any(chunk["resets"])
        for b, (ids, n) in enumerate(zip(chunk["ids"], chunk["ids_length"])):
            assert ids[n:] == [0] * (chunk_length - n)
            assert n == 0 or not ended[b]           # a row never resumes after it ended
            ended[b] = ended[b] or n < chunk_length
            pending[b].extend(ids[:n])
    restored.extend(pending or [])
    assert restored == rows
    per_batch = [lengths[i:i + batch_size] for i in range(0, len(lengths), batch_size)]
    assert len(chunks) == sum(max(1, -(-max(b) // chunk_length)) for b in per_batch)


# -- tbptt_stream ------------------------------------------------------------------------


def test_stream_worked_example():
    chunks = to_list(lines([[1, 2, 3], [4, 5, 6, 7, 8], [9, 10, 11]]).apply(
        tfseq.tbptt_stream(3, 2)))
    assert chunks == [
        {"ids": [[1, 2], [5, 6], [8, 9]], "ids_length": [2, 2, 2],
         "targets": [[2, 3], [6, 7], [9, 10]], "targets_length": [2, 2, 2],
         "resets": [T, T, T], "chunk_index": [0, 0, 0]},
        {"ids": [[3, 4], [7, 0], [10, 0]], "ids_length": [2, 1, 1],
         "targets": [[4, 5], [8, 0], [11, 0]], "targets_length": [2, 1, 1],
         "resets": [F, F, F], "chunk_index": [1, 1, 1]},
    ]


def test_stream_of_fewer_than_two_tokens_is_empty():
    assert to_list(lines([[7]]).apply(tfseq.tbptt_stream(2, 3))) == []
    assert to_list(lines([[7]]).take(0).apply(tfseq.tbptt_stream(2, 3))) == []


def test_stream_with_more_streams_than_pairs():
    chunks = to_list(lines([[1, 2, 3]]).apply(tfseq.tbptt_stream(4, 2)))
    assert chunks == [
        {"ids": [[1, 0], [2, 0], [0, 0], [0, 0]], "ids_length": [1, 1, 0, 0],
         "targets": [[2, 0], [3, 0], [0, 0], [0, 0]], "targets_length": [1, 1, 0, 0],
         "resets": [T, T, T, T], "chunk_index": [0, 0, 0, 0]}]


def test_stream_argument_checks():
    with pytest.raises(ValueError, match="batch_size"):
        tfseq.tbptt_stream(0, 2)
    with pytest.raises(ValueError, match="target_key"):
        tfseq.tbptt_stream(2, 2, target_key="ids")
    with pytest.raises(ValueError, match="1-D integer"):
        padded([[1, 2]], 1).apply(tfseq.tbptt_stream(2, 2))


# 8 draws: each builds and runs its own pipeline (~0.3 s of CPU).
@settings(max_examples=8, deadline=None)
@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=8),
       batch_size=st.integers(1, 5), chunk_length=st.integers(1, 6))
def test_stream_predicts_every_token_but_the_first_exactly_once(lengths, batch_size,
                                                                chunk_length):
    total = sum(lengths)
    tokens = list(range(1, total + 1))
    rows, start = [], 0
    for n in lengths:
        rows.append(tokens[start:start + n])
        start += n
    chunks = to_list(lines(rows).apply(tfseq.tbptt_stream(batch_size, chunk_length)))
    streams_in = [[] for _ in range(batch_size)]
    streams_out = [[] for _ in range(batch_size)]
    for k, chunk in enumerate(chunks):
        assert chunk["chunk_index"] == [k] * batch_size
        assert chunk["resets"] == [k == 0] * batch_size
        assert chunk["ids_length"] == chunk["targets_length"]
        for b in range(batch_size):
            n = chunk["ids_length"][b]
            assert chunk["ids"][b][n:] == [0] * (chunk_length - n)
            streams_in[b].extend(chunk["ids"][b][:n])
            streams_out[b].extend(chunk["targets"][b][:n])
    predicted = [t for s in streams_out for t in s]
    assert predicted == tokens[1:]                      # in order, each exactly once
    for inputs, targets in zip(streams_in, streams_out):
        assert targets == [t + 1 for t in inputs]       # next-token pairs, contiguous
    sizes = [len(s) for s in streams_out]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


# -- order assertion ---------------------------------------------------------------------


def test_assert_chunks_in_order_passes_in_order_data_and_new_passes():
    ds = padded([[1, 2, 3, 4, 5]], 1).apply(tfseq.tbptt_chunks(2)).repeat(2)
    got = to_list(ds.apply(tfseq.assert_chunks_in_order()))
    assert [c["chunk_index"] for c in got] == [[0], [1], [2], [0], [1], [2]]


def test_shuffled_chunks_raise():
    ds = padded([[1, 2, 3, 4, 5, 6, 7, 8]], 1).apply(tfseq.tbptt_chunks(1))
    shuffled = ds.shuffle(8, seed=3)
    assert [c["chunk_index"][0] for c in to_list(shuffled)] != list(range(8))
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of order"):
        to_list(shuffled.apply(tfseq.assert_chunks_in_order()))
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of order"):
        to_list(ds.skip(1).apply(tfseq.assert_chunks_in_order()))


def test_assert_chunks_in_order_needs_chunk_index():
    with pytest.raises(ValueError, match="chunk_index"):
        padded([[1]], 1).apply(tfseq.assert_chunks_in_order())


# -- the stateful model ------------------------------------------------------------------

IDS = [[3, 4, 5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17]]
TARGETS = [[4, 5, 6, 7, 8, 9, 2], [11, 12, 2], [14, 15, 16, 17, 2]]
LENGTHS = [7, 3, 5]


def whole_batch():
    ids = tf.ragged.constant(IDS).to_tensor()
    return {"ids": ids, "ids_length": tf.constant(LENGTHS)}, tf.ragged.constant(TARGETS).to_tensor()


def chunk_pairs(chunk_length):
    """``(features, targets)`` chunks of the batch above, as a training pipeline gives them."""
    ids = tf.ragged.constant(IDS).to_tensor()
    batch = {"ids": ids, "ids_length": tf.constant(LENGTHS),
             "targets": tf.ragged.constant(TARGETS).to_tensor(), "targets_length": tf.constant(LENGTHS)}
    chunks = tf.data.Dataset.from_tensors(batch).apply(tfseq.tbptt_chunks(chunk_length))
    return chunks.map(lambda c: ({k: c[k] for k in ("ids", "ids_length", "resets", "chunk_index")},
                                 c["targets"]))


def small_model(cell="gru", carry_state=True, max_batch_size=4, **kwargs):
    keras.utils.set_random_seed(1)
    model = StatefulLM(20, embedding_dim=5, units=6, cell=cell, carry_state=carry_state,
                       max_batch_size=max_batch_size, **kwargs)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0))
    return model


def unchunk(logits, num_chunks, rows, chunk_length):
    """predict() output [num_chunks * rows, C, V] -> [rows, num_chunks * C, V]."""
    v = logits.shape[-1]
    return logits.reshape(num_chunks, rows, chunk_length, v).transpose(1, 0, 2, 3).reshape(
        rows, num_chunks * chunk_length, v)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_carried_state_on_chunks_equals_the_whole_sequence(cell):
    model = small_model(cell)
    features, _ = whole_batch()
    whole_logits, whole_states = model.run(features)
    mask = tf.sequence_mask(LENGTHS, 7).numpy()
    # Evaluation path (predict_step, eval cache).
    logits = unchunk(model.predict(chunk_pairs(3), verbose=0), 3, 3, 3)[:, :7]
    np.testing.assert_allclose(logits[mask], whole_logits.numpy()[mask], atol=1e-5)
    for cached, state in zip(model.cached_state("eval"), whole_states):
        np.testing.assert_allclose(cached.numpy()[:3], state.numpy(), atol=1e-5)
        np.testing.assert_array_equal(cached.numpy()[3:], 0.0)  # row beyond the batch untouched
    # Training path (train_step, train cache); learning rate 0 keeps the weights.
    model.fit(chunk_pairs(2), verbose=0)
    for cached, state in zip(model.cached_state("train"), whole_states):
        np.testing.assert_allclose(cached.numpy()[:3], state.numpy(), atol=1e-5)


def test_loss_over_chunks_is_the_whole_sequence_loss():
    model = small_model()
    chunked = model.evaluate(chunk_pairs(3), verbose=0, return_dict=True)
    whole = model.evaluate(tf.data.Dataset.from_tensors(whole_batch()), verbose=0,
                           return_dict=True)
    assert chunked["tokens"] == whole["tokens"] == 15.0
    np.testing.assert_allclose(chunked["loss"], whole["loss"], rtol=1e-5)


def test_a_reset_row_restarts_from_the_default_state():
    model = small_model()
    first = ({"ids": tf.constant([[3, 4], [5, 6]]), "ids_length": tf.constant([2, 2]),
              "resets": tf.constant([T, T]), "chunk_index": tf.constant([0, 0], tf.int64)},
             tf.constant([[4, 5], [6, 7]]))
    second = ({"ids": tf.constant([[8, 9], [8, 9]]), "ids_length": tf.constant([2, 2]),
               "resets": tf.constant([F, T]), "chunk_index": tf.constant([1, 1], tf.int64)},
              tf.constant([[9, 2], [9, 2]]))
    model.predict(tf.data.Dataset.from_tensors(first), verbose=0)
    carried = model.cached_state("eval")[0][:2]
    logits = model.predict(tf.data.Dataset.from_tensors(second), verbose=0)
    from_cache, _ = model.run({"ids": second[0]["ids"][:1], "ids_length": tf.constant([2])},
                              [carried[:1]])
    from_zero, _ = model.run({"ids": second[0]["ids"][1:], "ids_length": tf.constant([2])})
    np.testing.assert_allclose(logits[0], from_cache.numpy()[0], atol=1e-6)
    np.testing.assert_allclose(logits[1], from_zero.numpy()[0], atol=1e-6)
    assert np.abs(logits[0] - logits[1]).max() > 1e-4  # the carried state made a difference


def test_independent_chunks_start_from_zero():
    model = small_model(carry_state=False, max_batch_size=None)
    features, _ = whole_batch()
    chunk = next(iter(chunk_pairs(3).skip(1)))[0]  # a middle chunk: resets false
    del chunk["chunk_index"]  # predicted on its own, it would (rightly) fail the order check
    logits = model.predict(tf.data.Dataset.from_tensors(chunk), verbose=0)
    expected, _ = model.run(chunk)
    np.testing.assert_allclose(logits, expected.numpy(), atol=1e-6)
    # Trains on chunks; the order is still checked.
    model.fit(chunk_pairs(3), verbose=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of order"):
        model.fit(chunk_pairs(3).skip(1), verbose=0)


def test_out_of_order_chunks_raise_in_fit():
    model = small_model()
    shuffled = chunk_pairs(1).shuffle(7, seed=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of order"):
        model.fit(shuffled, verbose=0)


def test_carried_training_needs_chunks_and_batches_fit_the_cache():
    with pytest.raises(ValueError, match="tbptt_chunks"):
        small_model(max_batch_size=2).fit(tf.data.Dataset.from_tensors(whole_batch()), verbose=0)
    with pytest.raises(ValueError, match="max_batch_size"):
        small_model(max_batch_size=2).fit(chunk_pairs(3), verbose=0)  # 3 rows, known statically
    unknown_rows = chunk_pairs(3).unbatch().batch(3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_batch_size"):
        small_model(max_batch_size=2).fit(unknown_rows, verbose=0)
    with pytest.raises(ValueError, match="max_batch_size"):
        StatefulLM(10, carry_state=True)
    with pytest.raises(ValueError, match="cell"):
        StatefulLM(10, cell="rnn", max_batch_size=2)
    with pytest.raises(ValueError, match="jit_compile"):
        small_model().compile(optimizer="sgd", jit_compile=True)


@pytest.mark.slow
def test_mixed_float16_trains_with_float32_state_and_loss():
    keras.utils.set_random_seed(0)
    model = StatefulLM(20, embedding_dim=8, units=8, max_batch_size=4, dtype="mixed_float16")
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    history = model.fit(chunk_pairs(3).repeat(3), verbose=0, epochs=2).history
    assert all(np.isfinite(history["loss"]))
    assert history["loss"][-1] < history["loss"][0]
    assert model.cached_state("train")[0].dtype == tf.float32
    assert model.rnn.compute_dtype == "float16"


@pytest.mark.slow
def test_resumed_trainer_carries_the_state_on_mid_stream(tmp_path):
    from tfseq.training import Trainer

    def train(model_dir, max_steps=None):
        model = small_model()
        model.compile(optimizer=keras.optimizers.Adam(1e-2))
        trainer = Trainer(model, chunk_pairs(2), model_dir=str(model_dir))
        trainer.restore()
        result = trainer.fit(1, verbose=0, max_steps=max_steps)
        return model, result

    straight, _ = train(tmp_path / "straight")
    _, stopped = train(tmp_path / "resumed", max_steps=2)   # 2 of the 4 chunks
    assert stopped.interrupted
    resumed, result = train(tmp_path / "resumed")            # restores cache + order counter
    assert not result.interrupted and result.steps_done == 4
    np.testing.assert_allclose(resumed.cached_state("train")[0].numpy(),
                               straight.cached_state("train")[0].numpy(), atol=1e-6)


def test_get_config_round_trip():
    model = small_model("lstm")
    clone = StatefulLM.from_config(model.get_config())
    assert (clone.cell, clone.units, clone.max_batch_size, clone.carry_state) == (
        "lstm", 6, 4, True)


# -- pipeline ----------------------------------------------------------------------------


@pytest.fixture
def tiny_corpus(tmp_path):
    verses = [("Gen", 1, 1, "in the beginning god created the heaven"),
              ("Gen", 1, 2, "and the earth was without form"),
              ("Gen", 2, 1, "thus the heavens and the earth were finished"),
              ("Gen", 2, 2, "and on the seventh day god ended his work"),
              ("Exod", 1, 1, "now these are the names"),
              ("Exod", 1, 2, "reuben simeon levi and judah")]
    path = tmp_path / "tiny.tsv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(f"{b}\t{c}\t{v}\t{t}\n" for b, c, v, t in verses))
    return str(path)


@pytest.mark.slow
def test_pipeline_stream_predicts_every_training_token_once(tiny_corpus):
    config = lm_tbptt.Config(files=(tiny_corpus,), min_count=1, batch_size=3, tbptt=4,
                             eval_percent=0)
    data = lm_tbptt.TASK.datasets(config)
    train_ds, info = data.train, data.state
    vocab = info["vocab"]
    words = " ".join(f"{line} </s>" for line in [
        "in the beginning god created the heaven", "and the earth was without form",
        "thus the heavens and the earth were finished",
        "and on the seventh day god ended his work", "now these are the names",
        "reuben simeon levi and judah"]).split()
    predicted = []
    batches = to_list(train_ds)
    for b in range(3):
        for features, targets in batches:
            n = features["ids_length"][b]
            predicted.append(targets[b][:n])
    flat = [t for part in predicted for t in part]
    assert vocab.to_tokens(tf.constant(flat)).numpy().astype(str).tolist() == words[1:]
    assert data.counters["train"].drops()["other_split"] == 0


@pytest.mark.slow
def test_pipeline_sequences_chunks_and_model_trains(tiny_corpus):
    config = lm_tbptt.Config(files=(tiny_corpus,), min_count=1, mode="sequences", batch_size=2,
                             tbptt=3, eval_percent=0)
    data = lm_tbptt.TASK.datasets(config)
    train_ds, info = data.train, data.state
    model = build_model(config, info, ModelConfig(embedding_dim=4, units=4))
    history = model.fit(train_ds, verbose=0).history
    assert history["tokens"] == [sum(len(line.split()) + 1 for line in [
        "in the beginning god created the heaven", "and the earth was without form",
        "thus the heavens and the earth were finished",
        "and on the seventh day god ended his work", "now these are the names",
        "reuben simeon levi and judah"])]
    assert model.carry_state


def test_pipeline_config_checks():
    with pytest.raises(ValueError, match="tbptt"):
        lm_tbptt.TASK.datasets(lm_tbptt.Config(mode="stream", tbptt=None))
    with pytest.raises(ValueError, match="mode"):
        lm_tbptt.TASK.datasets(lm_tbptt.Config(mode="pack"))


def test_join_chapters(tiny_corpus, tmp_path):
    out = tmp_path / "chapters.tsv"
    assert lm_tbptt.join_chapters(tiny_corpus, str(out)) == (3, 0)
    assert out.read_text().splitlines() == [
        "Gen\t1\t0\tin the beginning god created the heaven and the earth was without form",
        "Gen\t2\t0\tthus the heavens and the earth were finished and on the seventh day god "
        "ended his work",
        "Exod\t1\t0\tnow these are the names reuben simeon levi and judah"]
