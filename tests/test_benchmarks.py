"""The benchmarks (``benchmarks/``, not packaged) on tiny inputs: each run in this process as
``python -m benchmarks.<name>`` runs it (or its core function where it starts processes),
checking its JSON keys and that every scheme handled every example once; the harness they
share; and the logic of ``benchmarks.convergence`` on hand-made runs (nothing here trains
for long)."""

import contextlib
import dataclasses
import importlib
import json
import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

import tfseq
from benchmarks import harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS


@contextlib.contextmanager
def loaded(module_name, *argv):
    """The module imported afresh with ``argv``'s flags parsed, as ``python -m`` would start
    it; its flags are removed after (benchmarks define flags of the same names)."""
    before = set(FLAGS)
    sys.modules.pop(module_name, None)
    try:
        module = importlib.import_module(module_name)
        FLAGS.json_out = None
        FLAGS([module_name, *argv])
        yield module
    finally:
        sys.modules.pop(module_name, None)
        for flag in set(FLAGS) - before:
            delattr(FLAGS, flag)


def run_benchmark(name, tmp_path, *argv):
    """Runs ``python -m benchmarks.<name> argv --json_out=...`` in this process; its JSON."""
    out = tmp_path / f"{name}.json"
    with loaded(f"benchmarks.{name}", *argv, f"--json_out={out}") as module:
        module.main([name])
    return json.loads(out.read_text())


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


# 200 rows (label, text): 1, 2, ..., 12, 1, 2, ... words of 30, so 16 x 78 + 36 words in all.
ROWS = [(f"c{i % 3}", " ".join(f"w{(i * 7 + j) % 30}" for j in range(1 + i % 12)))
        for i in range(200)]
ROW_WORDS = 1_284


# ----------------------------------------------------------------------------- harness

def test_steady_splits_two_pass_lengths_into_a_rate_and_a_start():
    # 3M tokens in 1.0 s and 12M in 2.5 s: the 9M between them took 1.5 s (6M tokens/s),
    # so the short pass spent 0.5 s before delivering at that rate.
    assert harness.steady((3_000_000, 1.0), (12_000_000, 2.5)) == {
        "short_real_tokens": 3_000_000, "short_seconds": 1.0,
        "steady_tokens_per_second": 6_000_000.0, "start_seconds": 0.5}
    # A feed with no start: the rate of either pass.
    assert harness.steady((1_000, 0.5), (4_000, 2.0))["start_seconds"] == 0.0
    assert [harness.short_copies(n) for n in (1, 4, 16)] == [1, 1, 4]


def test_best_passes_count_in_the_graph_round_robin_and_keep_the_fastest():
    feeds = {"rows": (tf.data.Dataset.range(10), lambda x: tf.constant(1, tf.int64)),
             "sum": (tf.data.Dataset.range(10), lambda x: x)}
    seen = []
    best = harness.best_passes(feeds, 2, on_pass=lambda name, run: seen.append(name))
    assert seen == ["rows", "sum", "rows", "sum"]
    assert {name: n for name, (n, _, _) in best.items()} == {"rows": 10, "sum": 45}
    assert all(seconds > 0 for _, seconds, _ in best.values())


def test_batch_totals_count_rows_or_segments():
    padded = tf.data.Dataset.from_tensors({"ids": tf.constant([[5, 6, 0], [7, 0, 0]])})
    packed = tf.data.Dataset.from_tensors({"ids": tf.constant([[5, 6, 7, 0]]),
                                           "ids_segment_ids": tf.constant([[1, 1, 2, 0]])})
    assert harness.batch_totals(padded.repeat(2))[0].tolist() == [2, 4, 6, 12, 6]
    assert harness.batch_totals(packed)[0].tolist() == [1, 2, 3, 4, 4]


def test_table_aligns_text_left_and_numbers_right_and_ratios():
    rows = [{"scheme": "pad", "batches": 12, "rate": 1500.0},
            {"scheme": "bucket", "batches": 3, "rate": 6000.0, "extra": 1}]
    harness.add_ratios(rows, rows[0], vs_pad="rate")
    assert [r["vs_pad"] for r in rows] == [1.0, 4.0]
    assert harness.table(rows, [("scheme", "scheme", ""), ("batches", "batches", "d"),
                                ("tok/s", "rate", ",.0f"), ("x pad", "vs_pad", ".1f"),
                                ("extra", "extra", "d")]).split("\n") == [
        "scheme batches tok/s x pad extra",
        "--------------------------------",
        "pad         12 1,500   1.0",
        "bucket       3 6,000   4.0     1"]


def test_corpus_files_and_copies(tmp_path):
    rows = harness.embedded_rows()
    assert len(rows) == 62_204 and rows[0] == (  # both languages' verses
        "Gen", "In the beginning God created the heaven and the earth.")
    files = harness.embedded_text_files(str(tmp_path), 3)
    assert [os.path.basename(f) for f in files] == ["part00.txt", "part01.txt", "part02.txt"]
    assert sum(open(f).read().count("\n") for f in files) == 62_204
    (tmp_path / "links").mkdir()
    links = harness.linked_copies(files[:2], 2, str(tmp_path / "links"))
    assert [os.path.basename(f) for f in links] == [
        "copy000_part00.txt", "copy000_part01.txt", "copy001_part00.txt", "copy001_part01.txt"]
    assert [harness.original_name(f) for f in links[2:]] == ["part00.txt", "part01.txt"]
    assert open(links[3]).read() == open(files[1]).read()


def test_write_json_creates_the_folder_and_nothing_without_a_path(tmp_path):
    FLAGS.mark_as_parsed()
    FLAGS.json_out = None
    assert harness.write_json({"a": 1}) is None
    path = harness.write_json({"a": [1.5]}, str(tmp_path / "out" / "x.json"))
    assert json.loads(open(path).read()) == {"a": [1.5]}


