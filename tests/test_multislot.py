"""tfseq.multislot: worked examples, every bad-line kind, exactly-once, pipe_command."""

import collections
import gzip
import itertools
import os
import stat

import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfseq
from conftest import to_list, to_python
from tfseq import multislot
from tfseq.multislot import Slot

SLOTS = [Slot("click", "uint64", "dense", (1,)), Slot("words"), Slot("price", "float", "dense", (2,))]
GOOD = ["1 1 3 7 8 9 2 0.5 1.5", "1 0 0 2 2.0 -1", "1 1 1 42 2 1e3 0"]
GOOD_EXAMPLES = [
    {"click": [1], "words": [7, 8, 9], "price": [0.5, 1.5]},
    {"click": [0], "words": [], "price": [2.0, -1.0]},
    {"click": [1], "words": [42], "price": [1000.0, 0.0]},
]


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def _no_drops():
    return {reason: 0 for reason in multislot.REASONS}


def test_worked_example_examples(tmp_path):
    ds = multislot.read(_write(tmp_path / "a.txt", GOOD), SLOTS)
    assert ds.element_spec == {
        "click": tf.TensorSpec([1], tf.int64),
        "words": tf.TensorSpec([None], tf.int64),
        "price": tf.TensorSpec([2], tf.float32),
    }
    assert to_list(ds) == GOOD_EXAMPLES


@pytest.mark.parametrize("on_error", ["raise", "drop"])
def test_worked_example_batched(tmp_path, on_error):
    ds = multislot.read(_write(tmp_path / "a.txt", GOOD), SLOTS, batch_size=2, on_error=on_error,
                        counter=tfseq.DropCounter())
    assert isinstance(ds.element_spec["words"], tf.RaggedTensorSpec)
    assert ds.element_spec["click"] == tf.TensorSpec([None, 1], tf.int64)
    assert ds.element_spec["price"] == tf.TensorSpec([None, 2], tf.float32)
    assert to_list(ds) == [
        {"click": [[1], [0]], "words": [[7, 8, 9], []], "price": [[0.5, 1.5], [2.0, -1.0]]},
        {"click": [[1]], "words": [[42]], "price": [[1000.0, 0.0]]},
    ]


def test_parse_eager_and_scalar_dense_slot():
    slots = [("label", "uint64", "dense"), ("ids", "uint64", "sparse"),
             Slot("dense", "float", "dense", (2, 2))]
    features, errors, error_slots = multislot.parse(
        ["1 0 2 5 6 4 1 2 3 4", "1 1 0 4 0 0 0 .5", "1 1 1 007 4 -1 +2 3e-1 4."], slots)
    assert to_python(features) == {
        "label": [0, 1, 1],
        "ids": [[5, 6], [], [7]],
        "dense": [[[1.0, 2.0], [3.0, 4.0]], [[0.0, 0.0], [0.0, 0.5]],
                  [[-1.0, 2.0], [0.30000001192092896, 4.0]]],
    }
    assert to_python(errors) == [0, 0, 0]
    assert to_python(error_slots) == [0, 0, 0]


def test_parse_id_range():
    # The whole uint64 range, bit-cast to int64 as Paddle does (strtoull, then int64).
    features, errors, _ = multislot.parse(
        ["1 9223372036854775807", "1 0009223372036854775807", "1 9223372036854775808",
         "1 99999999999999999999", "1 1234567890123456789", "1 18446744073709551615",
         "1 18446744073709551616", "1 -5", "1 000018446744073709551615", "1 +5",
         "1 12345678901", "1 0"], [Slot("ids")])
    assert to_python(errors) == [0, 0, 0, 4, 0, 0, 4, 4, 0, 4, 0, 0]
    ids = to_python(features["ids"])
    assert ids[0] == [9223372036854775807]
    assert ids[1] == [9223372036854775807]
    assert ids[2] == [-9223372036854775808]
    assert ids[4] == [1234567890123456789]
    assert ids[5] == [-1]
    assert ids[8] == [-1]
    assert ids[10] == [12345678901]
    assert ids[11] == [0]


