"""pack: worked examples, long-example policies, pairs, budgets, exactly once; packed targets."""

import collections

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

import tfseq
from conftest import to_list

T, F = True, False


def examples(*seqs, label=False, dtype=tf.int32):
    def gen():
        for i, s in enumerate(seqs):
            yield ({"ids": s, "label": 10 * (i + 1)} if label else {"ids": s})
    sig = {"ids": tf.TensorSpec([None], dtype)}
    if label:
        sig["label"] = tf.TensorSpec([], tf.int32)
    return tf.data.Dataset.from_generator(gen, output_signature=sig)


def pairs(*items):
    return tf.data.Dataset.from_generator(
        lambda: iter([{"source": s, "target": t} for s, t in items]),
        output_signature={"source": tf.TensorSpec([None], tf.int32),
                          "target": tf.TensorSpec([None], tf.int32)})


def test_worked_example():
    counter = tfseq.DropCounter()
    ds = examples([7, 8, 5, 1], [8, 4, 9, 3, 1]).apply(
        tfseq.pack(10, batch_size=1, counter=counter))
    assert to_list(ds) == [{
        "ids":             [[7, 8, 5, 1, 8, 4, 9, 3, 1, 0]],
        "ids_segment_ids": [[1, 1, 1, 1, 2, 2, 2, 2, 2, 0]],
        "ids_positions":   [[0, 1, 2, 3, 0, 1, 2, 3, 4, 0]],
        "ids_resets":      [[T, F, F, F, T, F, F, F, F, F]],
    }]
    assert counter.drops() == {"empty": 0}
    assert counter.seen() == {"split": 0}


def test_several_row_lengths_worked_example():
    # Rows of 8 for the examples longer than 4 (lengths 5 and 6), their gaps (3 and 2) taking
    # the largest shorter examples that fit; what is left goes into rows of 4. Batches come in
    # the order of their oldest example; within a row, segments in arrival order.
    counter = tfseq.DropCounter()
    ds = examples([1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13, 14, 15], [16, 17],
                  label=True).apply(tfseq.pack([4, 8], batch_size=2, long_examples="truncate",
                                               counter=counter))
    assert ds.element_spec["ids"].shape.as_list() == [None, None]
    assert to_list(ds) == [{
        "ids":             [[1, 2, 3, 4, 5, 6, 7, 8], [10, 11, 12, 13, 14, 15, 16, 17]],
        "ids_segment_ids": [[1, 1, 1, 2, 2, 2, 2, 2], [1, 1, 1, 1, 1, 1, 2, 2]],
        "ids_positions":   [[0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 0, 1]],
        "ids_resets":      [[T, F, F, T, F, F, F, F], [T, F, F, F, F, F, T, F]],
        "label":           [[10, 20, 0, 0, 0, 0, 0, 0], [40, 50, 0, 0, 0, 0, 0, 0]],
    }, {
        "ids":             [[9, 0, 0, 0]],
        "ids_segment_ids": [[1, 0, 0, 0]],
        "ids_positions":   [[0, 0, 0, 0]],
        "ids_resets":      [[T, F, F, F]],
        "label":           [[30, 0, 0, 0, 0, 0, 0, 0]],
    }]
    assert counter.seen() == {"truncated": 0}


