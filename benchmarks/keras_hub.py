"""A KerasHub BertTextClassifier fed by its own preprocessor vs by tfseq's bucketed batches.

The same model (a small ``BertBackbone`` from a config, ``BertTextClassifier`` head), the same
data and the same seeds, fed three ways:

- ``keras_hub_512``: KerasHub's ``BertTextClassifierPreprocessor`` at its default
  ``sequence_length`` (512), ``--batch_size`` texts per step;
- ``keras_hub_tuned``: the same preprocessor at the training texts' ``--percentile`` length
  (longer texts cut, as the preprocessor does);
- ``tfseq_bucket``: ``tfseq.keras_hub.tokenize`` -> ``tfseq.bucket_by_length(max_tokens=...)``
  -> ``tfseq.keras_hub.inputs(batch_size=...)``, ``max_tokens`` set so that a step holds
  ``--batch_size`` examples on average (measured on one pass), every example weighing
  ``1/batch_size`` in the loss whatever the rows of its batch (``--equal_example_weights``).

The task: a verse's testament (``--task=testament``, 2 classes, ~3/4 Old Testament) or section
of the canon (``--task=section``, 7 classes) from its text, on a fixed random subset of the
embedded corpus (``tfseq.corpus_path()``, KJV verses: median 34 WordPiece tokens with [CLS]
and [SEP]). The WordPiece vocabulary is learned from the training texts
(``tfseq.Vocab.learn``). Each run trains ``--epochs`` epochs and evaluates on the held-out
texts ``--evals_per_epoch`` times per epoch, every scheme on the same exact held-out batches
(tfseq's: the model's output on a text does not depend on its padding); only training time
is counted, tracing included (most of the first epoch's).

Time to accuracy: the training seconds until a run's held-out accuracy first reaches the
target, ``keras_hub_512``'s best held-out accuracy (mean over seeds) less ``--tolerance``;
the mean over the seeds that reach it (how many do is printed). It prints one table, side by
side with ratios to ``keras_hub_512``, writes ``--json_out`` and plots held-out accuracy
against training seconds to ``--plot_out`` (matplotlib: the ``plot`` extra).

Usage (from the repository root):
  python -m benchmarks.keras_hub --json_out=bench_out/keras_hub.json
  python -m benchmarks.keras_hub --quick     # smoke run: one small model per scheme
"""

from __future__ import annotations

import gzip
import json
import os
import re
import statistics
import time

from absl import flags, logging

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfseq  # noqa: E402
from benchmarks import harness  # noqa: E402
from tfseq.corpus import BOOK_TO_SECTION, SECTION_NAMES  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("task", "testament", ["testament", "section"],
                  "Label: the verse's testament (2 classes) or section of the canon (7).")
flags.DEFINE_integer("train_examples", 1600, "Training verses (a fixed random subset).")
flags.DEFINE_integer("eval_examples", 1000, "Held-out verses (disjoint from the training ones).")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds: weights, shuffles and bucketing.")
flags.DEFINE_integer("epochs", 3, "Training epochs per run.")
flags.DEFINE_integer("batch_size", 32, "Texts per step (tfseq: on average).")
flags.DEFINE_integer("percentile", 99, "The tuned sequence_length: this percentile of lengths.")
flags.DEFINE_integer("vocab_size", 2000, "WordPiece vocabulary size.")
flags.DEFINE_integer("num_layers", 2, "Transformer layers.")
flags.DEFINE_integer("num_heads", 2, "Attention heads.")
flags.DEFINE_integer("hidden_dim", 64, "Hidden size.")
flags.DEFINE_integer("intermediate_dim", 128, "Feed-forward size.")
flags.DEFINE_float("learning_rate", 2e-3, "Adam learning rate.")
flags.DEFINE_bool("equal_example_weights", True, "tfseq: every example weighs 1/batch_size "
                  "in the loss whatever the rows of its batch (inputs(batch_size=...)).")
