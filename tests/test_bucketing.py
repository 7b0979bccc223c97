"""Tests for tfseq.bucketing: written-out batches, budgets and exactly-once as properties."""

import collections

import numpy as np
import pytest
import tensorflow as tf
from conftest import to_list
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tfseq
from tfseq.bucketing import bucket_by_length, fit_boundaries


def examples(lengths):
    """Example i has ``label`` i and ``ids`` [1, 2, ..., lengths[i]]."""
    ids = tf.ragged.constant([list(range(1, n + 1)) for n in lengths], dtype=tf.int32,
                             ragged_rank=1)
    return tf.data.Dataset.from_tensor_slices({"ids": ids, "label": tf.range(len(lengths))})


def summary(batches):
    """(ids_length, label, padded shape) of each batch."""
    return [(b["ids_length"], b["label"], list(np.shape(b["ids"]))) for b in batches]


LENGTHS_1_TO_10 = list(range(1, 11))


# --- written-out batches ---------------------------------------------------------------------

def test_docstring_example_dense_values():
    ds = tf.data.Dataset.from_tensor_slices({"ids": tf.ragged.constant([[1], [2, 3, 4], [5, 6]])})
    out = to_list(ds.apply(bucket_by_length(max_tokens=6, shuffle=False)))
    assert out == [
        {"ids": [[2, 3, 4], [5, 6, 0]], "ids_length": [3, 2]},
        {"ids": [[1]], "ids_length": [1]},
    ]


def test_boundaries_with_budget():
    ds = examples(LENGTHS_1_TO_10).apply(
        bucket_by_length(max_tokens=20, boundaries=[3, 7, 11], shuffle=False))
    # labels are length - 1
    assert summary(to_list(ds)) == [
        ([8, 9], [7, 8], [2, 9]),
        ([10, 4], [9, 3], [2, 10]),
        ([5, 6], [4, 5], [2, 6]),
        ([7, 1], [6, 0], [2, 7]),
        ([2, 3], [1, 2], [2, 3]),
    ]


def test_boundaries_pad_to_boundary():
    ds = examples(LENGTHS_1_TO_10).apply(bucket_by_length(
        max_tokens=22, boundaries=[3, 7, 11], pad_to_boundary=True, shuffle=False))
    out = to_list(ds)
    assert summary(out) == [
        ([8, 9], [7, 8], [2, 11]),
        ([10, 4], [9, 3], [2, 11]),
        ([5, 6, 7], [4, 5, 6], [3, 7]),
        ([1, 2, 3], [0, 1, 2], [3, 3]),
    ]
    assert out[1]["ids"] == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0],
                             [1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0]]


def test_boundaries_with_batch_size():
    ds = examples(LENGTHS_1_TO_10).apply(
        bucket_by_length(batch_size=3, boundaries=[3, 7, 11], shuffle=False))
    assert summary(to_list(ds)) == [
        ([8, 9, 10], [7, 8, 9], [3, 10]),
        ([4, 5, 6], [3, 4, 5], [3, 6]),
        ([7, 1, 2], [6, 0, 1], [3, 7]),
        ([3], [2], [1, 3]),
    ]


def test_bucket_width_pad_to_boundary():
    ds = examples(LENGTHS_1_TO_10).apply(bucket_by_length(
        batch_size=2, bucket_width=4, max_length=12, pad_to_boundary=True, shuffle=False))
    assert summary(to_list(ds)) == [
        ([9, 10], [8, 9], [2, 12]),
        ([5, 6], [4, 5], [2, 8]),
        ([7, 8], [6, 7], [2, 8]),
        ([1, 2], [0, 1], [2, 4]),
        ([3, 4], [2, 3], [2, 4]),
    ]


def test_no_buckets_sorts_by_length_and_pads_to_longest():
    ds = examples([3, 1, 4, 1, 5, 9, 2, 6]).apply(bucket_by_length(max_tokens=12, shuffle=False))
    assert summary(to_list(ds)) == [
        ([9], [5], [1, 9]),
        ([6, 5], [7, 4], [2, 6]),
        ([4, 3, 2], [2, 0, 6], [3, 4]),
        ([1, 1], [1, 3], [2, 1]),
    ]


def test_pad_to_boundary_without_buckets_pads_to_max_length():
    ds = examples([3, 1, 2]).apply(bucket_by_length(
        max_tokens=12, max_length=6, pad_to_boundary=True, shuffle=False))
    assert ds.element_spec["ids"].shape.as_list() == [None, 6]
    assert summary(to_list(ds)) == [([3, 2], [0, 2], [2, 6]), ([1], [1], [1, 6])]