def test_several_row_lengths_budget_and_fill():
    # Log-normal lengths (median ~12): rows of 32 hold most examples; every batch keeps to the
    # budget with rows of one length, and the gaps of the longer rows take shorter examples.
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(2.5, 0.8, size=1500).astype(int) + 1, 128)
    data = [[int(v) for v in rng.integers(1, 1000, n)] for n in lengths]
    ds = examples(*data).apply(tfseq.pack((128, 32, 64), max_tokens=1024, seed=0,
                                          long_examples="drop", counter=tfseq.DropCounter()))
    batches = [{k: v.numpy() for k, v in b.items()} for b in ds]
    widths = collections.Counter(b["ids"].shape[1] for b in batches)
    assert set(widths) == {32, 64, 128} and widths[32] > widths[64] > widths[128]
    shorter = {32: 0, 64: 32, 128: 64}
    for b in batches:
        rows, width = b["ids"].shape
        assert rows <= 1024 // width and rows * width <= 1024
        for seg in b["ids_segment_ids"]:
            # A row of 64 or 128 exists for an example longer than the next shorter row.
            assert np.bincount(seg)[1:].max() > shorter[width]
    cells = sum(b["ids"].size for b in batches)
    assert int(lengths.sum()) / cells >= 0.98
    assert collections.Counter(map(tuple, (e["ids"] for e in tfseq.unpack(batches)))) == \
        collections.Counter(map(tuple, data))


def test_rows_in_order_and_scalars_per_segment():
    # [6, 7, 8, 9] is longer than half a row: it gets a row, whose gap of 2 takes [4, 5]; the
    # shortest, [10], fills the gap after [1, 2, 3]. Rows come in the order of their oldest
    # example, segments in arrival order.
    ds = examples([1, 2, 3], [4, 5], [6, 7, 8, 9], [10], label=True).apply(
        tfseq.pack(6, batch_size=2, counter=tfseq.DropCounter()))
    assert to_list(ds) == [{
        "ids":             [[1, 2, 3, 10, 0, 0], [4, 5, 6, 7, 8, 9]],
        "ids_segment_ids": [[1, 1, 1, 2, 0, 0], [1, 1, 2, 2, 2, 2]],
        "ids_positions":   [[0, 1, 2, 0, 0, 0], [0, 1, 0, 1, 2, 3]],
        "ids_resets":      [[T, F, F, T, F, F], [T, F, T, F, F, F]],
        "label":           [[10, 40, 0, 0, 0, 0], [20, 30, 0, 0, 0, 0]],
    }]


def test_split_continues_in_the_same_row_of_the_next_batch_without_reset():
    counter = tfseq.DropCounter()
    ds = examples([1, 2], [3, 4, 5, 6, 7, 8, 9], [10], label=True).apply(
        tfseq.pack(4, batch_size=1, counter=counter))
    assert to_list(ds) == [
        {"ids": [[1, 2, 3, 4]], "ids_segment_ids": [[1, 1, 2, 2]],
         "ids_positions": [[0, 1, 0, 1]], "ids_resets": [[T, F, T, F]], "label": [[10, 20, 0, 0]]},
        {"ids": [[5, 6, 7, 8]], "ids_segment_ids": [[1, 1, 1, 1]],
         "ids_positions": [[0, 1, 2, 3]], "ids_resets": [[F, F, F, F]], "label": [[20, 0, 0, 0]]},
        {"ids": [[9, 10, 0, 0]], "ids_segment_ids": [[1, 2, 0, 0]],
         "ids_positions": [[0, 0, 0, 0]], "ids_resets": [[F, T, F, F]], "label": [[20, 30, 0, 0]]},
    ]
    assert counter.drops() == {"empty": 0}
    assert counter.seen() == {"split": 1}
    assert tfseq.unpack(ds) == [{"ids": [1, 2], "label": 10},
                                {"ids": [3, 4, 5, 6, 7, 8, 9], "label": 20},
                                {"ids": [10], "label": 30}]


