"""Click-through-rate prediction from Paddle-style MultiSlot files (``tfseq.multislot``).

Slots (in line order)::

    click     uint64 dense (1,)   label, 0 or 1
    user      uint64 sparse       1 id
    item      uint64 sparse       1 id
    category  uint64 sparse       1-2 ids (the item's categories)
    query     uint64 sparse       0-8 word ids
    history   uint64 sparse       0-15 ids of items seen before
    stats     float  dense (3,)   real-valued context features

``generate`` writes a synthetic data set with a learnable signal (seeded numpy): the click
probability is a logistic function of per-user and per-item biases, a user x item affinity
(dot product of hidden vectors), category and query-word weights, the affinity of the item to
the user's history, and a linear function of ``stats``. ``info["oracle_auc"]`` is the AUC of
the true probabilities on the eval files: the ceiling a model can reach.

Element spec of both datasets (B = batch, n = ids per line)::

    ({"user": int64 RaggedTensor [B, (n)], "item": ..., "category": ..., "query": ...,
      "history": ..., "stats": float32 [B, 3]}, float32 [B])

Malformed lines are dropped and counted by reason (``info["counters"][split].drops()``).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np
import tensorflow as tf
from absl import logging

import tfseq
from tfseq import multislot
from tfseq._common import check_positive_int
from tfseq.multislot import Slot
from tfseq.pipelines.replayed import ReplayedTask
from tfseq.replay import ReplayStream, epoch_shuffle

SLOTS = (
    Slot("click", "uint64", "dense", (1,)),
    Slot("user"),
    Slot("item"),
    Slot("category"),
    Slot("query"),
    Slot("history"),
    Slot("stats", "float", "dense", (3,)),
)
LABEL = "click"


@dataclasses.dataclass(frozen=True)
class Config:
    files: tuple[str, ...] = ()            # training MultiSlot files/globs; empty: generate
    eval_files: tuple[str, ...] = ()       # held-out files (required with ``files``)
    data_dir: str | None = None            # where generated files go (default: a temp dir)
    num_files: int = 4                     # generated training files
    examples_per_file: int = 8000
    eval_examples: int = 5000
    batch_size: int = 256
    num_parallel_reads: int = 4
    shuffle_buffer: int = 20000
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class _World:
    """The hidden parameters of the synthetic click model."""

    user_bias: np.ndarray
    item_bias: np.ndarray
    user_vec: np.ndarray
    item_vec: np.ndarray
    item_categories: np.ndarray
    category_weight: np.ndarray
    word_weight: np.ndarray
    stats_weight: np.ndarray


def _world(rng: np.random.Generator) -> _World:
    num_users, num_items, num_categories, num_words = 500, 1000, 30, 1000
    return _World(
        user_bias=rng.normal(0.0, 0.6, num_users),
        item_bias=rng.normal(0.0, 0.6, num_items),
        user_vec=rng.normal(0.0, 1.0, (num_users, 4)),
        item_vec=rng.normal(0.0, 1.0, (num_items, 4)),
        item_categories=rng.integers(0, num_categories, (num_items, 2)),
        category_weight=rng.normal(0.0, 0.6, num_categories),
        word_weight=rng.normal(0.0, 0.8, num_words) * (rng.random(num_words) < 0.2),
        stats_weight=np.array([0.8, -0.6, 0.0]),
    )


def _examples(world: _World, rng: np.random.Generator, n: int):
    """Yields ``(slot values dict, true click probability)``."""
    num_users, num_items = len(world.user_bias), len(world.item_bias)
    for _ in range(n):
        user = int(rng.integers(num_users))
        item = int(rng.integers(num_items))
        categories = world.item_categories[item][: int(rng.integers(1, 3))]
        query = rng.integers(0, len(world.word_weight), int(min(rng.poisson(3), 8)))
        history = rng.integers(0, num_items, int(rng.integers(0, 16)))
        stats = rng.normal(0.0, 1.0, 3)
        logit = (-0.8 + world.user_bias[user] + world.item_bias[item]
                 + 0.5 * world.user_vec[user] @ world.item_vec[item]
                 + world.category_weight[categories].mean() + world.word_weight[query].sum()
                 + stats @ world.stats_weight)
        if len(history):
            logit += 0.4 * world.item_vec[history].mean(0) @ world.item_vec[item]
        p = 1.0 / (1.0 + np.exp(-logit))
        click = int(rng.random() < p)
        yield {"click": [click], "user": [user], "item": [item], "category": categories.tolist(),
               "query": query.tolist(), "history": history.tolist(),
               "stats": np.round(stats, 4).tolist()}, p


def auc(labels, scores) -> float:
    """ROC AUC by ranks (ties averaged): the probability a positive outscores a negative."""
    labels = np.asarray(labels, bool)
    scores = np.asarray(scores, float)
    positives, negatives = labels.sum(), (~labels).sum()
    if not positives or not negatives:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average = first + (counts - 1) / 2.0 + 1.0
    ranks[order] = np.repeat(average, counts)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def generate(data_dir: str, *, num_files: int = 4, examples_per_file: int = 5000,
             eval_examples: int = 5000, seed: int = 0, bad_lines_per_file: int = 0) -> dict:
    """Writes a synthetic MultiSlot CTR data set with a learnable signal.

    Args:
      data_dir: output directory (created).
      num_files: training files ``train-0000.txt`` ...; the eval file is ``eval.txt``.
      examples_per_file, eval_examples: lines per training file / in the eval file.
      seed: numpy seed; the same seed writes the same bytes.
      bad_lines_per_file: malformed lines added to each training file (for drop accounting).

    Returns:
      ``{"train_files": [...], "eval_files": [...], "oracle_auc": float}``; the oracle AUC is
      that of the true click probabilities on the eval file.
    """
    check_positive_int("num_files", num_files)
    check_positive_int("examples_per_file", examples_per_file)
    check_positive_int("eval_examples", eval_examples)
    os.makedirs(data_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    world = _world(rng)
    bad = ["1 1 1 5", "1 0 1 x 1 2 1 3 0 0 3 0.1 0.2 0.3", "2 0 1 1 1 2 1 3 0 0 3 0 0 0"]
    train_files = []
    for i in range(num_files):
        path = os.path.join(data_dir, f"train-{i:04d}.txt")
        with open(path, "w") as f:
            for j, (values, _) in enumerate(_examples(world, rng, examples_per_file)):
                f.write(multislot.format_line(SLOTS, values) + "\n")
                if j < bad_lines_per_file:
                    f.write(bad[j % len(bad)] + "\n")
        train_files.append(path)
    eval_path = os.path.join(data_dir, "eval.txt")
    labels, probabilities = [], []
    with open(eval_path, "w") as f:
        for values, p in _examples(world, rng, eval_examples):
            f.write(multislot.format_line(SLOTS, values) + "\n")
            labels.append(values["click"][0])
            probabilities.append(p)
    return {"train_files": train_files, "eval_files": [eval_path],
            "oracle_auc": auc(labels, probabilities)}


class ServedClicks(tf.Module):
    """``line`` tf.string [B], MultiSlot lines -> ``probability`` float32 [B] (of a click) and
    ``valid`` bool [B].

    A line has the training files' slots, with or without the ``click`` slot first (its value
    is not read). A line that parses neither way is not valid and gets probability 0.
    """

    def __init__(self, model):
        super().__init__()
        # The model's variables are tracked, the model itself is not: a Keras model saved as
        # a child would add its own signature, which cannot take ragged inputs.
        self.weights = list(model.variables)
        self.model = lambda features: model(features, training=False)
        self.feature_slots = tuple(s for s in SLOTS if s.name != LABEL)
        self.serve = tf.function(self._serve, input_signature=[
            tf.TensorSpec([None], tf.string, name="line")])

    def _serve(self, line):
        labelled, errors, _ = multislot.parse(line, SLOTS)
        bare, bare_errors, _ = multislot.parse(line, self.feature_slots)
        use_labelled = tf.equal(errors, 0)
        valid = use_labelled | tf.equal(bare_errors, 0)

        def pick(a, b):
            if isinstance(a, tf.RaggedTensor):  # row by row: a ragged where
                rows = tf.where(use_labelled, tf.range(tf.shape(line)[0]),
                                tf.shape(line)[0] + tf.range(tf.shape(line)[0]))
                return tf.gather(tf.concat([a, b], axis=0), rows)
            mask = tf.reshape(use_labelled, [-1] + [1] * (a.shape.rank - 1))
            return tf.where(mask, a, b)

        features = {s.name: pick(labelled[s.name], bare[s.name]) for s in self.feature_slots}
        logit = tf.cast(tf.reshape(self.model(features), [-1]), tf.float32)
        probability = tf.where(valid, tf.sigmoid(logit), 0.0)
        return {"probability": probability, "valid": valid}


def serving_module(config: Config, info: dict, model, asset_dir: str):
    """``(ServedClicks, serving.json fields)`` for an export of a trained model."""
    return ServedClicks(model), {"input": "line", "outputs": ["probability", "valid"],
                                 "slots": [s.name for s in SLOTS]}


def _to_model_inputs(example):
    features = {k: v for k, v in example.items() if k != LABEL}
    return features, tf.cast(tf.reshape(example[LABEL], [-1]), tf.float32)


def _count(batch):
    """A batch's ids over the id slots (tokens; cells: the same, ragged) and examples."""
    features, labels = batch
    ids = tf.add_n([tf.size(v.flat_values) for v in features.values()
                    if isinstance(v, tf.RaggedTensor)])
    return ids, ids, tf.size(labels)