def test_parse_huge_count_is_bad_count():
    # A count >= 2**63 bit-casts to a negative number: still a bad count, not a crash.
    _, errors, slots_at = multislot.parse(["18446744073709551615 1", "2147483648 1"],
                                          [Slot("ids")])
    assert to_python(errors) == [2, 2]
    assert to_python(slots_at) == [0, 0]


# One bad line per kind: (line, reason, slot index where it is found).
BAD_LINES = [
    ("1 1 3 7 8 9", "missing_slot", 2),
    ("", "missing_slot", 0),
    ("1 1 x 7 8 9 2 0.5 1.5", "bad_count", 1),
    ("1 1 -1 2 0.5 1.5", "bad_count", 1),
    ("1 1 9 7 8 9 2 0.5 1.5", "count_too_large", 1),
    ("1 1 3 7 8 9 5 0.5 1.5", "count_too_large", 2),
    ("1 1 3 7 a 9 2 0.5 1.5", "non_numeric", 1),
    ("1 1 3 7 -8 9 2 0.5 1.5", "non_numeric", 1),
    ("1 1 1 18446744073709551616 2 0.5 1.5", "non_numeric", 1),
    ("1 1 3 7 8 9 2 0.5 abc", "non_numeric", 2),
    ("1 1 3 7 8 9 2 0.5 inf", "non_numeric", 2),
    ("1 1 3 7 8 9 3 0.5 1.5 2.5", "dense_size", 2),
    ("2 1 1 3 7 8 9 2 0.5 1.5", "dense_size", 0),
    ("1 1 3 7 8 9 2 0.5 1.5 7", "extra_tokens", 3),
]


def test_parse_classifies_every_bad_line():
    _, errors, error_slots = multislot.parse([GOOD[0]] + [line for line, _, _ in BAD_LINES], SLOTS)
    assert to_python(errors) == [0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 4, 4, 5, 5, 6]
    assert to_python(error_slots) == [0, 2, 0, 1, 1, 1, 2, 1, 1, 1, 2, 2, 2, 0, 3]
    assert [multislot.REASONS[e - 1] for e in to_python(errors)[1:]] == [
        reason for _, reason, _ in BAD_LINES]


# One line per reason for the end-to-end raise test.
RAISE_CASES = [BAD_LINES[i] for i in (0, 2, 4, 6, 11, 13)]


@pytest.mark.parametrize("line, reason, slot", RAISE_CASES, ids=[r for _, r, _ in RAISE_CASES])
def test_raise_names_file_line_and_reason(tmp_path, line, reason, slot):
    path = _write(tmp_path / "part-0.txt", [GOOD[0], GOOD[1], line, GOOD[2]])
    ds = multislot.read(path, SLOTS)
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        to_list(ds)
    message = info.value.message
    assert f"MultiSlot parse error in {path} line 3: {reason}" in message
    if slot < len(SLOTS):
        assert f"slot {SLOTS[slot].name} ({slot + 1} of 3" in message


def test_drop_counts_every_reason(tmp_path):
    lines = []
    for i, (bad, _, _) in enumerate(BAD_LINES):
        lines += [GOOD[i % 3], bad]
    path = _write(tmp_path / "part-0.txt", lines)
    counter = tfseq.DropCounter()
    ds = multislot.read(path, SLOTS, on_error="drop", counter=counter, parse_batch_size=5)
    assert to_list(ds) == (GOOD_EXAMPLES * 5)[:len(BAD_LINES)]
    assert counter.drops() == {"bad_count": 2, "count_too_large": 2, "dense_size": 2,
                               "extra_tokens": 1, "missing_slot": 2, "non_numeric": 5}


def test_drop_keeps_batches_full(tmp_path):
    path = _write(tmp_path / "a.txt", [GOOD[0], "1 1", GOOD[1], GOOD[2], GOOD[0], GOOD[1]])
    ds = multislot.read(path, SLOTS, on_error="drop", counter=tfseq.DropCounter(),
                        batch_size=2, parse_batch_size=2)
    assert [to_python(b["words"]) for b in ds] == [[[7, 8, 9], []], [[42], [7, 8, 9]], [[]]]


