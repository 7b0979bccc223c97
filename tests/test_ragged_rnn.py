"""Tests for RaggedRNN: ragged batch == each sequence alone, both directions, fit, saving."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfseq
from tfseq.layers import RaggedRNN

RNG = np.random.default_rng(7)
LENGTHS = [5, 2, 0, 3, 1]
SEQUENCES = [RNG.standard_normal([n, 3]).astype(np.float32) for n in LENGTHS]
RAGGED = tf.RaggedTensor.from_row_lengths(np.concatenate(SEQUENCES), LENGTHS)

LAYERS = {
    "gru": lambda **kw: keras.layers.GRU(4, **kw),
    "lstm": lambda **kw: keras.layers.LSTM(4, **kw),
    "simple_rnn": lambda **kw: keras.layers.SimpleRNN(4, **kw),
    "gru_backwards": lambda **kw: keras.layers.GRU(4, go_backwards=True, **kw),
    "bi_gru": lambda **kw: keras.layers.Bidirectional(keras.layers.GRU(4, **kw)),
    "bi_lstm": lambda **kw: keras.layers.Bidirectional(keras.layers.LSTM(4, **kw)),
    "bi_gru_sum": lambda **kw: keras.layers.Bidirectional(keras.layers.GRU(4, **kw),
                                                          merge_mode="sum"),
}


def _numpy(x):
    return x.numpy() if not isinstance(x, tf.RaggedTensor) else x


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_ragged_batch_equals_each_sequence_alone(name):
    rnn = RaggedRNN(LAYERS[name](return_sequences=True, return_state=True))
    sequences, *states = rnn(RAGGED)
    assert isinstance(sequences, tf.RaggedTensor)
    assert sequences.row_lengths().numpy().tolist() == LENGTHS
    for i, seq in enumerate(SEQUENCES):
        if not len(seq):
            assert all(np.abs(s.numpy()[i]).max() == 0 for s in states)
            continue
        alone, *alone_states = rnn(tf.constant(seq[None]))
        np.testing.assert_allclose(sequences[i].numpy(), alone.numpy()[0], atol=1e-5, rtol=0)
        for s, a in zip(states, alone_states):
            np.testing.assert_allclose(s.numpy()[i], a.numpy()[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["gru", "lstm", "bi_gru", "bi_lstm"])
def test_alone_equals_plain_keras_layer(name):
    # The wrapper on one unpadded sequence computes exactly what the Keras layer computes.
    keras_layer = LAYERS[name](return_sequences=True, return_state=True)
    rnn = RaggedRNN(LAYERS[name](return_sequences=True, return_state=True))
    x = tf.constant(SEQUENCES[0][None])
    ours = rnn(x)
    keras_layer(x)
    keras_layer.set_weights(rnn.get_weights())
    theirs = keras_layer(x)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6, rtol=0)


def test_backward_direction_starts_at_last_real_step():
    # Backward GRU over [x1, x2] padded to 4 steps must equal the GRU over [x2, x1]; reversing
    # the padded tensor instead would start on two pad steps.
    forward = keras.layers.GRU(2, return_sequences=True, return_state=True)
    rnn = RaggedRNN(keras.layers.GRU(2, return_sequences=True, return_state=True,
                                     go_backwards=True))
    padded = np.zeros([1, 4, 3], np.float32)
    padded[0, :2] = SEQUENCES[1]
    sequences, state = rnn(tf.constant(padded), lengths=[2])
    forward(tf.constant(SEQUENCES[1][None]))
    forward.set_weights(rnn.get_weights())
    expected, expected_state = forward(tf.constant(SEQUENCES[1][::-1].copy()[None]))
    np.testing.assert_allclose(sequences.numpy()[0, :2], expected.numpy()[0], atol=1e-6)
    np.testing.assert_array_equal(sequences.numpy()[0, 2:], np.zeros([2, 2]))
    np.testing.assert_allclose(state.numpy(), expected_state.numpy(), atol=1e-6)


@pytest.mark.parametrize("pad", [0.0, 1e6, float("nan")])
def test_padded_with_lengths_or_mask_equals_ragged(pad):
    rnn = RaggedRNN(LAYERS["bi_lstm"](return_sequences=True, return_state=True))
    ragged_out = rnn(RAGGED)
    padded = RAGGED.to_tensor(default_value=pad)
    by_lengths = rnn(padded, lengths=LENGTHS)
    by_mask = rnn(padded, mask=tf.sequence_mask(LENGTHS))
    assert not isinstance(by_lengths[0], tf.RaggedTensor)
    expected = ragged_out[0].to_tensor().numpy()
    for out in (by_lengths, by_mask):
        np.testing.assert_array_equal(out[0].numpy(), expected)  # zeros on pads
        for a, b in zip(out[1:], ragged_out[1:]):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_last_output_without_return_sequences():
    rnn = RaggedRNN(keras.layers.Bidirectional(keras.layers.GRU(4)))
    last = rnn(RAGGED).numpy()
    full = RaggedRNN(keras.layers.Bidirectional(keras.layers.GRU(4, return_sequences=True)))
    full(RAGGED)
    full.set_weights(rnn.get_weights())
    sequences = full(RAGGED)
    for i, n in enumerate(LENGTHS):
        if n == 0:
            np.testing.assert_array_equal(last[i], np.zeros(8))
            continue
        # Forward half: the output at the last real step; backward half: at the first step.
        np.testing.assert_allclose(last[i, :4], sequences[i, n - 1, :4].numpy(), atol=1e-6)
        np.testing.assert_allclose(last[i, 4:], sequences[i, 0, 4:].numpy(), atol=1e-6)


def test_output_format_and_initial_state():
    rnn = RaggedRNN(keras.layers.GRU(4, return_sequences=True, return_state=True),
                    output_format="padded")
    init = tf.constant(RNG.standard_normal([5, 4]), tf.float32)
    sequences, state = rnn(RAGGED, initial_state=[init])
    assert not isinstance(sequences, tf.RaggedTensor) and sequences.shape == (5, 5, 4)
    np.testing.assert_allclose(state.numpy()[2], init.numpy()[2])  # empty row keeps its state
    alone, alone_state = rnn(tf.constant(SEQUENCES[3][None]), initial_state=[init[3:4]])
    np.testing.assert_allclose(state.numpy()[3], alone_state.numpy()[0], atol=1e-5)
    ragged = RaggedRNN(keras.layers.GRU(4, return_sequences=True), output_format="ragged")
    assert isinstance(ragged(RAGGED.to_tensor(), lengths=LENGTHS), tf.RaggedTensor)


def test_all_empty_batch():
    empty = tf.RaggedTensor.from_row_lengths(tf.zeros([0, 3]), [0, 0])
    last, state = RaggedRNN(keras.layers.GRU(4, return_state=True))(empty)
    np.testing.assert_array_equal(last.numpy(), np.zeros([2, 4]))
    np.testing.assert_array_equal(state.numpy(), np.zeros([2, 4]))


def test_errors():
    with pytest.raises(TypeError, match="keras.layers.RNN"):
        RaggedRNN(keras.layers.Dense(3))
    with pytest.raises(ValueError, match="output_format"):
        RaggedRNN(keras.layers.GRU(3), output_format="dense")
    with pytest.raises(ValueError, match="initial states"):
        RaggedRNN(LAYERS["bi_gru"]())(RAGGED, initial_state=[tf.zeros([5, 4])])


def test_get_config_round_trip():
    rnn = RaggedRNN(keras.layers.Bidirectional(keras.layers.LSTM(3, return_sequences=True),
                                               merge_mode="ave"), output_format="padded",
                    name="bi")
    config = rnn.get_config()
    clone = RaggedRNN.from_config(config)
    assert clone.get_config() == config
    assert clone.merge_mode == "ave" and clone.bidirectional and clone.return_sequences
    assert tfseq.layers.RaggedRNN is RaggedRNN


def _model(name):
    inputs = keras.Input((None, 3), ragged=True)
    x = RaggedRNN(LAYERS[name](return_sequences=True), name="rnn")(inputs)
    x = tfseq.layers.AttentionPooling(name="pool")(x)
    outputs = keras.layers.Dense(2, dtype="float32")(x)
    return keras.Model(inputs, outputs)


@pytest.mark.parametrize("name", ["lstm", "bi_gru"])
def test_keras_save_load_identical_outputs(tmp_path, name):
    model = _model(name)
    expected = model(RAGGED).numpy()
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded(RAGGED).numpy(), expected)


@pytest.fixture
def mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_fit_on_ragged_dataset(policy, request):
    if policy == "mixed_float16":
        request.getfixturevalue("mixed_precision")
    model = _model("bi_gru")
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    lengths = RNG.integers(1, 6, 32)
    x = tf.RaggedTensor.from_row_lengths(
        tf.constant(RNG.standard_normal([int(lengths.sum()), 3]), tf.float32), lengths)
    y = (tf.reduce_sum(x, axis=[1, 2]) > 0).numpy().astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    history = model.fit(ds, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0]