FAKE_BENCHMARK = '''
import json, os
from absl import app, flags
from benchmarks import harness
harness.pin_cores()
flags.DEFINE_list("cores", ["1"], "")
flags.DEFINE_integer("size", 3, "")
flags.DEFINE_string("_child_out", None, "")
def main(argv):
    with open(flags.FLAGS._child_out, "w") as f:
        json.dump([{"cores": len(os.sched_getaffinity(0)), "size": flags.FLAGS.size,
                    "repeats": flags.FLAGS.repeats}], f)
harness.define_repeats(1)
if __name__ == "__main__":
    harness.run(main)
'''


def test_per_core_count_runs_a_pinned_child_with_this_runs_flags(tmp_path, monkeypatch):
    (tmp_path / "fake_benchmark.py").write_text(FAKE_BENCHMARK)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{ROOT}")
    with loaded("fake_benchmark", "--size=7", "--repeats=2", "--cores=1,9999"):
        rows = harness.per_core_count("fake_benchmark", ["1", "9999"])
    # One child, pinned to one core, given --size and --repeats (but not --cores); no
    # machine has 9,999 cores.
    assert rows == [{"cores": 1, "size": 7, "repeats": 2}]


def test_make_bench_runs_every_benchmark_as_a_module():
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    names = re.search(r"BENCHES := ((?:.*\\\n)*.*)", makefile).group(1).replace("\\\n", " ")
    names = names.split()
    assert "$(PY) -m benchmarks.$$b --json_out=bench_out/$$b.json" in makefile
    for name in names + ["raw_scaling", "convergence"]:
        source = open(os.path.join(ROOT, "benchmarks", f"{name}.py")).read()
        assert "\n    harness.run(main)\n" in source, name
    assert sorted(names) == sorted(
        f[:-3] for f in os.listdir(os.path.join(ROOT, "benchmarks"))
        if f.endswith(".py") and f not in (
            "__init__.py", "harness.py", "lanes.py", "raw_scaling.py", "convergence.py",
            "peers.py"))


# ----------------------------------------------------------------------------- benchmarks

def test_batching(tmp_path):
    out = run_benchmark("batching", tmp_path, "--synthetic=zipf", "--synthetic_size=300",
                        "--max_tokens=512", "--max_length=64", "--schemes=plain,tfseq,sorted")
    assert (out["examples"], out["kept"], out["max_tokens"], out["max_length"]) == (
        300, 270, 512, 64)
    schemes = [r["scheme"] for r in out["schemes"]]
    assert schemes == ["plain padded_batch", "tfseq bucket_by_length",
                       "sorted epoch, unshuffled (reference)"]
    for row in out["schemes"]:  # the main checks every scheme batched every example once
        assert set(row) == {"scheme", "step_efficiency", "padding_efficiency",
                            "batches_per_epoch", "max_batch_cells", "tokens_per_s",
                            "tokens_per_cpu_s", "steps_vs_tfseq", "speed_vs_tfseq",
                            "cpu_speed_vs_tfseq"}
        assert row["max_batch_cells"] <= 512 and 0 < row["step_efficiency"] <= 1
    tfseq_row = out["schemes"][1]
    assert tfseq_row["steps_vs_tfseq"] == 1.0
    assert tfseq_row["step_efficiency"] > out["schemes"][0]["step_efficiency"]


def test_training(tmp_path):
    data = write_lines(tmp_path / "rows.tsv", [f"{label}\t{text}" for label, text in ROWS])
    out = run_benchmark("training", tmp_path, f"--files={data}", "--field=1", "--examples=48",
                        "--max_tokens=64", "--max_length=16", "--units=4", "--embed_dim=4",
                        "--warmup_steps=1")
    assert [r["scheme"] for r in out["schemes"]] == [
        "plain padded_batch", "plain, rows by data's longest", "tfseq bucket_by_length"]
    plain, longest, bucket = out["schemes"]
    assert plain["steps"] == 12  # 48 examples, 64 // 16 = 4 rows a batch
    assert plain["speedup_vs_plain"] == 1.0
    assert bucket["steps"] < plain["steps"]
    assert bucket["padding_efficiency"] > plain["padding_efficiency"]
    assert 48 <= out["real_tokens"] <= 48 * 12  # 1..12 words a line


def test_packing_on_an_own_file_with_its_field(tmp_path):
    # 3 + 2 + 1 tokens in field 1, a line without field 1 (0 tokens: not kept), and 200 lines
    # of 6 tokens: 203 examples kept, 1,206 tokens.
    lines = ["a\tone two three", "b\tfour five", "c\tsix", "d"]
    lines += [f"x\tw{i} w w w w w" for i in range(200)]
    data = write_lines(tmp_path / "own.tsv", lines)
    out = run_benchmark("packing", tmp_path, f"--files={data}", "--field=1", "--train_steps=0",
                        "--max_tokens=64", "--block_length=16")
    (result,) = out["results"]  # only the given file: no --corpora
    assert result["corpus"] == "own.tsv (field 1)"
    assert (result["examples"], result["kept"], result["real_tokens"]) == (204, 203, 1206)
    assert result["fewest_batches"] == 19  # ceil(1206 / 64)
    batches = {r["scheme"]: r["batches"] for r in result["schemes"]}
    # Plain: 4 rows of 16 per batch, 51 batches. Packed: two 6-token lines per 16-token row,
    # the short ones in the gaps: 100 rows, 4 per batch. Rows of 4, 8 and 16: each 6-token
    # line needs a row of 8 (200 rows, 8 per batch: 25 batches), whose 2-token gaps take the
    # 2- and the 1-token line; the 3-token line gets a row of 4 (a batch of its own).
    assert batches == {"plain padded_batch": 51, "tfseq pack": 25,
                       "tfseq pack, 3 row lengths": 26,
                       "first-fit decreasing, offline (reference)": 25}
    assert {r["scheme"]: r["steps_vs_pack"] for r in result["schemes"]}["tfseq pack"] == 1.0


