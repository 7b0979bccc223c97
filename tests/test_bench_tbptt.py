"""scripts/bench_tbptt.py on a user's own file (--files, --field), run as users run it."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_own_file_trains_every_variant_on_its_field(tmp_path):
    # 2,000 lines "k<i>\t<6 words of 50>": the text is field 1; field 0 must not leak in.
    lines = [f"k{i}\t" + " ".join(f"w{(i * j + j) % 50}" for j in range(1, 7)) for i in range(2000)]
    data = tmp_path / "own.tsv"
    data.write_text("\n".join(lines) + "\n")
    out, work = tmp_path / "tbptt.json", tmp_path / "work"
    subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench_tbptt.py"), f"--files={data}",
         "--field=1", "--variants=full,carried", "--train_tokens=1500", "--eval_tokens=200",
         "--chunk_length=4", "--batch_size=4", "--max_vocab=100", "--units=8",
         "--embedding_dim=8", f"--work_dir={work}", f"--json_out={out}"],
        check=True, capture_output=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=600)
    rows = json.loads(out.read_text())["results"]
    # Only the given file (no --datasets): no embedded-corpus rows.
    assert [(r["dataset"], r["variant"]) for r in rows] == [("files", "full"),
                                                           ("files", "carried")]
    # The vocabulary is the file's 50 words after the 4 reserved tokens, nothing from field 0.
    vocab = (work / "vocab_files_100.txt").read_text().split("\n")
    assert vocab[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert sorted(t for t in vocab[4:] if t) == sorted(f"w{i}" for i in range(50))
    for row in rows:
        # Training stops at the first batch reaching 1,500 predicted tokens (7 per line with
        # </s>, at most 4 lines a batch); evaluation at the first batch of 4 x 4-token chunks
        # reaching 200 held-out tokens, the same chunks for both variants.
        assert 1500 <= row["train_tokens"] < 1500 + 4 * 7
        assert 200 <= row["eval_tokens"] < 200 + 4 * 4
        assert row["eval_tokens"] == rows[0]["eval_tokens"]
        # Below a uniform guess over the 54-token vocabulary (~30 measured): it learned the file.
        assert 1.0 < row["eval_perplexity"] < 54
    # Chunks of 4 tokens: the carried variant makes more, smaller updates than full BPTT.
    assert rows[1]["steps"] > rows[0]["steps"]
