"""tfseq.multislot against PaddlePaddle's own MultiSlot test files, declarations and rules.

Data lines and slot declarations are Paddle's (paddle/fluid/framework/data_feed_test.cc,
test/legacy_test/test_dataset.py); expected values are written out by hand.
"""

import gzip

import numpy as np
import pytest
import tensorflow as tf

import tfseq
from conftest import to_list, to_python
from tfseq import multislot
from tfseq.multislot import Slot

# data_feed_test.cc: GenerateFileForTest (the DataFeedDesc and the three data lines).
DESC = """name: "MultiSlotDataFeed"
batch_size: 2
multi_slot_desc {
    slots {
        name: "uint64_sparse_slot"
        type: "uint64"
        is_dense: false
        is_used: true
    }
    slots {
        name: "float_sparse_slot"
        type: "float"
        is_dense: false
        is_used: true
    }
    slots {
        name: "uint64_dense_slot"
        type: "uint64"
        is_dense: true
        is_used: true
    }
    slots {
        name: "float_dense_slot"
        type: "float"
        is_dense: true
        is_used: true
    }
    slots {
        name: "not_used_slot"
        type: "uint64"
        is_dense: false
        is_used: false
    }
}"""
FEED_TEST_LINES = ["3 3978 620 82 1 1926.08 1 1926 1 6.02 1 1996",
                   "2 1300 2983353 1 985.211 1 8 1 0.618 1 12",
                   "1 19260827 2 3.14 2.718 1 27 1 2.236 1 28"]

# test_dataset.py: test_queue_dataset_run / test_in_memory_dataset_run files a and b.
DATASET_A = ["1 1 2 3 3 4 5 5 5 5 1 1", "1 2 2 3 4 4 6 6 6 6 1 2", "1 3 2 3 5 4 7 7 7 7 1 3"]
DATASET_B = ["1 4 2 3 3 4 5 5 5 5 1 4", "1 5 2 3 4 4 6 6 6 6 1 5", "1 6 2 3 5 4 7 7 7 7 1 6",
             "1 7 2 3 6 4 8 8 8 8 1 7"]
# ... declared as paddle.static.data(name=slot, shape=[-1, 1], dtype="int64", lod_level=1).
USE_VARS = [(f"slot{i}", "int64", 1, [-1, 1]) for i in range(1, 5)]


def f32(text):
    return float(np.float32(text))


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_slots_from_desc_matches_paddle_declaration():
    assert multislot.slots_from_desc(DESC) == (
        Slot("uint64_sparse_slot", "uint64", "sparse"),
        Slot("float_sparse_slot", "float", "sparse"),
        Slot("uint64_dense_slot", "uint64", "dense", (1,)),
        Slot("float_dense_slot", "float", "dense", (1,)),
        Slot("not_used_slot", "uint64", "sparse", (), False),
    )


def test_data_feed_test_file_values_and_lod(tmp_path):
    path = _write(tmp_path / "TestMultiSlotDataFeed.data.0", FEED_TEST_LINES)
    slots = multislot.slots_from_desc(DESC)
    got = to_list(multislot.read(path, slots))
    assert got == [
        {"uint64_sparse_slot": [3978, 620, 82], "float_sparse_slot": [f32("1926.08")],
         "uint64_dense_slot": [1926], "float_dense_slot": [f32("6.02")]},
        {"uint64_sparse_slot": [1300, 2983353], "float_sparse_slot": [f32("985.211")],
         "uint64_dense_slot": [8], "float_dense_slot": [f32("0.618")]},
        {"uint64_sparse_slot": [19260827], "float_sparse_slot": [f32("3.14"), f32("2.718")],
         "uint64_dense_slot": [27], "float_dense_slot": [f32("2.236")]},
    ]
    # batch_size 2 as in the DataFeedDesc: row splits are Paddle's LoD offsets.
    first = next(iter(multislot.read(path, slots, batch_size=2)))
    assert "not_used_slot" not in first
    assert to_python(first["uint64_sparse_slot"].row_splits) == [0, 3, 5]
    assert to_python(first["float_sparse_slot"].row_splits) == [0, 1, 2]
    assert to_python(first["uint64_dense_slot"]) == [[1926], [8]]


