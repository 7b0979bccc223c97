"""filter_lines / filter_by_length: bad lines counted by reason, nothing silently lost."""

import gzip

import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import tfseq
from conftest import to_list


def test_filter_lines_counts_each_reason():
    counter = tfseq.DropCounter()
    raw = [b"ok line", b"", b"   \t ", b"bad \xff\xfe utf8", b"nul\x00byte", b"x" * 50, b"fine"]
    ds = tf.data.Dataset.from_tensor_slices(raw).apply(
        tfseq.filter_lines(max_line_bytes=40, counter=counter))
    assert to_list(ds) == ["ok line", "fine"]
    assert counter.drops() == {"empty": 2, "invalid_utf8": 1, "nul_byte": 1, "too_many_bytes": 1}


def test_filter_lines_on_a_dict_key():
    counter = tfseq.DropCounter()
    ds = tf.data.Dataset.from_tensor_slices({"text": ["a", ""], "label": [1, 2]})
    ds = ds.apply(tfseq.filter_lines(key="text", counter=counter))
    assert to_list(ds) == [{"text": "a", "label": 1}]
    assert counter.drops()["empty"] == 1


def test_filter_by_length_counts_short_and_long():
    counter = tfseq.DropCounter()
    ds = tf.data.Dataset.from_generator(
        lambda: ({"ids": [7] * n} for n in [0, 2, 5, 9]),
        output_signature={"ids": tf.TensorSpec([None], tf.int32)})
    ds = ds.apply(tfseq.filter_by_length(min_length=1, max_length=5, counter=counter))
    assert [len(e["ids"]) for e in to_list(ds)] == [2, 5]
    assert counter.drops() == {"too_long": 1, "too_short": 1}


def test_filter_by_length_uses_max_over_pair_features():
    counter = tfseq.DropCounter()
    ds = tf.data.Dataset.from_generator(
        lambda: iter([{"source": [1, 2], "target": [1, 2, 3, 4]}, {"source": [1], "target": [2]}]),
        output_signature={"source": tf.TensorSpec([None], tf.int32),
                          "target": tf.TensorSpec([None], tf.int32)})
    out = to_list(ds.apply(tfseq.filter_by_length(max_length=3, counter=counter)))
    assert out == [{"source": [1], "target": [2]}]
    assert counter.drops()["too_long"] == 1


def test_filter_by_length_identity_and_errors():
    assert tfseq.filter_by_length(min_length=0) is tfseq._common.identity
    with pytest.raises(ValueError, match="max_length"):
        tfseq.filter_by_length(min_length=5, max_length=2)
    ds = tf.data.Dataset.from_tensor_slices({"label": [1]})
    with pytest.raises(ValueError, match="no sequence feature"):
        ds.apply(tfseq.filter_by_length(max_length=3))


def _pipeline(paths, counter, vocab, **read_kwargs):
    """Examples, read one line at a time or (``batch_size=n``) through the batched path."""
    batched = read_kwargs.get("batch_size") is not None
    ds = tfseq.text_lines(paths, **read_kwargs).apply(counter.tally("lines_read", rows=batched))
    ds = ds.apply(tfseq.filter_lines(max_line_bytes=1 << 20, counter=counter))
    ds = ds.apply(tfseq.tokenize(vocab))
    ds = ds.apply(tfseq.filter_by_length(max_length=4, counter=counter))
    return tfseq.unbatch(ds) if batched else ds


def test_batched_lines_filter_as_batches_and_stay_batches():
    counter = tfseq.DropCounter()
    raw = [b"ok line", b"", b"bad \xff", b"fine", b"nul\x00", b"x" * 50]
    ds = tf.data.Dataset.from_tensor_slices(raw).batch(4).apply(
        tfseq.filter_lines(max_line_bytes=40, counter=counter))
    assert ds.element_spec.shape.as_list() == [None]
    assert to_list(ds) == [["ok line", "fine"], []]
    assert counter.drops() == {"empty": 1, "invalid_utf8": 1, "nul_byte": 1, "too_many_bytes": 1}
    counter = tfseq.DropCounter()
    ds = tf.data.Dataset.from_tensor_slices({"text": ["a", "", "b"], "label": [1, 2, 3]}).batch(3)
    ds = ds.apply(tfseq.filter_lines(key="text", counter=counter))
    assert to_list(ds) == [{"text": ["a", "b"], "label": [1, 3]}]
    assert counter.drops()["empty"] == 1


def test_filter_by_length_on_ragged_batches():
    counter = tfseq.DropCounter()
    ds = tf.data.Dataset.from_tensor_slices(
        {"ids": tf.ragged.constant([[], [7, 7], [7] * 5, [7] * 9]), "label": [0, 1, 2, 3]})
    out = to_list(ds.batch(3).apply(tfseq.filter_by_length(min_length=1, max_length=5,
                                                            counter=counter)))
    assert out == [{"ids": [[7, 7], [7] * 5], "label": [1, 2]}, {"ids": [], "label": []}]
    assert counter.drops() == {"too_long": 1, "too_short": 1}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=12), min_size=1, max_size=20))
def test_line_checks_match_pythons_utf8_decoder(lines):
    checks = tfseq.filtering.line_checks(tf.constant(lines), None)
    for i, line in enumerate(lines):
        try:
            text = line.decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            valid = False
        assert bool(checks["invalid_utf8"][i]) == (not valid), line
        assert bool(checks["nul_byte"][i]) == (valid and "\0" in text), line
        if valid and "\0" not in text:
            assert bool(checks["empty"][i]) == (text.strip(" \t\n\r\f") == ""), line


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=12), min_size=1, max_size=20))
def test_valid_utf8_is_pythons_decoder_nul_allowed(lines):
    expected = []
    for line in lines:
        try:
            line.decode("utf-8")
            expected.append(True)
        except UnicodeDecodeError:
            expected.append(False)
    assert tfseq.filtering.valid_utf8(tf.constant(lines)).numpy().tolist() == expected