def test_string_and_float_scalars_follow_their_pieces():
    ds = tf.data.Dataset.from_generator(
        lambda: iter([{"ids": [1, 2, 3], "book": "Gen", "w": 0.5},
                      {"ids": [4, 4, 4, 4, 4, 4], "book": "Exo", "w": 2.0}]),
        output_signature={"ids": tf.TensorSpec([None], tf.int32),
                          "book": tf.TensorSpec([], tf.string), "w": tf.TensorSpec([], tf.float32)})
    ds = ds.apply(tfseq.pack(4, batch_size=1, max_segments=2, counter=tfseq.DropCounter()))
    assert [(b["ids"], b["book"], b["w"]) for b in to_list(ds)] == [
        ([[1, 2, 3, 4]], [["Gen", "Exo"]], [[0.5, 2.0]]),
        ([[4, 4, 4, 4]], [["Exo", ""]], [[2.0, 0.0]]),
        ([[4, 0, 0, 0]], [["Exo", ""]], [[2.0, 0.0]]),
    ]
    assert tfseq.unpack(ds) == [{"ids": [1, 2, 3], "book": b"Gen", "w": 0.5},
                                {"ids": [4, 4, 4, 4, 4, 4], "book": b"Exo", "w": 2.0}]


def test_truncate_and_drop_are_counted():
    data = ([1, 2], [3, 4, 5, 6, 7, 8, 9], [10])
    counter = tfseq.DropCounter()
    ds = examples(*data).apply(tfseq.pack(4, batch_size=1, long_examples="truncate",
                                          counter=counter))
    assert [b["ids"] for b in to_list(ds)] == [[[1, 2, 10, 0]], [[3, 4, 5, 6]]]
    assert counter.drops() == {"empty": 0}
    assert counter.seen() == {"truncated": 1}
    counter = tfseq.DropCounter()
    ds = examples(*data).apply(tfseq.pack(4, batch_size=1, long_examples="drop",
                                          counter=counter))
    assert [b["ids"] for b in to_list(ds)] == [[[1, 2, 10, 0]]]
    assert counter.drops() == {"empty": 0, "too_long": 1}


def test_empty_examples_are_counted_not_packed():
    counter = tfseq.DropCounter()
    ds = examples([], [5], []).apply(tfseq.pack(3, batch_size=1, counter=counter))
    assert [b["ids"] for b in to_list(ds)] == [[[5, 0, 0]]]
    assert counter.drops() == {"empty": 2}


def test_pairs_segment_k_of_source_is_segment_k_of_target():
    ds = pairs(([1, 2, 3], [11]), ([4, 5], [12, 13, 14, 15, 16])).apply(
        tfseq.pack(6, batch_size=1, counter=tfseq.DropCounter()))
    assert to_list(ds) == [{
        "source":             [[1, 2, 3, 4, 5, 0]],
        "source_segment_ids": [[1, 1, 1, 2, 2, 0]],
        "source_positions":   [[0, 1, 2, 0, 1, 0]],
        "source_resets":      [[T, F, F, T, F, F]],
        "target":             [[11, 12, 13, 14, 15, 16]],
        "target_segment_ids": [[1, 2, 2, 2, 2, 2]],
        "target_positions":   [[0, 0, 1, 2, 3, 4]],
        "target_resets":      [[T, T, F, F, F, F]],
    }]


def test_per_feature_block_lengths():
    ds = pairs(([1, 2, 3], [11]), ([4], [12, 13])).apply(
        tfseq.pack({"source": 4, "target": 3}, batch_size=1, counter=tfseq.DropCounter()))
    assert to_list(ds) == [{
        "source": [[1, 2, 3, 4]], "source_segment_ids": [[1, 1, 1, 2]],
        "source_positions": [[0, 1, 2, 0]], "source_resets": [[T, F, F, T]],
        "target": [[11, 12, 13]], "target_segment_ids": [[1, 2, 2]],
        "target_positions": [[0, 0, 1]], "target_resets": [[T, T, F]],
    }]


def test_max_tokens_gives_rows_and_int64_is_kept():
    ds = examples([1, 2, 3], [4, 5, 6], [7], dtype=tf.int64).apply(
        tfseq.pack(4, max_tokens=9, counter=tfseq.DropCounter()))
    batch = next(iter(ds))
    assert batch["ids"].dtype == tf.int64
    assert batch["ids_segment_ids"].dtype == tf.int32
    assert to_list(ds)[0]["ids"] == [[1, 2, 3, 7], [4, 5, 6, 0]]


