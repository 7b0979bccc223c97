"""Sequence tagging: one label per token (part of speech, named entities), from the user's files.

Input, one example per sentence:

* CoNLL (``--format=conll``, or ``.conll``/``.conllu`` files): one token per line, columns
  separated by tabs (or spaces) and named by ``--columns``, which must name ``token`` and
  ``tag`` (``token,tag`` or ``token,_,_,tag``; ``_`` skips a column); a blank line ends a
  sentence, and so does the end of a file (see ``tfseq.formats``).
* TSV or CSV with ``--columns=tokens,tags``: the tokens and their tags, each space-separated,
  as many tags as tokens (otherwise the line is dropped and counted ``unequal_counts``).

Tokens are the words as given (split on whitespace; ``--tokenizer`` must stay ``whitespace``)
looked up in a vocabulary of the training tokens; tags are discovered from the training rows
into ``tags.txt``, tag id = line number + 1 (id 0 is padding, as everywhere). Examples
``{"ids": int32 [(T)], "tags": int32 [(T)]}``; batches for the model (``ModelFeatures``):

    padded  ({"ids": [B, T], "ids_length": [B]}, tags [B, T], weights [B, T])
    packed  ({"ids", "ids_segment_ids", "ids_resets": [B, L]}, tags [B, L], weights [B, L])

the tags in the cells of their tokens (``Batching(aligned=...)``), weights 1 on real tokens.
The export's ``serving_default`` takes ``text`` (``tf.string [None]``, whitespace-separated
tokens) and returns ``tags`` (``tf.string [None]``, one tag per token, space-joined).

Drop reasons: the source's (``malformed``, ``invalid_utf8``, ``empty_text``, ``other_split``),
``unequal_counts``, ``unknown_label`` (a tag never seen in training), the text checks,
``too_short`` and ``too_long`` / seen ``truncated`` (``long_examples``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import tensorflow as tf
import tensorflow_text as tf_text

from tfseq import formats, serving
from tfseq.errors import InputError
from tfseq.model_inputs import ModelFeatures
from tfseq.pipelines import sources
from tfseq.pipelines.config import TextConfig
from tfseq.pipelines.spine import TextTask, label_table, limit_lengths
from tfseq.pipelines.state import TaskState

CONLL_COLUMNS = ("token", "tag")
ROW_COLUMNS = ("tokens", "tags")


@dataclasses.dataclass(frozen=True)
class Config(TextConfig):
    """``TextConfig`` with tagging's defaults: words as they are (case kept)."""

    lowercase: bool = False
    min_count: int = 1
    max_vocab: int = 50000
    max_length: int = 128                  # tokens per sentence