def test_pairs_use_the_longer_side_and_pad_each_feature_to_its_own_longest():
    ds = tf.data.Dataset.from_tensor_slices({
        "source": tf.ragged.constant([[1, 2], [7, 8, 9], [5]]),
        "target": tf.ragged.constant([[3, 4, 5, 6], [1], [6]]),
        "weight": [0.5, 1.0, 2.0],
    })
    out = to_list(ds.apply(bucket_by_length(max_tokens=8, shuffle=False)))
    assert out == [
        {"source": [[1, 2, 0], [7, 8, 9]], "source_length": [2, 3],
         "target": [[3, 4, 5, 6], [1, 0, 0, 0]], "target_length": [4, 1], "weight": [0.5, 1.0]},
        {"source": [[5]], "source_length": [1], "target": [[6]], "target_length": [1],
         "weight": [2.0]},
    ]


def test_fixed_length_feature_counts_as_a_sequence():
    ds = tf.data.Dataset.from_tensor_slices({
        "ids": tf.ragged.constant([[1], [2, 3, 4]]),
        "tags": tf.constant([[5, 6], [7, 8]]),
    })
    out = to_list(ds.apply(bucket_by_length(max_tokens=4, shuffle=False)))
    assert out == [
        {"ids": [[2, 3, 4]], "ids_length": [3], "tags": [[7, 8]], "tags_length": [2]},
        {"ids": [[1]], "ids_length": [1], "tags": [[5, 6]], "tags_length": [2]},
    ]


def test_batch_multiple_rounds_rows_down():
    ds = examples([2] * 7).apply(bucket_by_length(max_tokens=10, batch_multiple=2, shuffle=False))
    assert [b["label"] for b in to_list(ds)] == [[0, 1, 2, 3], [4, 5, 6]]


def test_too_long_dropped_and_counted():
    counter = tfseq.DropCounter()
    ds = examples([1, 5, 2, 9, 4]).apply(
        bucket_by_length(max_tokens=8, max_length=4, shuffle=False, counter=counter))
    assert summary(to_list(ds)) == [([4, 2], [4, 2], [2, 4]), ([1], [0], [1, 1])]
    assert counter.drops() == {"too_long": 2}


def test_default_max_length_is_the_budget():
    counter = tfseq.DropCounter()
    ds = examples([3, 7, 6]).apply(bucket_by_length(max_tokens=6, shuffle=False, counter=counter))
    assert [b["label"] for b in to_list(ds)] == [[2], [0]]
    assert counter.drops() == {"too_long": 1}


def test_output_spec():
    ds = examples([1, 2]).apply(bucket_by_length(max_tokens=8))
    assert ds.element_spec == {
        "ids": tf.TensorSpec([None, None], tf.int32),
        "ids_length": tf.TensorSpec([None], tf.int32),
        "label": tf.TensorSpec([None], tf.int32),
    }


def test_fit_boundaries_known_lists():
    assert fit_boundaries([1, 1, 2, 3, 5, 8, 13, 21, 34, 55], 4) == [2, 5, 21, 55]
    assert fit_boundaries(np.arange(1, 11), 2) == [5, 10]
    assert fit_boundaries([7, 7, 7, 7, 7], 3) == [7]
    assert fit_boundaries([0, 0, 3], 3) == [1, 3]
    assert all(type(b) is int for b in fit_boundaries(np.array([4, 9], np.int64), 2))


# --- bad arguments (all raise before any dataset exists) -------------------------------------

@pytest.mark.parametrize("kwargs, name", [
    (dict(), "max_tokens"),
    (dict(max_tokens=64, batch_size=8), "batch_size"),
    (dict(max_tokens=64, boundaries=[7, 3]), "boundaries"),
    (dict(max_tokens=64, boundaries=[3, 3]), "boundaries"),
    (dict(max_tokens=64, boundaries=[0, 3]), "boundaries"),
    (dict(max_tokens=64, boundaries=[]), "boundaries"),
    (dict(max_tokens=64, max_length=32, boundaries=[8, 40]), "boundaries"),
    (dict(max_tokens=64, boundaries=[8], bucket_width=8), "bucket_width"),
    (dict(max_tokens=100, max_length=200), "max_tokens"),
    (dict(max_tokens=100, max_length=60, batch_multiple=2), "max_tokens"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(batch_size=-1), "batch_size"),
    (dict(batch_size=6, batch_multiple=4), "batch_size"),
    (dict(max_tokens=64, batch_multiple=4, pool_size=10), "pool_size"),
    (dict(batch_size=8, pool_size=4), "pool_size"),
    (dict(max_tokens=64, length_noise=1.5), "length_noise"),
    (dict(batch_size=8, pad_to_boundary=True), "max_length"),
    (dict(batch_size=8, bucket_width=0), "bucket_width"),
])
def test_bad_arguments_raise_value_error_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        bucket_by_length(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(max_tokens=64.0), "max_tokens"),
    (dict(max_tokens=64, boundaries="3,7"), "boundaries"),
    (dict(max_tokens=64, boundaries=[3.5]), "boundaries"),
    (dict(max_tokens=64, seed="1"), "seed"),
])
def test_bad_types_raise_type_error_naming_them(kwargs, name):
    with pytest.raises(TypeError, match=name):
        bucket_by_length(**kwargs)


