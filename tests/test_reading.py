"""text_lines: files, globs, gzip, sharding, CRLF/BOM, and bad files."""

import gzip

import pytest
import tensorflow as tf

import tfseq
from conftest import to_list


def write(path, data: bytes):
    path.write_bytes(data)
    return str(path)


def test_plain_file_strips_crlf_and_bom(tmp_path):
    f = write(tmp_path / "a.txt", b"\xef\xbb\xbfone two\r\nthree\r\n\r\nfour")
    assert to_list(tfseq.text_lines(f)) == ["one two", "three", "", "four"]


def test_gzip_detected_by_suffix_and_given_explicitly(tmp_path):
    gz = write(tmp_path / "a.txt.gz", gzip.compress(b"x y\nz\n"))
    assert to_list(tfseq.text_lines(gz)) == ["x y", "z"]
    odd = write(tmp_path / "a.data", gzip.compress(b"p\nq\n"))
    assert to_list(tfseq.text_lines(odd, compression="gzip")) == ["p", "q"]


def test_many_files_and_globs_read_every_line_in_interleaved_order(tmp_path):
    write(tmp_path / "a.txt", b"a1\na2\na3\n")
    write(tmp_path / "b.txt.gz", gzip.compress(b"b1\nb2\n"))
    write(tmp_path / "c.txt", b"c1\n")
    lines = to_list(tfseq.text_lines(str(tmp_path / "*.txt*")))
    # Files sorted, interleaved one line at a time.
    assert lines == ["a1", "b1", "c1", "a2", "b2", "a3"]
    lines = to_list(tfseq.text_lines([str(tmp_path / "c.txt"), str(tmp_path / "a.txt")]))
    assert lines == ["c1", "a1", "a2", "a3"]


def test_shuffle_files_is_seeded_and_keeps_every_line(tmp_path):
    paths = [write(tmp_path / f"{i}.txt", f"{i}a\n{i}b\n".encode()) for i in range(6)]
    first = to_list(tfseq.text_lines(paths, shuffle_files=True, seed=1, num_parallel_reads=1))
    again = to_list(tfseq.text_lines(paths, shuffle_files=True, seed=1, num_parallel_reads=1))
    assert first == again
    assert sorted(first) == sorted(f"{i}{s}" for i in range(6) for s in "ab")
    assert first != [f"{i}{s}" for i in range(6) for s in "ab"]  # the order did change


def test_shards_by_file_and_by_line_cover_every_line_once(tmp_path):
    paths = [write(tmp_path / f"{i}.txt", f"{i}a\n{i}b\n{i}c\n".encode()) for i in range(3)]
    by_file = [to_list(tfseq.text_lines(paths, num_shards=3, shard_index=i)) for i in range(3)]
    assert by_file == [["0a", "0b", "0c"], ["1a", "1b", "1c"], ["2a", "2b", "2c"]]
    one = write(tmp_path / "one.txt", b"l0\nl1\nl2\nl3\nl4\n")
    by_line = [to_list(tfseq.text_lines(one, num_shards=2, shard_index=i)) for i in range(2)]
    assert by_line == [["l0", "l2", "l4"], ["l1", "l3"]]


def test_pattern_matching_nothing_raises_before_any_graph(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        tfseq.text_lines(str(tmp_path / "nothing-here*.txt"))
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        tfseq.text_lines(str(tmp_path / "missing.txt"))


def test_truncated_gzip_raises_naming_the_file(tmp_path):
    data = gzip.compress(b"hello world\n" * 20000)
    bad = write(tmp_path / "cut.txt.gz", data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.txt\.gz: truncated gzip"):
        tfseq.text_lines(bad)
    garbage = write(tmp_path / "junk.gz", b"this is not gzip")
    with pytest.raises(ValueError, match=r"junk\.gz: corrupt gzip"):
        tfseq.text_lines(garbage)


def test_concatenated_gzip_members_are_valid(tmp_path):
    f = write(tmp_path / "two.gz", gzip.compress(b"a\n") + gzip.compress(b"b\n"))
    assert to_list(tfseq.text_lines(f)) == ["a", "b"]


def test_empty_file_gives_no_lines(tmp_path):
    assert to_list(tfseq.text_lines(write(tmp_path / "e.txt", b""))) == []


@pytest.mark.parametrize("kwargs, match", [
    ({"compression": "zip"}, "compression"),
    ({"num_shards": 0}, "num_shards"),
    ({"num_shards": 2, "shard_index": 2}, "shard_index"),
    ({"num_parallel_reads": 0}, "num_parallel_reads"),
])
def test_bad_arguments(tmp_path, kwargs, match):
    f = write(tmp_path / "a.txt", b"a\n")
    with pytest.raises(ValueError, match=match):
        tfseq.text_lines(f, **kwargs)


def test_embedded_corpus_is_gzip_with_every_verse():
    ds = tfseq.text_lines(tfseq.corpus_path("kjv_en"))
    n = int(ds.reduce(tf.constant(0, tf.int64), lambda c, _: c + 1))
    assert n == 31102
    assert tfseq.corpus_path("rv1909_es").endswith("rv1909_es.tsv.gz")
    with pytest.raises(ValueError, match="Unknown corpus"):
        tfseq.corpus_path("latin")


# Plain files on the batched path are read in blocks of bytes and split in the graph; the
# batches must be exactly TextLineDataset's lines, batched per file.
TRICKY = (b"\xef\xbb\xbfbom first\r\nsecond \xc3\xa9\r\n\r\nlone\rcr\n" + b"x" * 700 + b"\n"
          + b"".join(b"line %d \xe2\x82\xac\n" % i for i in range(300)) + b"no newline at end")


# The short files (at most two lines) are one batch at 7 already, as at 512.
@pytest.mark.parametrize("content, batch_size", [
    (content, batch_size) for content in [TRICKY, TRICKY + b"\n", b"", b"\n", b"\n\n", b"a"]
    for batch_size in [1, 7, 512] if batch_size != 512 or len(content) > 2])
def test_block_reader_gives_the_line_readers_batches(tmp_path, monkeypatch, content,
                                                     batch_size):
    monkeypatch.setattr(tfseq.reading, "_BLOCK_BYTES", 64)  # lines span many blocks
    path = str(tmp_path / "f.txt")
    with open(path, "wb") as f:
        f.write(content)
    for kwargs, reference in [
            ({}, tf.data.TextLineDataset(path)),
            ({"header": True}, tf.data.TextLineDataset(path).skip(1)),
            ({"num_shards": 3, "shard_index": 1}, tf.data.TextLineDataset(path).shard(3, 1)),
            ({"num_shards": 2, "shard_index": 0, "header": True},
             tf.data.TextLineDataset(path).skip(1).shard(2, 0))]:
        got = to_list(tfseq.text_lines(path, batch_size=batch_size, **kwargs))
        want = to_list(reference.batch(batch_size).map(tfseq.reading._strip_bom))
        assert got == want, kwargs


def test_block_reader_interleaves_files_batch_by_batch(tmp_path, monkeypatch):
    monkeypatch.setattr(tfseq.reading, "_BLOCK_BYTES", 32)
    for name, n in [("a", 5), ("b", 0), ("c", 3)]:
        (tmp_path / f"{name}.txt").write_text("".join(f"{name}{i}\n" for i in range(n)))
    got = to_list(tfseq.text_lines(str(tmp_path / "*.txt"), batch_size=2))
    assert got == [["a0", "a1"], ["c0", "c1"], ["a2", "a3"], ["c2"], ["a4"]]
