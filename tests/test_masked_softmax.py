"""Tests for tfseq.masked_softmax: exact pad zeros, fully masked rows, half precision."""

import math

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import tfseq
from tfseq.layers.masked_softmax import masked_softmax


def _value_and_grad(logits, mask, dtype=tf.float32):
    x = tf.constant(logits, dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = masked_softmax(x, mask)
        # A non-uniform cotangent, so the softmax gradient is not trivially zero.
        loss = tf.reduce_sum(y * tf.cast(tf.range(1, tf.shape(y)[-1] + 1), y.dtype))
    return y.numpy(), tape.gradient(loss, x).numpy()


def test_exported_at_top_level():
    assert tfseq.masked_softmax is masked_softmax
    assert tfseq.layers.masked_softmax is masked_softmax


def test_literal_values():
    y = masked_softmax(tf.constant([[1.0, 1.0, 5.0], [0.0, math.log(3.0), 9.0]]),
                       tf.constant([[True, True, False], [True, True, False]]))
    np.testing.assert_allclose(y.numpy(), [[0.5, 0.5, 0.0], [0.25, 0.75, 0.0]], atol=1e-7)


def test_no_mask_is_plain_softmax():
    y = masked_softmax(tf.constant([[0.0, math.log(3.0)]]), None)
    np.testing.assert_allclose(y.numpy(), [[0.25, 0.75]], atol=1e-7)


def test_numeric_mask_and_broadcast_mask():
    logits = tf.constant([[[0.0, 0.0, 7.0], [math.log(3.0), 0.0, -7.0]]])  # [1, 2, 3]
    y = masked_softmax(logits, tf.constant([[[1, 1, 0]]]))  # [1, 1, 3] int mask
    np.testing.assert_allclose(y.numpy(), [[[0.5, 0.5, 0.0], [0.75, 0.25, 0.0]]], atol=1e-7)


def test_other_axis():
    logits = tf.constant([[[0.0, 5.0], [math.log(3.0), 5.0], [9.0, 5.0]]])  # [1, 3, 2]
    mask = tf.constant([[[True], [True], [False]]])  # [1, 3, 1]: the third time step is a pad
    y = masked_softmax(logits, mask, axis=1)
    np.testing.assert_allclose(y.numpy(), [[[0.25, 0.5], [0.75, 0.5], [0.0, 0.0]]], atol=1e-7)


def test_lower_rank_mask_with_positive_axis():
    logits = tf.constant([[[0.0, 5.0], [math.log(3.0), 5.0], [9.0, 5.0]]])  # [1, 3, 2]
    y = masked_softmax(logits, tf.constant([[True], [True], [False]]), axis=1)  # mask [3, 1]
    np.testing.assert_allclose(y.numpy(), [[[0.25, 0.5], [0.75, 0.5], [0.0, 0.0]]], atol=1e-7)
    # mask [2]: column 1 is masked at every step, so its slice is empty -> zeros.
    y = masked_softmax(logits, tf.constant([True, False]), axis=1)
    np.testing.assert_allclose(y.numpy(), [[[1.2334891e-4, 0.0], [3.7004674e-4, 0.0],
                                             [0.99950660, 0.0]]], atol=1e-6)


@pytest.mark.parametrize("pad_value", [1e6, -1e6, 3e38, float("inf"), float("-inf"), float("nan")])
def test_pad_logits_never_change_output_or_gradient(pad_value):
    mask = tf.constant([[True, True, False, False], [True, False, True, False]])
    base = [[1.0, 2.0, 0.0, 0.0], [-3.0, 0.0, 4.0, 0.0]]
    changed = [[1.0, 2.0, pad_value, pad_value], [-3.0, pad_value, 4.0, -pad_value]]
    y0, g0 = _value_and_grad(base, mask)
    y1, g1 = _value_and_grad(changed, mask)
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(g0, g1)
    assert (y1[mask.numpy() == False] == 0.0).all()  # noqa: E712
    assert (g1[mask.numpy() == False] == 0.0).all()  # noqa: E712


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16, tf.float64])
def test_fully_masked_row_is_zero_with_finite_gradients(dtype):
    mask = tf.constant([[False, False, False], [True, True, False]])
    y, g = _value_and_grad([[1.0, 2.0, 3.0], [0.0, 0.0, 100.0]], mask, dtype)
    np.testing.assert_array_equal(y.astype(np.float64), [[0.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    assert np.isfinite(g.astype(np.float64)).all()
    np.testing.assert_array_equal(g[0].astype(np.float64), [0.0, 0.0, 0.0])


def test_float16_huge_logits():
    mask = tf.constant([[True, True, False], [True, True, True], [True, False, True]])
    y, g = _value_and_grad(
        [[-60000.0, -60000.0, 60000.0], [60000.0, 60000.0, -60000.0], [65504.0, 0.0, -65504.0]],
        mask, tf.float16)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y.astype(np.float64),
                                  [[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    assert np.isfinite(g.astype(np.float64)).all()


def test_bfloat16_huge_range():
    mask = tf.constant([[True, True, False], [True, True, True]])
    y, g = _value_and_grad([[1e30, 1e30, 3e38], [3e38, -3e38, 3e38]], mask, tf.bfloat16)
    np.testing.assert_array_equal(y.astype(np.float64), [[0.5, 0.5, 0.0], [0.5, 0.0, 0.5]])
    assert np.isfinite(g.astype(np.float64)).all()


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_half_precision_near_identical_logits_are_correctly_rounded(dtype):
    # Logits 1 and 1.0625 are exact in both dtypes; exact weights 0.4843800, 0.5156200
    # round to 0.484375 and 0.515625 in float16 and in bfloat16 (whose spacing near 0.5 is
    # 2**-8, so no bfloat16 result can be within 1e-3 of every float64 weight).
    y, _ = _value_and_grad([[1.0, 1.0625, 50.0]], tf.constant([[True, True, False]]), dtype)
    np.testing.assert_array_equal(y.astype(np.float64), [[0.484375, 0.515625, 0.0]])


def test_valid_logits_at_the_lowest_float32():
    lowest = float(np.finfo(np.float32).min)
    y, g = _value_and_grad([[lowest, lowest, 0.0]], tf.constant([[True, True, False]]))
    np.testing.assert_array_equal(y, [[0.5, 0.5, 0.0]])
    assert np.isfinite(g).all()


def test_pads_dominating():
    # One valid position among many pads with far larger logits: the valid one gets weight 1.
    logits = np.full([1, 64], 60000.0, np.float32)
    logits[0, 5] = -60000.0
    mask = np.zeros([1, 64], bool)
    mask[0, 5] = True
    for dtype in (tf.float32, tf.float16, tf.bfloat16):
        y, g = _value_and_grad(logits, tf.constant(mask), dtype)
        expected = np.zeros([1, 64])
        expected[0, 5] = 1.0
        np.testing.assert_array_equal(y.astype(np.float64), expected)
        assert np.isfinite(g.astype(np.float64)).all()


def test_inside_tf_function_with_unknown_shapes():
    fn = tf.function(masked_softmax, input_signature=[
        tf.TensorSpec([None, None], tf.float32), tf.TensorSpec([None, None], tf.bool)])
    y = fn(tf.constant([[2.0, 2.0, -1.0]]), tf.constant([[True, True, False]]))
    np.testing.assert_allclose(y.numpy(), [[0.5, 0.5, 0.0]], atol=1e-7)


def test_ragged_logits():
    y = masked_softmax(tf.ragged.constant([[1.0, 1.0], [3.0], []]), None)
    assert y.to_list() == [[0.5, 0.5], [1.0], []]
    y = masked_softmax(tf.ragged.constant([[[0.0, math.log(3.0)]], []], ragged_rank=1), None)
    np.testing.assert_allclose(y.flat_values.numpy(), [[0.25, 0.75]], atol=1e-7)
    assert y.row_lengths().numpy().tolist() == [1, 0]


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="floating point"):
        masked_softmax(tf.constant([[1, 2]]), None)
    with pytest.raises(TypeError, match="axis"):
        masked_softmax(tf.constant([[1.0]]), None, axis=1.0)
    with pytest.raises(ValueError, match="axis=2"):
        masked_softmax(tf.constant([[1.0]]), None, axis=2)
    with pytest.raises(ValueError, match="mask must be broadcastable"):
        masked_softmax(tf.constant([1.0, 2.0]), tf.constant([[True, True]]))
    with pytest.raises(ValueError, match="mask=None"):
        masked_softmax(tf.ragged.constant([[1.0]]), tf.constant([[True]]))


def _reference(logits, mask):
    x = np.where(mask, logits.astype(np.float64), -np.inf)
    top = np.max(x, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.where(mask, np.exp(x - top), 0.0)
    total = e.sum(-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 4),
    cols=st.integers(1, 9),
    scale=st.sampled_from([1e-3, 1.0, 30.0, 1e4]),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_float64_reference(rows, cols, scale, seed):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal([rows, cols]) * scale).astype(np.float32)
    mask = rng.random([rows, cols]) < 0.6
    y = masked_softmax(tf.constant(logits), tf.constant(mask)).numpy()
    np.testing.assert_allclose(y, _reference(logits, mask), atol=1e-6, rtol=0)
    assert (y[~mask] == 0.0).all()
    sums = y.sum(-1)
    np.testing.assert_allclose(sums, np.where(mask.any(-1), 1.0, 0.0), atol=1e-5)