def test_max_segments_limits_segments_per_row():
    ds = examples([1], [2], [3], [4], label=True).apply(
        tfseq.pack(4, batch_size=1, max_segments=2, counter=tfseq.DropCounter()))
    assert to_list(ds) == [
        {"ids": [[1, 2, 0, 0]], "ids_segment_ids": [[1, 2, 0, 0]],
         "ids_positions": [[0, 0, 0, 0]], "ids_resets": [[T, T, F, F]], "label": [[10, 20]]},
        {"ids": [[3, 4, 0, 0]], "ids_segment_ids": [[1, 2, 0, 0]],
         "ids_positions": [[0, 0, 0, 0]], "ids_resets": [[T, T, F, F]], "label": [[30, 40]]},
    ]


def test_equal_lengths_keep_their_order():
    ds = examples(*[[i, i] for i in range(1, 9)]).apply(
        tfseq.pack(4, batch_size=2, window=1, counter=tfseq.DropCounter()))
    assert [b["ids"] for b in to_list(ds)] == [[[1, 1, 2, 2], [3, 3, 4, 4]],
                                               [[5, 5, 6, 6], [7, 7, 8, 8]]]


def test_seed_shuffles_each_group_deterministically():
    data = [[i, i] for i in range(1, 41)]

    def packed(seed):
        return [b["ids"] for b in to_list(examples(*data).apply(
            tfseq.pack(4, batch_size=20, seed=seed, counter=tfseq.DropCounter())))]

    in_order = packed(None)
    assert in_order == [[[2 * r + 1] * 2 + [2 * r + 2] * 2 for r in range(20)]]
    shuffled = packed(3)
    assert shuffled == packed(3) and shuffled != in_order
    assert sorted(sum(shuffled[0], [])) == sorted(sum(in_order[0], []))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"block_length": 0, "batch_size": 2}, ValueError, "block_length"),
    ({"block_length": 4.0, "batch_size": 2}, TypeError, "block_length"),
    ({"block_length": 4}, ValueError, "give exactly one of batch_size=ROWS or max_tokens=CELLS"),
    ({"block_length": 4, "batch_size": 2, "max_tokens": 8}, ValueError, "exactly one"),
    ({"block_length": 4, "max_tokens": 3}, ValueError, "max_tokens=3"),
    ({"block_length": 4, "batch_size": 2, "long_examples": "cut"}, ValueError, "'cut'"),
    ({"block_length": 4, "batch_size": 2, "window": 0}, ValueError, "window"),
    ({"block_length": {}, "batch_size": 2}, ValueError, "empty dict"),
    ({"block_length": [], "batch_size": 2}, ValueError, "empty list"),
    ({"block_length": [4, 0], "batch_size": 2}, ValueError, r"block_length\[1\]"),
    ({"block_length": [4, 8], "batch_size": 2}, ValueError, "long_examples='drop' or 'truncate'"),
    ({"block_length": 4, "batch_size": 2, "seed": "1"}, TypeError, "seed"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        tfseq.pack(**kwargs)


def test_bad_datasets():
    with pytest.raises(ValueError, match="block_length keys"):
        pairs(([1], [2])).apply(tfseq.pack({"source": 4}, batch_size=1))
    with pytest.raises(ValueError, match="take one sequence feature"):
        pairs(([1], [2])).apply(tfseq.pack([4, 8], batch_size=1, long_examples="drop"))
    packed = examples([1]).apply(tfseq.pack(4, batch_size=1)).unbatch()
    with pytest.raises(ValueError, match="packed already"):
        packed.apply(tfseq.pack(4, batch_size=1))
    matrix = tf.data.Dataset.from_tensors({"ids": [1, 2], "image": [[1.0]]})
    with pytest.raises(ValueError, match="'image'"):
        matrix.apply(tfseq.pack(4, batch_size=1))
    with pytest.raises(TypeError, match="dict"):
        tf.data.Dataset.range(3).apply(tfseq.pack(4, batch_size=1))


# ----- properties: exactly once, budgets, shapes, determinism

_DATA: list = []
_PIPELINES: dict = {}


def _pipeline(mode, block, rows, window):
    """One traced pipeline per setting; hypothesis swaps the data under it."""
    key = (mode, block, rows, window)
    if key not in _PIPELINES:
        def gen():
            for i, ids in enumerate(_DATA):
                yield {"ids": ids, "label": i}
        ds = tf.data.Dataset.from_generator(gen, output_signature={
            "ids": tf.TensorSpec([None], tf.int32), "label": tf.TensorSpec([], tf.int32)})
        counter = tfseq.DropCounter()
        _PIPELINES[key] = (ds.apply(tfseq.pack(block, batch_size=rows, long_examples=mode,
                                               window=window, counter=counter)), counter)
    return _PIPELINES[key]


def _check_batch_layout(batches, block, rows):
    sizes = [b["ids"].shape[0] for b in batches]
    for before, after in zip(sizes, sizes[1:]):
        assert before == rows or after <= before, f"lanes keep their index: {sizes}"
    for b in batches:
        seg, pos, res, ids = (b["ids_segment_ids"], b["ids_positions"], b["ids_resets"], b["ids"])
        assert seg.shape[1] == block and 1 <= seg.shape[0] <= rows
        assert seg[-1].any(), "no trailing empty row"
        assert ((ids != 0) == (seg > 0)).all()
        for r in range(seg.shape[0]):
            real = seg[r][seg[r] > 0]
            if not real.size:
                continue  # an empty lane before a lane still carrying a split example
            assert (seg[r][: real.size] == real).all(), "padding only at the end of a row"
            assert (np.diff(real) >= 0).all() and (np.diff(real) <= 1).all()
            starts = np.concatenate([[True], np.diff(real) > 0])
            assert (res[r][: real.size] <= starts).all(), "a reset only where a segment starts"
            assert (res[r][: real.size][1:] == starts[1:]).all()
            expected_pos = np.concatenate([np.arange(c) for c in np.bincount(real)[1:]])
            assert (pos[r][: real.size] == expected_pos).all()


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(data=st.lists(st.integers(0, 13), max_size=25),
       setting=st.sampled_from([("split", 5, 3, 2), ("split", 6, 1, 1),
                                ("truncate", 5, 3, 2), ("drop", 6, 1, 1)]))
def test_exactly_once(data, setting):
    mode, block, rows, window = setting
    ds, counter = _pipeline(mode, block, rows, window)
    _DATA[:] = [[100 * (i + 1) + j for j in range(n)] for i, n in enumerate(data)]
    counter.reset()
    batches = [{k: v.numpy() for k, v in b.items()} for b in ds]
    _check_batch_layout(batches, block, rows)
    long_ids = [i for i, n in enumerate(data) if n > block]
    empty = sum(n == 0 for n in data)
    expected = []
    for i, ids in enumerate(_DATA):
        if not ids or (mode == "drop" and i in long_ids):
            continue
        expected.append({"ids": ids[:block] if mode == "truncate" else ids, "label": i})
    key = lambda e: e["label"]  # noqa: E731
    assert sorted(tfseq.unpack(batches), key=key) == expected
    # Emitted + dropped == input: dropped long examples are drops, split/truncated are noted.
    if mode == "drop":
        assert counter.drops() == {"empty": empty, "too_long": len(long_ids)}
    else:
        assert counter.drops() == {"empty": empty}
        reason = {"split": "split", "truncate": "truncated"}[mode]
        assert counter.seen() == {reason: len(long_ids)}


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(data=st.lists(st.integers(0, 13), max_size=40),
       mode=st.sampled_from(["truncate", "drop"]))
def test_several_row_lengths_exactly_once(data, mode):
    widths, rows = (3, 6, 12), 2
    ds, counter = _pipeline(mode, widths, rows, 4)
    _DATA[:] = [[100 * (i + 1) + j for j in range(n)] for i, n in enumerate(data)]
    counter.reset()
    batches = [{k: v.numpy() for k, v in b.items()} for b in ds]
    for b in batches:
        assert b["ids"].shape[1] in widths and 1 <= b["ids"].shape[0] <= rows
        _check_batch_layout([b], b["ids"].shape[1], rows)
    expected = [{"ids": ids[:12], "label": i} for i, ids in enumerate(_DATA)
                if ids and (mode == "truncate" or len(ids) <= 12)]
    assert sorted(tfseq.unpack(batches), key=lambda e: e["label"]) == expected
    long = sum(n > 12 for n in data)
    if mode == "drop":
        assert counter.drops() == {"empty": data.count(0), "too_long": long}
    else:
        assert counter.drops() == {"empty": data.count(0)}
        assert counter.seen() == {"truncated": long}


@pytest.mark.slow
@settings(max_examples=6, deadline=None)
@given(data=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=15))
def test_pairs_exactly_once_and_aligned(data):
    key = "pairs"
    if key not in _PIPELINES:
        def gen():
            for source, target in _DATA:
                yield {"source": source, "target": target}
        ds = tf.data.Dataset.from_generator(gen, output_signature={
            "source": tf.TensorSpec([None], tf.int32), "target": tf.TensorSpec([None], tf.int32)})
        _PIPELINES[key] = ds.apply(tfseq.pack(6, batch_size=2, long_examples="drop",
                                              counter=tfseq.DropCounter()))
    _DATA[:] = [([100 * (i + 1) + j for j in range(s)], [100 * (i + 1) + 50 + j for j in range(t)])
                for i, (s, t) in enumerate(data)]
    got = tfseq.unpack(_PIPELINES[key])
    expected = [{"source": s, "target": t} for s, t in _DATA if s or t]
    # Each unpacked example is one segment id across both rows, so pairs stay together.
    assert sorted(got, key=str) == sorted(expected, key=str)


