"""Tests for MaskedAttention and AttentionPooling: exact masking, packing, precision, saving."""

import math
import random

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfseq
from tfseq.layers import AttentionPooling, MaskedAttention

RNG = np.random.default_rng(1234)


def _grads(layer, *args, **kwargs):
    """Output and gradients w.r.t. the float positional inputs and the layer's weights."""
    tensors = [tf.constant(a) for a in args]
    with tf.GradientTape() as tape:
        for t in tensors:
            tape.watch(t)
        out = layer(*tensors, **kwargs)
        loss = tf.reduce_sum(tf.cast(out, tf.float32) * tf.range(1.0, out.shape[-1] + 1.0))
    grads = tape.gradient(loss, tensors + list(layer.trainable_weights))
    return out, grads


def _all_finite(grads):
    return all(g is None or np.isfinite(tf.cast(g, tf.float32).numpy()).all() for g in grads)


# --- literal values ------------------------------------------------------------------------

def test_dot_literal_values_with_lengths():
    # Query 0 scores both keys equally: mean of the valid values; the pad value 100 is ignored.
    query = tf.constant([[[0.0, 0.0]], [[0.0, 0.0]]])
    value = tf.constant([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]],
                         [[5.0, 6.0], [100.0, 100.0], [100.0, 100.0]]])
    out, weights = MaskedAttention()(query, value, value_lengths=[2, 1],
                                     return_attention_scores=True)
    np.testing.assert_allclose(out.numpy(), [[[2.0, 3.0]], [[5.0, 6.0]]], atol=1e-6)
    np.testing.assert_allclose(weights.numpy(), [[[0.5, 0.5, 0.0]], [[1.0, 0.0, 0.0]]], atol=1e-7)


def test_dot_scaled_literal():
    # q.k = [0, 2*ln(3)] scaled by 1/sqrt(4) -> [0, ln 3] -> weights [0.25, 0.75].
    query = tf.constant([[[1.0, 1.0, 1.0, 1.0]]])
    key = tf.constant([[[0.0, 0.0, 0.0, 0.0], [math.log(3.0) / 2] * 4]])
    value = tf.constant([[[4.0], [8.0]]])
    out = MaskedAttention()(query, value, key=key)
    np.testing.assert_allclose(out.numpy(), [[[7.0]]], atol=1e-5)
    # Unscaled logits [0, 2 ln 3] -> weights [1/10, 9/10].
    out = MaskedAttention(use_scale=False)(query, value, key=key)
    np.testing.assert_allclose(out.numpy(), [[[7.6]]], atol=1e-5)


def test_ragged_inputs_give_ragged_output():
    values = tf.ragged.constant([[[1.0], [3.0]], [[5.0]]], ragged_rank=1)
    out = MaskedAttention()(tf.ragged.constant([[[0.0]], []], ragged_rank=1, inner_shape=(1,)),
                            values)
    assert isinstance(out, tf.RaggedTensor)
    assert out.to_list() == [[[2.0]], []]


