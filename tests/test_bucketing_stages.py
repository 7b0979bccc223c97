"""The stages of bucket_by_length, each alone on literal inputs, and the pool-level entry
points (Bucketer.pool_batches / finish) against the streaming transformation."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from conftest import to_list, to_python
from hypothesis import given, settings
from hypothesis import strategies as st

import tfseq
from tfseq._pools import PoolLists, fill_pools
from tfseq.bucketing import Bucketer, _batch_seeds, bucket_by_length

T, F = True, False
SEED = tf.constant(7, tf.int64)
# The module docstring's worked example: lengths 1..10 sorted into buckets [3, 7, 11].
WORKED = dict(max_tokens=20, boundaries=[3, 7, 11], shuffle=False)
WORKED_ORDER = [7, 8, 9, 3, 4, 5, 6, 0, 1, 2]        # lengths 8 9 10 4 5 6 7 1 2 3
WORKED_LENGTHS = [8, 9, 10, 4, 5, 6, 7, 1, 2, 3]


def ints(values):
    return tf.constant(values, tf.int32)


def pool_of(lengths, dtype=tf.int32):
    """A pool whose example i has ``ids`` [1, ..., lengths[i]] and ``label`` i."""
    ids = tf.ragged.constant([list(range(1, n + 1)) for n in lengths], dtype=dtype,
                             ragged_rank=1, row_splits_dtype=tf.int32)
    return {"ids": ids, "label": tf.range(len(lengths))}


# --- the arguments ---------------------------------------------------------------------------

def test_bucketer_resolves_defaults_and_validates_like_bucket_by_length():
    b = Bucketer(max_tokens=64, boundaries=[4, 8])
    assert (b.boundaries, b.max_length, b.pool_size, b.pool_tokens) == ((4, 8), 64, None, 16384)
    assert Bucketer(batch_size=8).pool_size == 32768
    with pytest.raises(ValueError, match="batch_size"):
        Bucketer(max_tokens=64, batch_size=8)
    with pytest.raises(TypeError, match="seed"):
        Bucketer(max_tokens=64, seed="1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.max_tokens = 32


# --- stage 1: fill pools ---------------------------------------------------------------------

def test_fill_pools_closes_at_the_token_budget_and_at_the_end():
    # The _pools docstring example: chunks of 2, 3 and 2 examples of 3 tokens; max_tokens=12.
    chunks = [tf.ragged.constant([[1, 1, 1]] * n, row_splits_dtype=tf.int32) for n in (2, 3, 2)]
    ds = tf.data.Dataset.from_tensor_slices(tf.ragged.stack(chunks)).enumerate().map(
        lambda i, chunk: ({"ids": chunk}, i))
    lists = PoolLists(ds.element_spec[0])
    pools = fill_pools(ds, lists, lambda c: (tf.cast(c["ids"].nrows(), tf.int64), tf.cast(
        tf.reduce_sum(c["ids"].row_lengths()), tf.int64)), max_tokens=12)
    out = [(bool(is_last), lists.concat(pool)["ids"].row_lengths().numpy().tolist(), int(tag))
           for is_last, pool, tag in pools]
    assert out == [(False, [3, 3, 3, 3, 3], 1), (True, [3, 3], 2)]


def test_pool_lists_concat_both_puts_the_first_pool_first():
    lists = PoolLists({"ids": tf.RaggedTensorSpec([None, None], tf.int32, 1, tf.int32),
                       "label": tf.TensorSpec([None], tf.int32)})
    first = lists.push(lists.empty(), {"ids": tf.ragged.constant([[1, 2]]), "label": ints([10])})
    second = lists.push(lists.push(lists.empty(), {"ids": tf.ragged.constant([[3]]),
                                                   "label": ints([20])}),
                        {"ids": tf.ragged.constant([[4, 5, 6], []]), "label": ints([30, 40])})
    assert to_python(lists.concat_both(first, second)) == {
        "ids": [[1, 2], [3], [4, 5, 6], []], "label": [10, 20, 30, 40]}


# --- stage 3: order a pool -------------------------------------------------------------------

LENGTHS = [3, 1, 4, 1, 5, 2, 2, 6]


def test_order_pool_sorts_by_length_keeping_input_order_among_equals():
    order = Bucketer(max_tokens=12, shuffle=False).order_pool(ints(LENGTHS), SEED)
    assert order.numpy().tolist() == [7, 4, 2, 0, 5, 6, 1, 3]


def test_order_pool_shuffles_inside_each_length():
    order = Bucketer(max_tokens=12, seed=0).order_pool(ints(LENGTHS), SEED)
    assert order.numpy().tolist() == [7, 4, 2, 0, 5, 6, 3, 1]


def test_order_pool_by_bucket_longest_first():
    # Buckets (0, 2], (2, 4], (4, 6]: {1, 3, 5, 6}, {0, 2}, {4, 7}.
    unshuffled = Bucketer(max_tokens=12, boundaries=[2, 4, 6], shuffle=False)
    assert unshuffled.order_pool(ints(LENGTHS), SEED).numpy().tolist() == [4, 7, 0, 2, 1, 3, 5, 6]
    shuffled = Bucketer(max_tokens=12, boundaries=[2, 4, 6], seed=0)
    assert shuffled.order_pool(ints(LENGTHS), SEED).numpy().tolist() == [7, 4, 0, 2, 5, 3, 6, 1]


def test_order_pool_leaves_out_the_dropped_examples():
    keep = tf.constant([T, T, F, T, T, T, T, F])
    order = Bucketer(max_tokens=12, shuffle=False).order_pool(ints(LENGTHS), SEED, keep)
    assert order.numpy().tolist() == [4, 0, 5, 6, 1, 3]


# --- stage 4: cut ----------------------------------------------------------------------------

def test_cut_worked_example():
    starts, sizes = Bucketer(**WORKED).cut(ints(WORKED_LENGTHS))
    assert starts.numpy().tolist() == [0, 2, 4, 6, 8]
    assert sizes.numpy().tolist() == [2, 2, 2, 2, 2]


def test_cut_pad_to_boundary_sizes_rows_by_the_bound():
    b = Bucketer(max_tokens=22, boundaries=[3, 7, 11], pad_to_boundary=True, shuffle=False)
    assert b.padded_length(ints(WORKED_LENGTHS)).numpy().tolist() == [
        11, 11, 11, 7, 7, 7, 7, 3, 3, 3]
    starts, sizes = b.cut(ints(WORKED_LENGTHS))
    assert starts.numpy().tolist() == [0, 2, 4, 7]
    assert sizes.numpy().tolist() == [2, 2, 3, 3]


def test_cut_batch_size_and_multiple():
    starts, sizes = Bucketer(batch_size=4, batch_multiple=2).cut(ints([5, 4, 3, 3, 2, 1, 1]))
    assert (starts.numpy().tolist(), sizes.numpy().tolist()) == ([0, 4], [4, 3])
    starts, sizes = Bucketer(max_tokens=10, batch_multiple=2).cut(ints([5, 3, 3, 2, 2, 2, 1]))
    # [5 3 3] needs 15 cells: 2 rows; [3 2 2] fits 9 but rounds down to 2 rows; then 3 left.
    assert (starts.numpy().tolist(), sizes.numpy().tolist()) == ([0, 2, 4], [2, 2, 3])


# --- stage 5: choose the carried batches -----------------------------------------------------

def test_choose_carried_worked_example():
    # Cells 18 20 12 14 6, real tokens 17 14 11 8 5: fill .94 .70 .92 .57 .83. The last batch
    # always waits; [10 4] and [7 1] fill less than 90% of their cells.
    carried = Bucketer(**WORKED).choose_carried(ints(WORKED_LENGTHS), ints([2, 2, 2, 2, 2]))
    assert carried.numpy().tolist() == [F, T, F, T, T]


def test_choose_carried_with_batch_size_is_the_last_batch():
    carried = Bucketer(batch_size=2, shuffle=False).choose_carried(ints(WORKED_LENGTHS),
                                                                    ints([2, 2, 2, 2, 2]))
    assert carried.numpy().tolist() == [F, F, F, F, T]


def test_choose_carried_stops_at_eight_budgets_of_cells():
    # Ten batches [2 1] (4 cells each, fill .75) and a last [1] (1 cell): the last and the
    # first seven under-filled ones fit in 8 budgets (32 cells), the eighth would not.
    lengths = [2, 1] * 10 + [1]
    carried = Bucketer(max_tokens=4, max_length=2).choose_carried(ints(lengths),
                                                                    ints([2] * 10 + [1]))
    assert carried.numpy().tolist() == [T, T, T, T, T, T, T, F, F, F, T]


# --- stage 6: shuffle the batch order --------------------------------------------------------

def test_shuffle_batches_keeps_pool_order_without_shuffle_and_drops_carried():
    starts, sizes = Bucketer(**WORKED).shuffle_batches(
        ints([0, 2, 4, 6, 8]), ints([2, 2, 2, 2, 2]), tf.constant([T, F, T, F, F]), SEED)
    assert (starts.numpy().tolist(), sizes.numpy().tolist()) == ([0, 4], [2, 2])


def test_shuffle_batches_keeps_the_last_batch_last():
    starts, sizes = Bucketer(max_tokens=12, seed=0).shuffle_batches(
        ints([0, 2, 4, 6, 8]), ints([2, 2, 2, 2, 1]), tf.constant([T, T, T, T, T]), SEED)
    assert (starts.numpy().tolist(), sizes.numpy().tolist()) == ([6, 2, 0, 4, 8],
                                                                 [2, 2, 2, 2, 1])


# --- stage 7: pad ----------------------------------------------------------------------------

def test_pad_to_the_longest_row():
    rows = {"ids": tf.ragged.constant([[1, 2, 3], [4]]), "label": tf.constant([7, 8])}
    assert to_python(Bucketer(max_tokens=12).pad(rows)) == {
        "ids": [[1, 2, 3], [4, 0, 0]], "ids_length": [3, 1], "label": [7, 8]}


def test_pad_to_boundary():
    rows = {"ids": tf.ragged.constant([[1, 2, 3], [4]])}
    padded = Bucketer(max_tokens=12, boundaries=[2, 5], pad_to_boundary=True).pad(rows)
    assert to_python(padded) == {"ids": [[1, 2, 3, 0, 0], [4, 0, 0, 0, 0]],
                                 "ids_length": [3, 1]}


# --- stages 2-6 on a pool: split_pool ---------------------------------------------------------

def summary(batches):
    """Per batch of split_pool: (labels, lengths)."""
    return [(labels, [len(ids) for ids in batch])
            for labels, batch in zip(to_python(batches["label"]), to_python(batches["ids"]))]


def test_split_pool_carries_the_under_filled_batches():
    counter = tfseq.DropCounter()
    pool = pool_of(range(1, 11))
    batches, tail = Bucketer(counter=counter, **WORKED).split_pool(pool, SEED, False)
    assert summary(batches) == [([7, 8], [8, 9]), ([4, 5], [5, 6])]
    assert to_python(tail["label"]) == [9, 3, 6, 0, 1, 2]        # lengths 10 4 7 1 2 3
    assert counter.drops() == {"too_long": 0}


def test_split_pool_at_the_end_emits_everything_and_counts_drops():
    counter = tfseq.DropCounter()
    pool = pool_of([3, 9, 1, 5])
    b = Bucketer(max_tokens=8, max_length=6, shuffle=False, counter=counter)
    batches, tail = b.split_pool(pool, SEED, True)
    assert summary(batches) == [([3], [5]), ([0, 2], [3, 1])]
    assert to_python(tail["label"]) == []
    assert counter.drops() == {"too_long": 1}


# --- pool-level entry points -----------------------------------------------------------------

def streamed(pool, **kwargs):
    """bucket_by_length over a dataset holding ``pool`` as one ragged batch."""
    ds = tf.data.Dataset.from_tensors(pool)
    return to_list(ds.apply(bucket_by_length(**kwargs)))


def stream_seed(bucketer):
    """The seed the streaming transformation orders a one-batch stream's pool with."""
    if not (bucketer.shuffle or bucketer.length_noise > 0):
        return tf.constant(0, tf.int64)
    return next(iter(_batch_seeds(bucketer.seed)))


