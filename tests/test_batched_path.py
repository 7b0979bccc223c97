"""The batched path: ragged batches of examples go through bucketing, packing and padding
with the same results as one example at a time, and text_lines(batch_size=n) reads every line
once."""

import collections
import gzip

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import tfseq
from conftest import to_list, to_python


def _examples(lengths):
    """Examples {"ids": [label+1] * n, "label": i}: ids tell the example apart."""
    ids = tf.ragged.constant([[i + 1] * n for i, n in enumerate(lengths)], dtype=tf.int32)
    return tf.data.Dataset.from_tensor_slices({"ids": ids, "label": tf.range(len(lengths))})


def _per_example(ds):
    return ds.map(lambda e: e)  # ragged-rank-0 rows -> TensorSpec([None]) examples


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(0, 12), min_size=1, max_size=40),
       rows=st.integers(1, 9), max_length=st.integers(1, 12))
def test_bucketing_ragged_batches_emits_each_example_once(lengths, rows, max_length):
    counter = tfseq.DropCounter()
    ds = _examples(lengths).batch(rows).apply(tfseq.bucket_by_length(
        max_tokens=24, max_length=max_length, pool_size=10, seed=3, counter=counter))
    labels = []
    for batch in to_list(ds):
        ids = np.array(batch["ids"])
        assert ids.size <= 24
        for row, label, n in zip(ids, batch["label"], batch["ids_length"]):
            assert n == lengths[label] and list(row[:n]) == [label + 1] * n
            assert not row[n:].any()
            labels.append(label)
    expected = [i for i, n in enumerate(lengths) if n <= max_length]
    assert sorted(labels) == expected
    assert counter.drops() == {"too_long": len(lengths) - len(expected)}


def test_bucketing_ragged_batches_equals_examples_when_one_pool():
    lengths = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]
    make = lambda ds: ds.apply(tfseq.bucket_by_length(  # noqa: E731
        max_tokens=16, max_length=8, pool_size=64, shuffle=False))
    from_batches = to_list(make(_examples(lengths).batch(5)))
    from_examples = to_list(make(_per_example(_examples(lengths))))
    assert from_batches == from_examples
    assert [b["ids_length"] for b in from_batches] == [[8, 6], [5, 5, 5], [4, 3, 3, 2],
                                                       [1, 1]]


def test_bucketing_pools_whole_ragged_batches_until_pool_size():
    # batches of 3 rows, pool_size 4: pools {1..6} (closed at 6 >= 4) and {7, 8}; lengths
    # never mix across pools, so each pool's batches come out longest first.
    lengths = [1, 2, 3, 4, 5, 6, 7, 8]
    ds = _examples(lengths).batch(3)
    out = to_list(ds.apply(tfseq.bucket_by_length(max_tokens=8, pool_size=4, shuffle=False)))
    assert [b["ids_length"] for b in out] == [[6], [5], [4, 3], [2, 1], [8], [7]]


@pytest.mark.parametrize("seed", [None, 5])
def test_pack_ragged_batches_equals_examples(seed):
    lengths = [4, 5, 2, 1, 7, 3, 3, 6, 2]
    pack = lambda ds: ds.apply(tfseq.pack(8, batch_size=2, seed=seed))  # noqa: E731
    from_batches = to_list(pack(_examples(lengths).batch(64)))
    from_examples = to_list(pack(_per_example(_examples(lengths))))
    if seed is None:
        assert from_batches == from_examples
    segments = [s for b in from_batches for row in b["label"] for s in row]
    ids = [t for b in from_batches for t in np.ravel(b["ids"]) if t]
    assert collections.Counter(ids) == collections.Counter(
        {i + 1: n for i, n in enumerate(lengths)})
    assert sum(1 for b in from_batches for row in b["ids_resets"] for r in row if r) == 9
    assert len(segments) >= 9


def test_pad_batch_unbatches_ragged_batches():
    lengths = [2, 0, 3, 1, 1]
    out = to_list(_examples(lengths).batch(3).apply(tfseq.pad_batch(2)))
    assert out == [{"ids": [[1, 1], [0, 0]], "ids_length": [2, 0], "label": [0, 1]},
                   {"ids": [[3, 3, 3], [4, 0, 0]], "ids_length": [3, 1], "label": [2, 3]},
                   {"ids": [[5]], "ids_length": [1], "label": [4]}]