def test_pipeline(tmp_path):
    data = write_lines(tmp_path / "rows.txt", [text for _, text in ROWS])
    out = run_benchmark("pipeline", tmp_path, f"--files={data}", "--field=-1", "--copies=2",
                        "--repeats=1", "--read_batch=64", "--max_tokens=256",
                        "--max_length=16", "--feeds=python")
    rows = out["rows"]
    # Every feed reads the same lines (two copies of the file) and delivers the same tokens.
    assert [r["feed"] for r in rows] == [
        "raw read+tokenize+lookup", "tfseq full pipeline", "python generator feed"]
    assert {r["real_tokens"] for r in rows} == {2 * ROW_WORDS}
    assert out["flags"]["copies"] == 2 and len(out["files"]) == 2
    assert rows[1]["tfseq_over_feed"] == 1.0
    assert set(rows[0]) == {"feed", "real_tokens", "seconds", "first_pass_seconds",
                            "build_seconds", "tokens_per_second", "tfseq_over_feed"}


def test_scaling_child_feeds_deliver_the_same_tokens_at_any_parallelism(tmp_path):
    files = [write_lines(tmp_path / f"part{i}.txt", [t for _, t in ROWS[i::2]]) for i in (0, 1)]
    (tmp_path / "copies").mkdir()
    with loaded("benchmarks.scaling", "--copies=2", "--repeats=1", "--parallel=1,2",
                "--feeds=raw,bucket,read,stream_pack", "--tokenize_parallel=2",
                "--read_batch=32", "--max_tokens=256", "--max_length=16", "--nosteady",
                "--python_loop=false") as scaling:
        rows = scaling.run_child(files, harness.linked_copies(files, 2, str(tmp_path / "copies")))
    by_feed = {r["feed"]: r for r in rows}
    assert by_feed["read"]["lines"] == 2 * 200
    tokens = {name: r["real_tokens"] for name, r in by_feed.items() if name != "read"}
    # The same tokens at any parallelism of the batching stages (and of the stream's
    # encoding, --tokenize_parallel).
    assert tokens == {"raw": 2 * ROW_WORDS, "bucket parallel=1": 2 * ROW_WORDS,
                      "bucket parallel=2": 2 * ROW_WORDS, "stream_pack": 2 * ROW_WORDS}
    assert by_feed["raw"]["vs_raw"] == 1.0 and by_feed["read"]["lines_per_second"] > 0


def test_raw_scaling_child_variants_count_the_same(tmp_path):
    files = [write_lines(tmp_path / f"part{i}.txt", [t for _, t in ROWS[i::2]]) for i in (0, 1)]
    (tmp_path / "copies").mkdir()
    with loaded("benchmarks.raw_scaling", "--copies=2", "--repeats=1",
                "--variants=raw,raw_mapcount,raw_fixed,raw_nolookup,read,tok_alone") as raw:
        rows = raw.run_child(files, harness.linked_copies(files, 2, str(tmp_path / "copies")))
    counts = {r["variant"]: (r["count"], r["unit"]) for r in rows}
    assert counts == {"raw": (2 * ROW_WORDS, "tokens"), "raw_mapcount": (2 * ROW_WORDS, "tokens"),
                      "raw_fixed": (2 * ROW_WORDS, "tokens"),
                      "raw_nolookup": (2 * ROW_WORDS, "tokens"), "read": (400, "lines"),
                      "tok_alone": (2 * ROW_WORDS, "tokens")}
    assert all(r["cpu_cores_busy"] >= 0 and r["rate"] > 0 for r in rows)


def test_splitting(tmp_path):
    out = run_benchmark("splitting", tmp_path, "--synthetic=emails", "--num_batches=3",
                        "--batch_size=16", "--num_splits=2", "--max_length=64", "--repeats=1")
    assert (out["num_batches"], out["batch_size"], out["num_splits"]) == (3, 16, 2)
    assert [r["balance"] for r in out["schemes"]] == ["examples", "tokens",
                                                     "tokens, equal_rows"]
    for row in out["schemes"]:
        assert set(row) == {"balance", "split_ms_per_batch", "split_cost_ms",
                            "split_cost_vs_full_pipeline", "token_imbalance_mean",
                            "token_imbalance_worst", "cell_imbalance_mean",
                            "largest_part_vs_greedy", "largest_part_cells_vs_greedy_tokens"}
        assert 1.0 <= row["token_imbalance_mean"] <= row["token_imbalance_worst"]
    examples, tokens, _ = out["schemes"]
    assert tokens["token_imbalance_mean"] < examples["token_imbalance_mean"]


def test_attention(tmp_path):
    out = run_benchmark("attention", tmp_path, "--batch=2", "--time=6",
                        "--attention_shapes=2x6x4", "--rounds=1", "--calls=1", "--threads=0")
    ours, neg1e9 = out["accuracy"]["ours"], out["accuracy"]["(c) neg1e9"]
    for dtype in ("float32", "float16", "bfloat16"):
        for case in ("random", "huge_logits", "near_identical", "huge_range", "pads_dominate",
                     "fully_masked"):
            assert ours[dtype][case]["nonfinite_forward"] == 0, (dtype, case)
            assert ours[dtype][case]["nonfinite_backward"] == 0, (dtype, case)
            assert ours[dtype][case]["max_pad_weight"] == 0.0, (dtype, case)
    # -1e9 is -inf in float16: 0 * -inf on every valid position is NaN.
    assert neg1e9["float16"]["random"]["nonfinite_forward"] > 0
    assert set(out["attention_timing"]["2x6x4"]) == {"unmasked", "masked_keys",
                                                     "masked_queries_and_keys"}
    assert out["softmax_timing"]["float32"]["(a) plain"]["ratio"] == 1.0


