r"""Masked softmax and masked attention: accuracy, NaN/Inf safety and cost, from one run.

Compares four common ways to mask a softmax over padded keys with ``tfseq.masked_softmax``:

  (a) plain      softmax over everything (pads leak weight)
  (b) mul        softmax(logits * mask) (pads still get exp(0))
  (c) neg1e9     softmax(logits + (1 - mask) * -1e9) (-1e9 is -inf in float16: 0 * inf = NaN)
  (d) renorm     softmax, zero the pads, renormalise (0/0 on fully masked rows; underflow
                 when pads dominate)
  ours           tfseq.masked_softmax

on random and adversarial logits in float32, float16 and bfloat16. For each: the max abs
error vs a float64 NumPy reference on valid positions (the reference is computed from the
logits as rounded to the dtype, so it measures the algorithm, not the input rounding), the
largest weight given to a pad, NaN/Inf counts in the output and in the gradient, and the
forward time relative to plain ``tf.nn.softmax`` of the same dtype. Then the time of
``tfseq.layers.MaskedAttention`` (dot, scaled) against an unmasked softmax attention of the same
shape.

Timing runs single-threaded (``--threads``) and reports the median CPU time per call over
interleaved rounds, which stays comparable on a shared machine.

Usage:
  python -m benchmarks.attention --json_out=bench_out/attention.json
  python -m benchmarks.attention --batch=32 --time=128 --rounds=15
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from benchmarks import harness  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 16, "Rows of the softmax benchmark: logits are [batch, time, time].")
flags.DEFINE_integer("time", 128, "Query and key length of the softmax benchmark.")
flags.DEFINE_list("attention_shapes", ["32x64x64", "32x128x64", "16x256x64"],
                  "Attention shapes BxTxD (queries = keys = values length T, depth D).")
flags.DEFINE_integer("rounds", 9, "Interleaved timing rounds (the median is reported).")
flags.DEFINE_integer("calls", 20, "Calls per timing round.")
flags.DEFINE_integer("threads", 1, "TensorFlow intra/inter-op threads (0: TensorFlow's default).")
flags.DEFINE_integer("seed", 0, "Seed of the random logits and lengths.")

DTYPES = ("float32", "float16", "bfloat16")
CASES = ("random", "huge_logits", "near_identical", "huge_range", "pads_dominate",
         "fully_masked")


def implementations(tf, masked_softmax):
    """name -> fn(logits, mask) with a bool mask broadcastable to the logits."""

    def plain(x, mask):
        return tf.nn.softmax(x)

    def mul(x, mask):
        return tf.nn.softmax(x * tf.cast(mask, x.dtype))

    def neg1e9(x, mask):
        return tf.nn.softmax(x + (1 - tf.cast(mask, x.dtype)) * tf.constant(-1e9, x.dtype))

    def renorm(x, mask):
        p = tf.nn.softmax(x) * tf.cast(mask, x.dtype)
        return p / tf.reduce_sum(p, axis=-1, keepdims=True)

    def ours(x, mask):
        return masked_softmax(x, mask)

    return {"(a) plain": plain, "(b) mul": mul, "(c) neg1e9": neg1e9, "(d) renorm": renorm,
            "ours": ours}


def make_case(np, case, dtype_max, batch, time_steps, rng):
    """(float64 logits [B, T, T], bool mask [B, 1, T]) for one case."""
    shape = (batch, time_steps, time_steps)
    lengths = rng.integers(1, time_steps + 1, batch)
    logits = rng.standard_normal(shape) * 3.0
    if case == "huge_logits":
        logits = rng.uniform(-6e4, 6e4, shape)
    elif case == "near_identical":
        logits = 1.0 + rng.standard_normal(shape) * 1e-3
    elif case == "huge_range":
        logits = rng.uniform(-0.5, 0.5, shape) * dtype_max
    elif case == "pads_dominate":
        lengths = rng.integers(1, 5, batch)
        logits = rng.standard_normal(shape)
    elif case == "fully_masked":
        lengths[::2] = 0
    mask = np.arange(time_steps)[None, :] < lengths[:, None]
    if case == "pads_dominate":
        logits = np.where(mask[:, None, :], logits, 6e4)
    return logits, mask[:, None, :]


def reference(np, logits, mask):
    """float64 masked softmax: exact zeros on pads and on fully masked rows."""
    mask = np.broadcast_to(mask, logits.shape)
    x = np.where(mask, logits, -np.inf)
    top = np.max(x, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.where(mask, np.exp(x - top), 0.0)
    total = e.sum(-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)


def accuracy(tf, np, fn, logits, mask, dtype, rng):
    """Errors and NaN/Inf counts of ``fn`` on one case in one dtype."""
    x = tf.cast(tf.constant(logits, tf.float32 if dtype != "float32" else tf.float64), dtype)
    rounded = tf.cast(x, tf.float64).numpy()
    expected = reference(np, rounded, mask)
    cotangent = tf.constant(rng.standard_normal(logits.shape), dtype)
    mask_t = tf.constant(mask)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x, mask_t)
        loss = tf.reduce_sum(tf.cast(y * cotangent, tf.float32))
    grad = tape.gradient(loss, x)
    y64 = tf.cast(y, tf.float64).numpy()
    g64 = tf.cast(grad, tf.float64).numpy()
    full_mask = np.broadcast_to(mask, logits.shape)
    valid_rows = full_mask.any(-1, keepdims=True) & full_mask
    err = np.abs(y64 - expected)[valid_rows]
    expected_rounded = tf.cast(tf.cast(expected, dtype), tf.float64).numpy()
    beyond = np.abs(y64 - expected_rounded)[valid_rows]
    pads = np.abs(y64)[~full_mask]
    return {
        "max_abs_err": float(err.max()) if np.isfinite(err).all() else float("nan"),
        "max_err_beyond_rounding":
            float(beyond.max()) if np.isfinite(beyond).all() else float("nan"),
        "max_pad_weight": float(pads.max()) if pads.size and np.isfinite(pads).all()
        else (0.0 if not pads.size else float("nan")),
        "nonfinite_forward": int((~np.isfinite(y64)).sum()),
        "nonfinite_backward": int((~np.isfinite(g64)).sum()),
    }


def median_cpu_seconds(np, fns, rounds, calls):
    """Median CPU seconds per call of each fn, rounds interleaved across fns."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.process_time()
            for _ in range(calls):
                fn()
            times[name].append((time.process_time() - start) / calls)
    return {name: float(np.median(t)) for name, t in times.items()}


