"""tfseq.mix: an exact, deterministic mixture of several datasets."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

import tfseq
from tfseq.mixing import Mixture, integer_shares, mixture_weights, schedule


def numbered(first, n, length=None):
    """Examples {"ids": [first + j] * length_j} for j < n (length_j = j % 3 + 1 by default)."""
    return tf.data.Dataset.range(n).map(lambda j: {"ids": tf.fill(
        [length or tf.cast(j % 3 + 1, tf.int32)], tf.cast(first + j, tf.int32))})


def pairs(ds, n):
    """(source, first id) of the first n examples."""
    return [(int(x["source"]), int(x["ids"][0])) for x in ds.take(n)]


def test_the_exact_sequence_of_two_sources_two_to_one():
    ds = tfseq.mix([numbered(0, 3), numbered(10, 2)], [2, 1], seed=1)
    assert pairs(ds, 12) == [(0, 0), (0, 1), (1, 10), (0, 2), (0, 0), (1, 11),
                             (0, 1), (0, 2), (1, 10), (0, 0), (0, 1), (1, 11)]
    assert ds.element_spec == {"ids": tf.TensorSpec([None], tf.int32),
                               "source": tf.TensorSpec([], tf.int32)}


def test_the_same_seed_gives_the_same_sequence_and_ties_follow_the_seed():
    def run(seed):
        return pairs(tfseq.mix([numbered(0, 4), numbered(10, 4), numbered(20, 4)], seed=seed), 30)

    assert run(5) == run(5)
    orders = {tuple(s for s, _ in run(seed)[:3]) for seed in range(8)}
    assert len(orders) > 1  # equal weights: the seed picks the order of a round
    for seed in range(8):
        sources = [s for s, _ in run(seed)]
        assert all(sorted(sources[i:i + 3]) == [0, 1, 2] for i in range(0, 30, 3))


def test_the_schedule_of_literal_weights():
    m = Mixture.create(["a", "b", "c"], [0.5, 0.25, 0.25], seed=0)
    assert m.period == 4 and m.shares.tolist() == [2, 1, 1]
    assert m.order.tolist() == [0, 2, 1, 0]
    m = Mixture.create(["news", "web"], [0.7, 0.3])
    assert m.period == 10 and m.shares.tolist() == [7, 3]
    assert m.order.tolist() == [0, 0, 1, 0, 0, 1, 0, 0, 1, 0]
    assert m.counts(25).tolist() == [18, 7]  # 2 periods (14, 6) + 0 0 1 0 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=2, max_size=7), st.integers(0, 2**31 - 1))
def test_every_prefix_is_within_one_of_its_share(raw, seed):
    shares = np.array(raw, np.int64)
    order = schedule(shares, seed)
    period = int(shares.sum())
    counts = np.cumsum(np.eye(len(raw), dtype=np.int64)[order], axis=0)
    n = np.arange(1, period + 1)[:, None]
    assert np.abs(counts - n * shares[None] / period).max() <= 1
    assert counts[-1].tolist() == raw


def test_every_prefix_of_the_emitted_examples_is_within_one_of_the_weights():
    weights = [0.5, 0.3, 0.2]
    ds = tfseq.mix([numbered(0, 7), numbered(100, 5), numbered(200, 3)], weights, seed=3)
    sources = np.array([s for s, _ in pairs(ds, 2000)])
    counts = np.cumsum(np.eye(3, dtype=np.int64)[sources], axis=0)
    n = np.arange(1, 2001)[:, None]
    assert np.abs(counts - n * np.array(weights)[None]).max() <= 1


def test_one_example_an_element_mixes_into_the_sequence_of_ragged_batches():
    def sources():
        return [numbered(0, 7), numbered(100, 5), numbered(200, 3)]

    one = tfseq.mix(sources(), [0.5, 0.3, 0.2], seed=3)
    batched = tfseq.mix([ds.ragged_batch(4) for ds in sources()], [0.5, 0.3, 0.2], seed=3)
    # Blocks of 1,030 examples (103 periods of 10): the first two, example by example.
    rows = [(int(s), r.tolist()) for b in batched.take(2)
            for s, r in zip(b["source"].numpy(), b["ids"].numpy())]
    assert len(rows) == 2060 and rows[:6] == [(0, [0]), (1, [100]), (0, [1, 1]), (2, [200]),
                                             (0, [2, 2, 2]), (1, [101, 101])]
    assert [(int(x["source"]), x["ids"].numpy().tolist()) for x in one.take(2060)] == rows


def test_weights_that_are_not_fractions_are_shares_of_the_longest_period():
    m = Mixture.create(["a", "b"], [1 / 3 ** 0.5, 1.0])
    assert m.period == 16384 and m.shares.sum() == 16384
    assert np.abs(m.shares / m.period - m.weights).max() < 1 / 16384
    shares, period = integer_shares(np.array([1e-9, 1 - 1e-9]))
    assert period == 16384 and shares.tolist() == [1, 16383]  # a positive weight keeps one


def test_each_source_example_once_per_source_epoch_and_reshuffled_per_epoch():
    a = numbered(0, 5).shuffle(5, seed=7, reshuffle_each_iteration=True)
    b = numbered(100, 3)
    got = pairs(tfseq.mix({"a": a, "b": b}, [0.5, 0.5], seed=0), 30)
    of_a = [v for s, v in got if s == 0]
    of_b = [v for s, v in got if s == 1]
    assert len(of_a) == 15 and len(of_b) == 15
    epochs_a = [of_a[i:i + 5] for i in range(0, 15, 5)]
    assert all(sorted(e) == [0, 1, 2, 3, 4] for e in epochs_a)
    assert len({tuple(e) for e in epochs_a}) > 1  # a new order in some epoch
    assert all(of_b[i:i + 3] == [100, 101, 102] for i in range(0, 15, 3))


def test_temperature_weights_from_sizes_and_from_cardinality():
    w = mixture_weights(3, temperature=2, sizes=[100, 10, 1])
    expected = np.array([10.0, 10 ** 0.5, 1.0]) / (11 + 10 ** 0.5)
    np.testing.assert_allclose(w, expected)
    np.testing.assert_allclose(mixture_weights(2, sizes=[30, 10]), [0.75, 0.25])
    ds = tfseq.mix([numbered(0, 30), numbered(100, 10)], seed=0)  # T=1 from cardinality
    sources = [s for s, _ in pairs(ds, 40)]
    assert sources.count(0) == 30 and sources.count(1) == 10
    ds = tfseq.mix([numbered(0, 90), numbered(100, 10)], temperature=2, seed=0)
    sources = [s for s, _ in pairs(ds, 400)]
    assert sources.count(0) == 300 and sources.count(1) == 100  # 90**0.5 : 10**0.5 = 3 : 1


def test_a_dict_keeps_its_names_in_order():
    m = Mixture.create(list({"news": 0, "web": 0}), [3, 1])
    assert m.names == ("news", "web")
    got = pairs(tfseq.mix({"news": numbered(0, 6), "web": numbered(500, 2)}, [3, 1]), 8)
    assert {v for s, v in got if s == 1} == {500, 501}
    assert {v for s, v in got if s == 0} == {0, 1, 2, 3, 4, 5}


def test_ragged_batches_mix_into_ragged_batches_and_bucket_exactly_once():
    def source(first, n):
        return tf.data.Dataset.range(first, first + n).map(lambda j: {
            "ids": tf.fill([tf.cast(j % 7 + 1, tf.int32)], tf.cast(j, tf.int32)),
            "label": tf.cast(j % 2, tf.int32)}).ragged_batch(64)

    mixed = tfseq.mix([source(0, 1536), source(10_000, 512)], [3, 1], seed=0)
    assert tfseq._common.is_ragged_batch(mixed.element_spec)
    first = next(iter(mixed))
    assert first["ids"].nrows() == 1024
    assert int(tf.reduce_sum(tf.cast(first["source"] == 1, tf.int32))) == 256
    batches = list(mixed.take(2).apply(tfseq.bucket_by_length(max_tokens=64, seed=0)))
    ids = sorted(int(row[0]) for b in batches for row, n in zip(b["ids"].numpy(),
                                                                b["ids_length"].numpy()) if n)
    assert ids == list(range(1536)) + list(range(10_000, 10_512))
    sources = np.concatenate([b["source"].numpy() for b in batches])
    assert (sources == 1).sum() == 512 and (sources == 0).sum() == 1536


def test_the_sequence_does_not_depend_on_dataset_options():
    def run(deterministic):
        ds = tfseq.mix([numbered(0, 50), numbered(100, 20)], [0.6, 0.4], seed=2)
        options = tf.data.Options()
        options.deterministic = deterministic
        options.threading.private_threadpool_size = 3
        return pairs(ds.with_options(options), 3000)

    assert run(False) == run(True)


def test_sources_of_fixed_and_variable_lengths_mix():
    ds = tfseq.mix([numbered(0, 3, length=2), numbered(10, 3)], seed=0)
    assert ds.element_spec["ids"].shape.as_list() == [None]
    assert sorted(len(x["ids"]) for x in ds.take(6)) == [1, 2, 2, 2, 2, 3]


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="already have a 'source' feature"):
        tfseq.mix([tf.data.Dataset.from_tensors({"source": [1], "target": [2]})] * 2)
    with pytest.raises(ValueError, match="source '1' has features"):
        tfseq.mix([numbered(0, 3), tf.data.Dataset.from_tensors({"tokens": [1]})])
    with pytest.raises(ValueError, match="needs each source's size"):
        tfseq.mix([numbered(0, 3).filter(lambda x: True), numbered(0, 3)], temperature=2)
    with pytest.raises(ValueError, match="weights must be >= 0"):
        tfseq.mix([numbered(0, 3), numbered(0, 3)], [1, -1])
    with pytest.raises(ValueError, match="2 sources but 3 weights"):
        tfseq.mix([numbered(0, 3), numbered(0, 3)], [1, 1, 1])
    with pytest.raises(ValueError, match="no datasets"):
        tfseq.mix([])
    with pytest.raises(TypeError, match="dict examples"):
        tfseq.mix([tf.data.Dataset.range(3)])


def test_batched_rows_of_strings_mix_as_batches():
    def rows(prefix, n):
        return tf.data.Dataset.from_tensor_slices(
            {"text": [f"{prefix}{i}" for i in range(n)]}).batch(5)

    mixed = tfseq.mix([rows("a", 9), rows("b", 4)], [3, 1], seed=0, batched=True)
    block = next(iter(mixed))
    assert block["text"].shape == [1024] and block["source"].shape == [1024]
    texts = [t.decode() for t in block["text"].numpy()[:8]]
    assert texts == ["a0", "a1", "b0", "a2", "a3", "a4", "b1", "a5"]
    assert block["source"].numpy()[:8].tolist() == [0, 0, 1, 0, 0, 0, 1, 0]
    assert (block["source"].numpy() == 1).sum() == 256