class Tag(TextTask):
    name = "tag"
    Config = Config
    columns = ROW_COLUMNS
    allowed_columns = ROW_COLUMNS + CONLL_COLUMNS
    text_columns = ("tokens",)
    vocab_columns = {"vocab": ("tokens",)}
    label_columns = ("tags",)
    token_label_columns = ("tags",)
    features = ModelFeatures(("ids",), "tags", token_of="ids")
    aligned = (("tags", "ids"),)
    model_module = "tfseq.models.tagger"

    def source(self, config, split):
        if config.tokenizer != "whitespace":
            raise InputError(f"--task=tag tags the given tokens: --tokenizer must be whitespace, "
                             f"not {config.tokenizer}")
        if not config.train_files:
            return super().source(config, split)
        # A record per sentence (CoNLL), or a row of tokens and tags per line.
        conll = formats.format_of(formats.infer_format(
            formats.resolve(config.train_files), config.format)).token_lines
        required = CONLL_COLUMNS if conll else ROW_COLUMNS
        source = sources.user_source(config, split, required=required, allowed=required)
        if not conll:
            return dataclasses.replace(source, drop_examples=lambda limit: unequal_examples(
                source.files, config, limit) or source.drop_examples(limit))

        def parse(records, counter):
            rows = source.parse(records, counter)
            return {"tokens": rows["token"], "tags": rows["tag"]}

        return dataclasses.replace(source, parse=parse)

    def input_column(self, config):
        if config.train_files and formats.format_of(formats.infer_format(
                formats.resolve(config.train_files), config.format)).token_lines:
            return "token"
        return "tokens"

    def label_values(self, column, values):
        return tf.strings.split(values).flat_values

    def check_labels(self, labels):
        if not labels["tags"]:
            raise InputError("No tag in the training rows")

    def encode_rows(self, config, state: TaskState, rows, counter):
        words = tf.strings.split(rows["tokens"])
        tags = tf.strings.split(rows["tags"])
        counter.register("unequal_counts", "unknown_label")
        tag_ids = tags.with_flat_values(self._tags(state).lookup(tags.flat_values))
        unknown = tf.reduce_any(tag_ids < 0, axis=1)
        keep = counter.keep_if({"unequal_counts": words.row_lengths() != tags.row_lengths(),
                                "unknown_label": unknown})
        words = tf.ragged.boolean_mask(words, keep)
        tag_ids = tf.ragged.boolean_mask(tag_ids, keep)
        texts = words.flat_values
        if config.lowercase:
            texts = tf_text.case_fold_utf8(texts)
        examples = {"ids": words.with_flat_values(state.vocab.lookup(texts)),
                    "tags": tag_ids + 1}
        return limit_lengths(config, counter, examples,
                             {"ids": config.max_length, "tags": config.max_length},
                             min_length={"ids": 1})

    def _tags(self, state):
        if getattr(self, "_table_for", None) is not state:
            self._table, self._table_for = label_table(state.labels["tags"]), state
        return self._table

    def serving_module(self, config, state, model, asset_dir):
        encoder = serving.TextEncoder(state.vocab, asset_dir, tokenizer="whitespace",
                                      lowercase=config.lowercase)
        module = ServedTagger(serving.keras_model_fn(model), encoder,
                                      list(state.labels["tags"]), asset_dir)
        return module, {"input": "text", "outputs": ["tags"],
                        "num_tags": len(state.labels["tags"])}

    def prediction_line(self, row):
        return row["tags"].decode("utf-8")



class ServedTagger(serving.Served):
    """``text`` (whitespace-separated tokens) -> ``tags``: one tag per token, space-joined.

    The model's logits ``[B, T, K + 1]`` score tag ids 1..K (``tags.txt`` line i is id i + 1;
    0 is padding and never predicted). Every token of a line is tagged, however long the line.
    """

    def __init__(self, model_fn: serving.ModelFn, encoder: serving.TextEncoder, tags: Sequence[str],
                 asset_dir: str):
        super().__init__(encoder, "truncate")
        path = os.path.join(asset_dir, serving.ASSET_TAGS)
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(f"{tag}\n" for tag in tags))
        self.tags_file = tf.saved_model.Asset(path)
        self.tags = serving.id_to_line_table(self.tags_file)
        self.model_fn = model_fn

    def _predict(self, ids, lengths):
        ids = serving.at_least_one_step(ids)
        logits = self.model_fn(ids, tf.maximum(lengths, 1))[:, :, 1:]
        best = tf.argmax(logits, axis=-1)                          # [B, T]: tag id - 1
        names = self.tags.lookup(best)
        real = tf.range(tf.shape(best)[1])[None, :] < lengths[:, None]
        return {"tags": tf.strings.reduce_join(tf.ragged.boolean_mask(names, real), axis=1,
                                               separator=" ")}


TASK = Tag()


def unequal_examples(files, config, limit: int) -> list[str]:
    """``file:line`` of the first TSV/CSV rows whose tokens and tags differ in number."""
    fmt = formats.row_format(files, config.format, config.columns or None, config.header,
                             required=ROW_COLUMNS, allowed=ROW_COLUMNS)
    found = []
    for path in files:
        records = formats.read_records([path], fmt, in_order=True)
        number = 1 if fmt.header else 0
        for batch in records.as_numpy_iterator():
            rows, ok = formats.parse(tf.constant(batch), fmt)
            for tokens, tags, good in zip(rows["tokens"].numpy(), rows["tags"].numpy(),
                                          ok.numpy()):
                number += 1
                if good and len(tokens.split()) != len(tags.split()):
                    found.append(f"{path}:{number}: unequal_counts ({len(tokens.split())} "
                                 f"tokens, {len(tags.split())} tags)")
                    if len(found) >= limit:
                        return found
    return found
