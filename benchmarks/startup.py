r"""Your corpus at scale: time to the first step, memory, disk, and the checkpoint's data state.

Usage:
  python -m benchmarks.startup --json_out=bench_out/startup.json              # 1x, 4x, 16x
  python -m benchmarks.startup --sizes=1 --tokenizer=sentencepiece
  python -m benchmarks.startup --train_py=/tmp/old/scripts/train.py --sizes=1  # another tree

For each size (``--sizes`` times ``--base_mb`` of text) it writes a labelled TSV sorted by
label (``write_corpus``: 20 labels, Zipf-distributed words of a 50k vocabulary with
label-specific topic words, 4-60 words per line; written once into ``--data_dir`` and reused),
then, side by side from one run:

* the limit: one plain ``tf.data`` read of the file (``TextLineDataset``, batches of 8,192);
* ``tfseq-train --task=classify --train_files=<corpus> --columns=label,text
  --tokenizer=<t> --vocab_size=<n> --max_steps=<s> --checkpoint_every=<c>``, a new run in its own
  process: wall seconds to the first training step and its phases (the one read of the
  training files with the labels, the vocabulary sample and the shuffle shards; learning the
  vocabulary), the process' peak memory (``getrusage`` max RSS), the shards' disk, each
  checkpoint's size and the bytes of it that are the input's state, and the time to write one;
* the same command again, resuming from the last checkpoint with ``--max_steps=1``: seconds to
  restore and to the first batch after the restore, and the process' peak memory.

Targets (issue "corpus at scale" / "resume anywhere"): time to the first step at 16x <= 1.5 x
(plain read + the vocabulary learner's own time); peak memory bounded by the sample and shard
sizes, not the corpus; data state < 1 MB and restore < 10 s at every size.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from absl import flags  # noqa: E402

from benchmarks import harness  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_list("sizes", ["1", "4", "16"], "Corpus sizes, in multiples of --base_mb.")
flags.DEFINE_integer("base_mb", 60, "Megabytes of text of the 1x corpus.")
flags.DEFINE_string("data_dir", "/tmp/tfseq_bench_setup", "Where corpora and runs go.")
flags.DEFINE_enum("tokenizer", "wordpiece", ["wordpiece", "sentencepiece", "whitespace"],
                  "Tokenizer of the runs.")
flags.DEFINE_integer("vocab_size", 8000, "Learned vocabulary size.")
flags.DEFINE_integer("max_steps", 20, "Training steps of the first run.")
flags.DEFINE_integer("checkpoint_every", 10, "Checkpoint every N steps.")
flags.DEFINE_string("train_py", os.path.join(ROOT, "scripts", "train.py"),
                    "The training binary to measure (e.g. an older tree's).")
flags.DEFINE_integer("seed", 0, "Corpus seed.")

LABELS = 20
VOCAB = 50_000


def write_corpus(path: str, megabytes: float, seed: int = 0) -> dict:
    """Writes ``label<TAB>text`` lines sorted by label, about ``megabytes`` MB; returns
    ``{"lines", "bytes"}``."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = rng.integers(2, 11, VOCAB)
    words = np.array(["".join(rng.choice(letters, n)) for n in lengths], dtype=object)
    zipf = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    cdf = np.cumsum(zipf / zipf.sum())
    target, written, lines = megabytes * 1e6, 0, 0
    per_label = target / LABELS
    with open(path, "w", encoding="utf-8") as f:
        for label in range(LABELS):
            topic = rng.choice(VOCAB, 200, replace=False)
            name = f"label{label:02d}"
            size = 0
            while size < per_label:
                n = 2_000  # ~0.5 MB: sizes within ~1% of --base_mb x size
                counts = rng.integers(4, 61, n)
                ids = np.searchsorted(cdf, rng.random(counts.sum()))
                topical = rng.random(counts.sum()) < 0.1
                ids[topical] = rng.choice(topic, topical.sum())
                tokens = words[ids]
                ends = np.cumsum(counts)
                chunk = "".join(f"{name}\t{' '.join(tokens[e - c:e])}\n"
                                for c, e in zip(counts.tolist(), ends.tolist()))
                f.write(chunk)
                size += len(chunk)
                lines += n
            written += size
    return {"lines": lines, "bytes": written}


def plain_read_seconds(path: str) -> float:
    """One ``tf.data`` pass over the file's lines (batches of 8,192): the limit."""
    import tensorflow as tf

    start = time.perf_counter()
    total = tf.data.TextLineDataset(path, buffer_size=1 << 20).batch(8192).reduce(
        tf.constant(0, tf.int64), lambda n, b: n + tf.size(b, out_type=tf.int64))
    int(total)
    return time.perf_counter() - start


def run_train(args: list[str]) -> dict:
    """Runs the training binary; returns wall seconds, peak RSS (MB) and its stderr."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, FLAGS.train_py, *args], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    stderr = child.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"training failed ({args}):\n{stderr[-3000:]}")
    return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024, "stderr": stderr}


def disk_mb(path: str) -> float:
    total = 0
    for folder, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    return total / 1e6


def checkpoint_mb(model_dir: str) -> float:
    """The newest checkpoint's files, in MB."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(os.path.join(model_dir, "ckpt"))
    if not latest:
        return 0.0
    directory, prefix = os.path.split(latest)
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
               if f.startswith(prefix + ".")) / 1e6