@pytest.mark.slow  # two small language models trained: ~10 s
def test_tbptt_worker_trains_an_own_file_on_its_field(tmp_path):
    # 300 lines "k<i>\t<6 words of 50>": the text is field 1; field 0 must not leak in.
    data = write_lines(tmp_path / "own.tsv", [
        f"k{i}\t" + " ".join(f"w{(i * j + j) % 50}" for j in range(1, 7)) for i in range(300)])
    work = tmp_path / "work"
    work.mkdir()
    with loaded("benchmarks.tbptt", f"--files={data}", "--field=1", "--train_tokens=200",
                "--eval_tokens=40", "--chunk_length=4", "--batch_size=4", "--max_vocab=100",
                "--units=4", "--embedding_dim=4") as tbptt:
        prepared = tbptt.prepare(str(work))
        assert list(prepared) == ["files"]  # only the given file: no --datasets
        files, text_field, vocab_path = prepared["files"]
        rows = [tbptt.run_worker(json.dumps({
            "dataset": "files", "variant": variant, "files": files, "text_field": text_field,
            "vocab": vocab_path})) for variant in ("full", "carried")]
    # The vocabulary is the file's 50 words after the 4 reserved tokens, nothing from field 0.
    vocab = open(vocab_path).read().split("\n")
    assert vocab[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert sorted(t for t in vocab[4:] if t) == sorted(f"w{i}" for i in range(50))
    for row in rows:
        # Training stops at the first batch reaching 200 predicted tokens (7 per line with
        # </s>, at most 4 lines a batch); evaluation at the first batch of 4 x 4-token chunks
        # reaching 40 held-out tokens, the same chunks for both variants.
        assert 200 <= row["train_tokens"] < 200 + 4 * 7
        assert 40 <= row["eval_tokens"] < 40 + 4 * 4
        assert row["eval_tokens"] == rows[0]["eval_tokens"] and row["eval_perplexity"] > 1
    # Chunks of 4 tokens: the carried variant makes more, smaller updates than full BPTT.
    assert rows[1]["steps"] > rows[0]["steps"]
    assert "carried" in tbptt.format_table(rows).split("\n")[3]


def test_predict_corpus_has_log_normal_word_counts(tmp_path):
    with loaded("benchmarks.predict") as predict:
        counts = predict.write_corpus(str(tmp_path / "c.txt"), 500, 12.0, 1.0, seed=0)
    lines = (tmp_path / "c.txt").read_text().splitlines()
    assert [len(line.split()) for line in lines] == counts and len(counts) == 500
    assert min(counts) >= 1 and 9 <= np.median(counts) <= 15 and max(counts) > 40


def test_mixing(tmp_path):
    out = run_benchmark("mixing", tmp_path, "--lines=400", "--labels=4", "--repeats=1",
                        "--read_batch=64", "--schemes=pad", "--shuffle_shard_bytes=4096")
    assert (out["lines"], out["labels"]) == (400, 4)
    # (the main checks that every epoch has every line once)
    unshuffled, shuffled = out["results"]
    assert (unshuffled["shuffle_lines"], shuffled["shuffle_lines"]) == (False, True)
    # The sorted file read in order: batches of 64 of 100 lines a label, 4 of the 7 of one
    # label; the line shuffle mixes them as a perfect shuffle does.
    assert (unshuffled["batches"], unshuffled["one_label_batches"]) == (7, 0.571)
    assert unshuffled["mixing_ratio"] > 2 and shuffled["one_label_batches"] == 0.0
    assert shuffled["mixing_ratio"] < 1.5 and "rate_vs_unshuffled" in shuffled


def test_mean_tv_against_the_corpus_mix():
    with loaded("benchmarks.mixing") as mixing:
        # The corpus is half and half; a one-label batch is 0.5 away from it, a mixed one 0.
        assert mixing.mean_tv(np.array([[2, 0], [0, 2], [1, 1]])) == pytest.approx(1 / 3)


def test_multislot(tmp_path):
    out = run_benchmark("multislot", tmp_path, "--lines=200", "--num_files=2", "--rounds=1",
                        "--batch_size=32", f"--data_dir={tmp_path / 'feed'}")
    # Both readers read every line of the feed once (the main checks the count).
    assert {name: r["examples"] for name, r in out["results"].items()} == {
        "tfseq": 200, "python": 200}
    assert set(out["ratio"]) == {"examples_per_wall_s", "examples_per_cpu_s"}


def test_vocab(tmp_path):
    words = [f"{stem}{end}" for stem in ("talk", "walk", "jump", "play", "read", "sing")
             for end in ("", "s", "ed", "ing", "er")]
    lines = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(8)) for i in range(300)]
    data = write_lines(tmp_path / "text.txt", lines)
    out = run_benchmark("vocab", tmp_path, f"--files={data}", "--old_lines=60",
                        "--vocab_size=60", "--heldout_every=10")
    assert (out["learn_lines"], out["heldout_lines"], out["old_lines"]) == (270, 30, 60)
    assert [r["learner"] for r in out["results"]] == [
        "new wordpiece (tokenizers)", "sentencepiece (unigram)", "old wordpiece (tf-text lib)",
        "new wordpiece, same prefix"]
    for row in out["results"]:
        assert row["vocab_size"] <= 60 and 0 < row["heldout_words_without_unk"] <= 1
    assert set(out["ratios"]) == {"sentencepiece_over_new_wordpiece",
                                  "old_over_new_wordpiece_same_prefix"}


def test_startup_corpus_is_sorted_by_label_and_its_binary_is_there(tmp_path):
    with loaded("benchmarks.startup") as startup:
        info = startup.write_corpus(str(tmp_path / "c.tsv"), 0.2, seed=0)
        assert os.path.samefile(FLAGS.train_py, os.path.join(ROOT, "scripts", "train.py"))
    labels = [line.split("\t")[0] for line in open(tmp_path / "c.tsv")]
    assert len(labels) == info["lines"] == 40_000  # 20 labels, one chunk of 2,000 each
    assert labels == sorted(labels) and len(set(labels)) == 20
    assert info["bytes"] == os.path.getsize(tmp_path / "c.tsv")