def test_valid_utf8_on_tricky_bytes():
    lines = [b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80", b"\xff", b"\xc3",
             b"a\x00b", "é€𝄞".encode(), "\ufffd".encode(), b""]
    assert tfseq.filtering.valid_utf8(tf.constant(lines)).numpy().tolist() == (
        [False] * 5 + [True] * 4)


def test_line_checks_on_tricky_utf8():
    lines = [b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80", b"\xe0\x80\x80",
             "é€𝄞".encode(), b"\xef\xbf\xbf", b"a\nb\r", b"\x00"]
    checks = tfseq.filtering.line_checks(tf.constant(lines), None)
    # surrogate, overlong 2- and 3-byte forms, above U+10FFFF: invalid; the rest valid
    assert checks["invalid_utf8"].numpy().tolist() == [True] * 4 + [False] * 4
    assert checks["nul_byte"].numpy().tolist() == [False] * 7 + [True]
    scalar = tfseq.filtering.line_checks(tf.constant(b"a\x00"), 10)
    assert scalar["nul_byte"].shape == [] and bool(scalar["nul_byte"])


def test_line_checks_whitespace_and_each_reason_alone():
    # Good lines pass one regex; the others are checked reason by reason. \v is not RE2
    # whitespace (the "empty" check is `\s*`), so a line of it is kept.
    lines = [b" \t\r\n\f", b"\x0b", b" a ", b" \x00 ", b"\xff ", b"", b"x" * 12]
    checks = tfseq.filtering.line_checks(tf.constant(lines), 10)
    assert {k: v.numpy().tolist() for k, v in checks.items()} == {
        "too_many_bytes": [False, False, False, False, False, False, True],
        "invalid_utf8":   [False, False, False, False, True, False, False],
        "nul_byte":       [False, False, False, True, False, False, False],
        "empty":          [True, False, False, False, False, True, True],
    }


@pytest.mark.parametrize("batch_size", [None, 2])
def test_bad_files_end_to_end(tmp_path, batch_size):
    """Blank-only file, invalid UTF-8, NUL, CRLF, BOM and a 5 MB line: counted, not crashed."""
    (tmp_path / "blank.txt").write_bytes(b"\n\n  \n")
    (tmp_path / "mixed.txt").write_bytes(
        b"\xef\xbb\xbfa b\r\nbad\xffbyte\r\nnul\x00here\r\n" + b"w " * 2_500_000 + b"\nc d e f g\n")
    (tmp_path / "empty.txt").write_bytes(b"")
    vocab = tfseq.Vocab(["<pad>", "<unk>", "<s>", "</s>", "a", "b"])
    counter = tfseq.DropCounter()
    out = to_list(_pipeline(str(tmp_path / "*.txt"), counter, vocab, batch_size=batch_size))
    assert out == [{"ids": [4, 5]}]
    assert counter.seen() == {"lines_read": 8}
    assert counter.drops() == {"empty": 3, "invalid_utf8": 1, "nul_byte": 1,
                               "too_long": 1, "too_many_bytes": 1, "too_short": 0}


TOKENS = [b"a", b"b", b"c", b"ab", "é".encode(), b"\xff", b"x\x00y", b"zz"]
LINE = st.lists(st.tuples(st.sampled_from(TOKENS), st.sampled_from([b" ", b"\t", b"  "])),
                max_size=6).map(lambda parts: b"".join(t + sep for t, sep in parts))


def _expected_ids(line: bytes, vocab):
    """The ids a kept line must give, or None when the line must be dropped."""
    if b"\x00" in line:
        return None
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return None
    words = line.split()
    if not 1 <= len(words) <= 4:
        return None
    index = {t: i for i, t in enumerate(vocab.tokens)}
    return tuple(index.get(w.decode(), 1) for w in words)


@settings(max_examples=12, deadline=None)
@given(files=st.lists(st.lists(LINE, max_size=8), min_size=1, max_size=4),
       shuffle=st.booleans(), num_shards=st.integers(1, 3), gz=st.booleans(),
       batch_size=st.sampled_from([None, 1, 3]))
def test_exactly_once_lines_in_equal_examples_out_plus_drops(tmp_path_factory, files, shuffle,
                                                               num_shards, gz, batch_size):
    tmp = tmp_path_factory.mktemp("lines")
    paths = []
    for i, file_lines in enumerate(files):
        data = b"".join(line + b"\n" for line in file_lines)
        path = tmp / (f"{i}.txt.gz" if gz else f"{i}.txt")
        path.write_bytes(gzip.compress(data) if gz else data)
        paths.append(str(path))
    vocab = tfseq.Vocab(["<pad>", "<unk>", "<s>", "</s>", "a", "b", "c", "ab"])
    total_in = sum(len(f) for f in files)
    total_dropped = total_read = 0
    emitted = []
    for shard in range(num_shards):
        counter = tfseq.DropCounter()
        emitted += to_list(_pipeline(paths, counter, vocab, shuffle_files=shuffle, seed=7,
                                     num_shards=num_shards, shard_index=shard,
                                     batch_size=batch_size))
        total_dropped += counter.total_dropped()
        total_read += counter.seen()["lines_read"]
    assert total_read == total_in
    assert len(emitted) + total_dropped == total_in
    expected = [_expected_ids(line, vocab) for f in files for line in f]
    assert sorted(tuple(e["ids"]) for e in emitted) == sorted(e for e in expected if e is not None)