def test_tokenize_batched_lines_gives_ragged_batches():
    vocab = tfseq.Vocab(["<pad>", "<unk>", "<s>", "</s>", "a", "b"])
    ds = tf.data.Dataset.from_tensor_slices(["a b", "b", "", "zz a"]).batch(3)
    out = to_list(ds.apply(tfseq.tokenize(vocab, add_eos=True)))
    assert out == [{"ids": [[4, 5, 3], [5, 3], [3]]}, {"ids": [[1, 4, 3]]}]
    pairs = tf.data.Dataset.from_tensor_slices({"text": ["b a", "a"], "label": [7, 8]}).batch(2)
    out = to_list(pairs.apply(tfseq.tokenize(vocab, key="text")))
    assert out == [{"text": [[5, 4], [4]], "label": [7, 8]}]


def test_tally_rows_counts_lines_in_batches():
    counter = tfseq.DropCounter()
    ds = tf.data.Dataset.from_tensor_slices(["a", "b", "c", "d", "e"]).batch(2)
    to_list(ds.apply(counter.tally("lines", rows=True)))
    ragged = _examples([1, 2, 3]).batch(2).apply(counter.tally("examples", rows=True))
    to_list(ragged)
    assert counter.seen() == {"lines": 5, "examples": 3}


def test_text_lines_batches_keep_file_order_and_strip_bom(tmp_path):
    path = tmp_path / "a.txt.gz"
    path.write_bytes(gzip.compress("\ufeffone\r\ntwo\nthree\nfour\nfive".encode()))
    out = to_list(tfseq.text_lines(str(path), batch_size=2))
    assert out == [["one", "two"], ["three", "four"], ["five"]]


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(0, 7), min_size=1, max_size=4),
       num_shards=st.integers(1, 5), batch_size=st.integers(1, 4), shuffle=st.booleans())
def test_text_lines_batches_cover_every_line_once(tmp_path_factory, sizes, num_shards,
                                                  batch_size, shuffle):
    tmp = tmp_path_factory.mktemp("batched")
    paths, lines = [], []
    for f, n in enumerate(sizes):
        file_lines = [f"f{f} l{i}" for i in range(n)]
        (tmp / f"{f}.txt").write_text("".join(line + "\n" for line in file_lines))
        paths.append(str(tmp / f"{f}.txt"))
        lines += file_lines
    seen = []
    for shard in range(num_shards):
        for batch in to_list(tfseq.text_lines(paths, batch_size=batch_size, shuffle_files=shuffle,
                                              seed=1, num_shards=num_shards, shard_index=shard)):
            assert 1 <= len(batch) <= batch_size
            assert len({line.split()[0] for line in batch}) == 1  # one file per batch
            seen += batch
    assert sorted(seen) == sorted(lines)


@pytest.mark.parametrize("transform", ["bucket", "pack"])
def test_iterator_checkpoint_mid_pool_resumes_exactly(tmp_path, transform):
    # 60 examples in batches of 7, pools of 20: the checkpoint falls while a pool is
    # half-assembled in the scan's tensor lists (and packing's carried state).
    lengths = [1 + (i * 7) % 11 for i in range(60)]
    if transform == "bucket":
        make = lambda: _examples(lengths).batch(7).apply(tfseq.bucket_by_length(  # noqa: E731
            max_tokens=24, pool_size=20, seed=4))
    else:
        make = lambda: _examples(lengths).batch(7).apply(tfseq.pack(  # noqa: E731
            12, batch_size=2, seed=4))
    key = "label"
    options = tf.data.Options()  # the drop counters are saved separately (as in tfseq.Trainer)
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    unsaved = make
    make = lambda: unsaved().with_options(options)  # noqa: E731
    expected = [b[key] for b in to_list(make())]
    it = iter(make())
    first = [to_python(next(it))[key] for _ in range(3)]
    ckpt = tf.train.Checkpoint(iterator=it)
    path = ckpt.write(str(tmp_path / "ckpt"))
    rest_before = [to_python(b)[key] for b in it]
    it2 = iter(make())
    tf.train.Checkpoint(iterator=it2).read(path).assert_consumed()
    rest_after = [to_python(b)[key] for b in it2]
    assert first + rest_before == expected
    assert rest_after == rest_before
