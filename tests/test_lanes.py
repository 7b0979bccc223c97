"""Lanes (benchmarks/lanes.py, the experiment of ``python -m benchmarks.scaling --lanes``): K
whole pipelines over a round-robin split of the files, merged in a fixed order: the same
elements in the same order whatever the threads do, every example once."""

import collections

import pytest
import tensorflow as tf
from conftest import to_list

import tfseq
from benchmarks.lanes import in_lanes, lane_files, merge_lanes
from tfseq.experimental import parallelism


def write_files(tmp_path, num_files, lines_per_file):
    """File f holds lines "f.0", "f.1", ...; returns the paths in order."""
    paths = []
    for f in range(num_files):
        path = tmp_path / f"part{f:02d}.txt"
        path.write_text("".join(f"{f}.{i}\n" for i in range(lines_per_file)))
        paths.append(str(path))
    return paths


def test_lane_files_round_robin_and_no_empty_lanes():
    assert lane_files(["a", "b", "c", "d", "e"], 2) == [["a", "c", "e"], ["b", "d"]]
    assert lane_files(["a", "b"], 4) == [["a"], ["b"]]
    assert lane_files(["a", "b", "c"], 1) == [["a", "b", "c"]]
    with pytest.raises(ValueError, match="num_lanes"):
        lane_files(["a"], 0)


def test_merge_takes_one_element_per_lane_in_turn_and_drops_ended_lanes():
    lanes = [tf.data.Dataset.range(0, 3), tf.data.Dataset.range(10, 15),
             tf.data.Dataset.range(20, 21)]
    assert to_list(merge_lanes(lanes)) == [0, 10, 20, 1, 11, 2, 12, 13, 14]


def test_merge_refuses_lanes_of_different_specs():
    with pytest.raises(ValueError, match="lane 1 has element spec"):
        merge_lanes([tf.data.Dataset.range(3), tf.data.Dataset.from_tensors("a")])


def test_in_lanes_reads_each_lane_in_file_order(tmp_path):
    paths = write_files(tmp_path, num_files=3, lines_per_file=2)
    seen = []

    def build(files, index):
        seen.append((index, [p[-10:] for p in files]))
        return tfseq.text_lines(files, num_parallel_reads=1)

    out = to_list(in_lanes(paths, build, num_lanes=2))
    # lane 0: files 0 and 2 (0.0 0.1 2.0 2.1), lane 1: file 1 (1.0 1.1), one line each in turn
    assert out == ["0.0", "1.0", "0.1", "1.1", "2.0", "2.1"]
    assert seen == [(0, ["part00.txt", "part02.txt"]), (1, ["part01.txt"])]


def test_one_lane_is_the_pipeline_itself(tmp_path):
    paths = write_files(tmp_path, num_files=2, lines_per_file=3)
    lanes = in_lanes(paths, lambda files, i: tfseq.text_lines(files, num_parallel_reads=1),
                     num_lanes=1)
    assert to_list(lanes) == to_list(tfseq.text_lines(paths, num_parallel_reads=1))


def other_threads(ds, threads):
    """``ds`` on a private thread pool of ``threads`` with map parallelization on: other
    thread timing (``deterministic`` stays at its default: a user who turns it off lets
    ``text_lines`` and ``tokenize`` reorder, as they document)."""
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.experimental_optimization.map_parallelization = True
    return ds.with_options(options)


@pytest.fixture(name="corpus", scope="module")
def corpus_fixture(tmp_path_factory):
    """6 files of 40 lines each, line lengths 1..40 tokens; the vocabulary of its words."""
    tmp_path = tmp_path_factory.mktemp("lanes")
    paths = []
    for f in range(6):
        lines = []
        for i in range(40):
            n = 1 + (37 * (f * 100 + i) ** 2 + 11 * i) % 40
            lines.append(" ".join(f"w{(f * 7 + i + j) % 50}" for j in range(n)))
        path = tmp_path / f"c{f}.txt"
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    vocab = tfseq.Vocab.build(paths)
    return paths, vocab


def lane_dataset(corpus, num_lanes, stage, inner=1):
    paths, vocab = corpus

    def build(files, index):
        ds = tfseq.text_lines(files, batch_size=32, num_parallel_reads=2).apply(
            tfseq.tokenize(vocab))
        if stage == "bucket":
            return ds.apply(tfseq.bucket_by_length(
                max_tokens=160, pool_tokens=800, seed=7 + index, counter=tfseq.DropCounter()))
        return ds.apply(tfseq.pack(40, max_tokens=160, seed=7 + index,
                                   counter=tfseq.DropCounter()))

    with parallelism(pools_and_parts=inner):  # pools and parts inside each lane
        return in_lanes(paths, build, num_lanes=num_lanes)


def token_counts(batches, stage):
    """Multiset of the real token rows: each example's ids (bucketed) or its segments (packed)."""
    rows = collections.Counter()
    for b in batches:
        if stage == "bucket":
            for ids, n in zip(b["ids"], b["ids_length"]):
                rows[tuple(ids[:n])] += 1
        else:
            for ids, seg in zip(b["ids"], b["ids_segment_ids"]):
                for s in set(seg) - {0}:
                    rows[tuple(t for t, g in zip(ids, seg) if g == s)] += 1
    return rows


@pytest.mark.parametrize("stage", ["bucket", "pack"])
def test_lanes_give_the_same_batches_at_any_parallelism_and_every_example_once(corpus, stage):
    paths, vocab = corpus
    # 2 lanes of 3 files (about 2,400 tokens: three pools of 800 each); each lane's stages
    # are traced on their own, so two lanes cost two thirds of three.
    # A seeded pipeline reshuffles on each pass: each comparison builds its own. The most
    # parallel build (3 pools and parts inside each lane, the default thread pool) gives
    # the batches of the least parallel one (one at a time inside each lane, on one thread).
    reference = to_list(lane_dataset(corpus, 2, stage, inner=3))
    assert len(reference) > 20
    assert to_list(other_threads(lane_dataset(corpus, 2, stage), 1)) == reference
    # every line once: the same multiset of token rows as the lines tokenized one by one
    expected = collections.Counter()
    for ids in to_list(tfseq.text_lines(paths, batch_size=32).apply(tfseq.tokenize(vocab))):
        for row in ids["ids"]:
            expected[tuple(row)] += 1
    assert sum(expected.values()) == 6 * 40
    assert token_counts(reference, stage) == expected


def test_read_in_lanes_then_one_bucketing_stage(corpus):
    """The documented composition: read + tokenize in lanes, bucket once after the merge; the
    same batches on one thread or many, every line once."""
    paths, vocab = corpus

    def read(files, index):
        del index
        return tfseq.text_lines(files, batch_size=32, num_parallel_reads=2).apply(
            tfseq.tokenize(vocab))

    def batches(threads=None):
        ds = in_lanes(paths, read, num_lanes=3).apply(tfseq.bucket_by_length(
            max_tokens=160, pool_tokens=800, seed=3, counter=tfseq.DropCounter()))
        return to_list(other_threads(ds, threads) if threads else ds)

    reference = batches()
    assert batches(threads=1) == reference
    rows = token_counts(reference, "bucket")
    assert sum(rows.values()) == 6 * 40
    lines = to_list(tfseq.text_lines(paths, batch_size=32).apply(tfseq.tokenize(vocab)))
    assert rows == collections.Counter(tuple(r) for b in lines for r in b["ids"])
