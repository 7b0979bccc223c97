"""Before the first step: one read of the training files, a uniform vocabulary sample, progress
on the long phases (and none with --verbose=0)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sorted_corpus(path, lines=2000):
    """``label<TAB>text`` sorted by label; only the last tenth holds the words ``zebra``,
    ``quokka`` and ``axolotl`` (in every one of its lines)."""
    rows = []
    for i in range(lines):
        label = "a" if i < lines // 2 else "b"
        words = [f"common{i % 7}", f"word{i % 13}", "the", "and"]
        if i >= lines * 9 // 10:
            words += ["zebra", "quokka", "axolotl"]
        rows.append(f"{label}\t{' '.join(words)}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def train(*args, env=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "train.py"), *args],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer,verbose", [("wordpiece", 1), ("sentencepiece", 0)])
def test_one_read_gives_labels_a_uniform_sample_and_the_shards(tmp_path, tokenizer, verbose):
    corpus = sorted_corpus(tmp_path / "sorted.tsv")
    run = tmp_path / "run"
    # 200 sampled lines of 2,000: the first 200 would hold none of the last tenth's words;
    # shards of 8 KB: the 53 KB file is spilled into 7 of them in the same read. Every phase
    # is "long" when lines are due every 0 s (TFSEQ_PROGRESS_SECONDS).
    out = train(f"--train_files={corpus}", "--columns=label,text", f"--tokenizer={tokenizer}",
                "--vocab_size=200", "--vocab_max_lines=200", "--shuffle_shard_bytes=8192",
                "--epochs=1", "--max_steps=1", f"--model_dir={run}", f"--verbose={verbose}",
                "--noexport", env={"TFSEQ_PROGRESS_SECONDS": "0"})
    assert out.returncode == 0, out.stderr[-3000:]
    if verbose:  # progress on the long phases
        assert "reading the training records: 2,000 records" in out.stderr
        assert "MB/s" in out.stderr
        assert "learning a wordpiece vocabulary of 200 from 200 lines" in out.stderr
        assert "done in" in out.stderr
        assert "building the model ..." in out.stderr
        assert "building the training input ..." in out.stderr
    else:  # --verbose=0: no progress line, also with lines due every 0 s
        assert "reading the training records" not in out.stderr
        assert f"learning a {tokenizer} vocabulary" not in out.stderr
    report = json.loads((run / "report.json").read_text())
    assert report["setup"]["passes"] == 1
    assert report["setup"]["records"] == 2000
    assert report["setup"]["first_step_seconds"] > 0
    assert (run / "labels.txt").read_text() == "a\nb\n"
    assert len(list((run / "data" / "shuffle").glob("shard-*.tfrecord"))) == 7
    if tokenizer == "wordpiece":  # frequent in the sample: whole words of the vocabulary
        vocab = (run / "vocab.txt").read_text().split("\n")
        assert {"zebra", "quokka", "axolotl"} <= set(vocab)
        # A resume reads nothing before its first step: vocabulary, labels and shards are
        # saved.
        out = train(f"--flagfile={run / 'flags.txt'}", "--max_steps=1", "--noexport")
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads((run / "report.json").read_text())["setup"]["passes"] == 0
    else:  # their letters z, q, x, b, k, l, u, p occur nowhere else: none is <unk>
        import sentencepiece as spm
        processor = spm.SentencePieceProcessor(model_file=str(run / "vocab.model"))
        pieces = processor.encode("zebra quokka axolotl", out_type=str)
        assert processor.unk_id() not in processor.encode("zebra quokka axolotl"), pieces
