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


@settings(max_examples=4, deadline=None)  # each draw traces its own pipeline (~1.3 s)
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


@settings(max_examples=5, deadline=None)  # each draw traces its own pipeline (~1.3 s)
@given(lengths=st.lists(st.integers(0, 12), min_size=1, max_size=50),
       rows=st.integers(1, 9), max_length=st.integers(2, 12), multiple=st.sampled_from([2, 3, 4]),
       pool_size=st.integers(1, 12), shuffle=st.booleans())
def test_bucketing_batch_multiple_holds_across_pools_with_drops(lengths, rows, max_length,
                                                                multiple, pool_size, shuffle):
    # Small pools, drops in them: each pool's remainder is carried into the next, so every
    # batch but the last of the stream has a multiple of `multiple` rows, and the carried
    # tails come out exactly once when the stream ends.
    counter = tfseq.DropCounter()
    ds = _examples(lengths).batch(rows).apply(tfseq.bucket_by_length(
        max_tokens=12 * multiple, max_length=max_length, batch_multiple=multiple,
        pool_size=pool_size * multiple, shuffle=shuffle, seed=2, counter=counter))
    out = to_list(ds)
    kept = [i for i, n in enumerate(lengths) if n <= max_length]
    assert sorted(label for b in out for label in b["label"]) == kept
    assert counter.drops() == {"too_long": len(lengths) - len(kept)}
    assert all(len(b["label"]) % multiple == 0 for b in out[:-1])
    assert all(np.size(b["ids"]) <= 12 * multiple for b in out)


def test_bucketing_pools_by_tokens_and_carries_the_tail():
    # pool_tokens=10: a pool closes after the batch that brings it to >= 10 tokens. The first
    # ([4 4] + [3 3] = 14 tokens) is cut at 8 cells into [4 4] [3 3]: [4 4] goes out, the tail
    # [3 3] starts the second pool, which closes at [3 3] + [2 2] = 10 tokens: [3 3] goes out,
    # the tail [2 2] starts the third, which the end of the stream closes: [2 2 1 1].
    lengths = [4, 4, 3, 3, 2, 2, 1, 1]
    ds = _examples(lengths).batch(2).apply(tfseq.bucket_by_length(
        max_tokens=8, pool_tokens=10, shuffle=False))
    assert [b["ids_length"] for b in to_list(ds)] == [[4, 4], [3, 3], [2, 2, 1, 1]]


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
    # batches of 3 rows, pool_size 4: the first pool {1..6} closes at 6 >= 4 and is cut
    # [6] [5] [4 3] [2 1]; its last batch [2 1] and [4 3] (7 of 8 cells real, under 90%)
    # start the second pool {4, 3, 2, 1, 7, 8}, which the end of the stream closes:
    # [8] [7] [4 3] [2 1]. Without shuffling each pool's batches come out longest first.
    lengths = [1, 2, 3, 4, 5, 6, 7, 8]
    ds = _examples(lengths).batch(3)
    out = to_list(ds.apply(tfseq.bucket_by_length(max_tokens=8, pool_size=4, shuffle=False)))
    assert [b["ids_length"] for b in out] == [[6], [5], [8], [7], [4, 3], [2, 1]]


@pytest.mark.parametrize("seed", [None, 5])
def test_pack_ragged_batches_equals_examples(seed):
    lengths = [4, 5, 2, 1, 7, 3, 3, 6, 2]
    pack = lambda ds: ds.apply(tfseq.pack(8, batch_size=2, seed=seed))  # noqa: E731
    from_batches = to_list(pack(_examples(lengths).batch(64)))
    if seed is None:
        assert from_batches == to_list(pack(_per_example(_examples(lengths))))
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


@settings(max_examples=6, deadline=None)
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


def test_iterator_checkpoint_at_every_batch_resumes_bucketing_exactly(tmp_path):
    # 30 examples in batches of 4, pools of 10 with carried tails: checkpoints taken after
    # each batch, some while a tail waits in the scan state for the next pool.
    lengths = [1 + (i * 5) % 9 for i in range(30)]
    options = tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    make = lambda: _examples(lengths).batch(4).apply(tfseq.bucket_by_length(  # noqa: E731
        max_tokens=18, pool_size=10, seed=7)).with_options(options)
    expected_ds = make()
    expected = [b["label"] for b in to_list(expected_ds)]
    assert sorted(sum(expected, [])) == list(range(30)) and len(expected) >= 8
    it, paths = iter(make()), {}
    for position in range(1, len(expected)):  # one pass, a checkpoint after every batch
        next(it)
        paths[position] = tf.train.Checkpoint(iterator=it).write(
            str(tmp_path / f"ckpt{position}"))
    middle = len(expected) // 2
    for position, path in paths.items():
        # A fresh pipeline (as a restarted run builds) for one checkpoint; the others restore
        # into new iterators of the pipeline that gave `expected` (already read through once:
        # the checkpoint, not the pass count, decides what comes next).
        it2 = iter(make() if position == middle else expected_ds)
        tf.train.Checkpoint(iterator=it2).read(path).assert_consumed()
        assert [to_python(b)["label"] for b in it2] == expected[position:], position


