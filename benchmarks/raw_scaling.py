r"""Where the raw feed (read + tokenize + lookup) stops scaling with cores: variants side by side.

Usage (one child process per core count, pinned before TensorFlow starts):
  python -m benchmarks.raw_scaling --cores=2,16 --copies=16 --json_out=bench_out/raw_scaling.json

Variants, each consumed in the graph (``Dataset.reduce``), best of ``--repeats`` passes, M real
tokens/s (M lines/s for the read-only rows):

  raw             text_lines(batch_size=512) + tokenize, prefetch (benchmarks.scaling's raw)
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
import tempfile

from benchmarks import harness

harness.pin_cores()  # in a child: before TensorFlow starts
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("cores", ["1", "2"], "Core counts, one pinned child process each.")
harness.define_copies(16, "Each file is read this many times per pass.")
flags.DEFINE_integer("files_out", 16, "Files the embedded corpus is cut into.")
harness.define_repeats(3, "Timed passes per variant, round robin; the best is reported.")
flags.DEFINE_list("variants", [], "Variants to run (default: all).")
flags.DEFINE_string("_child_out", None, "Internal: a child's JSON output file.")


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
    """Times every variant at this process' core count; returns the rows."""
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
    best = harness.best_passes({name: (ds, count) for name, (ds, count, _) in timed.items()},
                               FLAGS.repeats)
    return [{"cores": cores, "variant": name, "unit": timed[name][2], "count": n,
             "seconds": round(seconds, 4), "rate": n / seconds,
             "cpu_cores_busy": round(cpu / seconds, 2)}
            for name, (n, seconds, cpu) in best.items()]


def main(argv):
    del argv
    if FLAGS._child_out:  # one core count, pinned
        with tempfile.TemporaryDirectory(prefix="raw_scaling_") as tmp:
            files = harness.embedded_text_files(tmp, FLAGS.files_out)
            rows = run_child(files, harness.linked_copies(files, FLAGS.copies, tmp))
        with open(FLAGS._child_out, "w") as f:
            json.dump(rows, f)
        return
    # After every core count: a run cut short keeps what it had.
    rows = harness.per_core_count(__name__, FLAGS.cores, after_each=harness.write_json)
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
    harness.run(main)
