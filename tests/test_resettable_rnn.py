"""ResettableRNN and segment masks: packed runs equal each example run alone; Keras plumbing."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfseq
from tfseq.layers import ResettableRNN, segment_attention_mask, segment_mean

CELLS = {"gru": lambda: keras.layers.GRUCell(6), "lstm": lambda: keras.layers.LSTMCell(6)}
VOCAB, DIM, BLOCK, ROWS = 40, 5, 8, 3


def random_examples(seed=0, count=14):
    """Random ids with lengths 1..20 (some longer than the block of 8, so they get split)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB, int(n)).tolist() for n in rng.integers(1, 21, count)]


def packed_batches(data, block=BLOCK, rows=ROWS):
    def gen():
        for i, ids in enumerate(data):
            yield {"ids": ids, "label": i}
    ds = tf.data.Dataset.from_generator(gen, output_signature={
        "ids": tf.TensorSpec([None], tf.int32), "label": tf.TensorSpec([], tf.int32)})
    counter = tfseq.DropCounter()
    batches = [{k: v.numpy() for k, v in b.items()}
               for b in ds.apply(tfseq.pack(block, batch_size=rows, counter=counter))]
    return batches, counter.seen()["split"]


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_packed_run_equals_each_example_alone(kind):
    data = random_examples()
    batches, num_split = packed_batches(data)
    assert num_split >= 3
    table = np.random.default_rng(1).normal(size=(VOCAB, DIM)).astype(np.float32)
    layer = ResettableRNN(CELLS[kind](), return_state=True)
    outputs = {i: [] for i in range(len(data))}
    state = None
    for batch in batches:
        rows = batch["ids"].shape[0]
        if state is not None:
            state = [s[:rows] for s in state]
        seg = batch["ids_segment_ids"]
        result = layer(table[batch["ids"]], batch["ids_resets"], mask=seg > 0,
                       initial_state=state)
        sequences, state = result[0].numpy(), result[1:]
        for r in range(rows):
            for t in np.flatnonzero(seg[r]):
                outputs[int(batch["label"][r, seg[r, t] - 1])].append(sequences[r, t])
    alone = keras.layers.RNN(layer.cell, return_sequences=True)
    for i, ids in enumerate(data):
        expected = alone(table[np.array(ids)][None]).numpy()[0]
        np.testing.assert_allclose(np.stack(outputs[i]), expected, atol=1e-5, rtol=0)


def test_continuation_needs_the_carried_state():
    # One example of 7 tokens at block 4: the second piece starts without a reset.
    data = [[3, 1, 4, 1, 5, 9, 2]]
    batches, num_split = packed_batches(data, block=4, rows=1)
    assert num_split == 1
    assert [b["ids"].tolist() for b in batches] == [[[3, 1, 4, 1]], [[5, 9, 2, 0]]]
    assert [b["ids_resets"].tolist() for b in batches] == [[[True, False, False, False]],
                                                           [[False, False, False, False]]]
    table = np.random.default_rng(1).normal(size=(VOCAB, DIM)).astype(np.float32)
    layer = ResettableRNN(keras.layers.GRUCell(4), return_state=True)
    full = layer(table[np.array(data)], np.array([[True] + [False] * 6]))[0].numpy()
    first, second = batches
    out1 = layer(table[first["ids"]], first["ids_resets"], mask=first["ids_segment_ids"] > 0)
    out2 = layer(table[second["ids"]], second["ids_resets"], mask=second["ids_segment_ids"] > 0,
                 initial_state=out1[1:])[0].numpy()
    np.testing.assert_allclose(out1[0].numpy()[0], full[0, :4], atol=1e-6)
    np.testing.assert_allclose(out2[0, :3], full[0, 4:], atol=1e-6)
    fresh = layer(table[second["ids"]], second["ids_resets"])[0].numpy()
    assert np.abs(fresh[0, :3] - full[0, 4:]).max() > 1e-3


def test_padding_keeps_the_state_and_outputs_zeros():
    layer = ResettableRNN(keras.layers.GRUCell(4), return_state=True)
    x = tf.random.stateless_normal([2, 5, 3], seed=[1, 2])
    mask = tf.constant([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]) > 0
    resets = tf.constant([[1, 0, 0, 0, 0], [1, 0, 0, 0, 0]]) > 0
    sequences, state = layer(x, resets, mask=mask)
    short, short_state = layer(x[:1, :3], resets[:1, :3])
    np.testing.assert_allclose(sequences[0, 3:], np.zeros([2, 4]))
    np.testing.assert_allclose(state[:1], short_state, atol=1e-6)
    last = ResettableRNN(layer.cell, return_sequences=False)(x, resets, mask=mask)
    np.testing.assert_allclose(last[0], short[0, 2], atol=1e-6)
    assert sequences.shape == (2, 5, 4) and last.shape == (2, 4)