POOL_SETTINGS = [
    dict(WORKED),
    dict(max_tokens=12, seed=3),
    dict(max_tokens=16, boundaries=[2, 5], pad_to_boundary=True, seed=1),
    dict(max_tokens=30, bucket_width=4, length_noise=0.3, batch_multiple=2, seed=2),
    dict(batch_size=3, max_length=7, seed=4),
]
POOL_LENGTHS = [[5, 1, 9, 3, 3, 2, 7, 8, 1, 4, 6, 2], [1], [4, 4, 4, 0, 2]]


@pytest.mark.parametrize("setting", POOL_SETTINGS)
def test_pool_batches_then_finish_equals_the_stream_of_that_pool(setting):
    # One bucketer per setting for every pool: its eager pool_batches graph is traced once.
    bucketer = Bucketer(counter=tfseq.DropCounter(), **setting)
    for k, lengths in enumerate(POOL_LENGTHS):
        pool = pool_of(lengths)
        out = bucketer.pool_batches(pool, stream_seed(bucketer))
        # Eagerly, batch by batch.
        num = int(out["ids"].nrows())
        eager = [to_python(bucketer.finish(tf.nest.map_structure(lambda x: x[i], out)))
                 for i in range(num)]
        assert eager == streamed(pool, counter=tfseq.DropCounter(), **setting), lengths
        if k == 0:  # and inside a Dataset.map, the same
            assert to_list(tf.data.Dataset.from_tensor_slices(out).map(bucketer.finish)) == eager