def test_keras_masks_from_embedding():
    ids = tf.constant([[1, 2, 0], [3, 0, 0]])
    embed = keras.layers.Embedding(5, 4, mask_zero=True)
    x = embed(ids)
    layer = MaskedAttention()
    out, weights = layer(x, x, return_attention_scores=True)
    w = weights.numpy()
    assert (w[0, :, 2] == 0).all() and (w[1, :, 1:] == 0).all()
    assert (w[0, 2] == 0).all() and (w[1, 1:] == 0).all()  # pad queries: zero rows
    np.testing.assert_array_equal(out.numpy()[1, 1:], np.zeros([2, 4]))
    np.testing.assert_allclose(w[1, 0], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(out.numpy()[1, 0], x.numpy()[1, 0], atol=1e-6)


def test_causal_mask():
    value = tf.constant([[[1.0], [2.0], [4.0]]])
    query = tf.zeros([1, 3, 1])
    out = MaskedAttention()(query, value, use_causal_mask=True)
    np.testing.assert_allclose(out.numpy(), [[[1.0], [1.5], [7.0 / 3.0]]], atol=1e-6)


def test_explicit_attention_mask():
    value = tf.constant([[[1.0], [2.0], [4.0]]])
    mask = tf.constant([[[False, True, True], [False, False, False]]])
    out = MaskedAttention()(tf.zeros([1, 2, 1]), value, attention_mask=mask)
    np.testing.assert_allclose(out.numpy(), [[[3.0], [0.0]]], atol=1e-6)


# --- pads never matter ------------------------------------------------------------------

@pytest.mark.parametrize("score", ["dot", "additive"])
@pytest.mark.parametrize("pad", [1e6, -1e6, float("inf"), float("nan")])
def test_pad_features_never_change_output_or_gradients(score, pad):
    layer = MaskedAttention(score)
    q = RNG.standard_normal([2, 3, 4]).astype(np.float32)
    v = RNG.standard_normal([2, 5, 4]).astype(np.float32)
    q_len, v_len = [3, 2], [4, 2]
    out0, g0 = _grads(layer, q, v, query_lengths=q_len, value_lengths=v_len)
    q2, v2 = q.copy(), v.copy()
    q2[1, 2:] = pad
    v2[0, 4:] = pad
    v2[1, 2:] = pad
    out1, g1 = _grads(layer, q2, v2, query_lengths=q_len, value_lengths=v_len)
    np.testing.assert_array_equal(out0.numpy(), out1.numpy())
    assert _all_finite(g1)
    # Gradients on real steps and weights are unchanged; on pads they are exactly 0.
    np.testing.assert_array_equal(g0[0].numpy(), g1[0].numpy())
    np.testing.assert_array_equal(g0[1].numpy(), g1[1].numpy())
    for a, b in zip(g0[2:], g1[2:]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert (g1[1].numpy()[0, 4:] == 0).all() and (g1[0].numpy()[1, 2:] == 0).all()


def test_fully_masked_rows_zero_output_finite_gradients():
    layer = MaskedAttention("additive")
    q = RNG.standard_normal([2, 3, 4]).astype(np.float32)
    v = RNG.standard_normal([2, 4, 4]).astype(np.float32)
    out, grads = _grads(layer, q, v, query_lengths=[3, 1], value_lengths=[0, 4])
    o = out.numpy()
    np.testing.assert_array_equal(o[0], np.zeros([3, 4]))   # no key at all
    np.testing.assert_array_equal(o[1, 1:], np.zeros([2, 4]))  # pad queries
    assert np.abs(o[1, 0]).sum() > 0
    assert _all_finite(grads)


# --- packed segments -------------------------------------------------------------------

@pytest.mark.parametrize("score", ["dot", "additive"])
def test_packed_segments_equal_each_segment_alone(score):
    layer = MaskedAttention(score)
    lengths = [3, 2, 4]
    segs = [RNG.standard_normal([n, 6]).astype(np.float32) for n in lengths]
    row = np.concatenate(segs + [np.full([2, 6], 1e6, np.float32)])[None]  # 2 pad steps
    segment_ids = tf.constant([[1, 1, 1, 2, 2, 3, 3, 3, 3, 0, 0]])
    packed = layer(row, row, query_segment_ids=segment_ids).numpy()[0]
    start = 0
    for seg in segs:
        alone = layer(seg[None], seg[None]).numpy()[0]
        np.testing.assert_allclose(packed[start:start + len(seg)], alone, atol=1e-5, rtol=0)
        start += len(seg)
    np.testing.assert_array_equal(packed[start:], np.zeros([2, 6]))


def test_packed_causal_cross_attention_segments():
    layer = MaskedAttention()
    value = tf.constant([[[1.0], [3.0], [10.0], [0.0]]])
    value_segments = tf.constant([[1, 1, 2, 0]])
    query_segments = tf.constant([[1, 2, 2, 3]])  # segment 3 has no value: zero row
    out = layer(tf.zeros([1, 4, 1]), value, query_segment_ids=query_segments,
                value_segment_ids=value_segments)
    np.testing.assert_allclose(out.numpy(), [[[2.0], [10.0], [10.0], [0.0]]], atol=1e-6)


# --- precision -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("score", ["dot", "additive"])
def test_half_precision_close_to_float32_and_finite(dtype, score):
    # Its own draws and weights, whatever ran before it in this process.
    rng = np.random.default_rng(7)
    random.seed(7)  # Keras draws the initializers' seeds from Python's random
    q = (rng.standard_normal([2, 4, 8]) * 30).astype(np.float32)   # large dot products
    v = (rng.standard_normal([2, 6, 8]) * 30).astype(np.float32)
    v[1, 3:] = 6e4
    reference = MaskedAttention(score, name="ref")
    expected = reference(q, v, value_lengths=[6, 3], query_lengths=[4, 2]).numpy()
    layer = MaskedAttention(score, dtype=dtype)
    layer.build(q.shape, v.shape)
    layer.set_weights(reference.get_weights())
    out, grads = _grads(layer, q, v, value_lengths=[6, 3], query_lengths=[4, 2])
    half = tf.bfloat16 if "bfloat16" in dtype else tf.float16
    assert out.dtype == half
    assert _all_finite(grads)
    tolerance = 0.02 if half == tf.float16 else 0.1   # relative to |values| ~ 30
    np.testing.assert_allclose(tf.cast(out, tf.float32).numpy(), expected, atol=30 * tolerance)
    np.testing.assert_array_equal(tf.cast(out, tf.float32).numpy()[1, 2:], np.zeros([2, 8]))


# --- config and saving -----------------------------------------------------------------

def test_constructor_errors():
    with pytest.raises(ValueError, match="score"):
        MaskedAttention("general")
    with pytest.raises(ValueError, match="units"):
        MaskedAttention("dot", units=4)
    with pytest.raises(ValueError, match="dropout"):
        MaskedAttention(dropout=1.0)
    with pytest.raises(ValueError, match="feature sizes to match"):
        MaskedAttention()(tf.zeros([1, 2, 3]), tf.zeros([1, 2, 4]))
    with pytest.raises(ValueError, match="units"):
        AttentionPooling(units=0)


def test_get_config_round_trip():
    layer = MaskedAttention("additive", units=7, use_scale=False, dropout=0.25, seed=3,
                            name="att")
    config = layer.get_config()
    assert {k: config[k] for k in ("score", "units", "use_scale", "dropout", "seed")} == {
        "score": "additive", "units": 7, "use_scale": False, "dropout": 0.25, "seed": 3}
    clone = MaskedAttention.from_config(config)
    assert clone.get_config() == config
    pool = AttentionPooling(units=5, name="pool")
    assert AttentionPooling.from_config(pool.get_config()).get_config() == pool.get_config()


def test_keras_save_load_identical_outputs(tmp_path):
    q_in = keras.Input((None, 6))
    v_in = keras.Input((None, 6))
    lengths = keras.Input((), dtype="int32")
    x = MaskedAttention("additive", units=5, name="add")(q_in, v_in, value_lengths=lengths)
    x = MaskedAttention("dot", name="dot")(x, v_in, value_lengths=lengths)
    pooled = AttentionPooling(units=3, name="pool")(x)
    model = keras.Model([q_in, v_in, lengths], pooled)
    inputs = [RNG.standard_normal([3, 4, 6]).astype(np.float32),
              RNG.standard_normal([3, 5, 6]).astype(np.float32), np.array([5, 2, 0], np.int32)]
    expected = model(inputs).numpy()
    path = str(tmp_path / "attention.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded(inputs).numpy(), expected)


def test_exported():
    assert tfseq.layers.MaskedAttention is MaskedAttention
    assert tfseq.layers.AttentionPooling is AttentionPooling


# --- AttentionPooling ------------------------------------------------------------------

def test_pooling_single_step_and_empty_rows():
    pool = AttentionPooling(units=4)
    out = pool(tf.ragged.constant([[[1.0, 2.0]], [], [[3.0, 4.0], [3.0, 4.0]]], ragged_rank=1,
                                  inner_shape=(2,)))
    np.testing.assert_allclose(out.numpy(), [[1.0, 2.0], [0.0, 0.0], [3.0, 4.0]], atol=1e-6)


@pytest.mark.parametrize("pad", [1e6, float("inf"), float("nan")])
def test_pooling_pads_never_matter(pad):
    pool = AttentionPooling()
    x = RNG.standard_normal([2, 4, 3]).astype(np.float32)
    out0, g0 = _grads(pool, x, lengths=[4, 2])
    x2 = x.copy()
    x2[1, 2:] = pad
    out1, g1 = _grads(pool, x2, lengths=[4, 2])
    np.testing.assert_array_equal(out0.numpy(), out1.numpy())
    assert _all_finite(g1)
    for a, b in zip(g0, g1):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_pooling_ragged_equals_lengths_equals_keras_mask():
    pool = AttentionPooling(units=4)
    rt = tf.RaggedTensor.from_row_lengths(tf.constant(RNG.standard_normal([6, 3]), tf.float32),
                                          [2, 0, 4])
    a = pool(rt).numpy()
    b = pool(rt.to_tensor(), lengths=[2, 0, 4]).numpy()
    c = pool(rt.to_tensor(), mask=tf.sequence_mask([2, 0, 4], 4)).numpy()
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("dtype", ["mixed_float16", "mixed_bfloat16"])
def test_pooling_mixed_precision_finite(dtype):
    pool = AttentionPooling(dtype=dtype)
    x = np.full([3, 3, 4], 6e4, np.float32)   # pads: 6e4 and inf
    x[0] = 30.0
    x[2, :2] = -30.0
    x[2, 2] = np.inf
    out, grads = _grads(pool, x, lengths=[3, 0, 2])
    assert out.dtype == (tf.float16 if dtype == "mixed_float16" else tf.bfloat16)
    np.testing.assert_array_equal(tf.cast(out, tf.float32).numpy(),
                                  [[30.0] * 4, [0.0] * 4, [-30.0] * 4])
    assert _all_finite(grads)
