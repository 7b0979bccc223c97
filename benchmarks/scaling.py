r"""How the input pipeline scales with cores: each feed's rate at N cores, side by side.

Usage:
  python -m benchmarks.scaling --cores=1,2 --json_out=bench_out/scaling.json
  python -m benchmarks.scaling --cores=2,4,8,16 --files='corpus/*.txt' --field=-1
  python -m benchmarks.scaling --cores=2 --feeds=bucket,bucket_alone --parallel=1,2,4

Each core count runs in a child process pinned to cores ``0..N-1`` before TensorFlow starts
(``os.sched_setaffinity``: TensorFlow sizes its thread pools from the affinity mask). In it,
every feed runs whole passes over the same lines and reports real (non-pad) tokens per second,
consumed in the graph (``Dataset.reduce``: no Python per batch), best of ``--repeats`` passes:

  read           ``text_lines(batch_size=--read_batch)`` alone, no tokenizing (its rate is
                 in lines per second, and so is every row's ``lines_per_second``);
  raw            ``text_lines(batch_size=--read_batch)`` + ``tokenize`` (split and vocabulary
                 lookup): the limit every batching pipeline is measured against;
  bucket         raw + ``bucket_by_length(max_tokens, max_length, seed=0)``;
  pack           raw + ``pack(max_length, max_tokens, long_examples="drop")``;
  bucket_alone   ``bucket_by_length`` on the raw feed's batches cached in memory (the stage's
                 own ceiling: what it costs per token without the read);
  pack_alone     ``pack`` on the same cached batches;
  stream_bucket  the training binaries' resumable stream (``ResumableStream``, records as
  stream_pack    one shard) with bucketing or packing;
  plain          what a user writes with tf.data alone: per-line map, filter, shuffle and
                 ``Dataset.bucket_by_sequence_length`` with batch sizes from the same budget
                 (over one copy of the files: it is ~30x slower).

``--steady`` (the default; needs ``--copies`` of 2 or more) also times each feed over a
quarter of the copies. Every pass is a new iterator, which builds its functions and fills its
first pool or part before its first batch, so a short pass understates the rate a feed keeps
up. From the two lengths each row gets ``steady_tokens_per_second`` (the tokens between the
passes over the seconds between them), ``steady_vs_raw`` and ``start_seconds`` (the short
pass' time beyond its tokens at that rate; ``harness.steady``).

``--python_loop`` also consumes raw, bucket and pack in a Python loop (one op per batch: what a
custom training loop pays). With several ``--parallel`` values the bucket and pack feeds run
once per value (``tfseq.experimental.parallelism(pools_and_parts=K)``: K pools or parts at
once): the batches are the same for every value, only the speed differs.

With ``--lanes=K`` raw, bucket and pack also run as K lanes (``benchmarks/lanes.py``: K copies
of the pipeline over a round-robin split of the files), and "bucket/pack after lanes" batch once
after K read-and-tokenize lanes.

The default corpus is the embedded one (both languages' text fields) cut into ``--files_out``
plain-text files and read ``--copies`` times, a stream many bucketing pools long.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time

from benchmarks import harness

harness.pin_cores()  # in a child: before TensorFlow starts
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("cores", ["1", "2"], "Core counts, one pinned child process each.")
flags.DEFINE_list("files", [], "Text files or globs (default: the embedded corpus, rewritten).")
flags.DEFINE_integer("field", -1, "0-based TSV field holding the text; -1 for the whole line.")
flags.DEFINE_integer("files_out", 16, "Files the embedded corpus is cut into.")
harness.define_copies(8)
flags.DEFINE_integer("max_tokens", 8192, "Token budget per batch.")
flags.DEFINE_integer("max_length", 512, "Length cap (longer examples are dropped and counted).")
flags.DEFINE_integer("read_batch", 512, "Lines per batch from text_lines.")
harness.define_repeats(3)
flags.DEFINE_list("parallel", ["default"], "Parallelism of the bucket and pack stages (pools "
                  "or parts at once), one run of those feeds each; 'default' leaves it to "
                  "them.")
flags.DEFINE_list("lanes", [], "Also run raw, bucket and pack as K lanes (benchmarks/lanes.py: "
                  "K whole pipelines over a round-robin split of the files, merged in a fixed "
                  "order), one run per K; inside a lane pools and parts are --lane_parallel at "
                  "once.")
flags.DEFINE_integer("lane_reads", 1, "Files each lane reads at once (text_lines' "
                     "num_parallel_reads inside a lane).")
flags.DEFINE_integer("lane_buffer", 2, "Elements each lane prepares ahead (in_lanes' buffer).")
flags.DEFINE_integer("lane_parallel", 0, "Pools or parts at once inside a lane; 0: the "
                     "default (the cores).")
flags.DEFINE_string("tokenize_parallel", "auto", "tokenize(num_parallel_calls=...), and the "
                    "stream feeds' encode_calls: 'auto' (tf.data.AUTOTUNE), 'cores' (the "
                    "process' cores) or a number.")
flags.DEFINE_list("feeds", ["raw", "bucket", "pack", "bucket_alone", "pack_alone", "plain", "read"],
                  "Feeds to run (raw always runs: every ratio needs it).")
flags.DEFINE_boolean("steady", True, "Also time each feed (but plain) over a quarter of "
                     "the copies and split its time into a steady rate and a start: each pass is "
                     "a new iterator, which builds its functions and fills its first pool before "
                     "its first batch.")
flags.DEFINE_boolean("python_loop", True, "Also consume raw, bucket and pack in a Python loop.")
flags.DEFINE_string("_child_out", None, "Internal: a child's JSON output file.")


def _text_of(lines, field):
    import tensorflow as tf

    return lines if field < 0 else tf.strings.split(lines, "\t").to_tensor("")[:, field]


def parallelism(**settings):
    """``tfseq.experimental.parallelism(**settings)`` for the pipelines built inside; nothing
    when every setting is None (the defaults), so an older tree without it runs too."""
    if all(value is None for value in settings.values()):
        return contextlib.nullcontext()
    from tfseq.experimental import parallelism as experimental_parallelism

    return experimental_parallelism(**settings)


def tokenize_calls():
    """``--tokenize_parallel`` as ``tokenize``'s ``num_parallel_calls`` (None: its default)."""
    value = FLAGS.tokenize_parallel
    if value == "auto":
        return None
    return len(os.sched_getaffinity(0)) if value == "cores" else int(value)


