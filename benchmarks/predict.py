r"""Batch inference: length bucketing vs plain padded batches, same model, same budget.

Usage:
  python -m benchmarks.predict --json_out=bench_out/predict.json
  python -m benchmarks.predict --lines=50000 --max_tokens=16384

Writes a corpus with skewed line lengths (log-normal word counts, median ``--median_words``,
capped at the model's ``max_length``), exports a classifier over it
(``tfseq.pipelines.exporting.export_run``; weights are untrained, which does not change the
cost of a forward pass) and runs ``tfseq.pipelines.predicting.predict_files`` (tfseq-predict)
twice on the same export:

- ``bucket``: ``tfseq.bucket_by_length`` under ``--max_tokens`` cells per batch, input order
  restored by ``tfseq.predict_in_order``;
- ``pad``: ``padded_batch`` in input order with ``max_tokens // max_length`` rows, the most
  rows that always fit the same budget.

Both write one line per input line in input order (checked equal); the table gives lines/s
and real tokens/s side by side and the ratio.
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from benchmarks import harness  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("lines", 10000, "Lines in the generated corpus.")
flags.DEFINE_float("median_words", 12.0, "Median words per line (log-normal lengths).")
flags.DEFINE_float("sigma", 1.0, "Log-normal sigma of the word counts (skew).")
flags.DEFINE_integer("max_length", 128, "The model's max_length (longer lines truncated).")
flags.DEFINE_integer("max_tokens", 8192, "Budget per batch (rows x padded length).")
flags.DEFINE_integer("pool_size", 8192, "Bucketing pool (lines).")
flags.DEFINE_integer("seed", 0, "Corpus seed.")
harness.define_repeats(2, "Runs per scheme, alternating; the fastest counts (the first run "
                       "of a process also pays one-time start-up costs).")


def write_corpus(path: str, lines: int, median: float, sigma: float, seed: int) -> list[int]:
    """Lines of random words with log-normal word counts (>= 1); returns the counts."""
    import numpy as np

    rng = np.random.default_rng(seed)
    counts = np.maximum(1, rng.lognormal(np.log(median), sigma, lines).astype(int))
    words = [f"w{i}" for i in range(2000)]
    with open(path, "w") as f:
        for n in counts:
            f.write(" ".join(words[j] for j in rng.integers(0, len(words), n)) + "\n")
    return counts.tolist()


def main(argv):
    del argv
    import numpy as np
    import tensorflow as tf

    import tfseq
    from tfseq.pipelines import classify
    from tfseq.pipelines.exporting import export_run
    from tfseq.pipelines.predicting import predict_files
    from tfseq.pipelines.state import TaskState

    tf.get_logger().setLevel("ERROR")
    work = tempfile.mkdtemp(prefix="bench_predict_")
    corpus = os.path.join(work, "corpus.txt")
    counts = write_corpus(corpus, FLAGS.lines, FLAGS.median_words, FLAGS.sigma, FLAGS.seed)
    config = classify.Config(max_length=FLAGS.max_length)
    vocab = tfseq.Vocab.build(corpus, min_count=1)
    state = TaskState({"vocab": vocab}, {"label": tuple(f"c{i}" for i in range(7))})
    tf.keras.utils.set_random_seed(FLAGS.seed)
    model = classify.TASK.build_model(config, state)
    export_run(os.path.join(work, "run"), classify.TASK, config, state, model)

    results, outputs = {}, {}
    for _ in range(FLAGS.repeats):
        for batching in ("pad", "bucket"):
            output = os.path.join(work, f"out_{batching}.txt")
            report = predict_files(os.path.join(work, "run"), [corpus], output,
                                   max_tokens=FLAGS.max_tokens, batching=batching,
                                   pool_size=FLAGS.pool_size)
            with open(output) as f:
                outputs[batching] = [line.split("\t") for line in f.read().splitlines()]
            if batching in results and results[batching]["seconds"] <= report["seconds"]:
                continue
            results[batching] = {k: report[k] for k in ("lines", "batches", "seconds",
                                                          "lines_per_second",
                                                          "real_tokens_per_second")}
    same_labels = [o[0] for o in outputs["pad"]] == [o[0] for o in outputs["bucket"]]
    max_diff = float(np.max(np.abs(np.array([float(o[1]) for o in outputs["pad"]])
                                   - np.array([float(o[1]) for o in outputs["bucket"]]))))
    speedup = results["bucket"]["lines_per_second"] / results["pad"]["lines_per_second"]
    lengths = np.minimum(counts, FLAGS.max_length)
    print(f"\nbenchmarks.predict (fastest of {FLAGS.repeats} runs each): {FLAGS.lines} lines, "
          f"words per line median {int(np.median(lengths))}, "
          f"p99 {int(np.percentile(lengths, 99))}, max {int(lengths.max())}; "
          f"max_tokens={FLAGS.max_tokens}, BiGRU classifier, CPU")
    names = {"pad": f"padded_batch({FLAGS.max_tokens // FLAGS.max_length}), in order",
             "bucket": "bucket_by_length + restore"}
    harness.print_table([{"batching": names[b], **results[b]} for b in ("pad", "bucket")], [
        ("batching", "batching", ""), ("batches", "batches", "d"), ("seconds", "seconds", ".1f"),
        ("lines/s", "lines_per_second", ",.0f"),
        ("real tokens/s", "real_tokens_per_second", ",.0f")])
    print(f"speedup (lines/s, bucket / pad): {speedup:.2f}x; same labels: {same_labels}, "
          f"max |probability difference|: {max_diff:.1e}")
    harness.write_json({"config": harness.flag_values(
        "lines", "median_words", "sigma", "max_length", "max_tokens", "pool_size", "seed",
        "repeats"), "results": results, "speedup": speedup, "same_labels": same_labels,
        "max_probability_difference": max_diff})
    if max_diff > 1e-4:
        raise SystemExit(f"bucketed and padded predictions differ by up to {max_diff}")


if __name__ == "__main__":
    harness.run(main)