@pytest.mark.slow
def test_budget_determinism_and_efficiency():
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(2.5, 0.8, size=1500).astype(int) + 1, 128)
    data = [[int(v) for v in rng.integers(1, 1000, n)] for n in lengths]
    ds = examples(*data).apply(tfseq.pack(128, max_tokens=1024, counter=tfseq.DropCounter()))
    first = to_list(ds)
    assert to_list(ds) == first
    for batch in first:
        assert np.array(batch["ids"]).size <= 1024
    real = int(lengths.sum())
    assert tfseq.step_efficiency(real, len(first), 1024) >= 0.99
    assert collections.Counter(map(tuple, (e["ids"] for e in tfseq.unpack(first)))) == \
        collections.Counter(map(tuple, data))


# ----- packed targets and weights

def test_lm_targets_never_cross_a_segment():
    batch = {"ids": tf.constant([[7, 8, 5, 1, 8, 4, 9, 3, 1, 0]]),
             "ids_segment_ids": tf.constant([[1, 1, 1, 1, 2, 2, 2, 2, 2, 0]])}
    features, targets, weights = tfseq.lm_targets(batch)
    assert sorted(features) == ["ids", "ids_segment_ids"]
    assert targets.numpy().tolist() == [[8, 5, 1, 0, 4, 9, 3, 1, 0, 0]]
    assert weights.numpy().tolist() == [[1, 1, 1, 0, 1, 1, 1, 1, 0, 0]]