def softmax_timing(tf, np, impls, rng):
    out = {}
    logits, mask = make_case(np, "random", 1.0, FLAGS.batch, FLAGS.time, rng)
    for dtype in DTYPES:
        x = tf.cast(tf.constant(logits, tf.float32), dtype)
        m = tf.constant(mask)
        fns = {name: tf.function(lambda fn=fn: fn(x, m)) for name, fn in impls.items()}
        seconds = median_cpu_seconds(np, fns, FLAGS.rounds, FLAGS.calls)
        base = seconds["(a) plain"]
        out[dtype] = {name: {"seconds": s, "ratio": s / base} for name, s in seconds.items()}
    return out


def attention_timing(tf, np, rng):
    from tfseq.layers import MaskedAttention

    out = {}
    layer = MaskedAttention("dot")
    for shape in FLAGS.attention_shapes:
        b, t, d = (int(v) for v in shape.lower().split("x"))
        q = tf.constant(rng.standard_normal([b, t, d]), tf.float32)
        v = tf.constant(rng.standard_normal([b, t, d]), tf.float32)
        lengths = tf.constant(rng.integers(1, t + 1, b), tf.int32)
        scale = 1.0 / float(np.sqrt(d))
        fns = {
            "unmasked": tf.function(
                lambda: tf.matmul(tf.nn.softmax(tf.matmul(q * scale, v, transpose_b=True)), v)),
            "masked_keys": tf.function(lambda: layer(q, v, value_lengths=lengths)),
            "masked_queries_and_keys": tf.function(
                lambda: layer(q, v, query_lengths=lengths, value_lengths=lengths)),
        }
        seconds = median_cpu_seconds(np, fns, FLAGS.rounds, FLAGS.calls)
        base = seconds["unmasked"]
        out[shape] = {name: {"seconds": s, "ratio": s / base} for name, s in seconds.items()}
    return out


