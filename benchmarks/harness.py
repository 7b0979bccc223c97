"""What the benchmarks share: common flags, the corpus files, in-graph timing with the steady
rate, side-by-side tables and the JSON output.

A benchmark runs from the repository root as ``python -m benchmarks.<name> [--flags]
--json_out=bench_out/<name>.json``, its ``__main__`` block calling ``harness.run(main)``.
Nothing here imports TensorFlow when the module is imported, so a benchmark that measures core
counts can pin its process first (``pin_cores``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_string("json_out", None, "Write the results here as JSON.")

CORES_ENV = "TFSEQ_BENCH_CORES"  # a child's core count (``per_core_count``, ``pin_cores``)


# ----------------------------------------------------------------------------- flags

def define_repeats(default: int, help: str = "Timed passes per feed, round robin; the best "
                   "is reported.") -> None:
    """``--repeats``: timed passes (the benchmark's default and, if it differs, meaning)."""
    flags.DEFINE_integer("repeats", default, help)


def define_copies(default: int, help: str = "Read each file this many times (as that many "
                  "symlinked files): a stream several bucketing pools long, so the rate is the "
                  "steady state and not one pool's fill-then-drain.") -> None:
    """``--copies``: the corpus size as a number of copies of its files."""
    flags.DEFINE_integer("copies", default, help)


def flag_values(*names: str) -> dict:
    """``{name: value}`` of these flags, for the JSON."""
    return {name: FLAGS[name].value for name in names}


def run(main) -> None:
    """``app.run(main)``, with the harness' flags listed by ``--helpshort`` beside the
    benchmark's own."""
    for flag in FLAGS.get_flags_for_module(__name__):
        FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    app.run(main)


# ----------------------------------------------------------------------------- corpus files

def embedded_rows() -> list[tuple[str, str]]:
    """``(label, text)`` of every verse of the embedded corpora, both languages (the first
    and the last TSV field)."""
    import gzip

    import tfseq

    english = tfseq.corpus_path()  # the Spanish file beside it (an older tree may lack it)
    rows = []
    for path in (english, os.path.join(os.path.dirname(english), "rv1909_es.tsv.gz")):
        if os.path.exists(path):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                for line in f:
                    fields = line.rstrip("\n").split("\t")
                    rows.append((fields[0], fields[-1]))
    return rows


def embedded_text_files(out_dir: str, num_files: int) -> list[str]:
    """The embedded corpus' text fields (``embedded_rows``) dealt round-robin into
    ``num_files`` plain-text files ``part00.txt``... in ``out_dir``."""
    lines = [text for _, text in embedded_rows()]
    files = []
    for i in range(num_files):
        name = os.path.join(out_dir, f"part{i:02d}.txt")
        with open(name, "w", encoding="utf-8") as f:
            f.write("\n".join(lines[i::num_files]) + "\n")
        files.append(name)
    return files


def linked_copies(files: list[str], copies: int, out_dir: str) -> list[str]:
    """``copies`` symlinks to each file in ``out_dir`` (``copy000_<name>``, ...), copy by copy:
    a stream ``copies`` times as long, read as that many distinct files."""
    links = []
    for i in range(copies):
        for path in files:
            link = os.path.join(out_dir, f"copy{i:03d}_{os.path.basename(path)}")
            os.symlink(os.path.abspath(path), link)
            links.append(link)
    return links


def original_name(link: str) -> str:
    """``copy003_part01.txt`` -> ``part01.txt`` (the file a ``linked_copies`` link copies)."""
    return os.path.basename(link).split("_", 1)[1]


def power_law_lengths(size: int, rng):
    """int64 [size] lengths ``ceil(8 * Pareto(1.2))`` - 7 (median ~14, a long tail), at most
    4096."""
    import numpy as np

    return np.minimum(np.ceil(8 * (rng.pareto(1.2, size) + 1)).astype(np.int64) - 7, 4096)


def lognormal_lengths(size: int, rng, *, median: float, sigma: float | None = None,
                      p99: float | None = None, longest: int = 4096):
    """int64 [size] lengths ``ceil(LogNormal)`` with this median and ``sigma`` (or the sigma
    that puts the 99th percentile at ``p99``), in 1..``longest``."""
    import math

    import numpy as np

    if sigma is None:
        sigma = (math.log(p99) - math.log(median)) / 2.326  # the normal's 99th percentile
    lengths = np.ceil(rng.lognormal(math.log(median), sigma, size))
    return np.clip(lengths, 1, longest).astype(np.int64)


# Synthetic stand-ins for corpus shapes: (examples, median, p99, max) tokens. Lengths are
# ceil(log-normal) with that median and p99, clipped at max.
SHAPES = {
    "phrases": (391_000, 2, 15, 100),       # dictionary phrase pairs
    "entries": (253_000, 16, 87, 2333),     # dictionary entries
    "prose": (57_000, 18, 62, 180),         # edited-prose sentences
    "emails": (6_000, 169, 3166, 14954),    # email bodies, long-tailed
}


def synthetic_lengths(kind: str, size: int | None, seed: int):
    """int64 [size] example lengths of a synthetic corpus: a shape of ``SHAPES`` (``size``
    None: the shape's own size), ``"zipf"`` (``power_law_lengths``) or ``"lognormal"``
    (median 20, sigma 1.2); those two default to 50,000 examples."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if size is None:
        size = SHAPES[kind][0] if kind in SHAPES else 50_000
    if kind == "zipf":
        return power_law_lengths(size, rng)
    if kind == "lognormal":
        return lognormal_lengths(size, rng, median=20, sigma=1.2)
    _, median, p99, longest = SHAPES[kind]
    return lognormal_lengths(size, rng, median=median, p99=p99, longest=longest)


def id_examples(lengths, rng, vocab_size: int):
    """A dataset of ``{"ids": int32 [(T)]}`` examples of these lengths, ids uniform in
    1..``vocab_size`` from ``rng``."""
    import numpy as np
    import tensorflow as tf

    values = rng.integers(1, vocab_size + 1, int(np.sum(lengths)), dtype=np.int32)
    ids = tf.RaggedTensor.from_row_lengths(values, lengths)
    return tf.data.Dataset.from_tensor_slices({"ids": ids}).map(lambda e: {"ids": e["ids"]})


def tf_data_bucketing(max_tokens: int, max_length: int, key: str = "ids"):
    """``Dataset.bucket_by_sequence_length`` as a budget user sets it: tensor2tensor's
    boundaries (8, then x1.1) up to ``max_length``, each bucket's batch size the most rows of
    its longest length within ``max_tokens`` cells; the length is ``key``'s."""
    import tensorflow as tf

    boundaries, b = [], 8
    while b < max_length:
        boundaries.append(b)
        b = max(b + 1, int(b * 1.1))
    # Boundaries are exclusive: bucket i holds lengths < boundaries[i].
    sizes = [max_tokens // (b - 1) for b in boundaries] + [max_tokens // max_length]
    return lambda ds: ds.bucket_by_sequence_length(
        lambda x: tf.shape(x[key], out_type=tf.int32)[0], boundaries, sizes)


# ----------------------------------------------------------------------------- timing

def count_pass(dataset, count) -> tuple[int, float, float]:
    """One pass over ``dataset`` consumed in the graph (``Dataset.reduce``: no Python per
    element): the sum of ``count(element)`` (int64), wall seconds and the process' CPU
    seconds."""
    import tensorflow as tf

    start, cpu = time.perf_counter(), time.process_time()
    total = int(dataset.reduce(tf.constant(0, tf.int64), lambda n, x: n + count(x)))
    return total, time.perf_counter() - start, time.process_time() - cpu


def call_pass(run) -> tuple[int, float, float]:
    """``run()`` (one pass of a feed outside tf.data, e.g. a Python-driven peer, returning
    its count) -> (count, wall seconds, the process' CPU seconds), as ``count_pass``."""
    start, cpu = time.perf_counter(), time.process_time()
    total = int(run())
    return total, time.perf_counter() - start, time.process_time() - cpu


def best_passes(feeds: dict, repeats: int, on_pass=None) -> dict:
    """Each feed ``name -> (dataset, count)`` timed by ``count_pass`` (or ``name -> run``, a
    function making one pass and returning its count, timed by ``call_pass``) ``repeats``
    times, round robin (a slow spell of the machine hits every feed alike; every pass is a
    new iterator, as every epoch of ``model.fit`` is), the fastest pass of each kept: ``name
    -> (count, seconds, cpu seconds)``. ``on_pass(name, (count, seconds, cpu))`` sees every
    pass."""
    best = {}
    for _ in range(repeats):
        for name, feed in feeds.items():
            result = call_pass(feed) if callable(feed) else count_pass(*feed)
            if on_pass:
                on_pass(name, result)
            if name not in best or result[1] < best[name][1]:
                best[name] = result
    return best


def short_copies(copies: int) -> int:
    """The short pass of a steady-rate measurement: a quarter of the copies, at least 1."""
    return max(1, copies // 4)


def steady(short, long) -> dict:
    """Two passes of one feed, ``(tokens, seconds)`` each, a short and a long one -> its rate
    once running (the tokens between them over the seconds between them) and its start (what
    the short pass took beyond its tokens at that rate: building the iterator's functions,
    filling the first pool or part)."""
    rate = (long[0] - short[0]) / max(long[1] - short[1], 1e-9)
    return {"short_real_tokens": short[0], "short_seconds": round(short[1], 4),
            "steady_tokens_per_second": rate,
            "start_seconds": round(short[1] - short[0] / rate, 4)}


def batch_totals(dataset, key: str = "ids"):
    """One pass over padded or packed batches, in the graph: (int64 numpy ``[batches,
    examples, real tokens, cells, the largest batch's cells]``, wall seconds, CPU seconds).
    Real tokens are the non-zero ``key`` ids; a packed batch (with ``<key>_segment_ids``)
    counts its segments as examples, a padded one its rows."""
    import tensorflow as tf

    def numbers(batch):
        ids = batch[key]
        cells = tf.cast(tf.size(ids), tf.int64)
        real = tf.math.count_nonzero(ids, dtype=tf.int64)
        if f"{key}_segment_ids" in batch:
            examples = tf.reduce_sum(tf.reduce_max(batch[f"{key}_segment_ids"], axis=1))
        else:
            examples = tf.shape(ids)[0]
        return tf.stack([tf.constant(1, tf.int64), tf.cast(examples, tf.int64), real, cells,
                         cells])

    start, cpu = time.perf_counter(), time.process_time()
    totals = dataset.map(numbers).reduce(
        tf.zeros([5], tf.int64),
        lambda acc, x: tf.concat([acc[:4] + x[:4], tf.maximum(acc[4:], x[4:])], 0))
    totals = totals.numpy()
    return totals, time.perf_counter() - start, time.process_time() - cpu


# ----------------------------------------------------------------------------- core counts

def pin_cores() -> None:
    """In a child of ``per_core_count``: pins this process to cores 0..N-1 before TensorFlow
    starts (it sizes its thread pools from the affinity mask). Elsewhere: nothing."""
    if os.environ.get(CORES_ENV):
        os.sched_setaffinity(0, range(int(os.environ[CORES_ENV])))


def per_core_count(module_name: str, cores, *, child_flag: str = "_child_out",
                   after_each=None) -> list:
    """Runs the benchmark ``module_name`` (its ``__name__``) once per core count in
    ``cores``, each in a child process pinned to that many cores (``pin_cores``), with this
    run's flags but ``--json_out`` and ``--cores``, and ``--<child_flag>=<file>``, where the
    child writes a JSON list of rows. Returns every child's rows in turn; ``after_each(rows)``
    sees them after each child (a run cut short keeps what it had). Core counts above the
    machine's are skipped."""
    module = sys.modules[module_name]
    own = sys.argv[0] if module_name == "__main__" else module_name
    args = [flag.serialize() for name in (own, __name__)
            for flag in FLAGS.get_flags_for_module(name)
            if flag.present and flag.name not in ("json_out", "cores", child_flag)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tfseq_cores_") as tmp:
        for n in [int(c) for c in cores]:
            if n > os.cpu_count():
                print(f"skipping {n} cores: this machine has {os.cpu_count()}")
                continue
            out = os.path.join(tmp, f"cores{n}.json")
            subprocess.run([sys.executable, "-m", module.__spec__.name, *args,
                            f"--{child_flag}={out}"],
                           env=dict(os.environ, **{CORES_ENV: str(n)}), check=True)
            with open(out) as f:
                rows += json.load(f)
            if after_each:
                after_each(rows)
    return rows


# ----------------------------------------------------------------------------- output

def add_ratios(rows: list[dict], reference: dict, **ratios: str) -> None:
    """Sets ``row[out] = row[key] / reference[key]`` on every row, for each ``out=key``: the
    side-by-side ratios against one scheme."""
    for row in rows:
        for out, key in ratios.items():
            row[out] = row[key] / reference[key]


def table(rows: list[dict], columns) -> str:
    """``rows`` side by side. ``columns``: ``(title, key, spec)``, the cell ``format(row[key],
    spec)`` (``key`` may be a function of the row; a missing value leaves the cell blank); text
    (spec ``""``) left-aligned, numbers right-aligned, each column as wide as its widest cell;
    a rule under the titles."""
    def cell(row, key, spec):
        value = key(row) if callable(key) else row.get(key)
        return "" if value is None else format(value, spec)

    cells = [[cell(row, key, spec) for _, key, spec in columns] for row in rows]
    widths = [max([len(title)] + [len(line[i]) for line in cells])
              for i, (title, _, _) in enumerate(columns)]

    def line(values):
        return " ".join(v.ljust(w) if spec == "" else v.rjust(w)
                        for v, w, (_, _, spec) in zip(values, widths, columns)).rstrip()

    header = line([title for title, _, _ in columns])
    return "\n".join([header, "-" * len(header)] + [line(values) for values in cells])


def print_table(rows: list[dict], columns, title: str | None = None) -> None:
    """``table(rows, columns)`` on stdout, after ``title`` if given."""
    if title:
        print(title)
    print(table(rows, columns), flush=True)


def write_json(result, path: str | None = None) -> str | None:
    """Writes ``result`` as JSON to ``path`` (default ``--json_out``), creating its folder;
    without either, nothing. Returns the path written."""
    path = path or FLAGS.json_out
    if not path:
        return None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    logging.info("wrote %s", path)
    return path