def _read(config: Config, files, counter: tfseq.DropCounter) -> tf.data.Dataset:
    """Examples of ``files`` in file order (deterministic: an epoch is rebuilt from its
    number), malformed lines dropped and counted."""
    return multislot.read(list(files), SLOTS, on_error="drop", counter=counter,
                          num_parallel_reads=config.num_parallel_reads, deterministic=True)


class ClicksTask(ReplayedTask):
    """``--task=ctr``: the probability of a click from a MultiSlot line.

    The training lines are read again every epoch, in file order, and shuffled with a seed of
    the epoch alone, so an epoch is rebuilt exactly from its number. ``info`` (``learn``):
    ``slots``, ``label``, ``files`` (``{"train": [...], "eval": [...]}``) and, for generated
    data, ``oracle_auc``.
    """

    name = "ctr"
    Config = Config
    model_module = "tfseq.models.ctr"
    prediction_input = "line"
    unusable = "malformed"

    def check(self, config):
        check_positive_int("batch_size", config.batch_size)
        if config.files and not config.eval_files:
            raise ValueError("Config.files needs Config.eval_files (held-out MultiSlot files)")

    def learn(self, config):
        """Raises ``ValueError``: ``files`` given without ``eval_files``."""
        self.check(config)
        info = {"slots": SLOTS, "label": LABEL}
        if config.files:
            info["files"] = {"train": list(config.files), "eval": list(config.eval_files)}
            return info
        data_dir = config.data_dir or tempfile.mkdtemp(prefix="tfseq_ctr_")
        generated = generate(data_dir, num_files=config.num_files,
                             examples_per_file=config.examples_per_file,
                             eval_examples=config.eval_examples, seed=config.seed)
        logging.info("ctr: generated %s (oracle AUC %.4f)", data_dir, generated["oracle_auc"])
        info["files"] = {"train": generated["train_files"], "eval": generated["eval_files"]}
        info["oracle_auc"] = generated["oracle_auc"]
        return info

    def replay(self, config, info, counter):
        lines = _read(config, info["files"]["train"], counter)

        def train_epoch(epoch):
            shuffled = epoch_shuffle(lines, config.shuffle_buffer, config.seed, epoch)
            return shuffled.ragged_batch(config.batch_size).map(_to_model_inputs)

        return ReplayStream(train_epoch, count=_count, seed=config.seed)

    def held_out(self, config, info, counter):
        lines = _read(config, info["files"]["eval"], counter)
        return lines.cache().ragged_batch(config.batch_size).map(_to_model_inputs)

    def serving_module(self, config, info, model, asset_dir):
        return serving_module(config, info, model, asset_dir)

    def prediction_inputs(self, info, paths):
        """MultiSlot lines, ``tf.string [n]`` batches in file order."""
        return tfseq.text_lines(paths).batch(512)

    def prediction_line(self, row):
        return f"{float(row['probability']):.6f}" if row["valid"] else ""


TASK = ClicksTask()