def test_raise_names_second_file_with_parallel_reads(tmp_path):
    a = _write(tmp_path / "a.txt", GOOD * 3)
    b = _write(tmp_path / "b.txt", [GOOD[0], GOOD[1], GOOD[2], GOOD[0], "1 1 3 7 8 9"])
    ds = multislot.read([a, b], SLOTS, num_parallel_reads=2, batch_size=4)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"MultiSlot parse error in .*b\.txt line 5: missing_slot: slot "
                             r"price \(3 of 3, float dense \(2,\)\)"):
        to_list(ds)


def test_deterministic_interleave_order(tmp_path):
    slots = [Slot("key", "uint64", "dense", (1,))]
    a = _write(tmp_path / "a.txt", ["1 10", "1 11", "1 12"])
    b = _write(tmp_path / "b.txt", ["1 20"])
    c = _write(tmp_path / "c.txt", ["1 30", "1 31"])
    ds = multislot.read(str(tmp_path / "*.txt"), slots, num_parallel_reads=2)
    assert [e["key"][0] for e in to_list(ds)] == [10, 20, 11, 12, 30, 31]
    ds = multislot.read([a, b, c], slots, num_parallel_reads=3, batch_size=4)
    assert [to_python(b["key"]) for b in ds] == [[[10], [20], [30], [11]], [[31], [12]]]


def test_gzip_file(tmp_path):
    path = tmp_path / "a.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(GOOD) + "\n")
    assert to_list(multislot.read(str(path), SLOTS)) == GOOD_EXAMPLES


@st.composite
def file_sets(draw):
    """Files of lines; each line has a unique key; some lines are bad (kind drawn)."""
    num_files = draw(st.integers(1, 4))
    files, key = [], 0
    for _ in range(num_files):
        lines = []
        for _ in range(draw(st.integers(0, 12))):
            key += 1
            ids = " ".join(str(i) for i in range(draw(st.integers(0, 3))))
            count = len(ids.split())
            bad = draw(st.sampled_from([None] * 4 + ["missing", "extra", "nonnum"]))
            if bad is None:
                lines.append((key, f"1 {key} {count} {ids}".strip(), None))
            elif bad == "missing":
                lines.append((key, f"1 {key}", "missing_slot"))
            elif bad == "extra":
                lines.append((key, f"1 {key} {count} {ids} 5".replace("  ", " "), "extra_tokens"))
            else:
                lines.append((key, f"1 {key} {count + 1} {ids} q".replace("  ", " "),
                              "non_numeric"))
        files.append(lines)
    return files


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=file_sets(), parallel=st.integers(1, 4), deterministic=st.sampled_from([None, False]),
       batch_size=st.sampled_from([None, 1, 3]), parse_batch_size=st.sampled_from([1, 4, 256]))
def test_exactly_once_across_files_and_readers(tmp_path_factory, files, parallel, deterministic,
                                               batch_size, parse_batch_size):
    root = tmp_path_factory.mktemp("files")
    paths = [_write(root / f"part-{i}.txt", [line for _, line, _ in lines])
             for i, lines in enumerate(files)]
    if not paths:
        return
    counter = tfseq.DropCounter()
    slots = [Slot("key", "uint64", "dense", ()), Slot("ids")]
    ds = multislot.read(paths, slots, on_error="drop", counter=counter, batch_size=batch_size,
                        num_parallel_reads=parallel, deterministic=deterministic,
                        parse_batch_size=parse_batch_size)
    got = []
    for element in to_list(ds):
        keys = element["key"] if batch_size else [element["key"]]
        ids = element["ids"] if batch_size else [element["ids"]]
        assert all(len(row) == len(set(row)) for row in ids)
        got.extend(zip(keys, map(tuple, ids)))
    lines = list(itertools.chain.from_iterable(files))
    want = [(key, tuple(int(t) for t in line.split()[3:])) for key, line, bad in lines
            if bad is None]
    assert sorted(got) == sorted(want)
    want_drops = collections.Counter(bad for _, _, bad in lines if bad)
    assert counter.drops() == {**_no_drops(), **want_drops}
    assert counter.seen() == {"lines_read": len(lines)}


def test_pipe_command_success(tmp_path):
    path = _write(tmp_path / "a.txt", ["1 1 3 x 8 9 2 0.5 1.5"])
    out_dir = tmp_path / "piped"
    ds = multislot.read(path, SLOTS, pipe_command=["sed", "s/x/7/"], pipe_dir=str(out_dir))
    assert to_list(ds) == [GOOD_EXAMPLES[0]]
    assert os.listdir(out_dir) == ["00000_a.txt.txt"]