def test_dataset_files_with_set_use_var_declarations(tmp_path):
    slots = multislot.slots_from_paddle(USE_VARS)
    assert slots == tuple(Slot(f"slot{i}") for i in range(1, 5))
    paths = [_write(tmp_path / "test_queue_dataset_run_a.txt", DATASET_A),
             _write(tmp_path / "test_queue_dataset_run_b.txt", DATASET_B)]
    got = to_list(multislot.read(paths, slots, num_parallel_reads=1))
    assert got == [
        {"slot1": [1], "slot2": [3, 3], "slot3": [5, 5, 5, 5], "slot4": [1]},
        {"slot1": [2], "slot2": [3, 4], "slot3": [6, 6, 6, 6], "slot4": [2]},
        {"slot1": [3], "slot2": [3, 5], "slot3": [7, 7, 7, 7], "slot4": [3]},
        {"slot1": [4], "slot2": [3, 3], "slot3": [5, 5, 5, 5], "slot4": [4]},
        {"slot1": [5], "slot2": [3, 4], "slot3": [6, 6, 6, 6], "slot4": [5]},
        {"slot1": [6], "slot2": [3, 5], "slot3": [7, 7, 7, 7], "slot4": [6]},
        {"slot1": [7], "slot2": [3, 6], "slot3": [8, 8, 8, 8], "slot4": [7]},
    ]


def test_slots_from_paddle_dense_and_errors():
    assert multislot.slots_from_paddle([("click", "int64", 0, [-1, 1]),
                                        ("dense", "float32", 0, [None, 2, 3])]) == (
        Slot("click", "uint64", "dense", (1,)), Slot("dense", "float", "dense", (2, 3)))
    with pytest.raises(ValueError, match="lod_level=2"):
        multislot.slots_from_paddle([("a", "int64", 2, [-1, 1])])
    with pytest.raises(ValueError, match="dtype 'int32'"):
        multislot.slots_from_paddle([("a", "int32", 1, [-1, 1])])
    with pytest.raises(ValueError, match="known shape"):
        multislot.slots_from_paddle([("a", "int64", 0, [-1, -1])])


def test_parse_ins_id_and_content(tmp_path):
    # test_dataset.py test_run_with_dump: "1 <ins_id> 1 <content>" before the slots.
    lines = ["1 a 1 a 1 1 2 3 3 4 5 5 5 5 1 1", "1 b 1 b 1 2 2 3 4 4 6 6 6 6 1 2"]
    slots = multislot.slots_from_paddle(USE_VARS)
    got = to_list(multislot.read(_write(tmp_path / "a.txt", lines), slots, parse_ins_id=True,
                                 parse_content=True))
    assert got == [
        {"ins_id": "a", "content": "a", "slot1": [1], "slot2": [3, 3],
         "slot3": [5, 5, 5, 5], "slot4": [1]},
        {"ins_id": "b", "content": "b", "slot1": [2], "slot2": [3, 4],
         "slot3": [6, 6, 6, 6], "slot4": [2]},
    ]
    only_id = ["1 1702f830e2e19501ad7429505f714c1d 1 1 2 3 3 4 5 5 5 5 1 1"]
    got = to_list(multislot.read(_write(tmp_path / "b.txt", only_id), slots, parse_ins_id=True))
    assert got == [{"ins_id": "1702f830e2e19501ad7429505f714c1d", "slot1": [1],
                    "slot2": [3, 3], "slot3": [5, 5, 5, 5], "slot4": [1]}]
    # A line without the prefix is a counted drop, not garbage.
    counter = tfseq.DropCounter()
    ds = multislot.read(_write(tmp_path / "c.txt", ["2 x 1 1 1 1 1 1 1 1"]), slots,
                        parse_ins_id=True, on_error="drop", counter=counter)
    assert to_list(ds) == []
    assert counter.drops()["missing_slot"] == 1


