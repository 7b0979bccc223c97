"""Next-token language modelling: one example per line of the user's text (``--train_files``,
``--format=text``, or a ``text`` column of TSV/CSV), or, by default, the verses of one side of
the embedded corpus (English; the first ``max_lines``).

A line ``w1 .. wn`` becomes ``{"ids": <s> w1 .. wn, "targets": w1 .. wn </s>}``: the model reads
``ids`` and predicts ``targets`` token by token. Batches for the model (``ModelFeatures``):

    padded  ({"ids": int32 [B, T], "ids_length": int32 [B]}, targets [B, T], weights [B, T])
    packed  ({"ids", "ids_segment_ids", "ids_resets": [B, L]}, targets [B, L], weights [B, L])

weights 1 on real target tokens, 0 on padding. Packed targets share their input's cells
(``Batching(aligned=...)``), so no target crosses into the next example of a row; with one row
length a longer line is split across rows (``resets`` false on its continuation).

Drop reasons: the source's (``malformed``, ``invalid_utf8``, ``empty_text``, ``other_split``),
the text checks (``empty``, ...), ``too_short`` and ``too_long`` (``long_examples="drop"``, the
default; ``"truncate"`` cuts lines to ``max_length`` words, seen ``truncated``).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfseq import serving
from tfseq.model_inputs import ModelFeatures
from tfseq.pipelines import verses
from tfseq.pipelines.config import GenerativeConfig
from tfseq.pipelines.spine import TextTask, limit_lengths, token_ids


@dataclasses.dataclass(frozen=True)
class Config(GenerativeConfig):
    """``GenerativeConfig`` with language modelling's lengths, and the corpus to read."""

    corpus: str = "kjv_en"                 # the embedded corpus' side: kjv_en or rv1909_es
    max_length: int = 48                   # words per line, not counting <s> and </s>
    # 1,024 cells: about the real tokens of a 32-row pad batch, and the lm learns faster at
    # it than at 2,048: see docs/convergence.md#language-model-embedded-corpus
    max_tokens: int = 1024


class LanguageModelling(TextTask):
    name = "lm"
    Config = Config
    columns = ("text",)
    features = ModelFeatures(("ids",), "targets", token_of="ids")
    aligned = (("targets", "ids"),)
    pack_split = True
    model_module = "tfseq.models.lm"

    def corpus_source(self, config, split):
        return verses.text_source(config, split)

    def longest(self, config):
        return config.max_length + 1  # <s> w1 .. wn

    def encode_rows(self, config, state, rows, counter):
        full = token_ids(config, state.vocab, rows["text"], add_bos=True, add_eos=True)
        full = limit_lengths(config, counter, {"ids": full}, {"ids": config.max_length + 2},
                             min_length={"ids": 3})["ids"]
        return {"ids": full[:, :-1], "targets": full[:, 1:]}

    def serving_module(self, config, state, model, asset_dir):
        encoder = serving.TextEncoder(state.vocab, asset_dir, tokenizer=config.tokenizer,
                                      lowercase=config.lowercase, max_length=config.max_length,
                                      add_bos=True, add_eos=True)
        module = ServedLanguageModel(serving.keras_model_fn(model), encoder,
                                             config.long_examples)
        return module, {"input": "text", "outputs": ["log_likelihood", "tokens"],
                        "max_ids": config.max_length + 2, "needs_tokens": False}

    def prediction_line(self, row):
        return f"{float(row['log_likelihood']):.6f}\t{int(row['tokens'])}"



class ServedLanguageModel(serving.Served):
    """``text`` -> ``log_likelihood``, ``tokens``; the ids are ``<s> w1 .. wn </s>`` and the
    model reads ``<s> w1 .. wn`` to score ``w1 .. wn </s>``."""

    def __init__(self, model_fn: serving.ModelFn, encoder: serving.TextEncoder,
                 long_examples: str = "truncate"):
        super().__init__(encoder, long_examples)
        self.model_fn = model_fn

    def _predict(self, ids, lengths):
        inputs, targets = ids[:, :-1], ids[:, 1:]
        logits = self.model_fn(inputs, lengths - 1)
        scores = tf.gather(tf.nn.log_softmax(logits, axis=-1), targets, batch_dims=2)
        real = tf.range(tf.shape(targets)[1])[None, :] < (lengths - 1)[:, None]
        return {"log_likelihood": tf.reduce_sum(tf.where(real, scores, 0.0), axis=1),
                "tokens": tf.maximum(lengths - 1, 0)}


TASK = LanguageModelling()
