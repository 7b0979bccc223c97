"""scripts/bench_packing.py on a user's own file (--files, --field), run as users run it."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_own_file_is_a_corpus_with_its_field(tmp_path):
    # 3 + 2 + 1 tokens in field 1, a line without field 1 (0 tokens: not kept), and 200 lines
    # of 6 tokens: 203 examples kept, 1,206 tokens.
    lines = ["a\tone two three", "b\tfour five", "c\tsix", "d"]
    lines += [f"x\tw{i} w w w w w" for i in range(200)]
    data = tmp_path / "own.tsv"
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "packing.json"
    subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench_packing.py"), f"--files={data}",
         "--field=1", "--train_steps=0", "--max_tokens=64", "--block_length=16",
         f"--json_out={out}"],
        check=True, capture_output=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=300)
    (result,) = json.loads(out.read_text())["results"]  # only the given file: no --corpora
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