def test_pool_batches_written_out():
    bucketer = Bucketer(max_tokens=8, max_length=6, shuffle=False, counter=tfseq.DropCounter())
    out = bucketer.pool_batches(pool_of([3, 9, 1, 5]), 0)
    assert to_python(out) == {"ids": [[[1, 2, 3, 4, 5]], [[1, 2, 3], [1]]],
                              "label": [[3], [0, 2]]}
    assert to_list(tf.data.Dataset.from_tensor_slices(out).map(bucketer.finish)) == [
        {"ids": [[1, 2, 3, 4, 5]], "ids_length": [5], "label": [3]},
        {"ids": [[1, 2, 3], [1, 0, 0]], "ids_length": [3, 1], "label": [0, 2]}]
    assert bucketer.counter.drops() == {"too_long": 1}


def test_pool_batches_inside_map_and_scan():
    bucketer = Bucketer(max_tokens=12, seed=0, counter=tfseq.DropCounter())
    pools = tf.data.Dataset.from_tensors(pool_of([5, 1, 9, 3, 3, 2, 7])).repeat(2)
    mapped = pools.map(lambda pool: bucketer.pool_batches(pool, 5))
    scanned = pools.scan(tf.constant(5, tf.int64),
                         lambda seed, pool: (seed, bucketer.pool_batches(pool, seed)))
    eager = bucketer.pool_batches(pool_of([5, 1, 9, 3, 3, 2, 7]), 5)
    for ds in (mapped, scanned):
        out = to_list(ds.flat_map(tf.data.Dataset.from_tensor_slices).map(bucketer.finish))
        expected = to_list(tf.data.Dataset.from_tensor_slices(eager).map(bucketer.finish))
        assert out == expected * 2
    assert bucketer.counter.drops() == {"too_long": 0}