@pytest.mark.parametrize("reader, want", [
    ("queue", [{"ids": [0, 5, 0], "f": [f32("0.0000001"), 2.5], "d": [0]},
               {"ids": [0], "f": [0.0], "d": [3]},
               {"ids": [], "f": [], "d": [4]}]),
    ("in_memory", [{"ids": [5], "f": [2.5], "d": [0]},
                   {"ids": [0], "f": [0.0], "d": [3]},
                   {"ids": [0], "f": [0.0], "d": [4]}]),
])
def test_zero_id_policy_per_reader(tmp_path, reader, want):
    lines = ["3 0 5 0 2 0.0000001 2.5 1 0", "1 0 1 0.0 1 3", "0 0 1 4"]
    slots = [Slot("ids"), Slot("f", "float"), Slot("d", "uint64", "dense", (1,))]
    path = _write(tmp_path / "a.txt", lines)
    assert to_list(multislot.read(path, slots, reader=reader)) == want
    batch = next(iter(multislot.read(path, slots, reader=reader, batch_size=3)))
    assert to_python(batch["ids"]) == [row["ids"] for row in want]


def test_unknown_reader():
    with pytest.raises(ValueError, match="reader must be one of"):
        multislot.read("x", [Slot("a")], reader="memory")


def test_ids_over_the_whole_uint64_range(tmp_path):
    lines = ["2 9223372036854775808 18446744073709551615", "1 9223372036854775807"]
    got = to_list(multislot.read(_write(tmp_path / "a.txt", lines), [Slot("ids")]))
    assert got == [{"ids": [-9223372036854775808, -1]}, {"ids": [9223372036854775807]}]
    for bad in ["1 -5", "1 18446744073709551616"]:
        path = _write(tmp_path / "bad.txt", [lines[1], bad])
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"bad.txt line 2: non_numeric"):
            to_list(multislot.read(path, [Slot("ids")]))


BAD_BYTES = b"1 1 3 7 8 \xff\xfe 2 0.5 1.5"
SPLIT_CHAR = ("1 1 1 x" + "\u00e9" * 200 + " 2 0.5 1.5").encode()  # byte 200 cuts an é in two
SLOTS = [Slot("click", "uint64", "dense", (1,)), Slot("words"),
         Slot("price", "float", "dense", (2,))]


@pytest.mark.parametrize("bad", [BAD_BYTES, SPLIT_CHAR], ids=["non_utf8", "split_char"])
def test_undecodable_bad_line_names_file_and_line(tmp_path, bad):
    path = tmp_path / "feed.txt"
    path.write_bytes(b"1 1 1 42 2 1e3 0\n" + bad + b"\n")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"feed.txt line 2: non_numeric: slot words") as info:
        to_list(multislot.read(str(path), SLOTS))
    assert "\ufffd" in info.value.message
    counter = tfseq.DropCounter()
    got = to_list(multislot.read(str(path), SLOTS, on_error="drop", counter=counter))
    assert got == [{"click": [1], "words": [42], "price": [1000.0, 0.0]}]
    assert counter.drops()["non_numeric"] == 1


def test_gz_with_pipe_command_cat(tmp_path):
    plain = _write(tmp_path / "part.txt", FEED_TEST_LINES)
    packed = tmp_path / "part.txt.gz"
    with gzip.open(packed, "wt") as f:
        f.write("".join(line + "\n" for line in FEED_TEST_LINES))
    slots = multislot.slots_from_desc(DESC)
    want = to_list(multislot.read(plain, slots))
    got = to_list(multislot.read(str(packed), slots, pipe_command=["cat"],
                                 pipe_dir=str(tmp_path / "piped")))
    assert got == want
    assert got[0]["uint64_sparse_slot"] == [3978, 620, 82]


def test_shuffle_lines_mixes_and_keeps_every_line(tmp_path):
    paths = [_write(tmp_path / "a.txt", DATASET_A), _write(tmp_path / "b.txt", DATASET_B)]
    slots = multislot.slots_from_paddle(USE_VARS)
    plain = [row["slot1"][0] for row in to_list(multislot.read(paths, slots))]
    mixed = [row["slot1"][0] for row in to_list(multislot.read(paths, slots, shuffle_lines=True,
                                                               seed=7))]
    again = [row["slot1"][0] for row in to_list(multislot.read(paths, slots, shuffle_lines=True,
                                                               seed=7))]
    assert sorted(mixed) == [1, 2, 3, 4, 5, 6, 7]
    assert mixed == again
    assert mixed != plain