def test_no_resets_is_a_plain_rnn():
    layer = ResettableRNN(keras.layers.LSTM(4))
    x = tf.random.stateless_normal([2, 6, 3], seed=[3, 4])
    expected = keras.layers.RNN(layer.cell, return_sequences=True)(x)
    np.testing.assert_allclose(layer(x), expected, atol=1e-6)


def test_bad_cell():
    with pytest.raises(TypeError, match="cell"):
        ResettableRNN(keras.layers.Dense(3))


def lm_model():
    ids = keras.Input(shape=(None,), dtype="int32", name="ids")
    resets = keras.Input(shape=(None,), dtype="bool", name="ids_resets")
    x = keras.layers.Embedding(VOCAB, 8, mask_zero=True)(ids)
    x = ResettableRNN(keras.layers.GRUCell(8))(x, resets)
    return keras.Model({"ids": ids, "ids_resets": resets}, keras.layers.Dense(VOCAB)(x))


def test_config_round_trip_and_keras_file(tmp_path):
    layer = ResettableRNN(keras.layers.LSTMCell(4), return_state=True, name="rnn")
    clone = ResettableRNN.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    model = lm_model()
    batch = {"ids": np.array([[5, 6, 7, 8, 9, 0]]),
             "ids_resets": np.array([[True, False, True, False, False, False]])}
    path = str(tmp_path / "lm.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded.predict(batch, verbose=0), model.predict(batch, verbose=0),
                               atol=1e-6)


def test_trains_with_model_fit_on_packed_lm_targets():
    batches = tf.data.Dataset.from_generator(
        lambda: iter({"ids": ids} for ids in random_examples(2, 30)),
        output_signature={"ids": tf.TensorSpec([None], tf.int32)}).apply(
        tfseq.pack(16, batch_size=4, counter=tfseq.DropCounter()))

    def to_fit(batch):
        features, targets, weights = tfseq.lm_targets(batch)
        return ({"ids": features["ids"], "ids_resets": features["ids_resets"]}, targets,
                weights)

    model = lm_model()
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(batches.map(to_fit), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert history.history["loss"][1] < history.history["loss"][0]


def test_segment_attention_mask():
    mask = segment_attention_mask(tf.constant([[1, 1, 2, 0]]))
    assert mask.numpy().astype(int).tolist() == [[[1, 1, 0, 0],
                                                  [1, 1, 0, 0],
                                                  [0, 0, 1, 0],
                                                  [0, 0, 0, 0]]]
    causal = segment_attention_mask(tf.constant([[1, 1, 2, 0]]), causal=True)
    assert causal.numpy().astype(int).tolist() == [[[1, 0, 0, 0],
                                                    [1, 1, 0, 0],
                                                    [0, 0, 1, 0],
                                                    [0, 0, 0, 0]]]
    with pytest.raises(ValueError, match="rank 2"):
        segment_attention_mask(tf.constant([1, 2]))


def test_packed_attention_equals_each_example_alone():
    data = [[4, 8, 15], [16, 23], [42, 7, 1]]
    batch = {"ids": np.array([[4, 8, 15, 16, 23, 0], [42, 7, 1, 0, 0, 0]]),
             "ids_segment_ids": np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 0, 0, 0]])}
    table = np.random.default_rng(3).normal(size=(50, 4)).astype(np.float32)

    def attend(x, mask):
        logits = tf.matmul(x, x, transpose_b=True) / 2.0
        return tf.matmul(tfseq.masked_softmax(logits, mask), x).numpy()

    packed = attend(table[batch["ids"]], segment_attention_mask(batch["ids_segment_ids"]))
    pieces = [packed[0, :3], packed[0, 3:5], packed[1, :3]]
    for ids, got in zip(data, pieces):
        x = table[np.array(ids)][None]
        np.testing.assert_allclose(got, attend(x, None)[0], atol=1e-5)
    np.testing.assert_allclose(packed[0, 5], 0.0)


def test_segment_mean_lines_up_with_per_segment_labels():
    values = tf.constant([[[1.0], [3.0], [10.0], [0.0]], [[2.0], [4.0], [6.0], [8.0]]])
    segment_ids = tf.constant([[1, 1, 2, 0], [1, 1, 1, 1]])
    assert segment_mean(values, segment_ids, 3).numpy().tolist() == [[[2.0], [10.0], [0.0]],
                                                                     [[5.0], [0.0], [0.0]]]


