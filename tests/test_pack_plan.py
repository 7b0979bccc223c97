"""The whole-part packing plan (tfseq._pack_plan) and its dense layout (tfseq._pack_layout)."""

import numpy as np
import tensorflow as tf
from hypothesis import example, given, settings, strategies as st

import tfseq
from conftest import to_list
from tfseq import _pack_layout, _pack_plan

_plan = tf.function(_pack_plan.plan_part, reduce_retracing=True)


def check_plan(lengths, block, segments):
    """Runs the plan and checks every invariant; returns the number of rows."""
    # block and segments as tensors: one trace for every draw (as Python ints, one each)
    row_of, seg_of, rows, order = (x.numpy() for x in _plan(
        tf.constant(lengths, tf.int32), tf.constant(block), tf.constant(segments)))
    rows = int(rows)
    lengths = np.asarray(lengths, np.int64)
    assert row_of.shape == seg_of.shape == lengths.shape
    assert ((row_of >= 0) & (row_of < rows)).all()          # every example placed once
    assert (np.bincount(row_of, weights=lengths, minlength=rows) <= block).all()
    count = np.bincount(row_of, minlength=rows)
    assert (count >= 1).all() and (count <= segments).all()  # no empty row, segment cap
    for r in range(rows):                          # segments 1..n in arrival order
        assert seg_of[row_of == r].tolist() == list(range(1, count[r] + 1))
    assert order.tolist() == np.lexsort((seg_of, row_of)).tolist()
    oldest = [np.flatnonzero(row_of == r).min() for r in range(rows)]
    assert oldest == sorted(oldest)                          # rows by their oldest example
    return rows


def test_next_fit_runs_worked_example():
    starts, ends = _pack_plan.next_fit_runs(tf.constant([3, 4, 2, 5]), 6, 100)
    assert starts.numpy().tolist() == [0, 1, 3]
    assert ends.numpy().tolist() == [1, 3, 4]


def test_next_fit_runs_respects_the_segment_cap():
    starts, ends = _pack_plan.next_fit_runs(tf.constant([1] * 7), 100, 3)
    assert starts.numpy().tolist() == [0, 3, 6]
    assert ends.numpy().tolist() == [3, 6, 7]


def test_small_plans_written_out():
    # Big examples (> block / 2) get a row each, 7 and 6; their gaps take the largest others
    # that fit, larger gaps choosing first: 6's gap of 4 takes 3, 7's gap of 3 takes 2, then 1.
    row_of, seg_of, rows, order = _plan(tf.constant([7, 1, 6, 2, 3]), 10, 10)
    assert int(rows) == 2
    assert row_of.numpy().tolist() == [0, 0, 1, 0, 1]
    assert seg_of.numpy().tolist() == [1, 2, 1, 3, 2]
    assert order.numpy().tolist() == [0, 1, 3, 2, 4]
    # No big example: the three shortest (3, 2, 1) are held back as fillers, the others fill
    # rows next-fit in order (4 + 5 | 4); the gaps take 3 then 2 (second row) and 1 (first).
    row_of, seg_of, rows, _ = _plan(tf.constant([4, 5, 3, 2, 1, 4]), 10, 10)
    assert int(rows) == 2
    assert row_of.numpy().tolist() == [0, 0, 1, 1, 0, 1]
    assert seg_of.numpy().tolist() == [1, 2, 1, 2, 3, 3]
    row_of, seg_of, rows, _ = _plan(tf.zeros([0], tf.int32), 10, 10)
    assert int(rows) == 0 and row_of.numpy().tolist() == []


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 16), max_size=60), block=st.integers(16, 40),
       segments=st.integers(1, 8))
@example(lengths=[16] * 5 + [1] * 9, block=16, segments=2)
def test_every_example_once_within_block_and_segments(lengths, block, segments):
    check_plan(lengths, block, segments)


def test_near_the_fewest_rows_on_realistic_lengths():
    rng = np.random.default_rng(0)
    shapes = {  # name: (lengths, block, most rows allowed over ceil(tokens / block))
        "sentences": (np.clip(rng.lognormal(2.3, 0.6, 40000).astype(int), 1, 512), 512, 1.001),
        "phrases": (np.clip(rng.lognormal(1.0, 0.6, 100000).astype(int), 1, 100), 512, 1.001),
        "zipf": (np.clip(rng.zipf(1.3, 6000), 1, 512), 512, 1.015),
        "documents": (np.clip(rng.lognormal(4.8, 1.0, 4000).astype(int), 1, 512), 512, 1.01),
    }
    for name, (lengths, block, slack) in shapes.items():
        fewest = -(-int(lengths.sum()) // block)
        rows = check_plan(lengths, block, block)
        assert fewest <= rows <= slack * fewest, (name, rows, fewest)


def test_lay_out_rows_matches_the_general_layout():
    rng = np.random.default_rng(1)
    lengths = tf.constant(rng.integers(1, 30, 300), tf.int32)
    values = tf.range(1, tf.reduce_sum(lengths) + 1)
    row_of, seg_of, rows, order = _plan(lengths, 64, 64)
    src = tf.gather(tf.cumsum(lengths, exclusive=True), order)
    take, row, seg = (tf.gather(x, order) for x in (lengths, row_of, seg_of))
    fast = _pack_layout.lay_out_rows(values, src, take, row, rows, 64)
    general = _pack_layout.lay_out(values, src, take, row, seg, tf.zeros_like(row, tf.bool),
                                   rows, 64)
    for a, b in zip(fast, general):
        assert a.numpy().tolist() == b.numpy().tolist()


def test_split_without_long_examples_packs_like_drop():
    # With nothing to split, "split" plans each part whole, as "drop" does: same batches.
    rng = np.random.default_rng(2)
    rows = [list(range(1, n + 1)) for n in rng.integers(1, 9, 200)]
    ds = tf.data.Dataset.from_tensor_slices({"ids": tf.ragged.constant(rows)}).ragged_batch(50)
    split = to_list(ds.apply(tfseq.pack(8, batch_size=4, counter=tfseq.DropCounter())))
    drop = to_list(ds.apply(tfseq.pack(8, batch_size=4, long_examples="drop",
                                       counter=tfseq.DropCounter())))
    assert split == drop
    assert sum(int(np.count_nonzero(b["ids_resets"])) for b in split) == 200