def test_pipe_command_output_errors_name_original_file(tmp_path):
    path = _write(tmp_path / "a.txt", GOOD)
    ds = multislot.read(path, SLOTS, pipe_command=["sed", "2s/ 0 0 / 0 x /"],
                        pipe_dir=str(tmp_path / "piped"))
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        to_list(ds)
    assert f"in {path} (after pipe_command ['sed', '2s/ 0 0 / 0 x /']) line 2: bad_count" in (
        info.value.message.replace("\\'", "'"))


def test_pipe_command_failure(tmp_path):
    path = _write(tmp_path / "a.txt", GOOD)
    with pytest.raises(multislot.PipeCommandError,
                       match=r"pipe_command \['false'\] exited with status 1 on file .*a\.txt"):
        multislot.read(path, SLOTS, pipe_command=["false"], pipe_dir=str(tmp_path / "piped"))


def test_pipe_command_script_exit_3(tmp_path):
    a = _write(tmp_path / "a.txt", GOOD)
    b = _write(tmp_path / "b.txt", GOOD)
    script = tmp_path / "fail.sh"
    script.write_text("#!/bin/sh\ncat > /dev/null\necho 'bad input' >&2\nexit 3\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(multislot.PipeCommandError,
                       match=r"fail\.sh'\] exited with status 3 on file .*a\.txt'?: bad input"):
        multislot.read([a, b], SLOTS, pipe_command=[str(script)], num_parallel_reads=1,
                       pipe_dir=str(tmp_path / "piped"))


def test_pipe_command_missing(tmp_path):
    path = _write(tmp_path / "a.txt", GOOD)
    with pytest.raises(FileNotFoundError,
                       match=r"command 'tfseq-no-such-command' not found on PATH \(needed for "
                             r"file .*a\.txt'\)"):
        multislot.read(path, SLOTS, pipe_command=["tfseq-no-such-command", "-x"])
    with pytest.raises(FileNotFoundError, match=r"command '.*nope\.sh' not found"):
        multislot.run_pipe_command([str(tmp_path / "nope.sh")], path, str(tmp_path / "out.txt"))


def test_pipe_command_must_be_argv_list(tmp_path):
    path = _write(tmp_path / "a.txt", GOOD)
    with pytest.raises(TypeError, match=r"argv list .* without a shell"):
        multislot.read(path, SLOTS, pipe_command="sed s/x/y/")


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(slots=[Slot("a"), Slot("a")]), ValueError, r"duplicated: \['a'\]"),
    (dict(slots=[]), TypeError, r"non-empty list of Slot"),
    (dict(on_error="skip"), ValueError, r"on_error must be 'raise' or 'drop'"),
    (dict(batch_size=0), ValueError, r"batch_size must be positive"),
    (dict(compression="zip"), ValueError, r"compression must be"),
])
def test_argument_errors(tmp_path, kwargs, error, match):
    args = dict(patterns=_write(tmp_path / "a.txt", GOOD), slots=SLOTS)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        multislot.read(**args)


@pytest.mark.parametrize("args, match", [
    (("a", "int"), r"unknown type 'int'"),
    (("a", "uint64", "dense", (0,)), r"shape must be a tuple of positive ints"),
    (("a", "uint64", "sparse", (2,)), r"a sparse slot has no shape"),
    (("a", "float", "ragged"), r"unknown kind 'ragged'"),
])
def test_slot_errors(args, match):
    with pytest.raises(ValueError, match=match):
        Slot(*args)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"No file matches the pattern .*nothing\*"):
        multislot.read(str(tmp_path / "nothing*"), SLOTS)


def test_format_line_round_trip(tmp_path):
    line = multislot.format_line(SLOTS, {"click": [1], "words": [7, 8, 9], "price": [0.5, 1.5]})
    assert line == "1 1 3 7 8 9 2 0.5 1.5"
    with pytest.raises(ValueError, match=r"dense slot 'price' needs 2 values"):
        multislot.format_line(SLOTS, {"click": [1], "words": [], "price": [0.5]})