def test_pool_batches_takes_int64_row_splits_and_rejects_other_pools():
    bucketer = Bucketer(max_tokens=12, shuffle=False)
    pool = {"ids": tf.ragged.constant([[1, 2], [3]], row_splits_dtype=tf.int64)}
    assert to_python(bucketer.pool_batches(pool, 0)) == {"ids": [[[1, 2], [3]]]}
    with pytest.raises(TypeError, match="pool_batches"):
        bucketer.pool_batches([1, 2], 0)
    with pytest.raises(ValueError, match="RaggedTensor"):
        bucketer.pool_batches({"ids": tf.constant([[1, 2]])}, 0)


@st.composite
def _pool_settings(draw):
    multiple = draw(st.sampled_from([1, 2]))
    budget = draw(st.integers(8, 40)) // multiple * multiple
    setting = dict(max_tokens=budget, batch_multiple=multiple,
                   max_length=draw(st.one_of(st.none(), st.integers(1, budget // multiple))),
                   pad_to_boundary=draw(st.booleans()), shuffle=draw(st.booleans()),
                   seed=draw(st.integers(0, 100)))
    kind = draw(st.sampled_from(["none", "boundaries", "width"]))
    limit = setting["max_length"] or budget // multiple
    if kind == "boundaries":
        setting["boundaries"] = sorted(draw(st.sets(st.integers(1, limit), min_size=1,
                                                    max_size=3)))
    elif kind == "width":
        setting["bucket_width"] = draw(st.integers(1, 6))
    return setting, limit


@settings(max_examples=10, deadline=None)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=40), setup=_pool_settings(),
       pool_seed=st.integers(0, 2**40))
def test_pool_batches_emit_every_kept_example_once_within_the_budget(lengths, setup,
                                                                     pool_seed):
    setting, limit = setup
    bucketer = Bucketer(counter=tfseq.DropCounter(), **setting)
    out = bucketer.pool_batches(pool_of(lengths), pool_seed)
    batches = to_list(tf.data.Dataset.from_tensor_slices(out).map(bucketer.finish))
    kept = [i for i, n in enumerate(lengths) if n <= limit]
    assert sorted(label for b in batches for label in b["label"]) == kept
    assert bucketer.counter.drops().get("too_long", 0) == len(lengths) - len(kept)
    for b in batches:
        rows, width = np.shape(b["ids"])
        assert rows * width <= setting["max_tokens"]
        assert b["ids_length"] == [lengths[label] for label in b["label"]]
    # Every batch but the last has a multiple of batch_multiple rows.
    assert all(len(b["label"]) % setting["batch_multiple"] == 0 for b in batches[:-1])
