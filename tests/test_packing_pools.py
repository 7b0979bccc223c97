"""The pool-level entry points of pack (Packer.pool_batches / finish): written-out batches,
the same batches as the streaming transformation on a one-pool stream, graph and eager use,
and exactly-once as a property."""

import collections

import numpy as np
import pytest
import tensorflow as tf
from conftest import to_list, to_python
from hypothesis import given, settings
from hypothesis import strategies as st

import tfseq
from tfseq.packing import Packer

T, F = True, False


def pool_of(*seqs, labels=True):
    """A pool of the ``ids`` sequences, example i labelled i + 1."""
    pool = {"ids": tf.ragged.constant(list(seqs), dtype=tf.int32, ragged_rank=1)}
    if labels:
        pool["label"] = tf.range(1, len(seqs) + 1)
    return pool


def finished(packer, out):
    return to_list(tf.data.Dataset.from_tensor_slices(out).map(packer.finish))


def streamed(pool, *args, **kwargs):
    """pack over a dataset holding ``pool`` as one ragged batch."""
    return to_list(tf.data.Dataset.from_tensors(pool).apply(tfseq.pack(*args, **kwargs)))


# --- written out -----------------------------------------------------------------------------

def test_worked_example():
    packer = Packer(10, batch_size=1, counter=tfseq.DropCounter())
    out = packer.pool_batches(pool_of([7, 8, 5, 1], [8, 4, 9, 3, 1], labels=False), 0)
    assert to_python(out) == {
        "ids":             [[[7, 8, 5, 1, 8, 4, 9, 3, 1, 0]]],
        "ids_segment_ids": [[[1, 1, 1, 1, 2, 2, 2, 2, 2, 0]]],
        "ids_positions":   [[[0, 1, 2, 3, 0, 1, 2, 3, 4, 0]]],
        "ids_resets":      [[[T, F, F, F, T, F, F, F, F, F]]],
    }
    assert finished(packer, out) == [{
        "ids":             [[7, 8, 5, 1, 8, 4, 9, 3, 1, 0]],
        "ids_segment_ids": [[1, 1, 1, 1, 2, 2, 2, 2, 2, 0]],
        "ids_positions":   [[0, 1, 2, 3, 0, 1, 2, 3, 4, 0]],
        "ids_resets":      [[T, F, F, F, T, F, F, F, F, F]],
    }]