@pytest.mark.parametrize("transform", ["bucket", "pack", "pack_lengths"])
def test_iterator_checkpoint_mid_pool_resumes_exactly(tmp_path, transform):
    # 60 examples in batches of 7, pools of 20: the checkpoint falls while a pool is
    # half-assembled in the scan's tensor lists (and packing's carried state).
    lengths = [1 + (i * 7) % 11 for i in range(60)]
    if transform == "bucket":
        make = lambda: _examples(lengths).batch(7).apply(tfseq.bucket_by_length(  # noqa: E731
            max_tokens=24, pool_size=20, seed=4))
    elif transform == "pack":
        make = lambda: _examples(lengths).batch(7).apply(tfseq.pack(  # noqa: E731
            12, batch_size=2, seed=4))
    else:  # rows of 4, 8 and 12
        make = lambda: _examples(lengths).batch(7).apply(tfseq.pack(  # noqa: E731
            [4, 8, 12], batch_size=2, seed=4, long_examples="drop"))
    key = "label"
    options = tf.data.Options()  # the drop counters are saved separately (as in tfseq.Trainer)
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    unsaved = make
    make = lambda: unsaved().with_options(options)  # noqa: E731
    expected_ds = make()
    expected = [b[key] for b in to_list(expected_ds)]
    it = iter(make())
    first = [to_python(next(it))[key] for _ in range(3)]
    ckpt = tf.train.Checkpoint(iterator=it)
    path = ckpt.write(str(tmp_path / "ckpt"))
    rest_before = [to_python(b)[key] for b in it]
    it2 = iter(expected_ds)  # read through once already: the checkpoint decides what follows
    tf.train.Checkpoint(iterator=it2).read(path).assert_consumed()
    rest_after = [to_python(b)[key] for b in it2]
    assert first + rest_before == expected
    assert rest_after == rest_before


def test_mark_last_flags_only_the_last_element_and_keeps_structure():
    from tfseq._common import mark_last

    assert to_list(mark_last(tf.data.Dataset.range(3))) == [(False, 0), (False, 1), (True, 2)]
    assert to_list(mark_last(tf.data.Dataset.range(0))) == []
    ds = _examples([2, 0, 3]).batch(2)
    assert to_list(mark_last(ds)) == [(False, x) for x in to_list(ds)[:1]] + [(True, to_list(ds)[1])]


def test_lazy_cond_keeps_its_branches_as_functions_and_computes_tf_cond():
    from tfseq._common import lazy_cond

    def f(x):
        return lazy_cond(x > 2, lambda: x * 10, lambda: x - 1)

    graph = tf.function(f).get_concrete_function(tf.TensorSpec([], tf.int64)).graph
    (op,) = [o for o in graph.get_operations() if o.type in ("If", "StatelessIf")]
    assert op.get_attr("_lower_using_switch_merge") is False
    # In a dataset map (where it is used), eagerly, and both branches.
    assert to_list(tf.data.Dataset.range(5).map(f)) == [-1, 0, 1, 30, 40]
    assert [int(f(tf.constant(v, tf.int64))) for v in (1, 3)] == [0, 30]


@pytest.mark.parametrize("transform", ["bucket", "pack"])
def test_through_the_data_service_every_workers_tail_is_flushed(tmp_path, transform):
    # Two workers, four files read in batches: each worker's stream ends with a part-filled
    # pool (and a carried tail) that must come out. A marker appended with `concatenate`
    # would be a split of its own on the service and reach at most one worker.
    lines, paths = [], []
    for f in range(4):
        file_lines = [f"w{f}_{i} " + "x " * (i % 13) for i in range(100)]
        (tmp_path / f"{f}.txt").write_text("\n".join(file_lines) + "\n")
        paths.append(str(tmp_path / f"{f}.txt"))
        lines += file_lines
    vocab = tfseq.Vocab(["<pad>", "<unk>", "<s>", "</s>", "x"] + [l.split()[0] for l in lines])
    service = tf.data.experimental.service
    dispatcher = service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    workers = [service.WorkerServer(service.WorkerConfig(dispatcher_address=address))
               for _ in range(2)]
    ds = tfseq.text_lines(paths, batch_size=64).apply(tfseq.tokenize(vocab))
    if transform == "bucket":
        ds = ds.apply(tfseq.bucket_by_length(max_tokens=128, max_length=16, seed=0))
    else:
        ds = ds.apply(tfseq.pack(16, max_tokens=128, seed=0))
    first_ids = []  # each line's first token is its own id (5, 6, ...); "x" is id 4
    for batch in tfseq.use_data_service(ds, dispatcher.target):
        first_ids += [i for i in batch["ids"].numpy().ravel().tolist() if i >= 5]
    assert sorted(first_ids) == list(range(5, 5 + len(lines)))
    del workers
