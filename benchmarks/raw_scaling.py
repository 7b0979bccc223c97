r"""Where the raw feed (read + tokenize + lookup) stops scaling with cores: variants side by side.

Usage (one child process per core count, pinned before TensorFlow starts):
  python scripts/diag_raw_scaling.py --cores=2,16 --copies=16 --json_out=out/diag.json

Variants, each consumed in the graph (``Dataset.reduce``), best of ``--repeats`` passes, M real
tokens/s (M lines/s for the read-only rows):

  raw             text_lines(batch_size=512) + tokenize, prefetch (bench_scaling's raw feed)
  raw_mapcount    the same, counted in a parallel map before the reduce (consumer cost)
  raw_fixed       tokenize as a map with num_parallel_calls = the cores (not AUTOTUNE)
  raw_nofusion    without tfseq.pipeline_options (map fusion off)
  raw_2048        text_lines(batch_size=2048)
  raw_nolookup    tokenize without the vocabulary lookup (string tokens counted)
  raw_lines       the line reader (TextLineDataset per file, batch(512)) + tokenize
  raw_reads32     text_lines(num_parallel_reads=32)
  tok_alone       tokenize on the read batches cached in memory
  tok_alone_fixed the same with num_parallel_calls = the cores
  read            text_lines alone (lines/s)
  read_lines      the line reader alone (lines/s)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if os.environ.get("TFSEQ_BENCH_CORES"):  # the child: pin before TensorFlow starts
    os.sched_setaffinity(0, range(int(os.environ["TFSEQ_BENCH_CORES"])))

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("cores", ["1", "2"], "Core counts, one pinned child process each.")
flags.DEFINE_integer("copies", 16, "Each file is read this many times per pass.")
flags.DEFINE_integer("files_out", 16, "Files the embedded corpus is cut into.")
flags.DEFINE_integer("repeats", 3, "Timed passes per variant; the best is reported.")
flags.DEFINE_list("variants", [], "Variants to run (default: all).")
flags.DEFINE_string("json_out", None, "Write the rows here as JSON.")
flags.DEFINE_string("_child_out", None, "Internal: a child's JSON output file.")


def corpus_files(out_dir: str) -> list[str]:
    """The embedded corpus' text fields cut into ``--files_out`` files."""
    from tfseq.scripts import embedded_text_files

    return embedded_text_files(out_dir, FLAGS.files_out)


def variants(files, vocab, cores):
    """name -> (dataset, count fn, unit)."""
    import tensorflow as tf

    import tfseq
    from tfseq.text import get_tokenizer

    tok = get_tokenizer()
    auto = tf.data.AUTOTUNE

    def ids(lines):
        return {"ids": vocab.lookup(tok.tokenize(lines))}

    def line_reader(batch):
        return tf.data.Dataset.from_tensor_slices(files).interleave(
            lambda f: tf.data.TextLineDataset(f).batch(batch), cycle_length=16,
            num_parallel_calls=auto)

    count_ids = lambda b: tf.cast(tf.size(b["ids"].flat_values), tf.int64)  # noqa: E731
    count_lines = lambda b: tf.cast(tf.size(b), tf.int64)  # noqa: E731
    read = lambda **kw: tfseq.text_lines(files, batch_size=kw.pop("batch", 512), **kw)  # noqa
    out = {
        "raw": (read().apply(tfseq.tokenize(vocab)).prefetch(auto), count_ids, "tokens"),
        "raw_mapcount": (read().apply(tfseq.tokenize(vocab)).map(count_ids, num_parallel_calls=auto)
                         .prefetch(auto), lambda n: n, "tokens"),
        "raw_fixed": (read().map(ids, num_parallel_calls=cores).prefetch(auto), count_ids,
                      "tokens"),
        "raw_nofusion": (read().apply(tfseq.tokenize(vocab)).prefetch(auto), count_ids,
                         "tokens", "nofusion"),
        "raw_2048": (read(batch=2048).apply(tfseq.tokenize(vocab)).prefetch(auto), count_ids,
                     "tokens"),
        "raw_nolookup": (read().map(lambda l: {"ids": tok.tokenize(l)}, num_parallel_calls=auto)
                         .prefetch(auto), count_ids, "tokens"),
        "raw_lines": (line_reader(512).apply(tfseq.tokenize(vocab)).prefetch(auto), count_ids,
                      "tokens"),
        "raw_reads32": (read(num_parallel_reads=32).apply(tfseq.tokenize(vocab)).prefetch(auto),
                        count_ids, "tokens"),
        "read": (read().prefetch(auto), count_lines, "lines"),
        "read_lines": (line_reader(512).prefetch(auto), count_lines, "lines"),
    }
    wanted = FLAGS.variants or list(out) + ["tok_alone", "tok_alone_fixed"]
    if {"tok_alone", "tok_alone_fixed"} & set(wanted):
        cached = read().cache()
        cached.reduce(tf.constant(0, tf.int64), lambda a, b: a + 1)
        out["tok_alone"] = (cached.apply(tfseq.tokenize(vocab)), count_ids, "tokens")
        out["tok_alone_fixed"] = (cached.map(ids, num_parallel_calls=cores), count_ids,
                                  "tokens")
    return {k: v for k, v in out.items() if k in wanted}


