"""pad_batch: dense + lengths, ragged, remainders, scalars."""

import pytest
import tensorflow as tf

import tfseq
from conftest import to_list


def examples(*seqs, label=False):
    def gen():
        for i, s in enumerate(seqs):
            yield ({"ids": s, "label": i} if label else {"ids": s})
    sig = {"ids": tf.TensorSpec([None], tf.int32)}
    if label:
        sig["label"] = tf.TensorSpec([], tf.int32)
    return tf.data.Dataset.from_generator(gen, output_signature=sig)


def test_dense_batches_padded_with_zero_plus_lengths():
    ds = examples([5, 6, 7], [8], [9, 10], label=True).apply(tfseq.pad_batch(2))
    assert to_list(ds) == [
        {"ids": [[5, 6, 7], [8, 0, 0]], "ids_length": [3, 1], "label": [0, 1]},
        {"ids": [[9, 10]], "ids_length": [2], "label": [2]},
    ]


def test_ragged_batches_have_no_length_key():
    ds = examples([5, 6, 7], [8], [9, 10]).apply(tfseq.pad_batch(2, ragged=True))
    batches = list(ds)
    assert isinstance(batches[0]["ids"], tf.RaggedTensor)
    assert to_list(ds) == [{"ids": [[5, 6, 7], [8]]}, {"ids": [[9, 10]]}]


def test_drop_remainder_is_opt_in():
    ds = examples([1], [2], [3])
    assert len(to_list(ds.apply(tfseq.pad_batch(2)))) == 2
    assert len(to_list(ds.apply(tfseq.pad_batch(2, drop_remainder=True)))) == 1


def test_pair_features_each_get_a_length():
    ds = tf.data.Dataset.from_generator(
        lambda: iter([{"source": [1, 2], "target": [3]}, {"source": [4], "target": [5, 6, 7]}]),
        output_signature={"source": tf.TensorSpec([None], tf.int32),
                          "target": tf.TensorSpec([None], tf.int32)})
    assert to_list(ds.apply(tfseq.pad_batch(2))) == [{
        "source": [[1, 2], [4, 0]], "source_length": [2, 1],
        "target": [[3, 0, 0], [5, 6, 7]], "target_length": [1, 3]}]


def test_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        tfseq.pad_batch(0)
    with pytest.raises(TypeError, match="batch_size"):
        tfseq.pad_batch(2.5)


def test_batch_stats_padding_efficiency():
    stats = tfseq.BatchStats()
    ds = examples([5, 6, 7], [8], [9, 10]).apply(tfseq.pad_batch(2)).apply(stats.track())
    to_list(ds)
    # Batch 1: 4 real tokens in 6 cells; batch 2: 2 in 2.
    assert stats.as_dict() == {"real_tokens": 6, "cells": 8, "examples": 3, "batches": 2,
                               "padding_efficiency": 0.75}


def test_step_efficiency():
    assert tfseq.step_efficiency(real_tokens=10_000, batches=4, max_tokens=4096) == 0.75
    assert tfseq.step_efficiency(real_tokens=0, batches=0, max_tokens=4096) == 0.0


def test_tally_counts_dict_and_tuple_elements():
    counter = tfseq.DropCounter()
    ds = tf.data.Dataset.from_tensor_slices(({"ids": [[1], [2], [3]]}, [0, 1, 0]))
    out = to_list(ds.apply(counter.tally("pairs")))
    assert out == [({"ids": [1]}, 0), ({"ids": [2]}, 1), ({"ids": [3]}, 0)]
    to_list(tf.data.Dataset.range(4).apply(counter.tally("numbers")))
    assert counter.seen() == {"numbers": 4, "pairs": 3}
