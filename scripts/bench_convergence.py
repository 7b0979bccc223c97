r"""Time to accuracy: held-out metric per epoch and wall seconds per batching scheme.

Usage:
  python scripts/bench_convergence.py --tasks=lm --epochs=2 --seeds=0 --lm_max_lines=1000
  python scripts/bench_convergence.py --json_out=bench_out/convergence.json --plot=docs/conv.png

For each task (classify: held-out accuracy, higher is better; lm: held-out loss, lower is
better), each scheme of the task's pipeline (``Config.batching``: pad, bucket, pack) and each
seed: the pipeline's datasets and the task's ``models.<task>.build_model(config, info)`` (the
same model code for every scheme), trained one epoch at a time; after each epoch the held-out
metric and the cumulative training wall seconds. Reported: the per-epoch mean and spread over
seeds, and the wall seconds at which each scheme first reaches the pad baseline's best seed-mean
metric (within 0.005 accuracy / 1% of loss). ``--plot`` draws metric vs wall seconds
(matplotlib, the optional ``plot`` extra; skipped with a warning without it).

Not yet covered (issue 18 part 3): tf.data ``bucket_by_sequence_length``, the skewed-length
corpus, and the randomness-vs-padding sweep.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from absl import app, flags, logging  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("tasks", ["classify", "lm"], "Tasks.")
flags.DEFINE_list("schemes", ["pad", "bucket", "pack"], "Config.batching values; pad first.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds.")
flags.DEFINE_integer("epochs", 3, "Epochs per run.")
flags.DEFINE_integer("lm_max_lines", 3000, "lm: lines read (small sizes for a 2-core box).")
flags.DEFINE_integer("max_tokens", 2048, "Token budget per batch (bucket, pack).")
flags.DEFINE_string("json_out", None, "Write the results here as JSON.")
flags.DEFINE_string("plot", None, "Write a PNG of held-out metric vs wall seconds here.")


def run(task, scheme, seed):
    import keras

    if task == "classify":
        from models import classifier as model_module
        from pipelines import classify as pipeline
        config = pipeline.Config(batching=scheme, seed=seed, max_tokens=FLAGS.max_tokens)
    else:
        from models import lm as model_module
        from pipelines import lm as pipeline
        config = pipeline.Config(batching=scheme, seed=seed, max_tokens=FLAGS.max_tokens,
                                 max_lines=FLAGS.lm_max_lines)
    keras.utils.set_random_seed(seed)
    train_ds, eval_ds, info = pipeline.datasets(config)
    model = model_module.build_model(config, info)
    seconds, metrics = 0.0, []
    for _ in range(FLAGS.epochs):
        start = time.perf_counter()
        model.fit(train_ds, epochs=1, verbose=0)
        seconds += time.perf_counter() - start
        result = model.evaluate(eval_ds, verbose=0, return_dict=True)
        key = "loss" if task == "lm" else next(k for k in result if "acc" in k)
        metrics.append({"seconds": round(seconds, 2), "metric": float(result[key])})
    return {"task": task, "scheme": scheme, "seed": seed, "config": dataclasses.asdict(config),
            "epochs": metrics}


def time_to(runs, target, higher):
    """Mean over seeds of the first cumulative seconds reaching ``target`` (None if never)."""
    times = []
    for r in runs:
        hit = [e["seconds"] for e in r["epochs"]
               if (e["metric"] >= target if higher else e["metric"] <= target)]
        if not hit:
            return None
        times.append(hit[0])
    return float(np.mean(times))


def summarize(task, by_scheme):
    higher = task == "classify"
    base = np.array([[e["metric"] for e in r["epochs"]] for r in by_scheme["pad"]])
    best = base.mean(0).max() if higher else base.mean(0).min()
    target = best - 0.005 if higher else best * 1.01
    rows = []
    for scheme, runs in by_scheme.items():
        m = np.array([[e["metric"] for e in r["epochs"]] for r in runs])
        s = np.array([[e["seconds"] for e in r["epochs"]] for r in runs])
        rows.append({"scheme": scheme, "metric_mean": m.mean(0).round(4).tolist(),
                     "metric_spread": (m.max(0) - m.min(0)).round(4).tolist(),
                     "seconds_mean": s.mean(0).round(1).tolist(),
                     "seconds_to_baseline_best": time_to(runs, target, higher)})
    return {"task": task, "metric": "accuracy" if higher else "loss",
            "baseline_best": float(best), "target": float(target), "schemes": rows}


def plot(summaries, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logging.warning("matplotlib is not installed (pip install tfseq[plot]); no plot")
        return
    fig, axes = plt.subplots(1, len(summaries), figsize=(5 * len(summaries), 4), squeeze=False)
    for ax, summary in zip(axes[0], summaries):
        for row in summary["schemes"]:
            ax.errorbar(row["seconds_mean"], row["metric_mean"],
                        yerr=np.array(row["metric_spread"]) / 2, marker="o",
                        label=row["scheme"])
        ax.set_title(summary["task"])
        ax.set_xlabel("training wall seconds")
        ax.set_ylabel(f"held-out {summary['metric']}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main(argv):
    del argv
    seeds = [int(s) for s in FLAGS.seeds]
    if FLAGS.schemes[0] != "pad":
        raise ValueError(f"--schemes must start with pad (the baseline); got {FLAGS.schemes}")
    summaries, raw = [], []
    print("shared, loaded 2-core machine: wall seconds are rough")
    for task in FLAGS.tasks:
        by_scheme = {}
        for scheme in FLAGS.schemes:
            by_scheme[scheme] = [run(task, scheme, seed) for seed in seeds]
            raw.extend(by_scheme[scheme])
        summary = summarize(task, by_scheme)
        summaries.append(summary)
        print(f"{task}: pad best {summary['metric']} {summary['baseline_best']:.4f}")
        for row in summary["schemes"]:
            print(f"  {row['scheme']:7} per epoch {row['metric_mean']} "
                  f"(spread {row['metric_spread']}) at {row['seconds_mean']} s; "
                  f"to pad's best: {row['seconds_to_baseline_best']} s")
    if FLAGS.json_out:
        os.makedirs(os.path.dirname(FLAGS.json_out) or ".", exist_ok=True)
        with open(FLAGS.json_out, "w") as f:
            json.dump({"seeds": seeds, "epochs": FLAGS.epochs, "summaries": summaries,
                       "runs": raw}, f, indent=1)
    if FLAGS.plot:
        plot(summaries, FLAGS.plot)


if __name__ == "__main__":
    app.run(main)