def test_non_dict_dataset_raises_type_error():
    with pytest.raises(TypeError, match="bucket_by_length"):
        tf.data.Dataset.range(3).apply(bucket_by_length(max_tokens=8))


@pytest.mark.parametrize("lengths, num_buckets, error", [
    ([], 2, ValueError), ([1, -2], 2, ValueError), ([1.5, 2.0], 2, ValueError),
    ([[1, 2]], 2, ValueError), ([1, 2], 0, ValueError), ([1, 2], 2.0, TypeError),
])
def test_fit_boundaries_bad_arguments(lengths, num_buckets, error):
    with pytest.raises(error):
        fit_boundaries(lengths, num_buckets)


# --- shuffling, determinism, infinite input --------------------------------------------------

def labels_of(ds):
    return [b["label"] for b in to_list(ds)]


def test_seed_is_deterministic_and_reshuffles_each_pass():
    lengths = [1 + (7 * i) % 13 for i in range(120)]
    make = lambda seed: examples(lengths).apply(  # noqa: E731
        bucket_by_length(max_tokens=40, pool_size=40, seed=seed))
    ds = make(3)
    first, second = labels_of(ds), labels_of(ds)
    assert first != second
    again = make(3)
    assert labels_of(again) == first and labels_of(again) == second
    assert labels_of(make(4)) != first


def test_shuffle_puts_longest_batch_anywhere():
    lengths = [1 + i % 20 for i in range(200)]
    ds = examples(lengths).apply(bucket_by_length(max_tokens=60, pool_size=200, seed=0))
    widths = [len(b["ids"][0]) for b in to_list(ds)]
    assert widths != sorted(widths, reverse=True)


def test_repeated_dataset_emits_each_example_once_per_pass():
    counter = tfseq.DropCounter()
    lengths = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]  # label 5 (length 9) is over max_length
    ds = examples(lengths).repeat(30).apply(
        bucket_by_length(max_tokens=12, max_length=8, pool_size=10, seed=1, counter=counter))
    seen = collections.Counter()
    for batch in ds:
        assert np.size(batch["ids"]) <= 12
        seen.update(batch["label"].numpy().tolist())
    assert seen == {label: 30 for label in range(10) if label != 5}
    assert counter.drops() == {"too_long": 30}


def test_infinite_dataset_streams_batches():
    ds = examples([3, 1, 4, 1, 5, 2, 6, 5, 3]).repeat().apply(
        bucket_by_length(max_tokens=12, pool_size=10, seed=1))
    batches = list(ds.take(40))
    assert len(batches) == 40 and all(np.size(b["ids"]) <= 12 for b in batches)


def test_length_noise_keeps_the_budget_and_every_example():
    lengths = [1 + (5 * i) % 17 for i in range(90)]
    out = to_list(examples(lengths).apply(
        bucket_by_length(max_tokens=34, length_noise=0.5, pool_size=30, seed=2)))
    assert max(len(b["ids"]) * len(b["ids"][0]) for b in out) <= 34
    assert sorted(label for b in out for label in b["label"]) == list(range(90))


# --- properties ------------------------------------------------------------------------------

def _lengths():
    random_lengths = st.lists(st.integers(0, 30), min_size=1, max_size=60)
    all_equal = st.builds(lambda n, v: [v] * n, st.integers(1, 60), st.integers(1, 30))
    all_one = st.builds(lambda n: [1] * n, st.integers(1, 60))
    outliers = st.builds(lambda base, huge: base + huge,
                         st.lists(st.integers(1, 5), min_size=1, max_size=40),
                         st.lists(st.integers(100, 400), min_size=1, max_size=3))
    return st.one_of(random_lengths, all_equal, all_one, outliers).flatmap(st.permutations)