def test_lm_targets_in_a_pipeline():
    ds = examples([7, 8, 5], [4, 9]).apply(
        tfseq.pack(6, batch_size=1, counter=tfseq.DropCounter())).map(tfseq.lm_targets)
    (_, targets, weights), = to_list(ds)
    assert targets == [[8, 5, 0, 9, 0, 0]]
    assert weights == [[1.0, 1.0, 0.0, 1.0, 0.0, 0.0]]


def test_packed_weights():
    batch = {"ids": tf.constant([[7, 8, 5, 1, 3, 0], [2, 0, 0, 0, 0, 0]]),
             "ids_segment_ids": tf.constant([[1, 1, 1, 1, 2, 0], [1, 0, 0, 0, 0, 0]])}
    assert tfseq.packed_weights(batch).numpy().tolist() == [[1, 1, 1, 1, 1, 0],
                                                            [1, 0, 0, 0, 0, 0]]
    assert tfseq.packed_weights(batch, per_segment=True).numpy().tolist() == [
        [0.25, 0.25, 0.25, 0.25, 1.0, 0.0], [1.0, 0, 0, 0, 0, 0]]
    with pytest.raises(ValueError, match="'target'"):
        tfseq.packed_weights(batch, "target")


def test_more_rows_than_unrolled_keep_order_and_lanes():
    # 70 rows (above the 64 rows whose chain is unrolled): rows take consecutive examples, and
    # the split example's rest starts the same row (lane 0) of the next batch, without reset.
    # Built after the input ends, the first batch drops its 34 trailing empty rows.
    data = [[1, 2, 3, 4, 5, 6]] + [[i, i] for i in range(7, 7 + 69)]
    batches = to_list(examples(*data).apply(
        tfseq.pack(4, batch_size=70, counter=tfseq.DropCounter())))
    assert [len(b["ids"]) for b in batches] == [36, 1]
    assert batches[0]["ids"][0] == [1, 2, 3, 4]
    assert batches[0]["ids"][1] == [7, 7, 8, 8]
    assert batches[0]["ids"][35] == [75, 75, 0, 0]
    assert batches[1] == {"ids": [[5, 6, 0, 0]], "ids_segment_ids": [[1, 1, 0, 0]],
                          "ids_positions": [[0, 1, 0, 0]], "ids_resets": [[F, F, F, F]]}


