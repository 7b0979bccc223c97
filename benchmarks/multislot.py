"""MultiSlot feed reading speed: tfseq.multislot.read vs a Python parser in from_generator.

Writes a CTR feed with the ctr pipeline's generator (``pipelines/ctr.py``: 7 slots, sparse id
slots and dense click/stats slots) in ``--num_files`` files, then reads it both ways, one
after the other in this run, into batches of ``--batch_size``:

- tfseq: ``tfseq.multislot.read(files, SLOTS, batch_size=...)`` (tf ops only);
- python: a generator that splits each line and converts counts/ids/floats with ``int`` /
  ``float``, through ``tf.data.Dataset.from_generator`` and ``ragged_batch``.

Reports examples per wall second and per CPU second of the process (on a shared machine the
CPU figure is the steadier one), best of ``--rounds``, and the ratio tfseq / python.

Usage:
  python -m benchmarks.multislot --json_out=bench_out/multislot.json
  python -m benchmarks.multislot --lines=200000 --rounds=1   # a shorter run
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from absl import flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from benchmarks import harness  # noqa: E402
from tfseq import multislot  # noqa: E402
from tfseq.pipelines import ctr  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("lines", 1_000_000, "Lines in the feed (over all files).")
flags.DEFINE_integer("num_files", 8, "Files of the feed.")
flags.DEFINE_integer("batch_size", 512, "Examples per batch.")
flags.DEFINE_integer("rounds", 2, "Timed passes per reader (best is reported).")
flags.DEFINE_string("data_dir", None, "Where the feed is written (default: a temporary dir); "
                    "an existing feed with the same line count is reused.")


def python_examples(files):
    """The baseline: a plain Python MultiSlot parser (one dict of lists per line)."""
    slots = ctr.SLOTS
    for path in files:
        with open(path) as f:
            for line in f:
                tokens = line.split()
                pos, example = 0, {}
                for slot in slots:
                    count = int(tokens[pos])
                    convert = int if slot.type == "uint64" else float
                    example[slot.name] = [convert(t) for t in tokens[pos + 1:pos + 1 + count]]
                    pos += 1 + count
                if pos != len(tokens):
                    raise ValueError(f"{path}: extra tokens in {line!r}")
                yield example


def python_dataset(files, batch_size):
    signature = {s.name: tf.TensorSpec(s.shape if s.kind == "dense" else [None], s.dtype)
                 for s in ctr.SLOTS}
    ds = tf.data.Dataset.from_generator(lambda: python_examples(files),
                                        output_signature=signature)
    return ds.ragged_batch(batch_size)


def timed(make):
    wall, cpu = time.perf_counter(), time.process_time()
    n = 0
    for batch in make():
        n += int(batch["click"].shape[0])
    return n, time.perf_counter() - wall, time.process_time() - cpu


def main(argv):
    del argv
    data_dir = FLAGS.data_dir or tempfile.mkdtemp(prefix="bench_multislot_")
    per_file = FLAGS.lines // FLAGS.num_files
    files = [os.path.join(data_dir, f"train-{i:04d}.txt") for i in range(FLAGS.num_files)]
    stamp = os.path.join(data_dir, "LINES")
    if not (os.path.exists(stamp) and open(stamp).read() == str(per_file * FLAGS.num_files)):
        start = time.perf_counter()
        files = ctr.generate(data_dir, num_files=FLAGS.num_files, examples_per_file=per_file,
                             eval_examples=1)["train_files"]
        with open(stamp, "w") as f:
            f.write(str(per_file * FLAGS.num_files))
        print(f"wrote {per_file * FLAGS.num_files} lines in {FLAGS.num_files} files "
              f"({time.perf_counter() - start:.0f} s)")
    readers = {
        "tfseq": lambda: multislot.read(files, ctr.SLOTS, batch_size=FLAGS.batch_size),
        "python": lambda: python_dataset(files, FLAGS.batch_size),
    }
    results = {}
    for name, make in readers.items():
        runs = [timed(make) for _ in range(FLAGS.rounds)]
        n = runs[0][0]
        if n != per_file * FLAGS.num_files:
            raise RuntimeError(f"{name} read {n} examples; expected {per_file * FLAGS.num_files}")
        results[name] = {"examples": n,
                         "examples_per_wall_s": max(n / w for _, w, _ in runs),
                         "examples_per_cpu_s": max(n / c for _, _, c in runs),
                         "wall_s": [w for _, w, _ in runs], "cpu_s": [c for _, _, c in runs]}
    ratio = {k: results["tfseq"][k] / results["python"][k]
             for k in ("examples_per_wall_s", "examples_per_cpu_s")}
    harness.print_table([{"reader": name, **r} for name, r in results.items()], [
        ("reader", "reader", ""), ("examples", "examples", "d"),
        ("ex/wall-s", "examples_per_wall_s", ".0f"), ("ex/cpu-s", "examples_per_cpu_s", ".0f")])
    print(f"tfseq / python: {ratio['examples_per_wall_s']:.1f}x wall, "
          f"{ratio['examples_per_cpu_s']:.1f}x cpu")
    harness.write_json({"flags": harness.flag_values("lines", "num_files", "batch_size", "rounds"),
                        "argv": sys.argv, "results": results, "ratio": ratio,
                        "load_average": os.getloadavg()})

if __name__ == "__main__":
    harness.run(main)