def run_child(files, copies):
    import tensorflow as tf

    import tfseq

    cores = len(os.sched_getaffinity(0))
    texts = tfseq.text_lines(files, batch_size=4096).unbatch()
    vocab = tfseq.Vocab.build(texts, min_count=1)
    feeds = variants(copies, vocab, cores)
    timed = {}
    for name, spec in feeds.items():
        ds, count, unit = spec[:3]
        if len(spec) < 4:
            ds = ds.with_options(tfseq.pipeline_options())
        timed[name] = (ds, count, unit)
    best = {}
    for _ in range(FLAGS.repeats):
        for name, (ds, count, unit) in timed.items():
            start, cpu = time.perf_counter(), time.process_time()
            n = int(ds.reduce(tf.constant(0, tf.int64), lambda a, b, c=count: a + c(b)))
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            if name not in best or seconds < best[name]["seconds"]:
                best[name] = {"cores": cores, "variant": name, "unit": unit, "count": n,
                              "seconds": round(seconds, 4), "rate": n / seconds,
                              "cpu_cores_busy": round(cpu / seconds, 2)}
    return list(best.values())


def main(argv):
    del argv
    with tempfile.TemporaryDirectory(prefix="diag_raw_") as tmp:
        if FLAGS._child_out:
            files = corpus_files(tmp)
            copies = []
            for i in range(FLAGS.copies):
                for path in files:
                    link = os.path.join(tmp, f"copy{i:02d}_{os.path.basename(path)}")
                    os.symlink(path, link)
                    copies.append(link)
            with open(FLAGS._child_out, "w") as f:
                json.dump(run_child(files, copies), f)
            return
        rows = []
        for n in [int(c) for c in FLAGS.cores]:
            if n > os.cpu_count():
                continue
            out = os.path.join(tmp, f"c{n}.json")
            args = [a for a in sys.argv[1:] if not a.startswith(("--json_out", "--cores"))]
            subprocess.run([sys.executable, os.path.abspath(__file__), *args,
                            f"--_child_out={out}"], env=dict(os.environ, TFSEQ_BENCH_CORES=str(n)),
                           check=True)
            with open(out) as f:
                rows += json.load(f)
            if FLAGS.json_out:  # after every core count: a run cut short keeps what it had
                with open(FLAGS.json_out, "w") as f:
                    json.dump(rows, f, indent=1)
    cores = sorted({r["cores"] for r in rows})
    print(f"{'variant':18s}" + "".join(f"{f'{c} cores (busy)':>22s}" for c in cores))
    for name in dict.fromkeys(r["variant"] for r in rows):
        cells = []
        for c in cores:
            r = next((r for r in rows if r["cores"] == c and r["variant"] == name), None)
            cells.append(f"{r['rate'] / 1e6:8.2f} {r['unit'][0]} ({r['cpu_cores_busy']:5.2f})"
                         if r else "")
        print(f"{name:18s}" + "".join(f"{c:>22s}" for c in cells))


if __name__ == "__main__":
    app.run(main)
