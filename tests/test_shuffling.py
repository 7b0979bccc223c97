"""text_lines(shuffle_lines=True): exactly once, reshuffled per epoch, seeded, checkpointable, mixed."""

import gzip
import json
import os

import pytest
import tensorflow as tf

import tfseq


def write(path, data: bytes):
    path.write_bytes(data)
    return str(path)


def numbered(tmp_path, n=300, name="a.txt"):
    return write(tmp_path / name, "".join(f"l{i}\n" for i in range(n)).encode())


def epoch(ds):
    """One pass: the lines in order, as Python strings (batches flattened)."""
    out = []
    for x in ds:
        out.extend(v.decode() for v in tf.reshape(x, [-1]).numpy())
    return out


# 4 shards of about 350 bytes each (1,390 bytes): the multi-shard path on a small file.
SMALL_SHARDS = {"shuffle_shard_bytes": 400}


@pytest.mark.parametrize("kwargs", [{}, SMALL_SHARDS])
def test_every_line_exactly_once_and_a_new_order_each_epoch(tmp_path, kwargs):
    f = numbered(tmp_path)
    ds = tfseq.text_lines(f, batch_size=32, shuffle_lines=True, seed=5, **kwargs)
    first, second = epoch(ds), epoch(ds)
    expected = sorted(f"l{i}" for i in range(300))
    assert sorted(first) == expected
    assert sorted(second) == expected
    assert first != second
    assert first != [f"l{i}" for i in range(300)]
    assert all(0 < len(b) <= 32 for b in ds.as_numpy_iterator())


def test_same_seed_same_order_other_seed_other_order(tmp_path):
    f = numbered(tmp_path)

    def two_epochs(seed):
        ds = tfseq.text_lines(f, batch_size=32, shuffle_lines=True, seed=seed, **SMALL_SHARDS)
        return epoch(ds) + epoch(ds)

    seven = two_epochs(7)
    assert two_epochs(7) == seven
    assert two_epochs(8) != seven


@pytest.mark.parametrize("kwargs", [{}, SMALL_SHARDS])
@pytest.mark.parametrize("epochs_before", [0, 1])
def test_checkpoint_mid_epoch_resumes_exactly(tmp_path, kwargs, epochs_before):
    f = numbered(tmp_path)
    ds = tfseq.text_lines(f, batch_size=16, shuffle_lines=True, seed=3, **kwargs)
    for _ in range(epochs_before):  # one shard: the second epoch comes from the kept lines
        epoch(ds)
    it = iter(ds)
    head = [next(it).numpy().tolist() for _ in range(7)]
    path = tf.train.Checkpoint(iterator=it).save(str(tmp_path / "ckpt"))
    rest = [b.numpy().tolist() for b in it]
    restored = iter(ds)
    tf.train.Checkpoint(iterator=restored).restore(path)
    assert [b.numpy().tolist() for b in restored] == rest
    assert sorted(x.decode() for b in head + rest for x in b) == sorted(
        f"l{i}" for i in range(300))


def test_one_shard_is_read_in_the_first_epoch_only(tmp_path):
    f = numbered(tmp_path)
    ds = tfseq.text_lines(f, batch_size=32, shuffle_lines=True, seed=5)
    first = epoch(ds)
    os.remove(f)  # later epochs permute the lines kept from the first read
    second, third = epoch(ds), epoch(ds)
    expected = sorted(f"l{i}" for i in range(300))
    assert sorted(second) == expected and sorted(third) == expected
    assert len({tuple(first), tuple(second), tuple(third)}) == 3


