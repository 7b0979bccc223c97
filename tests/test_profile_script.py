"""scripts/profile.py and scripts/bench_pipeline.py run and report every stage."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(name, *args, timeout=600, check=True):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", name), *args],
                         capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if check:
        assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.slow
def test_profile_has_a_row_per_stage_with_positive_rates(tmp_path):
    out = run_script("profile.py", "--max_lines=2000", "--repeats=1", "--batching=pad",
                     "--model_step_ms=1000", f"--json_out={tmp_path / 'p.json'}")
    report = json.loads((tmp_path / "p.json").read_text())
    stages = [r["stage"] for r in report["rows"]]
    assert stages == ["read", "field", "clean lines", "tokenize+lookup", "length filter",
                      "shuffle", "batch (pad)", "prefetch"]
    for row in report["rows"]:
        assert row["examples"] == 2000 and row["examples_per_s"] > 0
    for row in report["rows"][3:]:
        assert row["tokens_per_s"] > 0
    assert report["model_check"]["model_step_ms"] == 1000
    assert "<- slowest" in out.stdout and "keeps up" in out.stdout


@pytest.mark.slow
def test_bench_pipeline_feeds_deliver_the_same_real_tokens(tmp_path):
    # Every feed reads the same lines (two copies of the corpus): the same real tokens come
    # out of the raw limit, the tfseq pipelines (bucket, pack with one and with three row
    # lengths, line shuffle, per-example), the plain tf.data pipeline and the Python
    # generator feed.
    run_script("bench_pipeline.py", "--copies=2", "--repeats=1",
               f"--json_out={tmp_path / 'b.json'}")
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [r["feed"] for r in rows] == ["raw read+tokenize+lookup", "tfseq full pipeline",
                                         "tfseq full pipeline, pack",
                                         "tfseq pack, 3 row lengths",
                                         "tfseq full pipeline, shuffle_lines",
                                         "tfseq per-example pipeline", "plain tf.data pipeline",
                                         "python generator feed"]
    assert len({r["real_tokens"] for r in rows}) == 1
    assert rows[0]["real_tokens"] == 2 * 792_676  # the embedded English corpus, twice
    assert all(r["tokens_per_second"] > 0 for r in rows)


@pytest.mark.slow
def test_bench_scaling_feeds_deliver_the_same_real_tokens_at_any_parallelism(tmp_path):
    # One pinned child at 1 core; the embedded corpus (both languages) in 4 files read once:
    # raw, bucketing and packing (with 1 and 2 parallel pools/parts), each stage alone on
    # cached input, and plain tf.data all deliver the same real tokens (none is over 512).
    run_script("bench_scaling.py", "--cores=1", "--copies=1", "--files_out=4", "--repeats=1",
               "--parallel=1,2", "--python_loop=false", f"--json_out={tmp_path / 's.json'}")
    report = json.loads((tmp_path / "s.json").read_text())
    rows = report["rows"]
    read = next(r for r in rows if r["feed"] == "read")  # lines, not tokens
    assert read["lines"] == 62_204  # both languages' text, every line once
    assert read["lines_per_second"] > 0
    rows = [r for r in rows if r["feed"] != "read"]
    assert [r["feed"] for r in rows] == [
        "raw", "bucket parallel=1", "pack parallel=1", "bucket_alone parallel=1",
        "pack_alone parallel=1", "bucket parallel=2", "pack parallel=2",
        "bucket_alone parallel=2", "pack_alone parallel=2", "plain"]
    assert {r["cores"] for r in rows} == {1}
    assert len({r["real_tokens"] for r in rows}) == 1
    assert rows[0]["real_tokens"] > 792_676  # the English side alone has that many
    assert all(r["tokens_per_second"] > 0 for r in rows)


@pytest.mark.slow
def test_bench_sources_reads_the_same_rows_in_every_format(tmp_path):
    # The embedded corpus' rows twice as TSV, JSON Lines and TFRecord (and in 8 shards of
    # TSV and of TFRecord, read in parallel): every reader gives the same rows (18 of the
    # 62,204 have an empty text), and the mixture of the three thirds buckets at least the
    # one source's real tokens (its last block runs past them). --steady times the bucket
    # feeds over one copy too: one source's short pass has exactly half its tokens.
    run_script("bench_sources.py", "--copies=2", "--repeats=1",
               f"--json_out={tmp_path / 's.json'}")
    report = json.loads((tmp_path / "s.json").read_text())
    assert {report[f"read {k}"]["count"] for k in ("tsv", "jsonl", "tfrecord",
                                                   "tsv, 8 shards", "tfrecord, 8 shards")
            } == {2 * 62_186}
    one, mixed = report["bucket, one source"], report["bucket, mix of 3"]
    assert mixed["count"] >= one["count"] > 2_000_000
    assert all(report[k]["rate"] > 0 for k in report if k != "file_bytes")
    assert 2 * one["short_count"] == one["count"]
    assert mixed["short_count"] >= one["short_count"]
    assert one["steady_ratio"] == 1.0
    for row in (one, mixed):
        assert row["steady_rate"] > 0 and row["short_seconds"] > 0
        assert row["start_seconds"] <= row["short_seconds"]


@pytest.mark.slow
def test_profile_reads_a_conll_file_by_its_token_column(tmp_path):
    conll = tmp_path / "x.conll"
    conll.write_text("EU\tNNP\tB-ORG\nrejects\tVBZ\tO\n\nPeter\tNNP\tB-PER\nBlackburn\tNNP\t"
                     "I-PER\nsaid\tVBD\tO\n\n")
    run_script("profile.py", f"--train_files={conll}", "--columns=token,_,tag", "--repeats=1",
               f"--json_out={tmp_path / 'p.json'}")
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    assert {r["examples"] for r in rows} == {2}  # two sentences, their tokens the text
    assert rows[-1]["real_tokens"] == 5


@pytest.mark.slow
def test_profile_task_tag_profiles_the_training_stream_of_a_conll_file(tmp_path):
    # 40 sentences (every 10th held out by its hash): the stream trains every encoded
    # sentence once, and its real tokens are the encoded tokens.
    sentences = []
    for i in range(40):
        words = [f"w{(i * 7 + j) % 13}" for j in range(i % 5 + 2)]
        sentences.append("\n".join(f"{w}\tNN\t{'B-X' if j == 0 else 'O'}"
                                   for j, w in enumerate(words)))
    conll = tmp_path / "train.conll"
    conll.write_text("\n\n".join(sentences) + "\n\n")
    run_script("profile.py", "--task=tag", f"--train_files={conll}", "--columns=token,_,tag",
               "--repeats=1", f"--json_out={tmp_path / 'p.json'}")
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    assert [r["stage"] for r in rows] == ["read records", "encode (tag)",
                                          "train stream (bucket)"]
    assert rows[0]["examples"] == 40  # every sentence read
    assert 30 <= rows[1]["examples"] < 40  # the held-out ones dropped as other_split
    assert rows[2]["examples"] == rows[1]["examples"]
    assert rows[2]["real_tokens"] == rows[1]["real_tokens"] > 0


@pytest.mark.slow
def test_profile_task_ctr_profiles_its_own_pipeline(tmp_path):
    # A task off the spine: its training dataset, whole, one row.
    run_script("profile.py", "--task=ctr", "--repeats=1", f"--json_out={tmp_path / 'p.json'}")
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    assert [r["stage"] for r in rows] == ["train dataset (ctr)"]
    assert rows[0]["examples"] > rows[0]["elements"] > 1


def test_profile_task_refuses_a_budget_as_training_does(tmp_path):
    # The task's own checks, in the one-line error style: no traceback.
    out = run_script("profile.py", "--task=classify", "--max_tokens=100", "--max_length=128",
                     "--repeats=1", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "tfseq-profile: error: max_tokens=100 cannot hold one example of 128 tokens "
        "(max_length); raise max_tokens or lower max_length")


@pytest.mark.slow
def test_bench_steps_trains_the_same_steps_at_any_steps_per_execution(tmp_path):
    # 3,000 synthetic examples: one and eight steps per Python call train an epoch of the
    # same number of steps (the batches do not depend on it).
    run_script("bench_steps.py", "--examples=3000", "--steps_per_execution=1,8",
               "--repeats=1", f"--json_out={tmp_path / 's.json'}")
    rows = json.loads((tmp_path / "s.json").read_text())["rows"]
    assert [r["steps_per_execution"] for r in rows] == [1, 8]
    assert rows[0]["steps"] == rows[1]["steps"] > 20
    assert all(r["steps_per_second"] > 0 for r in rows) and rows[0]["vs_first"] == 1.0


def test_bench_scaling_splits_two_pass_lengths_into_a_steady_rate_and_a_start():
    from tfseq.scripts.pass_lengths import steady

    # 3M tokens in 1.0 s and 12M in 2.5 s: the 9M between them took 1.5 s (6M tokens/s),
    # so the short pass spent 0.5 s before delivering at that rate.
    out = steady((3_000_000, 1.0), (12_000_000, 2.5))
    assert out == {"short_real_tokens": 3_000_000, "short_seconds": 1.0,
                   "steady_tokens_per_second": 6_000_000.0, "start_seconds": 0.5}
    # A feed with no start: the rate of either pass.
    assert steady((1_000, 0.5), (4_000, 2.0))["start_seconds"] == 0.0