def test_a_split_example_ends_within_its_pool_and_drops_are_counted():
    # Block 4, 2 rows: the 10-token example takes row 0 of three batches (continuations have
    # no reset); the empty one is dropped; the last batch loses its trailing empty row.
    counter = tfseq.DropCounter()
    packer = Packer(4, batch_size=2, counter=counter)
    out = packer.pool_batches(pool_of([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [11, 12], [],
                                      [13, 14, 15]), 0)
    assert finished(packer, out) == [{
        "ids":             [[1, 2, 3, 4], [11, 12, 0, 0]],
        "ids_segment_ids": [[1, 1, 1, 1], [1, 1, 0, 0]],
        "ids_positions":   [[0, 1, 2, 3], [0, 1, 0, 0]],
        "ids_resets":      [[T, F, F, F], [T, F, F, F]],
        "label":           [[1, 0, 0, 0], [2, 0, 0, 0]],
    }, {
        "ids":             [[5, 6, 7, 8], [13, 14, 15, 0]],
        "ids_segment_ids": [[1, 1, 1, 1], [1, 1, 1, 0]],
        "ids_positions":   [[0, 1, 2, 3], [0, 1, 2, 0]],
        "ids_resets":      [[F, F, F, F], [T, F, F, F]],
        "label":           [[1, 0, 0, 0], [4, 0, 0, 0]],
    }, {
        "ids":             [[9, 10, 0, 0]],
        "ids_segment_ids": [[1, 1, 0, 0]],
        "ids_positions":   [[0, 1, 0, 0]],
        "ids_resets":      [[F, F, F, F]],
        "label":           [[1, 0, 0, 0]],
    }]
    assert counter.drops() == {"empty": 1}
    assert counter.seen() == {"split": 1}


def test_greedy_docstring_example():
    # tfseq._pack_greedy's example: tokens are their example's length.
    packer = Packer(6, batch_size=2, counter=tfseq.DropCounter())
    out = packer.pool_batches(pool_of([5] * 5, [3] * 3, [9] * 9, [1], [2] * 2, labels=False), 0)
    assert [(b["ids"], b["ids_resets"]) for b in finished(packer, out)] == [
        ([[5, 5, 5, 5, 5, 1], [3, 3, 3, 9, 9, 9]], [[T, F, F, F, F, T], [T, F, F, T, F, F]]),
        ([[2, 2, 0, 0, 0, 0], [9, 9, 9, 9, 9, 9]], [[T, F, F, F, F, F], [F, F, F, F, F, F]]),
    ]


# --- the same batches as the stream of one pool ----------------------------------------------

LENGTHS = [5, 1, 9, 0, 3, 3, 2, 7, 8, 1, 4, 6, 2, 12, 3]
SINGLE = [
    ((10,), dict(batch_size=2)),                                   # planned
    ((8,), dict(batch_size=3)),                                    # split: greedy builds
    ((8,), dict(batch_size=2, long_examples="drop", seed=1)),      # planned, shuffled
    ((6,), dict(max_tokens=12, long_examples="truncate", max_segments=2)),
    (([4, 8, 12],), dict(batch_size=2, long_examples="truncate", seed=3)),   # row lengths
]


def _ids(lengths, offset=0):
    return [[offset + 10 * i + j + 1 for j in range(n)] for i, n in enumerate(lengths)]


# Each case traces a pool and a stream (~5 s). LENGTHS has empty and over-long examples for
# every setting; the pool of one empty and one very long example adds what a policy does with
# nothing else in the pool: nothing left (drop) or one cut example (truncate, row lengths).
# The split of a long example over rows is already in LENGTHS' cases of the first two.
CASES = [(LENGTHS, args, kwargs) for args, kwargs in SINGLE] + [
    ([0, 20], args, kwargs) for args, kwargs in SINGLE[2:]]


@pytest.mark.parametrize("lengths, args, kwargs", CASES)
def test_pool_batches_then_finish_equals_the_stream_of_that_pool(lengths, args, kwargs):
    pool = pool_of(*_ids(lengths))
    counter, stream_counter = tfseq.DropCounter(), tfseq.DropCounter()
    packer = Packer(*args, counter=counter, **kwargs)
    out = packer.pool_batches(pool, 0)
    expected = streamed(pool, *args, counter=stream_counter, **kwargs)
    assert finished(packer, out) == expected
    assert (counter.drops(), counter.seen()) == (stream_counter.drops(), stream_counter.seen())
    # Eagerly, batch by batch, the same.
    num = int(out["ids"].nrows())
    assert [to_python(packer.finish(tf.nest.map_structure(lambda x: x[i], out)))
            for i in range(num)] == expected


@pytest.mark.parametrize("kwargs", [dict(batch_size=2), dict(batch_size=2, seed=4,
                                                             long_examples="drop")])
def test_pairs_equal_the_stream(kwargs):
    pool = {"source": tf.ragged.constant(_ids([3, 5, 1, 8, 2, 0])),
            "target": tf.ragged.constant(_ids([4, 1, 6, 2, 9, 0], offset=500)),
            "weight": tf.constant([0.5, 1.0, 1.5, 2.0, 2.5, 3.0])}
    blocks = {"source": 6, "target": 7}
    packer = Packer(blocks, counter=tfseq.DropCounter(), **kwargs)
    assert finished(packer, packer.pool_batches(pool, 0)) == streamed(
        pool, blocks, counter=tfseq.DropCounter(), **kwargs)


def test_pool_seed_reshuffles_the_pool():
    # With a seed, pool_seed takes the part of a stream group's index (0 above).
    pool = pool_of(*_ids([4, 3, 2, 1, 5, 6, 2, 3]))
    packer = Packer(8, batch_size=2, seed=9, counter=tfseq.DropCounter())
    first, again, other = (finished(packer, packer.pool_batches(pool, s)) for s in (0, 0, 1))
    assert first == again and first != other

    def labels(batches):
        return sorted(label for b in batches for row in b["label"] for label in row if label)

    assert labels(first) == labels(other) == list(range(1, 9))


# --- graph and eager ------------------------------------------------------------------------

def test_pool_batches_inside_map_and_scan():
    packer = Packer(8, batch_size=2, counter=tfseq.DropCounter())
    pool = pool_of(*_ids([5, 1, 9, 3, 3, 2, 7]))
    expected = finished(packer, packer.pool_batches(pool, 0))
    pools = tf.data.Dataset.from_tensors(pool).repeat(2)
    mapped = pools.map(lambda p: packer.pool_batches(p, 0))
    scanned = pools.scan(tf.constant(0, tf.int64),
                         lambda seed, p: (seed, packer.pool_batches(p, seed)))
    for ds in (mapped, scanned):
        assert to_list(ds.flat_map(tf.data.Dataset.from_tensor_slices)
                       .map(packer.finish)) == expected * 2
    assert packer.counter.seen() == {"split": 5}


def test_pool_batches_rejects_what_pack_rejects():
    with pytest.raises(ValueError, match="batch_size"):
        Packer(8)
    packer = Packer(8, batch_size=2)
    with pytest.raises(TypeError, match="pool_batches"):
        packer.pool_batches([1, 2], 0)
    with pytest.raises(ValueError, match="RaggedTensor"):
        packer.pool_batches({"ids": tf.constant([[1, 2]])}, 0)
    with pytest.raises(ValueError, match="block_length keys"):
        Packer({"src": 4}, batch_size=2).pool_batches(pool_of([1]), 0)


# --- properties -----------------------------------------------------------------------------

# A few packers reused across draws, so each layout is traced once.
_PACKERS = {}
_SETTINGS = {
    "planned": ((6,), dict(batch_size=2, long_examples="drop")),
    "split": ((6,), dict(batch_size=3)),
    "truncate": ((6,), dict(batch_size=2, long_examples="truncate", max_segments=2)),
    "widths": (([3, 6],), dict(batch_size=2, long_examples="truncate")),
}


def _packer(name):
    if name not in _PACKERS:
        args, kwargs = _SETTINGS[name]
        _PACKERS[name] = Packer(*args, counter=tfseq.DropCounter(), seed=0, **kwargs)
    return _PACKERS[name]


@settings(max_examples=5, deadline=None)
@given(name=st.sampled_from(sorted(_SETTINGS)),
       lengths=st.lists(st.integers(0, 14), min_size=1, max_size=30),
       pool_seed=st.integers(0, 1000))
def test_every_example_comes_out_once_within_the_budgets(name, lengths, pool_seed):
    packer = _packer(name)
    args, kwargs = _SETTINGS[name]
    block = max(np.ravel(args[0]))
    rows = kwargs["batch_size"]
    drops, seen = packer.counter.drops(), packer.counter.seen()
    examples = _ids(lengths)
    batches = finished(packer, packer.pool_batches(pool_of(*examples), pool_seed))
    for b in batches:
        ids = np.array(b["ids"])
        assert 1 <= ids.shape[0] <= rows and ids.shape[1] <= block
        assert np.max(b["ids_segment_ids"]) <= kwargs.get("max_segments", block)
    policy = kwargs.get("long_examples", "split")
    expected = [(e[:block] if policy == "truncate" else e, i + 1) for i, e in enumerate(examples)
                if e and (policy != "drop" or len(e) <= block)]
    got = [(e["ids"], e["label"]) for e in tfseq.unpack(batches)]
    assert collections.Counter(map(repr, got)) == collections.Counter(map(repr, expected))
    num_long = sum(len(e) > block for e in examples)
    delta = {k: v - drops.get(k, 0) for k, v in packer.counter.drops().items()}
    assert delta.get("empty") == lengths.count(0)
    if policy == "drop":
        assert delta["too_long"] == num_long
    else:
        reason = "split" if policy == "split" else "truncated"
        assert packer.counter.seen()[reason] - seen.get(reason, 0) == num_long
