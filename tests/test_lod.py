"""tfseq.lod: Paddle's LoD document examples, branch slices, validation, round trips."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import to_python
from tfseq import lod

# The 2-level tree of the LoD document: 3 articles of 3, 1, 2 sentences of 3, 2, 4, 1, 2, 3 words.
TREE_LENGTHS = [[3, 1, 2], [3, 2, 4, 1, 2, 3]]
TREE_OFFSETS = [[0, 3, 4, 6], [0, 3, 5, 9, 10, 12, 15]]
TREE = [[[0, 1, 2], [3, 4], [5, 6, 7, 8]], [[9]], [[10, 11], [12, 13, 14]]]


def _lists(levels):
    return [to_python(level) for level in levels]


def test_tree_from_lengths():
    rt = lod.from_lengths(np.arange(15), TREE_LENGTHS)
    assert rt.ragged_rank == 2
    assert to_python(rt) == TREE
    assert _lists(lod.to_lengths(rt)) == TREE_LENGTHS
    assert _lists(lod.to_offsets(rt)) == TREE_OFFSETS


def test_tree_from_offsets():
    rt = lod.from_offsets(tf.range(15), TREE_OFFSETS)
    assert to_python(rt) == TREE
    assert _lists(lod.to_lengths(rt)) == TREE_LENGTHS
    assert _lists(lod.to_offsets(rt)) == TREE_OFFSETS


def test_videos_one_level():
    # 3 videos of 3, 1 and 2 frames; each frame a 2-feature vector.
    frames = [[0, 0], [0, 1], [0, 2], [1, 0], [2, 0], [2, 1]]
    rt = lod.from_lengths(np.array(frames, np.float32), [[3, 1, 2]])
    assert rt.ragged_rank == 1
    assert rt.shape.as_list() == [3, None, 2]
    assert to_python(rt) == [[[0.0, 0.0], [0.0, 1.0], [0.0, 2.0]],
                             [[1.0, 0.0]],
                             [[2.0, 0.0], [2.0, 1.0]]]
    assert _lists(lod.to_lengths(rt)) == [[3, 1, 2]]
    assert _lists(lod.to_offsets(rt)) == [[0, 3, 4, 6]]
    assert to_python(lod.slice_branch(rt, (2,))) == [[2.0, 0.0], [2.0, 1.0]]


def test_image_batch_all_ones():
    # A batch of 3 images of 2x2 pixels: every "sequence" has length 1.
    images = np.arange(12, dtype=np.int32).reshape(3, 2, 2)
    rt = lod.from_lengths(images, [[1, 1, 1]])
    assert rt.shape.as_list() == [3, None, 2, 2]
    assert to_python(rt) == [[[[0, 1], [2, 3]]], [[[4, 5], [6, 7]]], [[[8, 9], [10, 11]]]]
    assert _lists(lod.to_lengths(rt)) == [[1, 1, 1]]
    assert _lists(lod.to_offsets(rt)) == [[0, 1, 2, 3]]


def test_slice_branch_from_lod_document():
    rt = lod.from_lengths(np.arange(15), TREE_LENGTHS)
    two = lod.slice_branch(rt, (2,))
    assert to_python(two) == [[10, 11], [12, 13, 14]]  # words 10..15
    assert _lists(lod.to_lengths(two)) == [[2, 3]]
    assert to_python(lod.slice_branch(rt, (2, 0))) == [10, 11]  # words 10..12
    assert to_python(lod.slice_branch(rt, (0, 2))) == [5, 6, 7, 8]
    assert to_python(lod.slice_branch(rt, (1,))) == [[9]]
    assert lod.slice_branch(rt, ()) is rt


def test_slice_branch_in_graph():
    spec = tf.RaggedTensorSpec([None, None, None], tf.int64, ragged_rank=2)
    rt = lod.from_lengths(np.arange(15), TREE_LENGTHS)
    sliced = tf.function(lambda x: lod.slice_branch(x, (2, 0)), input_signature=[spec])
    assert to_python(sliced(rt)) == [10, 11]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"index 2 at level 0 is out of range"):
        sliced(rt[:2])


@pytest.mark.parametrize("branch, error, match", [
    ((3,), ValueError, r"index 3 at level 0 is out of range; the sequence \(\) has 3"),
    ((2, 2), ValueError, r"index 2 at level 1 is out of range; the sequence \(2,\) has 2"),
    ((0, 0, 0), ValueError, r"has 3 indices but the tensor has only 2 LoD level"),
    ((-1,), ValueError, r"non-negative"),
    (2, TypeError, r"tuple of ints"),
])
def test_slice_branch_errors(branch, error, match):
    rt = lod.from_lengths(np.arange(15), TREE_LENGTHS)
    with pytest.raises(error, match=match):
        lod.slice_branch(rt, branch)


def test_empty_levels_and_dense_input():
    values = tf.constant([1, 2])
    assert lod.from_lengths(values, []) is values
    assert lod.to_lengths(values) == []
    assert lod.to_offsets(values) == []
    rt = lod.from_lengths(np.zeros([0], np.int32), [[0, 0], []])
    assert to_python(rt) == [[], []]


def test_int32_row_splits():
    rt = lod.from_lengths(np.arange(15), TREE_LENGTHS, row_splits_dtype=tf.int32)
    assert rt.row_splits.dtype == tf.int32
    assert _lists(lod.to_offsets(rt)) == TREE_OFFSETS


@pytest.mark.parametrize("lengths, match", [
    ([[3, 1, 2], [3, 2, 4, 1, 2]],
     r"LoD lengths level 0 sums to 6 but level 1 has 5 entries: level 0 = \[3, 1, 2\]"),
    ([[3, 1, 2], [3, 2, 4, 1, 2, 4]],
     r"LoD lengths level 1 sums to 16 but there are 15 values: level 1 = \[3, 2, 4, 1, 2, 4\]"),
    ([[3, -1, 4], [3, 2, 4, 1, 2, 3]],
     r"LoD lengths level 0 has a negative length: level 0 = \[3, -1, 4\]"),
    ([[3, 1, 2], [[3, 2, 4, 1, 2, 3]]], r"level 1 must be 1-D"),
])
def test_lengths_errors_in_python(lengths, match):
    with pytest.raises(ValueError, match=match):
        lod.from_lengths(np.arange(15), lengths)


@pytest.mark.parametrize("offsets, match", [
    ([[0, 3, 4, 6], [0, 3, 5, 9, 10, 12, 14]],
     r"LoD offsets level 1 ends at 14 but there are 15 values: level 1 = \[0, 3, 5, 9, 10, 12, 14\]"),
    ([[0, 3, 4, 5], [0, 3, 5, 9, 10, 12, 15]],
     r"LoD offsets level 0 ends at 5 but level 1 has 6 sequences: level 0 = \[0, 3, 4, 5\]"),
    ([[1, 3, 4, 6], [0, 3, 5, 9, 10, 12, 15]],
     r"LoD offsets level 0 does not start at 0: level 0 = \[1, 3, 4, 6\]"),
    ([[0, 4, 3, 6], [0, 3, 5, 9, 10, 12, 15]],
     r"LoD offsets level 0 is not non-decreasing \(monotonic\): level 0 = \[0, 4, 3, 6\]"),
    ([[], [0]], r"LoD offsets level 0 is empty"),
])
def test_offsets_errors_in_python(offsets, match):
    with pytest.raises(ValueError, match=match):
        lod.from_offsets(np.arange(15), offsets)


def test_type_errors():
    with pytest.raises(TypeError, match=r"list of levels"):
        lod.from_lengths(np.arange(3), np.array([3]))
    with pytest.raises(TypeError, match=r"must hold integers"):
        lod.from_lengths(np.arange(3), [[1.5, 1.5]])
    with pytest.raises(TypeError, match=r"expects a tf.RaggedTensor"):
        lod.to_lengths([[1, 2], [3]])


_I64 = tf.TensorSpec([None], tf.int64)


@pytest.mark.parametrize("levels, match", [
    ([[3, 1, 2], [3, 2, 4, 1, 2]], r"LoD lengths level 0 sums to 6 but level 1 has 5 entries: "
                                   r"level 0 = \[3 1 2\]"),
    ([[3, 1, 2], [3, 2, 4, 1, 2, 4]], r"LoD lengths level 1 sums to 16 but there are 15 values"),
    ([[3, -1, 4], [3, 2, 4, 1, 2, 3]], r"LoD lengths level 0 has a negative length: "
                                       r"level 0 = \[3 -1 4\]"),
])
def test_lengths_errors_in_graph(levels, match):
    build = tf.function(lambda v, a, b: lod.from_lengths(v, [a, b]).flat_values,
                        input_signature=[tf.TensorSpec([None], tf.int32), _I64, _I64])
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        build(tf.range(15), tf.constant(levels[0], tf.int64), tf.constant(levels[1], tf.int64))


@pytest.mark.parametrize("levels, match", [
    ([[0, 3, 4, 6], [0, 3, 5, 9, 10, 12, 14]], r"LoD offsets level 1 ends at 14 but there are 15"),
    ([[1, 3, 4, 6], [0, 3, 5, 9, 10, 12, 15]], r"LoD offsets level 0 does not start at 0: "
                                               r"level 0 = \[1 3 4 6\]"),
    ([[0, 4, 3, 6], [0, 3, 5, 9, 10, 12, 15]], r"LoD offsets level 0 is not non-decreasing"),
])
def test_offsets_errors_in_dataset_map(levels, match):
    ds = tf.data.Dataset.from_tensors(
        (tf.range(15), tf.constant(levels[0], tf.int64), tf.constant(levels[1], tf.int64)))
    ds = ds.map(lambda v, a, b: lod.from_offsets(v, [a, b]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        list(ds)


def test_valid_tree_in_dataset_map_and_batch():
    ds = tf.data.Dataset.from_tensors(
        (tf.range(15), tf.constant(TREE_LENGTHS[0], tf.int64),
         tf.constant(TREE_LENGTHS[1], tf.int64)))
    ds = ds.map(lambda v, a, b: lod.from_lengths(v, [a, b])).repeat(2).ragged_batch(2)
    (batch,) = list(ds)
    assert to_python(batch) == [TREE, TREE]


@st.composite
def trees(draw):
    """Random LoD lengths (1-3 levels, zeros allowed), outermost first."""
    num_levels = draw(st.integers(1, 3))
    levels = [draw(st.lists(st.integers(0, 4), min_size=0, max_size=6))]
    for _ in range(num_levels - 1):
        levels.append(draw(st.lists(st.integers(0, 4), min_size=sum(levels[-1]),
                                    max_size=sum(levels[-1]))))
    return levels


def _nest(values, levels):
    """Reference nesting written independently of tfseq.lod: split innermost level first."""
    out = list(values)
    for level in reversed(levels):
        grouped, start = [], 0
        for n in level:
            grouped.append(out[start:start + n])
            start += n
        out = grouped
    return out


@settings(max_examples=30, deadline=None)
@given(trees())
def test_round_trip_lengths(levels):
    values = list(range(sum(levels[-1])))
    rt = lod.from_lengths(np.array(values, np.int64), levels)
    assert rt.ragged_rank == len(levels)
    assert to_python(rt) == _nest(values, levels)
    assert _lists(lod.to_lengths(rt)) == levels


@settings(max_examples=30, deadline=None)
@given(trees())
def test_round_trip_offsets(levels):
    offsets = [np.concatenate([[0], np.cumsum(level, dtype=np.int64)]).tolist() for level in levels]
    values = list(range(offsets[-1][-1]))
    rt = lod.from_offsets(tf.constant(values, tf.int64), offsets)
    assert to_python(rt) == _nest(values, levels)
    assert _lists(lod.to_offsets(rt)) == offsets
    again = lod.from_lengths(rt.flat_values, lod.to_lengths(rt))
    assert _lists(lod.to_offsets(again)) == offsets
