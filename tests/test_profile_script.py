"""scripts/profile.py (tfseq-profile) runs and reports every stage."""

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
    out = run_script("profile.py", "--max_lines=500", "--repeats=1", "--batching=pad",
                     "--model_step_ms=1000", f"--json_out={tmp_path / 'p.json'}")
    report = json.loads((tmp_path / "p.json").read_text())
    stages = [r["stage"] for r in report["rows"]]
    assert stages == ["read", "field", "clean lines", "tokenize+lookup", "length filter",
                      "shuffle", "batch (pad)", "prefetch"]
    for row in report["rows"]:
        assert row["examples"] == 500 and row["examples_per_s"] > 0
    for row in report["rows"][3:]:
        assert row["tokens_per_s"] > 0
    assert report["model_check"]["model_step_ms"] == 1000
    assert "<- slowest" in out.stdout and "keeps up" in out.stdout


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