def test_gaps_take_the_longest_example_that_leaves_a_usable_gap():
    # Row 1 takes [1 x3] (then [2 x4] does not fit), row 2 the next run [2 x4] [3 x2]. Row 1's
    # gap of 3 then takes the longest example that fits: [5 x3], an exact fit, before [4 x1],
    # which waits for the next batch.
    ds = examples([1] * 3, [2] * 4, [3] * 2, [4], [5] * 3).apply(
        tfseq.pack(6, batch_size=2, counter=tfseq.DropCounter()))
    assert to_list(ds)[0]["ids"] == [[1, 1, 1, 5, 5, 5], [2, 2, 2, 2, 3, 3]]


@pytest.mark.parametrize("rows", [16, 64])
def test_a_lone_example_that_leaves_an_unusable_gap_keeps_its_row(rows):
    # 64 examples of 47 tokens in rows of 48 leave a gap of 1, shorter than the shortest
    # example (2 tokens): each still takes a row of its own (64 rows) and the ten short ones
    # share one more row, 65 rows in all. A row once gave its only example back, which left
    # that row and every row after it in the build empty: many empty batches, or rows filled
    # one example per round.
    data = [[i] * 47 for i in range(1, 65)] + [[100 + i] * 2 for i in range(10)]
    batches = to_list(examples(*data).apply(
        tfseq.pack(48, batch_size=rows, long_examples="drop", counter=tfseq.DropCounter())))
    used_rows = [row for b in batches for row in b["ids_segment_ids"] if any(row)]
    assert len(used_rows) == 65
    assert len(batches) == -(-65 // rows)
    assert sorted(tok for b in batches for row in b["ids"] for tok in set(row) - {0}) == (
        list(range(1, 65)) + list(range(100, 110)))