flags.DEFINE_integer("evals_per_epoch", 4, "Held-out evaluations per epoch (not timed).")
flags.DEFINE_float("tolerance", 0.01, "Time to accuracy: target = baseline's best minus this.")
flags.DEFINE_list("schemes", ["keras_hub_512", "keras_hub_tuned", "tfseq_bucket"],
                  "Which feeds to run (keras_hub_512 is the baseline of the ratios).")
flags.DEFINE_string("plot_out", "docs/keras_hub.png", "Held-out accuracy vs seconds (PNG); "
                    "'' for none. Needs matplotlib (the plot extra).")
flags.DEFINE_bool("quick", False, "Smoke run: 300 verses, one seed, one epoch, a tiny model "
                  "(no plot unless --plot_out is given).")

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_PUNCTUATION = re.compile(r"([^\w\s])")


TESTAMENT = ("Old Testament", "New Testament")
NEW_TESTAMENT_FROM = SECTION_NAMES.index("Gospels and Acts")


def class_names(task: str):
    return TESTAMENT if task == "testament" else SECTION_NAMES


def read_corpus(train_examples: int, eval_examples: int, task: str):
    """Two disjoint random subsets (seed 0) of the embedded corpus: (texts, labels)."""
    with gzip.open(tfseq.corpus_path(), "rt", encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    order = np.random.default_rng(0).permutation(len(rows))
    picked = [rows[i] for i in order[:train_examples + eval_examples]]
    texts = [r[3] for r in picked]
    sections = np.array([BOOK_TO_SECTION[r[0]] for r in picked], np.int32)
    labels = (sections >= NEW_TESTAMENT_FROM).astype(np.int32) if task == "testament" else sections
    return ((texts[:train_examples], labels[:train_examples]),
            (texts[train_examples:], labels[train_examples:]))


def learn_tokenizer(texts, vocab_size: int):
    """A ``BertTokenizer`` over a WordPiece vocabulary learned from ``texts`` (lower-cased,
    punctuation split off, as BERT's tokenizer splits it)."""
    sample = [_PUNCTUATION.sub(r" \1 ", t.lower()) for t in texts]
    learned = tfseq.Vocab.learn(sample, vocab_size=vocab_size, progress_every=10**9)
    vocabulary = SPECIALS + learned.tokens[4:]
    return keras_hub.models.BertTokenizer(vocabulary=vocabulary, lowercase=True)


def build_classifier(vocabulary_size: int, seed: int):
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=vocabulary_size, num_layers=FLAGS.num_layers, num_heads=FLAGS.num_heads,
        hidden_dim=FLAGS.hidden_dim, intermediate_dim=FLAGS.intermediate_dim,
        max_sequence_length=512)
    model = keras_hub.models.BertTextClassifier(backbone, num_classes=len(class_names(FLAGS.task)),
                                                preprocessor=None)
    model.compile(optimizer=keras.optimizers.Adam(FLAGS.learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


# ------------------------------------------------------------------------------ feeds

def keras_hub_feed(tokenizer, sequence_length, texts, labels, *, seed=None):
    """KerasHub's own input: shuffle, batch texts, map the preprocessor (pads to the length)."""
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer, sequence_length=sequence_length)
    ds = tf.data.Dataset.from_tensor_slices((texts, labels))
    if seed is not None:
        ds = ds.shuffle(len(texts), seed=seed)
    return (ds.batch(FLAGS.batch_size)
            .map(preprocessor, num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))


def tfseq_batches(tokenizer, max_tokens, texts, labels, *, seed=None):
    """tfseq's input before the model: tokenized ragged batches bucketed under a budget."""
    ds = tf.data.Dataset.from_tensor_slices({"ids": texts, "label": labels})
    if seed is not None:
        ds = ds.shuffle(len(texts), seed=seed)
    return (ds.batch(1024)
            .apply(tfseq.keras_hub.tokenize(tokenizer, counter=tfseq.DropCounter()))
            .apply(tfseq.bucket_by_length(max_tokens=max_tokens, max_length=512,
                                          shuffle=seed is not None, seed=seed)))


def tfseq_feed(model, tokenizer, max_tokens, texts, labels, *, seed=None):
    equal = FLAGS.equal_example_weights and seed is not None  # training only
    return (tfseq_batches(tokenizer, max_tokens, texts, labels, seed=seed)
            .apply(tfseq.keras_hub.inputs(model, batch_size=FLAGS.batch_size if equal else None))
            .prefetch(tf.data.AUTOTUNE))


def batch_shapes(ds, key_ids="token_ids", mask="padding_mask"):
    """(examples per step, padding efficiency) of one pass over a model-input dataset."""
    steps = examples = real = cells = 0
    for x, *_ in ds:
        rows, width = x[key_ids].shape
        steps, examples, cells = steps + 1, examples + rows, cells + rows * width
        real += int(tf.reduce_sum(tf.cast(x[mask], tf.int64)))
    return examples / steps, real / cells


def fit_max_tokens(tokenizer, texts, labels, mean_length: float) -> int:
    """A budget giving ``--batch_size`` examples per step on average: a first guess from the
    mean length, corrected by one measured pass."""
    guess = max(512, int(round(FLAGS.batch_size * mean_length)))
    steps = sum(1 for _ in tfseq_batches(tokenizer, guess, texts, labels, seed=0))
    per_step = len(texts) / steps
    return max(512, int(round(guess * FLAGS.batch_size / per_step)))


# ------------------------------------------------------------------------------- runs

class Progress(keras.callbacks.Callback):
    """Training seconds (evaluation not counted) and held-out accuracy every ``every`` steps
    and at the end of each epoch."""

    def __init__(self, held_out, every: int):
        super().__init__()
        self.held_out, self.every = held_out, every
        self.steps, self.train_seconds = 0, 0.0
        self.epoch_seconds, self.points = [], []   # points: (seconds, steps, accuracy)

    def _now(self) -> float:
        return self.train_seconds + time.perf_counter() - self._resumed

    def _evaluate(self):
        self.train_seconds = self._now()
        result = self.model.evaluate(self.held_out, verbose=0, return_dict=True)
        self.points.append((self.train_seconds, self.steps, float(result["accuracy"])))
        self._resumed = time.perf_counter()

    def on_train_begin(self, logs=None):
        self._resumed = time.perf_counter()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._now()

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps % self.every == 0:
            self._evaluate()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_seconds.append(self._now() - self._epoch_start)
        if self.steps % self.every:
            self._evaluate()


def run(scheme, seed, tokenizer, lengths, data):
    (texts, labels), (eval_texts, eval_labels) = data
    model = build_classifier(tokenizer.vocabulary_size(), seed)
    if scheme == "tfseq_bucket":
        max_tokens = lengths["max_tokens"]
        train = tfseq_feed(model, tokenizer, max_tokens, texts, labels, seed=seed)
        setting = {"max_tokens": max_tokens}
    else:
        length = 512 if scheme == "keras_hub_512" else lengths["percentile"]
        train = keras_hub_feed(tokenizer, length, texts, labels, seed=seed)
        setting = {"sequence_length": length}
    # One held-out feed for every scheme: the model's output on a text does not depend on
    # its padding (tests/test_keras_hub.py), and evaluating at 512 would cost more than the
    # training it measures. Held-out texts are never cut.
    held_out = tfseq_feed(model, tokenizer, lengths["max_tokens"], eval_texts, eval_labels)
    every = max(1, -(-len(texts) // (FLAGS.batch_size * FLAGS.evals_per_epoch)))
    progress = Progress(held_out, every)
    model.fit(train, epochs=FLAGS.epochs, verbose=0, callbacks=[progress])
    per_step, efficiency = batch_shapes(train)
    logging.info("%s seed %d: %s s/epoch, accuracy %s", scheme, seed,
                 [round(s, 1) for s in progress.epoch_seconds],
                 [round(a, 3) for _, _, a in progress.points])
    return {"scheme": scheme, "seed": seed, **setting, "epoch_seconds": progress.epoch_seconds,
            "points": progress.points, "examples_per_step": per_step,
            "padding_efficiency": efficiency}


def time_to(points, target):
    """Training seconds until the held-out accuracy first reaches ``target``; None if never."""
    return next((seconds for seconds, _, accuracy in points if accuracy >= target), None)


def summarize(runs, baseline="keras_hub_512"):
    by_scheme = {}
    for r in runs:
        by_scheme.setdefault(r["scheme"], []).append(r)
    best = {s: [max(a for _, _, a in r["points"]) for r in rs] for s, rs in by_scheme.items()}
    reference = baseline if baseline in best else next(iter(best))
    target = statistics.mean(best[reference]) - FLAGS.tolerance
    rows = []
    for scheme, rs in by_scheme.items():
        steady = [s for r in rs for s in (r["epoch_seconds"][1:] or r["epoch_seconds"])]
        times = [time_to(r["points"], target) for r in rs]
        reached = [t for t in times if t is not None]
        rows.append({
            "scheme": scheme,
            "setting": {k: rs[0][k] for k in ("sequence_length", "max_tokens") if k in rs[0]},
            "examples_per_step": statistics.mean(r["examples_per_step"] for r in rs),
            "padding_efficiency": statistics.mean(r["padding_efficiency"] for r in rs),
            "first_epoch_seconds": statistics.mean(r["epoch_seconds"][0] for r in rs),
            "epoch_seconds": statistics.median(steady),
            "best_accuracy": statistics.mean(best[scheme]),
            "best_accuracy_per_seed": best[scheme],
            "final_accuracy": statistics.mean(r["points"][-1][2] for r in rs),
            "time_to_target": statistics.mean(reached) if reached else None,
            "seeds_reaching_target": len(reached), "seeds": len(rs)})
    base = next(r for r in rows if r["scheme"] == reference)
    for r in rows:
        r["epoch_seconds_ratio"] = r["epoch_seconds"] / base["epoch_seconds"]
        r["accuracy_difference"] = r["best_accuracy"] - base["best_accuracy"]
        r["time_to_target_ratio"] = (r["time_to_target"] / base["time_to_target"]
                                     if r["time_to_target"] and base["time_to_target"] else None)
    return {"target_accuracy": target, "baseline": reference, "rows": rows}


def print_table(summary):
    print(f"\nTarget held-out accuracy: {summary['target_accuracy']:.3f} "
          f"({summary['baseline']}'s best, mean over seeds, less {FLAGS.tolerance})")
    header = (f"{'scheme':<17}{'setting':<17}{'ex/step':>8}{'pad eff':>8}{'epoch 1 s':>10}"
              f"{'s/epoch':>9}{'ratio':>7}{'best acc':>9}{'diff':>7}{'to target s':>12}"
              f"{'ratio':>7}{'reached':>8}")
    print(header)
    print("-" * len(header))
    for r in summary["rows"]:
        setting = ",".join(f"{k.split('_')[-1]}={v}" for k, v in r["setting"].items())
        to = f"{r['time_to_target']:.1f}" if r["time_to_target"] is not None else "-"
        ratio = f"{r['time_to_target_ratio']:.2f}" if r["time_to_target_ratio"] else "-"
        print(f"{r['scheme']:<17}{setting:<17}{r['examples_per_step']:>8.1f}"
              f"{r['padding_efficiency']:>8.2f}{r['first_epoch_seconds']:>10.1f}"
              f"{r['epoch_seconds']:>9.1f}{r['epoch_seconds_ratio']:>7.2f}"
              f"{r['best_accuracy']:>9.3f}{r['accuracy_difference']:>+7.3f}{to:>12}{ratio:>7}"
              f"{r['seeds_reaching_target']:>5}/{r['seeds']}")


def plot(runs, summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"keras_hub_512": "tab:red", "keras_hub_tuned": "tab:orange",
              "tfseq_bucket": "tab:blue"}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labelled = set()
    for r in runs:
        seconds, _, accuracy = zip(*r["points"])
        name = r["scheme"]
        if name == "keras_hub_tuned":
            name = f"keras_hub, sequence_length={r['sequence_length']} (p{FLAGS.percentile})"
        elif name == "keras_hub_512":
            name = "keras_hub, sequence_length=512 (default)"
        else:
            name = f"tfseq bucket_by_length(max_tokens={r['max_tokens']})"
        ax.plot(seconds, accuracy, ".-", color=colors[r["scheme"]], alpha=0.8,
                label=None if name in labelled else name)
        labelled.add(name)
    ax.axhline(summary["target_accuracy"], color="gray", ls="--", lw=1, label="target")
    ax.set_xlabel(f"training wall seconds ({len(os.sched_getaffinity(0))}-core CPU)")
    ax.set_ylabel("held-out accuracy")
    ax.set_xscale("log")
    ax.set_title(f"BertTextClassifier, verse -> {FLAGS.task}: one line per seed")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    logging.info("wrote %s", path)


def main(argv):
    del argv
    if FLAGS.quick:
        if not FLAGS["plot_out"].present:
            FLAGS.plot_out = ""
        for name, value in dict(train_examples=200, eval_examples=100, seeds=["0"], epochs=1,
                                evals_per_epoch=1,
                                num_layers=1, hidden_dim=16, intermediate_dim=32,
                                vocab_size=500).items():
            setattr(FLAGS, name, value)
    start = time.perf_counter()
    data = read_corpus(FLAGS.train_examples, FLAGS.eval_examples, FLAGS.task)
    (texts, labels), _ = data
    tokenizer = learn_tokenizer(texts, FLAGS.vocab_size)
    lengths_all = np.array([len(ids) + 2 for ids in tokenizer(texts)])
    lengths = {"percentile": int(np.ceil(np.percentile(lengths_all, FLAGS.percentile))),
               "median": float(np.median(lengths_all)), "mean": float(lengths_all.mean())}
    lengths["max_tokens"] = fit_max_tokens(tokenizer, texts, labels, lengths["mean"])
    print(f"{len(texts)} training / {len(data[1][0])} held-out verses; tokens per verse "
          f"([CLS] and [SEP] included): median {lengths['median']:.0f}, mean "
          f"{lengths['mean']:.1f}, p{FLAGS.percentile} {lengths['percentile']}, max "
          f"{lengths_all.max()}; tfseq max_tokens={lengths['max_tokens']}")
    runs = []
    for seed in [int(s) for s in FLAGS.seeds]:
        for scheme in FLAGS.schemes:
            runs.append(run(scheme, seed, tokenizer, lengths, data))
    summary = summarize(runs)
    print_table(summary)
    print(f"\nwall {time.perf_counter() - start:.0f} s")
    config = {name: FLAGS[name].value for name in (
        "train_examples", "eval_examples", "seeds", "epochs", "batch_size", "percentile",
        "vocab_size", "num_layers", "num_heads", "hidden_dim", "intermediate_dim",
        "learning_rate", "tolerance", "quick")}
    if FLAGS.json_out:
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.json_out)), exist_ok=True)
        with open(FLAGS.json_out, "w") as f:
            json.dump({"config": config, "lengths": lengths, "summary": summary, "runs": runs,
                       "cores": len(os.sched_getaffinity(0))}, f, indent=1)
    if FLAGS.plot_out:
        plot(runs, summary, FLAGS.plot_out)


if __name__ == "__main__":
    harness.run(main)