# --- bidirectional: the backward direction restarts at each segment's end

@pytest.mark.parametrize("kind", sorted(CELLS))
def test_bidirectional_packed_row_equals_a_bidirectional_rnn_over_each_segment(kind):
    x = np.random.default_rng(3).normal(size=(2, 7, DIM)).astype(np.float32)
    segment_ids = np.array([[1, 1, 1, 2, 2, 3, 0], [1, 1, 1, 1, 1, 1, 1]], np.int32)
    layer = ResettableRNN(CELLS[kind](), bidirectional=True)
    packed = layer(x, segment_ids=segment_ids).numpy()
    assert packed.shape == (2, 7, 12)
    assert packed[0, 6].tolist() == [0.0] * 12  # padding outputs zeros
    forward = keras.layers.RNN(layer.cell, return_sequences=True)
    backward = keras.layers.RNN(layer.backward_cell, return_sequences=True, go_backwards=True)
    for row, start, end in [(0, 0, 3), (0, 3, 5), (0, 5, 6), (1, 0, 7)]:
        alone = x[row:row + 1, start:end]
        expected = np.concatenate([forward(alone).numpy()[0],
                                   backward(alone).numpy()[0][::-1]], axis=-1)
        np.testing.assert_allclose(packed[row, start:end], expected, atol=1e-5, rtol=0)


def test_bidirectional_segment_ends_from_resets_and_mask_match_segment_ids():
    x = np.random.default_rng(4).normal(size=(1, 6, DIM)).astype(np.float32)
    layer = ResettableRNN(keras.layers.GRUCell(3), bidirectional=True)
    from_ids = layer(x, segment_ids=np.array([[1, 1, 2, 2, 2, 0]])).numpy()
    from_resets = layer(x, np.array([[1, 0, 1, 0, 0, 0]]),
                        mask=np.array([[1, 1, 1, 1, 1, 0]], bool)).numpy()
    np.testing.assert_allclose(from_resets, from_ids, atol=1e-6, rtol=0)
    # A padded row is one segment: the backward direction starts at the last real step.
    padded = layer(x[:, :2], mask=np.array([[True, True]])).numpy()
    np.testing.assert_allclose(from_ids[:, :2], padded, atol=1e-6, rtol=0)


def test_bidirectional_config_round_trip_save_load_and_bad_arguments(tmp_path):
    layer = ResettableRNN(keras.layers.GRUCell(4), bidirectional=True, name="birnn")
    clone = ResettableRNN.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config() and clone.bidirectional
    ids = keras.Input((None,), dtype="int32", name="ids")
    segment_ids = keras.Input((None,), dtype="int32", name="ids_segment_ids")
    x = keras.layers.Embedding(VOCAB, DIM)(ids)
    model = keras.Model({"ids": ids, "ids_segment_ids": segment_ids},
                        layer(x, segment_ids=segment_ids))
    batch = {"ids": np.array([[5, 6, 7, 8, 0]]), "ids_segment_ids": np.array([[1, 1, 2, 2, 0]])}
    path = str(tmp_path / "birnn.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    out = loaded.predict(batch, verbose=0)
    assert out.shape == (1, 5, 8)
    np.testing.assert_allclose(out, model.predict(batch, verbose=0), atol=1e-6)
    with pytest.raises(ValueError, match="returns sequences only"):
        ResettableRNN(keras.layers.GRUCell(4), bidirectional=True, return_state=True)
    with pytest.raises(ValueError, match="initial_state"):
        layer(np.zeros((1, 2, DIM), np.float32), initial_state=[np.zeros((1, 4), np.float32)])


def test_segment_pooling_modes_literal_and_config():
    from tfseq.layers import SegmentPooling
    values = np.array([[[1.0], [3.0], [-2.0], [9.0]]], np.float32)
    segment_ids = np.array([[1, 1, 2, 0]])
    expected = {"mean": [[[2.0], [-2.0], [0.0]]], "max": [[[3.0], [-2.0], [0.0]]],
                "sum": [[[4.0], [-2.0], [0.0]]]}
    for mode, want in expected.items():
        layer = SegmentPooling(3, mode=mode)
        assert layer(values, segment_ids).numpy().tolist() == want
        assert SegmentPooling.from_config(layer.get_config()).get_config() == layer.get_config()
    with pytest.raises(ValueError, match="mode"):
        SegmentPooling(3, mode="median")
    with pytest.raises(ValueError, match="num_segments"):
        SegmentPooling(0)