def test_several_shards_are_spilled_once_and_read_from_disk(tmp_path):
    f = numbered(tmp_path, name="b.txt")
    spill = tmp_path / "spill"
    ds = tfseq.text_lines(f, batch_size=32, shuffle_lines=True, seed=5, shuffle_dir=str(spill),
                          **SMALL_SHARDS)
    os.remove(f)  # the input was read once, when the dataset was built
    (directory,) = spill.iterdir()
    assert sorted(p.name for p in directory.iterdir()) == ["manifest.json"] + [
        f"shard-{k:05d}-of-00004.tfrecord" for k in range(4)]
    manifest = json.loads((directory / "manifest.json").read_text())
    assert (manifest["num_shards"], manifest["seed"], sum(manifest["sizes"])) == (4, 5, 300)
    epochs = [epoch(ds) for _ in range(3)]
    expected = sorted(f"l{i}" for i in range(300))
    assert all(sorted(e) == expected for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3


def test_several_shards_built_in_a_graph_read_the_input_per_shard(tmp_path):
    # Inside a tf.function nothing can be spilled: each epoch reads the input once per shard.
    f = numbered(tmp_path)

    @tf.function
    def line_numbers():
        ds = tfseq.text_lines(f, batch_size=32, shuffle_lines=True, seed=5, **SMALL_SHARDS)
        ds = ds.map(lambda b: tf.strings.to_number(tf.strings.substr(b, 1, 9), tf.int64))
        return ds.reduce((tf.constant(0, tf.int64), tf.constant(0, tf.int64)),
                         lambda acc, b: (acc[0] + tf.size(b, out_type=tf.int64),
                                         acc[1] + tf.reduce_sum(b)))

    count, total = line_numbers()
    assert (int(count), int(total)) == (300, 299 * 300 // 2)


def test_an_epoch_is_the_record_shards_order_of_a_drawn_epoch_number(tmp_path):
    # text_lines' shuffle is the training stream's engine: each iteration draws an epoch number
    # from the seed and emits that epoch of RecordShards (here unspilled: the same shards).
    f = numbered(tmp_path)
    ds = tfseq.text_lines(f, batch_size=32, shuffle_lines=True, seed=5, **SMALL_SHARDS)
    keys = [int(k) for k in tfseq.shuffling.epoch_key(5).repeat(2)]
    assert keys[0] != keys[1] and all(0 <= k < 2**30 for k in keys)
    shards = tfseq.RecordShards(lambda: tfseq.text_lines(f, batch_size=8192), num_shards=4,
                                seed=5)
    for key in keys:
        expected = [b.numpy().tolist() for b, *_ in shards.epoch_batches(key, 0, 0, 32)]
        assert [b.numpy().tolist() for b in ds] == expected


def test_label_sorted_file_comes_out_mixed(tmp_path):
    # 15 labels x 100 lines, sorted by label. Unshuffled, a 64-line batch holds 1 or 2 labels;
    # a perfect shuffle puts 14 to 15 in each (fewer than 9 has probability < 1e-6 per batch).
    lines = "".join(f"{label}\tx\n" for label in range(15) for _ in range(100))
    f = write(tmp_path / "sorted.tsv", lines.encode())
    plain = tfseq.text_lines(f, batch_size=64)
    assert max(len({x.split(b"\t")[0] for x in b}) for b in plain.as_numpy_iterator()) == 2
    for kwargs in ({}, SMALL_SHARDS):
        ds = tfseq.text_lines(f, batch_size=64, shuffle_lines=True, seed=0, **kwargs)
        labels = [len({x.split(b"\t")[0] for x in b}) for b in ds.as_numpy_iterator()
                  if len(b) == 64]
        assert len(labels) >= 15
        assert min(labels) >= 9


def test_unbatched_and_gzip(tmp_path):
    f = write(tmp_path / "a.txt.gz", gzip.compress(b"a\nb\nc\nd\n"))
    ds = tfseq.text_lines(f, shuffle_lines=True, seed=1)
    assert ds.element_spec == tf.TensorSpec([], tf.string)
    assert sorted(epoch(ds)) == ["a", "b", "c", "d"]


def test_many_files_and_worker_shards_cover_every_line_once(tmp_path):
    files = [numbered(tmp_path, 50, "a.txt"),
             write(tmp_path / "b.txt", "".join(f"m{i}\n" for i in range(50)).encode())]
    got = []
    for index in range(2):
        got += epoch(tfseq.text_lines(files, batch_size=8, shuffle_lines=True, seed=2,
                                      num_shards=2, shard_index=index))
    assert sorted(got) == sorted([f"l{i}" for i in range(50)] + [f"m{i}" for i in range(50)])


def test_empty_and_missing_files(tmp_path):
    empty = write(tmp_path / "e.txt", b"")
    assert epoch(tfseq.text_lines(empty, batch_size=8, shuffle_lines=True, seed=0)) == []
    assert epoch(tfseq.text_lines(empty, shuffle_lines=True, seed=0)) == []
    with pytest.raises(FileNotFoundError, match="nope"):
        tfseq.text_lines(str(tmp_path / "nope*.txt"), batch_size=8, shuffle_lines=True)
    with pytest.raises(ValueError, match="shuffle_shard_bytes"):
        tfseq.text_lines(empty, shuffle_lines=True, shuffle_shard_bytes=0)


def test_shard_count_follows_input_size(tmp_path):
    f = numbered(tmp_path, 1000)  # 4,890 bytes
    assert tfseq.shuffling.num_shuffle_shards([f], [""], 64 << 20) == 1
    assert tfseq.shuffling.num_shuffle_shards([f], [""], 1000) == 5
    assert tfseq.shuffling.num_shuffle_shards([f], ["GZIP"], 1000) == 20


# ----------------------------------------------------------------------------- one engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = "tfseq/shuffling.py"
# The shuffle engine's pieces: (what marks one in the source, text its next 200 characters
# must hold, or None). Each is written once, in the engine, for every user of the shuffle.
ENGINE_PIECES = {
    "shard file name": (r"shard-\{", None),
    "stateless shard draw": (r"stateless_uniform\(", "num_shards"),
    "per-epoch shard order": (r"stateless_shuffle\(", "num_shards"),
    "stateless seed of (seed, epoch, ...)": (r"0x5EED", None),
    "gzip ratio": (r"GZIP_RATIO\s*=\s*\d", None),
    "spill writer": (r"TFRecordWriter\(", None),
}


def engine_pieces(root):
    """{piece: [(path, line)]}: where each piece of the engine is written under ``root``."""
    import re

    found = {name: [] for name in ENGINE_PIECES}
    for top in ("tfseq", "pipelines", "scripts"):
        for directory, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(n for n in names if n.endswith(".py")):
                path = os.path.join(directory, name)
                text = open(path, encoding="utf-8").read()
                for piece, (pattern, near) in ENGINE_PIECES.items():
                    for m in re.finditer(pattern, text):
                        if near is None or near in text[m.end():m.end() + 200]:
                            found[piece].append((os.path.relpath(path, root),
                                                 text.count("\n", 0, m.start()) + 1))
    return found


def test_the_shuffle_engine_is_written_once():
    found = engine_pieces(ROOT)
    assert {piece: [path for path, _ in places] for piece, places in found.items()} == {
        piece: [ENGINE] for piece in ENGINE_PIECES}, found