@st.composite
def _setups(draw):
    multiple = draw(st.sampled_from([1, 2, 4]))
    budget = draw(st.integers(8, 300)) // multiple * multiple
    max_length = draw(st.one_of(st.none(), st.integers(1, budget // multiple)))
    limit = max_length or budget // multiple
    buckets = draw(st.sampled_from(["none", "boundaries", "width"]))
    kwargs = dict(max_tokens=budget, max_length=max_length, batch_multiple=multiple,
                  pool_size=multiple * draw(st.integers(1, 12)),
                  pad_to_boundary=draw(st.booleans()),
                  length_noise=draw(st.sampled_from([0.0, 0.3])),
                  shuffle=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)))
    if buckets == "boundaries":
        kwargs["boundaries"] = sorted(draw(st.sets(st.integers(1, limit), min_size=1,
                                                   max_size=4)))
    elif buckets == "width":
        kwargs["bucket_width"] = draw(st.integers(1, 10))
    return kwargs, limit


@pytest.mark.slow
@settings(max_examples=4, deadline=None)  # each draw traces two pipelines: ~1.3 s each
@given(lengths=_lengths(), setup=_setups())
# Found by a CI run: the over-long example left the first pool with an odd count, and each pool
# cut its own remainder (two batches of one row with batch_multiple=2).
@example(lengths=[0, 0, 0, 0, 0, 5, 0],
         setup=({"max_tokens": 8, "max_length": None, "batch_multiple": 2, "pool_size": 2,
                 "pad_to_boundary": False, "length_noise": 0.0, "shuffle": False, "seed": 0}, 4))
def test_budget_exactly_once_multiple_and_determinism(lengths, setup):
    kwargs, limit = setup
    counter = tfseq.DropCounter()
    ds = examples(lengths).apply(bucket_by_length(counter=counter, **kwargs))
    out = to_list(ds)
    kept = [i for i, n in enumerate(lengths) if n <= limit]
    assert sorted(label for b in out for label in b["label"]) == kept
    assert counter.drops().get("too_long", 0) == len(lengths) - len(kept)
    for b in out:
        rows, width = np.shape(b["ids"])
        assert rows * width <= kwargs["max_tokens"]
        assert b["ids_length"] == [lengths[label] for label in b["label"]]
        assert [sum(1 for v in row if v) for row in b["ids"]] == b["ids_length"]
        if not kwargs["pad_to_boundary"]:
            assert width == max(b["ids_length"])
    ragged_rows = [len(b["label"]) for b in out if len(b["label"]) % kwargs["batch_multiple"]]
    assert len(ragged_rows) == (1 if len(kept) % kwargs["batch_multiple"] else 0)
    assert to_list(examples(lengths).apply(bucket_by_length(**kwargs))) == out


@settings(max_examples=6, deadline=None)
@given(lengths=_lengths(), batch_size=st.sampled_from([1, 2, 3, 4, 8]), data=st.data())
def test_batch_size_exactly_once_and_row_counts(lengths, batch_size, data):
    pool_size = batch_size * data.draw(st.integers(1, 6))
    out = to_list(examples(lengths).batch(3).apply(
        bucket_by_length(batch_size=batch_size, pool_size=pool_size, seed=0)))
    assert sorted(label for b in out for label in b["label"]) == list(range(len(lengths)))
    assert all(len(b["label"]) <= batch_size for b in out)
    # A pool's under-filled last batch is carried into the next pool: every batch is full
    # but the last of the stream.
    assert [len(b["label"]) for b in out[:-1]] == [batch_size] * (len(out) - 1)
    assert len(out) == -(-len(lengths) // batch_size)


def _greedy_reference(padded, max_tokens, batch_size, multiple):
    """(start, rows) of each batch: as many rows as fit, rounded down to ``multiple`` unless
    they are the last ones."""
    out, start = [], 0
    while start < len(padded):
        remaining = len(padded) - start
        if max_tokens is None:
            rows = min(batch_size, remaining)
        else:
            rows = 1
            while (rows < remaining
                   and (rows + 1) * max(padded[start:start + rows + 1]) <= max_tokens):
                rows += 1
            if rows < remaining:
                rows = rows // multiple * multiple
        out.append((start, rows))
        start += rows
    return out


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 10), max_size=40), multiple=st.sampled_from([1, 2, 4]),
       budget_factor=st.integers(1, 4), sort=st.booleans())
def test_greedy_cut_matches_a_reference(lengths, multiple, budget_factor, sort):
    from tfseq.bucketing import _cut

    padded = sorted(lengths, reverse=True) if sort else lengths
    max_tokens = 10 * multiple * budget_factor
    starts, sizes = _cut(tf.constant(padded, tf.int32), max_tokens, None, multiple,
                         descending=sort)
    assert list(zip(starts.numpy().tolist(), sizes.numpy().tolist())) == _greedy_reference(
        padded, max_tokens, None, multiple)