def fmt(value):
    if value != value:
        return "NaN"
    if value == 0:
        return "0"
    return f"{value:.1e}"


def main(argv):
    del argv
    import numpy as np
    import tensorflow as tf

    from tfseq.layers.masked_softmax import masked_softmax

    if FLAGS.threads:
        tf.config.threading.set_intra_op_parallelism_threads(FLAGS.threads)
        tf.config.threading.set_inter_op_parallelism_threads(FLAGS.threads)
    rng = np.random.default_rng(FLAGS.seed)
    impls = implementations(tf, masked_softmax)
    results = {}
    for dtype in DTYPES:
        dtype_max = float(tf.as_dtype(dtype).max)
        cases = {case: make_case(np, case, dtype_max, FLAGS.batch, FLAGS.time, rng)
                 for case in CASES}
        for name, fn in impls.items():
            results.setdefault(name, {})[dtype] = {
                case: accuracy(tf, np, fn, logits, mask, dtype, rng)
                for case, (logits, mask) in cases.items()}
    timing = softmax_timing(tf, np, impls, rng)
    attention = attention_timing(tf, np, rng)

    header = (f"{'implementation':14s} {'dtype':9s} " + " ".join(f"{c[:12]:>12s}" for c in CASES)
              + f" {'pad weight':>10s} {'NaN/Inf fw':>10s} {'NaN/Inf bw':>10s} {'time':>6s}")
    print(f"\nmasked softmax, logits [{FLAGS.batch}, {FLAGS.time}, {FLAGS.time}]: max abs error vs "
          "float64 on valid positions per case; worst pad weight; NaN/Inf counts over all "
          "cases; forward time / tf.nn.softmax")
    print(header)
    print("-" * len(header))
    for name in impls:
        for dtype in DTYPES:
            r = results[name][dtype]
            pad = max((r[c]["max_pad_weight"] for c in CASES), key=lambda v: (v != v, v))
            row = (f"{name:14s} {dtype:9s} " + " ".join(f"{fmt(r[c]['max_abs_err']):>12s}"
                                                         for c in CASES)
                   + f" {fmt(pad):>10s} {sum(r[c]['nonfinite_forward'] for c in CASES):>10d}"
                   f" {sum(r[c]['nonfinite_backward'] for c in CASES):>10d}"
                   f" {timing[dtype][name]['ratio']:>5.2f}x")
            print(row)
    ours = results["ours"]
    print("\nours, max error beyond rounding the exact answer to the dtype: " + ", ".join(
        f"{d} {fmt(max(ours[d][c]['max_err_beyond_rounding'] for c in CASES))}" for d in DTYPES))
    print("\nMaskedAttention (dot, scaled) vs unmasked softmax attention, float32, "
          "median CPU time ratio")
    print(f"{'B x T x D':12s} {'unmasked':>10s} {'masked keys':>12s} {'masked q+k':>11s}")
    for shape, r in attention.items():
        print(f"{shape:12s} {r['unmasked']['seconds'] * 1e3:>8.2f}ms "
              f"{r['masked_keys']['ratio']:>11.2f}x "
              f"{r['masked_queries_and_keys']['ratio']:>10.2f}x")

    harness.write_json({"flags": harness.flag_values(
        "batch", "time", "attention_shapes", "rounds", "calls", "threads", "seed"),
        "argv": sys.argv, "accuracy": results, "softmax_timing": timing,
        "attention_timing": attention, "load_average": os.getloadavg()})

if __name__ == "__main__":
    harness.run(main)