def build_feeds(files, vocab, parallel):
    """name -> (dataset, count) where count maps an element to its real tokens (int64)."""
    import tensorflow as tf

    import tfseq
    from benchmarks import lanes as lanes_module

    def raw():
        ds = tfseq.text_lines(files, batch_size=FLAGS.read_batch)
        if FLAGS.field >= 0:
            ds = ds.map(lambda lines: _text_of(lines, FLAGS.field),
                        num_parallel_calls=tf.data.AUTOTUNE)
        return ds.apply(tfseq.tokenize(vocab, num_parallel_calls=tokenize_calls()))

    def bucket(ds, k):
        with parallelism(pools_and_parts=k):
            return ds.apply(tfseq.bucket_by_length(
                max_tokens=FLAGS.max_tokens, max_length=FLAGS.max_length, seed=0,
                counter=tfseq.DropCounter()))

    def pack(ds, k):
        with parallelism(pools_and_parts=k):
            return ds.apply(tfseq.pack(FLAGS.max_length, max_tokens=FLAGS.max_tokens,
                                       long_examples="drop", counter=tfseq.DropCounter()))

    count_raw = lambda b: tf.cast(tf.size(b["ids"].flat_values), tf.int64)  # noqa: E731
    count_bucket = lambda b: tf.reduce_sum(tf.cast(b["ids_length"], tf.int64))  # noqa: E731
    count_pack = lambda b: tf.math.count_nonzero(b["ids_segment_ids"], dtype=tf.int64)  # noqa
    feeds = {"raw": (raw().prefetch(tf.data.AUTOTUNE), count_raw)}
    wanted = set(FLAGS.feeds)
    if "read" in wanted:  # lines, not tokens: the read alone
        feeds["read"] = (tfseq.text_lines(files, batch_size=FLAGS.read_batch).prefetch(
            tf.data.AUTOTUNE), lambda lines: tf.cast(tf.size(lines), tf.int64))
    cached = None
    if wanted & {"bucket_alone", "pack_alone"}:
        cached = raw().cache()
        cached.reduce(tf.constant(0, tf.int64), lambda a, b: a + 1)  # fill the cache
    for k in parallel:
        suffix = "" if parallel == [None] else f" parallel={k}"
        if "bucket" in wanted:
            feeds["bucket" + suffix] = (bucket(raw(), k).prefetch(tf.data.AUTOTUNE),
                                        count_bucket)
        if "pack" in wanted:
            feeds["pack" + suffix] = (pack(raw(), k).prefetch(tf.data.AUTOTUNE), count_pack)
        if "bucket_alone" in wanted:
            feeds["bucket_alone" + suffix] = (bucket(cached, k), count_bucket)
        if "pack_alone" in wanted:
            feeds["pack_alone" + suffix] = (pack(cached, k), count_pack)
    for lanes in [int(k) for k in FLAGS.lanes]:
        inner = FLAGS.lane_parallel or None

        def lane_raw(lane_files, index):
            del index
            ds = tfseq.text_lines(lane_files, batch_size=FLAGS.read_batch,
                                  num_parallel_reads=FLAGS.lane_reads)
            if FLAGS.field >= 0:
                ds = ds.map(lambda lines: _text_of(lines, FLAGS.field))
            return ds.apply(tfseq.tokenize(vocab, num_parallel_calls=tokenize_calls()))

        def in_lanes(build, k=lanes):
            return lanes_module.in_lanes(files, build, num_lanes=k, buffer=FLAGS.lane_buffer)

        suffix = f" lanes={lanes}"
        feeds["raw" + suffix] = (in_lanes(lane_raw), count_raw)
        if "bucket" in wanted:  # batching inside each lane
            feeds["bucket" + suffix] = (
                in_lanes(lambda f, i: bucket(lane_raw(f, i), inner)), count_bucket)
        if "pack" in wanted:
            feeds["pack" + suffix] = (
                in_lanes(lambda f, i: pack(lane_raw(f, i), inner)), count_pack)
        # read and tokenize in lanes, one batching stage on the merged stream
        merged = in_lanes(lane_raw)
        if "bucket" in wanted:
            feeds["bucket after" + suffix] = (bucket(merged, None).prefetch(tf.data.AUTOTUNE),
                                              count_bucket)
        if "pack" in wanted:
            feeds["pack after" + suffix] = (pack(merged, None).prefetch(tf.data.AUTOTUNE),
                                            count_pack)
    for mode in [m for m in ("bucket", "pack") if "stream_" + m in wanted]:
        feeds["stream_" + mode] = (stream_feed(files, vocab, mode), lambda b: b[1]["tokens"])
    if "plain" in wanted:  # one copy of the files: it is ~30x slower than the others
        feeds["plain"] = (plain_feed(files[:max(1, len(files) // FLAGS.copies)], vocab),
                          lambda ids: tf.math.count_nonzero(ids, dtype=tf.int64))
    return feeds


def stream_feed(files, vocab, mode):
    """The training binaries' stream (``tfseq.ResumableStream``): the records as one shard
    (permuted in memory each epoch), encoded in a parallel map, pooled, each pool batched
    apart (``Batching(mode).pool_batcher``), finished; one epoch per pass."""
    import tensorflow as tf

    import tfseq

    tok = tfseq.text.get_tokenizer()
    batching = tfseq.Batching(mode=mode, max_tokens=FLAGS.max_tokens,
                              max_length=FLAGS.max_length, block_length=FLAGS.max_length,
                              long_examples="drop")
    counter = tfseq.DropCounter()
    shards = tfseq.RecordShards(lambda: tfseq.text_lines(files, batch_size=FLAGS.read_batch),
                                num_shards=1, seed=0)

    def encode(records):
        ids = vocab.lookup(tok.tokenize(_text_of(records, FLAGS.field)))
        return {"ids": tf.cast(ids, tf.int32)}

    epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
    with parallelism(encode_calls=tokenize_calls()):
        return tfseq.ResumableStream(shards, encode, batching.pool_batcher(counter),
                                     counter=counter, seed=0, epoch=epoch,
                                     **batching.pool_size).dataset()


def plain_feed(files, vocab):
    """tf.data alone, one line at a time: ``bucket_by_sequence_length`` with bucket upper
    bounds 8, 16, ..., max_length and batch sizes from the token budget."""
    import tensorflow as tf

    import tfseq

    tok = tfseq.text.get_tokenizer()
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TextLineDataset, cycle_length=16, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.map(lambda line: vocab.lookup(tok.tokenize(_text_of(line[None], FLAGS.field)[0])),
                num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.filter(lambda ids: (tf.size(ids) >= 1) & (tf.size(ids) <= FLAGS.max_length))
    ds = ds.shuffle(16384, seed=0)
    uppers = [8]
    while uppers[-1] < FLAGS.max_length:
        uppers.append(min(2 * uppers[-1], FLAGS.max_length))
    return ds.bucket_by_sequence_length(
        lambda ids: tf.size(ids), bucket_boundaries=[u + 1 for u in uppers[:-1]],
        bucket_batch_sizes=[max(1, FLAGS.max_tokens // u) for u in uppers]).prefetch(
            tf.data.AUTOTUNE)


def run_child(files, copies):
    """Times every feed at this process' core count; returns the rows."""
    import tensorflow as tf

    import tfseq

    texts = tfseq.text_lines(files, batch_size=4096).map(
        lambda lines: _text_of(lines, FLAGS.field)).unbatch()
    vocab = tfseq.Vocab.build(texts, min_count=1)
    parallel = [None if k == "default" else int(k) for k in FLAGS.parallel]
    feeds = build_feeds(copies, vocab, parallel)
    options = tfseq.pipeline_options()
    timers = {name: (ds.with_options(options), count) for name, (ds, count) in feeds.items()}
    short_copies = harness.short_copies(FLAGS.copies)
    if FLAGS.steady and short_copies < FLAGS.copies:
        short = build_feeds(copies[:len(files) * short_copies], vocab, parallel)
        for name, (ds, count) in short.items():
            if name in timers and not name.startswith(("plain", "read")):
                timers[name + " (short)"] = (ds.with_options(options), count)

    def report(name, run):  # as it goes: a run cut short still shows
        tokens, seconds, cpu = run
        print(f"  {name}: {tokens / seconds / 1e6:.2f}M/s ({tokens} in {seconds:.2f} s, "
              f"cpu {cpu:.1f} s)", flush=True)

    best = harness.best_passes(timers, FLAGS.repeats, on_pass=report)
    shorts = {name[:-len(" (short)")]: best.pop(name) for name in list(best)
              if name.endswith(" (short)")}
    if FLAGS.python_loop:
        for name in [n for n in timers if n.split(" ")[0] in ("raw", "bucket", "pack")]:
            ds, count = timers[name]
            count_fn = tf.function(count, reduce_retracing=True)
            for _ in range(1):
                start, cpu = time.perf_counter(), time.process_time()
                tokens = 0
                for batch in ds:
                    tokens += int(count_fn(batch))
                seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
                key = name + ", python loop"
                if key not in best or seconds < best[key][1]:
                    best[key] = (tokens, seconds, cpu)
    cores = len(os.sched_getaffinity(0))
    raw_rate = best["raw"][0] / best["raw"][1]
    raw_steady = (harness.steady(shorts["raw"], best["raw"])["steady_tokens_per_second"]
                  if "raw" in shorts else None)
    lines = best["read"][0] if "read" in best else None  # lines per pass (all copies)
    rows = []
    for name, (tokens, seconds, cpu) in best.items():
        if name.startswith("read"):  # lines, not tokens: compared with raw's lines/s
            rows.append({"cores": cores, "feed": name, "lines": tokens,
                         "seconds": round(seconds, 4), "lines_per_second": tokens / seconds,
                         "vs_raw": best["raw"][1] / seconds})
            continue
        # CPU ns per token (all threads of the process, in the best pass): steadier than the
        # wall clock on a shared machine, and what a stage costs the cores the reading needs.
        row = {"cores": cores, "feed": name, "real_tokens": tokens,
               "seconds": round(seconds, 4), "tokens_per_second": tokens / seconds,
               "vs_raw": tokens / seconds / raw_rate, "cpu_ns_per_token": cpu / tokens * 1e9}
        if name in shorts and raw_steady:
            row.update(harness.steady(shorts[name], (tokens, seconds)))
            row["steady_vs_raw"] = row["steady_tokens_per_second"] / raw_steady
        if lines and not name.startswith("plain"):
            row["lines_per_second"] = lines / seconds
        rows.append(row)
    return rows


def main(argv):
    del argv
    if FLAGS._child_out:  # one core count, pinned
        import tfseq

        with tempfile.TemporaryDirectory(prefix="bench_scaling_") as tmp:
            files = tfseq.reading.resolve_files(
                FLAGS.files or harness.embedded_text_files(tmp, FLAGS.files_out))
            rows = run_child(files, harness.linked_copies(files, FLAGS.copies, tmp))
        with open(FLAGS._child_out, "w") as f:
            json.dump(rows, f)
        return
    rows = harness.per_core_count(__name__, FLAGS.cores)
    by_cores = {}
    for row in rows:
        by_cores.setdefault(row["cores"], {})[row["feed"]] = row
    feeds = list(dict.fromkeys(row["feed"] for row in rows))
    print("\nM real tokens/s (x raw at the same core count) [CPU ns per token], in-graph unless "
          "noted")
    print(f"{'feed':32s} " + " ".join(f"{f'{c} cores':>24s}" for c in by_cores))
    for feed in feeds:
        cells = []
        for c in by_cores:
            row = by_cores[c].get(feed)
            if row and "cpu_ns_per_token" not in row:   # the read alone: M lines/s
                cells.append(f"{row['lines_per_second'] / 1e6:7.2f} ({row['vs_raw']:.2f}x) "
                             "M lines/s")
                continue
            cells.append(f"{row['tokens_per_second'] / 1e6:7.2f} ({row['vs_raw']:.2f}x) "
                         f"[{row['cpu_ns_per_token']:5.0f}]" if row else "")
        print(f"{feed:32s} " + " ".join(f"{cell:>24s}" for cell in cells))
    if any("steady_tokens_per_second" in row for row in rows):
        print("\nsteady M real tokens/s (x raw's steady rate) and start s, from passes of "
              f"{FLAGS.copies} and {harness.short_copies(FLAGS.copies)} copies")
        print(f"{'feed':32s} " + " ".join(f"{f'{c} cores':>24s}" for c in by_cores))
        for feed in feeds:
            cells = []
            for c in by_cores:
                row = by_cores[c].get(feed)
                cells.append(f"{row['steady_tokens_per_second'] / 1e6:7.2f} "
                             f"({row['steady_vs_raw']:.2f}x) {row['start_seconds']:5.2f} s"
                             if row and "steady_tokens_per_second" in row else "")
            if any(cells):
                print(f"{feed:32s} " + " ".join(f"{cell:>24s}" for cell in cells))
    cores = sorted(by_cores)
    gains = {}
    if len(cores) > 1:
        lo, hi = cores[0], cores[-1]
        print(f"\ngain from {lo} to {hi} cores")
        for feed in feeds:
            a, b = by_cores[lo].get(feed), by_cores[hi].get(feed)
            if a and b:
                gains[feed] = a["seconds"] / b["seconds"] if feed.startswith("read") else (
                    b["tokens_per_second"] / a["tokens_per_second"])
                print(f"  {feed:32s} x{gains[feed]:.2f}")
    harness.write_json({"benchmark": "scaling", "max_tokens": FLAGS.max_tokens,
                        "max_length": FLAGS.max_length, "read_batch": FLAGS.read_batch,
                        "tokenize_parallel": FLAGS.tokenize_parallel,
                        "copies": FLAGS.copies, "steady": FLAGS.steady, "rows": rows,
                        "gains": {"from_cores": cores[0], "to_cores": cores[-1],
                                  "feeds": gains} if len(cores) > 1 else None})

if __name__ == "__main__":
    harness.run(main)
