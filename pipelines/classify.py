"""Text classification: ``text -> label``, from the user's files or the embedded corpus.

Rows come from ``--train_files`` (TSV, CSV or text with ``--columns`` naming ``label`` and
``text``) or, by default, from the embedded verse corpus labelled by section of the canon
(``pipelines.verses``). Labels are discovered from the training rows and sorted
(``labels.txt``, label id = line number).

Examples: ``{"ids": int32 [(T)], "label": int32}``. Batches for the model (``ModelFeatures``):

    padded (pad, bucket)  ({"ids": [B, T], "ids_length": [B]}, label [B], weight [B])
    packed (pack)         ({"ids", "ids_segment_ids", "ids_resets": [B, L]},
                           label [B, S], weight [B, S])

one label per segment (example) of a packed row, weight 0 on the label table's empty columns.

Drop reasons: the source's (``malformed``, ``invalid_utf8``, ``empty_text``, ``other_split``;
``unknown_book`` for the verse corpus), the text checks (``empty``, ``nul_byte``, ...),
``unknown_label`` (an eval label never seen in training) and ``too_short``;
``long_examples="truncate"`` (the default) cuts examples to ``max_length`` tokens (seen
``truncated``), ``"drop"`` drops them (``too_long``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import numpy as np
import tensorflow as tf

from tfseq import serving
from tfseq.errors import InputError
from tfseq.model_inputs import ModelFeatures
from tfseq.pipelines import verses
from tfseq.pipelines.config import TextConfig
from tfseq.pipelines.spine import TextTask, limit_lengths, token_ids
from tfseq.text import UNK_ID


@dataclasses.dataclass(frozen=True)
class Config(TextConfig):
    """``TextConfig`` with classification's defaults (those of ``TextConfig``)."""


class Classify(TextTask):
    name = "classify"
    Config = Config
    columns = ("label", "text")
    label_columns = ("label",)
    features = ModelFeatures(("ids",), "label")
    model_module = "tfseq.models.classifier"

    def corpus_source(self, config, split):
        return verses.classify_source(config, split)

    def fixed_labels(self, config):
        return {} if config.train_files else {"label": tuple(verses.CLASS_NAMES)}

    def check_labels(self, labels):
        if len(labels["label"]) < 2:
            raise InputError(f"Only one label ({labels['label'][0]!r}) in the training files: "
                             "classification needs at least two")

    def encode_rows(self, config, state, rows, counter):
        examples = {"ids": token_ids(config, state.vocab, rows["text"]), "label": rows["label"]}
        return limit_lengths(config, counter, examples, {"ids": config.max_length},
                             min_length={"ids": 1})

    def serving_module(self, config, state, model, asset_dir):
        labels = list(state.labels["label"])
        encoder = serving.TextEncoder(state.vocab, asset_dir, tokenizer=config.tokenizer,
                                      lowercase=config.lowercase, max_length=config.max_length)
        module = ServedClassifier(serving.keras_model_fn(model), encoder, labels,
                                          asset_dir, config.long_examples)
        return module, {"input": "text", "outputs": ["label", "probabilities"],
                        "num_labels": len(labels), "max_ids": config.max_length}

    def prediction_line(self, row):
        label = row["label"].decode("utf-8")
        return f"{label}\t{float(row['probabilities'].max()):.6f}"

    def baselines(self, eval_ds):
        return {"majority-class": majority_baseline(eval_ds)}



class ServedClassifier(serving.Served):
    """``text`` -> ``label``, ``probabilities`` (see ``tfseq.serving``)."""

    def __init__(self, model_fn: serving.ModelFn, encoder: serving.TextEncoder,
                 labels: Sequence[str], asset_dir: str, long_examples: str = "truncate"):
        super().__init__(encoder, long_examples)
        path = os.path.join(asset_dir, serving.ASSET_LABELS)
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(f"{label}\n" for label in labels))
        self.labels_file = tf.saved_model.Asset(path)
        self.labels = serving.id_to_line_table(self.labels_file)
        self.num_labels = len(labels)
        self.model_fn = model_fn

    def _predict(self, ids, lengths):
        valid = lengths >= 1
        # Rows with no tokens run as one <unk> (their output is replaced anyway).
        ids = serving.at_least_one_step(ids)
        ids = tf.where((lengths == 0)[:, None] & (tf.range(tf.shape(ids)[1]) == 0)[None, :],
                       UNK_ID, ids)
        probabilities = tf.nn.softmax(self.model_fn(ids, tf.maximum(lengths, 1)), axis=-1)
        probabilities = tf.where(valid[:, None], probabilities, 0.0)
        best = tf.argmax(probabilities, axis=-1)
        label = tf.where(valid, self.labels.lookup(best), "")
        return {"label": label, "probabilities": probabilities}


TASK = Classify()


def majority_baseline(eval_ds: tf.data.Dataset) -> float:
    """Accuracy of always predicting the most frequent label of ``eval_ds``
    (``(inputs, label, weight)`` batches; packed label tables count their weighted columns)."""
    counts = np.zeros([0])
    for _, labels, weights in eval_ds.as_numpy_iterator():
        labels, weights = labels.reshape(-1), weights.reshape(-1)
        found = np.bincount(labels[weights > 0], weights[weights > 0])
        counts = np.pad(counts, [0, max(0, len(found) - len(counts))])
        counts[:len(found)] += found
    total = counts.sum()
    return float(counts.max() / total) if total else 0.0