def data_state(model_dir: str) -> int:
    """The input's bytes in the newest checkpoint (for a run whose report does not say)."""
    import tensorflow as tf

    from tfseq.training import data_state_bytes

    latest = tf.train.latest_checkpoint(os.path.join(model_dir, "ckpt"))
    return data_state_bytes(latest) if latest else 0


def measure(size: int) -> dict:
    corpus = os.path.join(FLAGS.data_dir, f"corpus_{size}x.tsv")
    info_path = corpus + ".json"
    if not os.path.exists(info_path):
        info = write_corpus(corpus, FLAGS.base_mb * size, FLAGS.seed + size)
        with open(info_path, "w") as f:
            json.dump(info, f)
    with open(info_path) as f:
        info = json.load(f)
    model_dir = os.path.join(FLAGS.data_dir, f"run_{size}x_{FLAGS.tokenizer}")
    shutil.rmtree(model_dir, ignore_errors=True)
    limit = plain_read_seconds(corpus)
    args = [f"--train_files={corpus}", "--columns=label,text", f"--tokenizer={FLAGS.tokenizer}",
            "--epochs=1", f"--checkpoint_every={FLAGS.checkpoint_every}",
            f"--model_dir={model_dir}", "--export=false", "--verbose=1"]
    if FLAGS.tokenizer != "whitespace":
        args.append(f"--vocab_size={FLAGS.vocab_size}")
    first = run_train(args + [f"--max_steps={FLAGS.max_steps}"])
    with open(os.path.join(model_dir, "report.json")) as f:
        report = json.load(f)
    resumed = run_train(args + ["--max_steps=1"])
    with open(os.path.join(model_dir, "report.json")) as f:
        again = json.load(f)
    setup = report.get("setup", {})
    return {
        "size": f"{size}x", "megabytes": info["bytes"] / 1e6, "lines": info["lines"],
        "plain_read_seconds": limit,
        "first_step_seconds": setup.get("first_step_seconds"),
        "phases": setup.get("seconds", {}), "passes": setup.get("passes"),
        "run_seconds": first["seconds"], "peak_rss_mb": first["peak_rss_mb"],
        "shard_disk_mb": disk_mb(os.path.join(model_dir, "data")),
        "checkpoint_mb": checkpoint_mb(model_dir),
        "data_state_bytes": report.get("data_state_bytes", data_state(model_dir)),
        "save_seconds": report.get("checkpoints", {}).get("save_seconds"),
        "restore_seconds": again.get("checkpoints", {}).get("restore_seconds"),
        "first_batch_after_restore_seconds": again.get("checkpoints", {}).get(
            "first_batch_after_restore_seconds"),
        "resume_first_step_seconds": again.get("setup", {}).get("first_step_seconds"),
        "resume_peak_rss_mb": resumed["peak_rss_mb"],
        "progress_lines": sum(1 for line in first["stderr"].splitlines()
                              if line.startswith(("reading the training", "learning a"))),
    }


def main(argv):
    del argv
    os.makedirs(FLAGS.data_dir, exist_ok=True)
    rows = [measure(int(s)) for s in FLAGS.sizes]
    print(f"\nbenchmarks.startup: classify, --tokenizer={FLAGS.tokenizer} "
          f"--vocab_size={FLAGS.vocab_size}, {os.cpu_count()} cores, wall seconds")
    print(f"{'size':>5} {'MB':>6} {'lines':>10} {'plain read':>10} {'read+labels+':>12} "
          f"{'vocab':>6} {'first step':>10} {'/ (read+vocab)':>14} {'peak MB':>8} "
          f"{'shards MB':>9}")
    for r in rows:
        vocab = r["phases"].get("vocab", 0.0)
        ratio = (r["first_step_seconds"] / (r["plain_read_seconds"] + vocab)
                 if r["first_step_seconds"] else float("nan"))
        print(f"{r['size']:>5} {r['megabytes']:6.0f} {r['lines']:10,d} "
              f"{r['plain_read_seconds']:10.1f} {r['phases'].get('read', 0.0):12.1f} "
              f"{vocab:6.1f} {r['first_step_seconds'] or 0:10.1f} {ratio:14.2f} "
              f"{r['peak_rss_mb']:8.0f} {r['shard_disk_mb']:9.0f}")
    print(f"\n{'size':>5} {'checkpoint MB':>13} {'data state B':>12} {'save s':>7} "
          f"{'restore s':>9} {'1st batch s':>11} {'resume peak MB':>14}")
    for r in rows:
        print(f"{r['size']:>5} {r['checkpoint_mb']:13.1f} {r['data_state_bytes'] or 0:12,d} "
              f"{r['save_seconds'] or 0:7.2f} {r['restore_seconds'] or 0:9.2f} "
              f"{r['first_batch_after_restore_seconds'] or 0:11.1f} "
              f"{r['resume_peak_rss_mb']:14.0f}")
    harness.write_json({"flags": harness.flag_values(
        "sizes", "base_mb", "tokenizer", "vocab_size", "max_steps", "checkpoint_every",
        "train_py"), "rows": rows})

if __name__ == "__main__":
    harness.run(main)