@pytest.mark.slow  # building the JSON Lines reader alone takes seconds
def test_sources(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "embedded_rows", lambda: ROWS * 3)  # mix blocks: 600 rows
    out = run_benchmark("sources", tmp_path, "--copies=2", "--repeats=1")
    # Every reader gives the same rows, in one file or in 8 shards.
    assert {out[f"read {k}"]["count"] for k in (
        "tsv", "jsonl", "jsonl renamed keys", "tfrecord", "parquet", "parquet uncompressed",
        "tsv, 8 shards", "tfrecord, 8 shards")} == {2 * 600}
    one, mixed = out["bucket, one source"], out["bucket, mix of 3"]
    assert one["count"] == 2 * 3 * ROW_WORDS and one["ratio"] == 1.0
    assert mixed["count"] >= one["count"]  # its last block may run past the rows
    # --steady: one copy too (a quarter of 2, at least one), its tokens half.
    assert 2 * one["short_count"] == one["count"] and one["steady_ratio"] == 1.0
    assert mixed["short_count"] >= one["short_count"]
    assert set(out["file_bytes"]) == {"tsv", "jsonl", "jsonl renamed keys", "tfrecord",
                                      "parquet", "parquet uncompressed"}


def test_steps(tmp_path):
    out = run_benchmark("steps", tmp_path, "--examples=400", "--steps_per_execution=1,4",
                        "--max_tokens=256", "--repeats=1")
    rows = out["rows"]
    # One and four steps per call train an epoch of the same batches.
    assert [r["steps_per_execution"] for r in rows] == [1, 4]
    assert rows[0]["steps"] == rows[1]["steps"] > 20 and rows[0]["vs_first"] == 1.0


# ----------------------------------------------------------------------------- convergence

@pytest.fixture(name="convergence")
def convergence_fixture():
    """``benchmarks.convergence`` with its default flags."""
    with loaded("benchmarks.convergence") as module:
        yield module


def make_run(points, tokens=1000.0):
    return {"epochs": [{"seconds": s, "metric": m} for s, m in points],
            "shapes": {"steps": 10, "tokens_per_step": tokens}, "learning_rate": 0.003}


def test_time_to_is_the_first_epoch_reaching_the_target_per_run(convergence):
    loss_runs = [make_run([(2.0, 5.3), (4.0, 5.1), (6.0, 5.0)]),
                 make_run([(3.0, 5.15), (6.0, 5.2), (9.0, 5.1)]),
                 make_run([(1.0, 5.4), (2.0, 5.16)])]
    assert convergence.time_to(loss_runs, 5.15, higher=False) == [4.0, 3.0, None]
    acc_runs = [make_run([(1.0, 0.5), (2.0, 0.745), (3.0, 0.9)]),
                make_run([(1.5, 0.7), (3.0, 0.74)])]
    assert convergence.time_to(acc_runs, 0.745, higher=True) == [2.0, None]


def test_baseline_target_is_the_best_seed_mean_with_its_tolerance(convergence):
    loss = [make_run([(1, 5.3), (2, 5.1), (3, 5.2)]), make_run([(1, 5.5), (2, 5.3), (3, 5.0)])]
    best, target = convergence.baseline_target(loss, higher=False)  # means 5.4, 5.2, 5.1
    assert best == pytest.approx(5.1) and target == pytest.approx(5.151)
    acc = [make_run([(1, 0.5), (2, 0.7)]), make_run([(1, 0.6), (2, 0.8)])]
    best, target = convergence.baseline_target(acc, higher=True)  # means 0.55, 0.75
    assert best == pytest.approx(0.75) and target == pytest.approx(0.745)


def test_summarize_reports_spread_time_to_target_and_fraction_of_baseline_time(convergence):
    by_scheme = {
        "pad": [make_run([(10.0, 5.4), (20.0, 5.2)], 500.0),
                make_run([(12.0, 5.6), (22.0, 5.0)], 500.0)],   # means 5.5, 5.1 -> target 5.151
        "bucket": [make_run([(4.0, 5.3), (8.0, 5.15)], 2000.0),
                   make_run([(5.0, 5.12), (9.0, 5.05)], 2000.0)],  # means 5.21, 5.10
        "pack": [make_run([(6.0, 5.3), (12.0, 5.2)]), make_run([(6.0, 5.1), (12.0, 5.2)])],
    }
    summary = convergence.summarize("lm", by_scheme)
    assert summary["metric"] == "loss" and summary["baseline"] == "pad"
    assert summary["baseline_best"] == pytest.approx(5.1)
    assert summary["target"] == pytest.approx(5.151)
    assert summary["baseline_seconds"] == pytest.approx(21.0)  # the mean curve's epoch 2
    pad, bucket, pack = summary["schemes"]
    assert pad["metric_mean"] == pytest.approx([5.5, 5.1])
    assert pad["metric_spread"] == pytest.approx([0.2, 0.2])
    assert pad["seconds_mean"] == pytest.approx([11.0, 21.0])
    assert pad["seconds_to_target"] == pytest.approx(21.0)
    assert pad["seeds_to_target"] == [None, 22.0]  # seed 0 ends at 5.2, above the target
    assert pad["fraction_of_baseline_time"] == pytest.approx(1.0)
    assert bucket["seconds_to_target"] == pytest.approx(8.5)
    assert bucket["seeds_to_target"] == [8.0, 5.0]
    assert bucket["fraction_of_baseline_time"] == pytest.approx(0.4)  # 8.5 / 21
    assert bucket["tokens_per_step"] == pytest.approx(2000.0)
    assert pack["metric_mean"] == pytest.approx([5.2, 5.2])  # above 5.151: never
    assert pack["seeds_to_target"] == [None, 6.0]
    assert pack["seconds_to_target"] is None and pack["fraction_of_baseline_time"] is None
    text = convergence.format_summary(summary)
    assert "target at 8.5 s (0.4x), 2/2 seeds" in text
    assert "target at None s (None" in text and "1/2 seeds" in text


def test_accuracy_summary_uses_the_first_scheme_and_higher_is_better(convergence):
    by_scheme = {"pad:64": [make_run([(3.0, 0.60), (6.0, 0.70)])],
                 "bucket": [make_run([(2.0, 0.696), (4.0, 0.72)])]}
    summary = convergence.summarize("classify", by_scheme)
    assert summary["metric"] == "accuracy" and summary["target"] == pytest.approx(0.695)
    assert [r["seconds_to_target"] for r in summary["schemes"]] == [6.0, 2.0]
    assert summary["schemes"][1]["fraction_of_baseline_time"] == pytest.approx(0.33)


def test_lr_factor(convergence):
    assert convergence.lr_factor(2000.0, 500.0, "none") == 1.0
    assert convergence.lr_factor(2000.0, 500.0, "sqrt") == pytest.approx(2.0)
    assert convergence.lr_factor(2000.0, 500.0, "linear") == pytest.approx(4.0)
    assert convergence.lr_factor(2000.0, None, "sqrt") == 1.0  # the baseline itself


def test_tfdata_bucketing_sizes_batches_from_the_budget(convergence):
    lengths = list(range(1, 21)) * 3  # 60 examples, lengths 1..20
    ds = tf.data.Dataset.from_tensor_slices(
        {"ids": tf.ragged.constant([[7] * n for n in lengths]), "label": tf.range(60)})
    ds = ds.apply(convergence.tfdata_bucketing(max_tokens=40, max_length=20))
    # Width-8 buckets: lengths 1-8 (batch 40 // 8 = 5), 9-16 (40 // 16 = 2), 17-20 (2).
    seen = []
    for batch in ds:
        n, t = batch["ids"].shape
        got = batch["ids_length"].numpy()
        bucket = 0 if got.max() <= 8 else 1 if got.max() <= 16 else 2
        assert n <= [5, 2, 2][bucket] and n * t <= 40
        assert t == got.max() and ((got - 1) // 8).clip(max=2).tolist() == [bucket] * n
        seen += batch["label"].numpy().tolist()
    assert sorted(seen) == list(range(60))


def test_skewed_corpus_has_long_tailed_lengths_and_four_labels(convergence, tmp_path):
    train, eval_ = convergence.skewed_corpus(str(tmp_path), 2000)
    rows = [line.rstrip("\n").split("\t") for line in open(train)]
    assert len(rows) == 2000 and len(open(eval_).readlines()) == 200
    assert sorted({label for label, _ in rows}) == ["c0", "c1", "c2", "c3"]
    lengths = np.array([len(text.split()) for _, text in rows])
    assert lengths.min() >= 3 and lengths.max() <= 120
    assert 8 <= np.median(lengths) <= 12  # log-normal, median 10
    assert lengths.max() >= 5 * np.median(lengths)  # the long tail


def test_epochs_to_run_fixed_count_or_until_the_time_budget_is_spent(convergence):
    assert [convergence.epochs_to_run(n, 99.0, None, 3, 30) for n in (0, 2, 3)] == [
        True, True, False]
    # Under a budget: the epoch count does not matter, the spent seconds do (the last epoch
    # may overshoot), up to max_epochs.
    assert convergence.epochs_to_run(5, 9.9, 10.0, 3, 30)
    assert not convergence.epochs_to_run(5, 10.0, 10.0, 3, 30)
    assert not convergence.epochs_to_run(6, 10.4, 10.0, 3, 30)
    assert not convergence.epochs_to_run(30, 1.0, 10.0, 3, 30)


def test_baseline_budgets_per_seed_on_the_clock(convergence):
    runs = [{"seed": 0, "epochs": [{"seconds": 5.0, "cpu_seconds": 7.0},
                                   {"seconds": 9.0, "cpu_seconds": 13.5}]},
            {"seed": 2, "epochs": [{"seconds": 4.0, "cpu_seconds": 6.0}]}]
    assert convergence.baseline_budgets(runs, "cpu") == {0: 13.5, 2: 6.0}
    assert convergence.baseline_budgets(runs, "wall") == {0: 9.0, 2: 4.0}
    timed = convergence.on_clock({"epochs": runs[0]["epochs"]}, "cpu")
    assert [e["seconds"] for e in timed["epochs"]] == [7.0, 13.5]
    old = {"epochs": [{"seconds": 5.0}]}  # stored before the CPU clock: keeps wall seconds
    assert convergence.on_clock(old, "cpu") is old


def test_summarize_runs_with_different_epoch_counts_under_a_time_budget(convergence):
    by_scheme = {
        "pad": [make_run([(10.0, 0.40), (20.0, 0.50)]), make_run([(10.0, 0.44), (20.0, 0.54)])],
        # Cheaper epochs, so more of them in the same budget; seed 1 ran one epoch fewer.
        "bucket": [make_run([(5.0, 0.30), (10.0, 0.45), (15.0, 0.52), (20.0, 0.56)]),
                   make_run([(6.0, 0.35), (12.0, 0.51), (18.0, 0.55)])],
    }
    summary = convergence.summarize("classify", by_scheme)  # pad means 0.42, 0.52 -> target 0.515
    assert summary["target"] == pytest.approx(0.515)
    pad, bucket = summary["schemes"]
    assert bucket["epochs_run"] == [4, 3]
    assert bucket["metric_mean"] == pytest.approx([0.325, 0.48, 0.535])  # the common 3 epochs
    assert bucket["seconds_to_target"] == pytest.approx(16.5)
    assert bucket["fraction_of_baseline_time"] == pytest.approx(0.82)  # 16.5 / 20
    assert bucket["seeds_to_target"] == [15.0, 18.0]
    assert bucket["final_metric_mean"] == pytest.approx(0.555)  # each seed's last epoch
    assert bucket["final_metric_spread"] == pytest.approx(0.01)
    assert bucket["final_seconds_mean"] == pytest.approx(19.0)
    assert bucket["best_metric_mean"] == pytest.approx(0.555)  # each seed's best is its last
    assert convergence.epochs_text(bucket) == "3-4" and convergence.epochs_text(pad) == "2"
    table = convergence.markdown_table(summary)
    assert "| bucket | 10 x 1000 (0.0 x 0.0, 0.00) | 0.003 | 3-4 | 0.555 (0.010) | " \
           "0.555 (0.010) | 19.0 | 16.5 (0.82x), 2/2 |" in table
    assert "3-4 epochs, end 0.5550(0.010) at 19.0 s, best 0.5550(0.010)" in \
        convergence.format_summary(summary)


def test_best_held_out_is_each_seeds_best_point_even_after_it_falls(convergence):
    by_scheme = {"pad": [make_run([(10.0, 5.3), (20.0, 5.2)])],
                 # Overfits: the loss rises after its second point; seed 1 is best at the end.
                 "bucket": [make_run([(5.0, 5.25), (10.0, 5.1), (15.0, 5.3)]),
                            make_run([(5.0, 5.4), (10.0, 5.2), (15.0, 5.15)])]}
    bucket = convergence.summarize("lm", by_scheme)["schemes"][1]
    assert bucket["final_metric_mean"] == pytest.approx(5.225)
    assert bucket["best_metric_mean"] == pytest.approx(5.125)  # mean of 5.1 and 5.15
    assert bucket["best_metric_spread"] == pytest.approx(0.05)


def test_a_scheme_suffix_must_name_a_learning_rate_rule(convergence):
    with pytest.raises(ValueError, match="'bucket/cube'.*none, sqrt or linear"):
        convergence.run("lm", "bucket/cube", 0, {})


def test_a_scheme_may_carry_its_own_token_budget_and_learning_rate_rule(convergence):
    assert convergence.parse_scheme("bucket") == ("bucket", 2048, "none")
    assert convergence.parse_scheme("bucket@1024/sqrt") == ("bucket", 1024, "sqrt")
    assert convergence.parse_scheme("pad:64@512") == ("pad:64", 512, "none")
    for bad in ("bucket@/sqrt", "bucket@0", "bucket@1k"):
        with pytest.raises(ValueError, match="after '@' must be a positive integer"):
            convergence.parse_scheme(bad)


def test_pad_rows_follow_the_schemes_token_budget(convergence):
    task, full = convergence.task_config("lm", "pad", 0, {})
    _, half = convergence.task_config("lm", "pad", 0, {}, max_tokens=1024)
    _, bucket = convergence.task_config("lm", "bucket", 0, {}, max_tokens=1024)
    assert task.name == "lm" and full.max_length == 48 and task.longest(full) == 49  # <s> w1..
    assert (full.batch_size, half.batch_size) == (41, 20)  # 2048 // 49, 1024 // 49
    assert (full.max_tokens, half.max_tokens, bucket.max_tokens) == (2048, 1024, 1024)
    assert (full.batching, bucket.batching, full.max_lines) == ("pad", "bucket", 3000)


def test_task_config_per_corpus(convergence):
    task, pack = convergence.task_config("classify", "pack", 3, {"verses": "/d/verses.txt"})
    assert (task.name, pack.files, pack.batching, pack.seed) == (
        "classify", ("/d/verses.txt",), "pack", 3)
    _, tfdata = convergence.task_config("classify", "tfdata", 0,
                                        {"skewed": ("/d/t.tsv", "/d/e.tsv")})
    assert (tfdata.train_files, tfdata.eval_files, tfdata.format, tfdata.columns,
            tfdata.max_length, tfdata.batching) == (
        ("/d/t.tsv",), ("/d/e.tsv",), "tsv", ("label", "text"), 120, "bucket")
    _, lm = convergence.task_config("lm", "pad:16", 0, {"skewed": ("/d/t.tsv", "/d/e.tsv")})
    assert (lm.columns, lm.batch_size) == (("_", "text"), 16)
    task, tag = convergence.task_config("tag", "pad", 1,
                                        {"brown": ("/d/train.conll", "/d/eval.conll")})
    assert (task.name, tag.train_files, tag.eval_files, tag.format, tag.columns) == (
        "tag", ("/d/train.conll",), ("/d/eval.conll",), "conll", ("token", "tag"))
    assert (tag.max_length, task.longest(tag), tag.batch_size, tag.lowercase) == (64, 64, 32, False)


def test_explicit_batching_only_for_tfdata_and_the_sweep(convergence):
    for scheme in ("pad", "bucket", "pack"):
        assert convergence.explicit_batching(scheme, max_tokens=64, max_length=8) is None
    examples = tf.data.Dataset.from_tensor_slices(
        {"ids": tf.ragged.constant([[5, 6, 7], [8], [9, 10]])}).map(lambda e: {"ids": e["ids"]})
    for scheme, knob, value in (("tfdata", None, None), ("bucket", "pool_budgets", "2"),
                                ("bucket", "length_noise", "0.5"), ("bucket", "bucket_width", "2")):
        batching = convergence.explicit_batching(scheme, knob, value, max_tokens=8, max_length=4,
                                           seed=0)
        rows = sorted(r[:n].tolist() for b in examples.apply(batching)
                      for r, n in zip(b["ids"].numpy(), b["ids_length"].numpy()))
        assert rows == [[5, 6, 7], [8], [9, 10]], (scheme, knob)


def test_mid_epoch_evaluation_points(convergence):
    assert convergence.eval_interval(35, 1) is None and convergence.eval_interval(1, 4) is None
    assert convergence.eval_interval(35, 4) == 9  # ceil(35 / 4)
    assert convergence.mid_epoch_points(35, 9) == [9, 18, 27]  # the 4th point is the epoch's end
    assert convergence.mid_epoch_points(36, 9) == [9, 18, 27]
    assert convergence.mid_epoch_points(10, None) == []
    # Whole epochs come from the last point's epoch field (runs stored before it: points).
    assert convergence.epochs_run({"epochs": [{"epoch": 0.5}, {"epoch": 1.0}, {"epoch": 1.5},
                                        {"epoch": 2.0}]}) == 2
    assert convergence.epochs_run({"epochs": [{}, {}, {}]}) == 3


def test_mid_epoch_callback_fires_after_its_steps_only(convergence):
    import keras
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    ds = tf.data.Dataset.from_tensor_slices((tf.ones([10, 2]), tf.ones([10, 1]))).batch(2)
    seen = []
    callback = convergence.mid_epoch_callback(5, convergence.eval_interval(5, 3), seen.append)
    model.fit(ds, epochs=2, verbose=0, callbacks=[callback])
    assert seen == [0.4, 0.8, 0.4, 0.8]  # every 2 of 5 steps, both epochs


def test_training_clock_counts_only_while_running(convergence):
    clock = convergence.TrainingClock()
    clock.stop()  # not started: nothing counted
    assert clock.wall == 0.0 and clock.cpu == 0.0
    clock.start()
    sum(i * i for i in range(200_000))
    clock.stop()
    first = clock.wall
    assert first > 0.0 and clock.cpu > 0.0
    sum(i * i for i in range(200_000))  # stopped: not counted
    assert clock.wall == first


# ----------------------------------------------------------------------------- tag (Brown)

TRAIN_CONLL = "a\tat\ndog\tnn\nbarks\tvbz\n\nthe\tat\ndog\tnn\nruns\tvbz\n\n" \
              "run\tvb\nrun\tnn\nrun\tnn\n\n"
EVAL_CONLL = "the\tat\ncat\tnn\nruns\tvbz\nrun\tvb\n\na\tat\ndog\tnn\n.\t.\n\n" \
             "dog\tnn\ndog\tnn\ndog\tvb\n\n"


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_tag_baselines_score_the_tokens_the_task_scores(convergence, tmp_path):
    train = write(tmp_path / "train.conll", TRAIN_CONLL)
    eval_ = write(tmp_path / "eval.conll", EVAL_CONLL)
    # Majority tag nn (4 of 9). Per word: the/a -> at, dog -> nn, runs/barks -> vbz, run -> nn
    # (2 of 3); cat is unknown -> nn. The 2nd eval sentence has a tag never seen in training
    # ('.'): the task drops it. The others are cut to max_length=3 tokens.
    # Scored: the cat runs | dog dog dog; majority (nn) right: cat, dog, dog (3 of 6); per word
    # right: the, cat, runs, dog, dog (5 of 6).
    got = convergence.tag_baselines(train, eval_, max_length=3)
    assert got == {"majority-tag": 0.5, "most-frequent-tag-per-word": pytest.approx(5 / 6)}
    # Uncut, the 1st sentence adds run/vb: wrong for both.
    got = convergence.tag_baselines(train, eval_, max_length=64)
    assert got == {"majority-tag": pytest.approx(3 / 7),
                   "most-frequent-tag-per-word": pytest.approx(5 / 7)}


def test_summaries_of_tag_are_accuracy_with_the_baselines_line(convergence):
    summary = convergence.summarize("tag", {"pad": [make_run([(3.0, 0.80), (6.0, 0.90)])],
                                      "pack": [make_run([(1.0, 0.85), (2.0, 0.897)])]})
    assert summary["metric"] == "accuracy" and summary["target"] == pytest.approx(0.895)
    assert [r["seconds_to_target"] for r in summary["schemes"]] == [6.0, 2.0]
    summary["baselines"] = {"majority-tag": 0.1462, "most-frequent-tag-per-word": 0.9024}
    assert convergence.format_summary(summary).splitlines()[-1] == (
        "  baselines on the eval split: majority-tag 0.1462, most-frequent-tag-per-word 0.9024")


def test_example_batches_give_every_training_sentence_once_per_epoch(convergence, tmp_path):
    """The explicit stream of tfdata and the sweep on the tag task's own pieces."""
    train = write(tmp_path / "train.conll", TRAIN_CONLL + "a\tat\ndog\tnn\n\nrun\tvb\n\n")
    eval_ = write(tmp_path / "eval.conll", EVAL_CONLL)
    task, config = convergence.task_config("tag", "tfdata", 0, {"brown": (train, eval_)},
                                     max_tokens=8)
    config = dataclasses.replace(config, max_length=4)
    state, _ = task.prepare(config)
    assert state.labels["tags"] == ("at", "nn", "vb", "vbz")  # ids 1..4
    counter = tfseq.DropCounter("train")
    for scheme, knob, value in (("tfdata", None, None), ("bucket", "pool_budgets", "1")):
        batching = convergence.explicit_batching(scheme, knob, value, max_tokens=8,
                                           max_length=task.longest(config), seed=0,
                                           counter=counter)
        ds = convergence.example_batches(task, config, state, batching, seed=0, counter=counter)
        for _ in range(2):  # two epochs
            tags = []
            for x, y, w in ds.as_numpy_iterator():
                assert x["ids"].size <= 8 and sorted(x) == ["ids", "ids_length"]
                assert w.sum() == x["ids_length"].sum()
                tags += [row[:n].tolist() for row, n in zip(y, x["ids_length"])]
            assert sorted(tags) == [[1, 2], [1, 2, 4], [1, 2, 4], [3], [3, 2, 2]], scheme
