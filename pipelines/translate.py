"""Translation: ``source -> target`` pairs from the user's files or the embedded corpus.

User pairs come from one file with ``--columns=source,target`` (TSV or CSV), or from two
line-aligned plain-text files ``--source_files``/``--target_files`` (line N pairs with line N;
files of unequal line counts are an error naming both, found before training). Without
``eval_files`` a stable hash of each pair holds out ``eval_percent`` of them. By default the
embedded corpus translates English verses to Spanish (the first ``max_lines`` pairs).

A pair becomes ``{"source": w1 .. wm, "target_in": <s> v1 .. vn, "targets": v1 .. vn </s>}``
(the decoder reads ``target_in``, teacher forcing). Batches for the model:

    padded  ({"source": int32 [B, S], "source_length": [B],
              "target_in": int32 [B, T], "target_in_length": [B]}, targets [B, T], weights)
    packed  ({"source", "source_segment_ids", "source_resets": [B, L],
              "target_in", "target_in_segment_ids", "target_in_resets": [B, L]},
             targets [B, L], weights [B, L])

Packed rows hold source and target in parallel rows with their own segment ids (as seqio packs
inputs and targets): segment k of a source row and segment k of the same target row are one
pair; the targets share the cells of ``target_in``::

    source                 5  6  7  8  9  0      target_in   2 11 12  2 13  0
    source_segment_ids     1  1  2  2  2  0      targets    11 12  3 13  3  0
    target_in_segment_ids  1  1  1  2  2  0      weights     1  1  1  1  1  0

Vocabularies: one per side (built or learned on that side of the training pairs), or one
shared by both from ``--vocab`` (e.g. a joint SentencePiece model).

Drop reasons: ``malformed``, ``misaligned`` (verse corpus: the lines name different verses),
``empty_target``/``empty_source`` (verse corpus) or ``empty_text``, ``other_split``, the text
checks, ``too_short`` and ``too_long`` (``long_examples="drop"``, the default).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import tensorflow as tf

from tfseq import serving
from tfseq.decoding import greedy_decode
from tfseq.model_inputs import ModelFeatures
from tfseq.models.translate import decode_examples
from tfseq.pipelines import sources, verses
from tfseq.pipelines.config import GenerativeConfig
from tfseq.pipelines.spine import TextTask, limit_lengths, token_ids
from tfseq.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID


@dataclasses.dataclass(frozen=True)
class Config(GenerativeConfig):
    """``GenerativeConfig`` with translation's lengths, and the two aligned files."""

    source_files: tuple[str, ...] = ()     # plain text, line-aligned with target_files
    target_files: tuple[str, ...] = ()     # (both empty, no train_files: the verse corpus)
    max_length: int = 40                   # words per side, not counting <s> and </s>
    block_length: int | tuple[int, ...] = 64


class Translate(TextTask):
    name = "translate"
    Config = Config
    columns = ("source", "target")
    text_columns = ("source", "target")
    vocab_columns = {"source": ("source",), "target": ("target",)}
    features = ModelFeatures(("source", "target_in"), "targets", token_of="target_in")
    aligned = (("targets", "target_in"),)
    model_module = "tfseq.models.translate"
    prediction_input = "source"

    def source(self, config, split):
        if config.source_files or config.target_files:
            return sources.aligned_source(config, split)
        return super().source(config, split)

    def corpus_source(self, config, split):
        return verses.pair_source(config, split)

    def longest(self, config):
        return config.max_length + 1  # <s> v1 .. vn

    def encode_rows(self, config, state, rows, counter):
        examples = {"source": token_ids(config, state.vocabs["source"], rows["source"]),
                    "target": token_ids(config, state.vocabs["target"], rows["target"],
                                        add_bos=True, add_eos=True)}
        examples = limit_lengths(config, counter, examples,
                                 {"source": config.max_length, "target": config.max_length + 2},
                                 min_length={"source": 1, "target": 3})
        target = examples["target"]
        return {"source": examples["source"], "target_in": target[:, :-1],
                "targets": target[:, 1:]}

    def serving_module(self, config, state, model, asset_dir):
        source = serving.TextEncoder(state.vocabs["source"], asset_dir,
                                     tokenizer=config.tokenizer, lowercase=config.lowercase,
                                     max_length=config.max_length, name="source_vocab.txt")
        target = serving.TextEncoder(state.vocabs["target"], asset_dir,
                                     tokenizer=config.tokenizer, lowercase=config.lowercase,
                                     name="target_vocab.txt")
        module = ServedTranslator(model.encode, model.decode_step, source, target,
                                          max_decode_length=config.max_length + 1,
                                          long_examples=config.long_examples)
        return module, {"input": "source", "outputs": ["translation"],
                        "max_ids": config.max_length}

    def prediction_line(self, row):
        return row["translation"].decode("utf-8")

    def sample_lines(self, config, state, model, eval_ds):
        return decode_examples(model, eval_ds, state, max_length=config.max_length + 1)



class ServedTranslator(serving.Served):
    """``source`` -> ``translation`` by greedy decoding (``tfseq.decoding.greedy_decode``), at
    most ``max_decode_length`` tokens.

    Args:
      encode_fn: ``(source int32 [B, S], lengths [B]) -> (memory, state)``.
      step_fn: ``(token int32 [B, 1], state, memory, lengths) -> (logits float32 [B, V],
        state)``.
      encoder: the source ``serving.TextEncoder``; target_encoder: the target one (its vocabulary
        turns ids back into text).
      suppress_ids: ids never generated (``<pad>``, ``<unk>``, ``<s>``).
    """

    input_name = "source"

    def __init__(self, encode_fn, step_fn, encoder: serving.TextEncoder,
                 target_encoder: serving.TextEncoder, max_decode_length: int,
                 long_examples: str = "truncate",
                 suppress_ids: Sequence[int] = (PAD_ID, UNK_ID, BOS_ID)):
        super().__init__(encoder, long_examples)
        self.target_encoder = target_encoder
        self.encode_fn = encode_fn
        self.step_fn = step_fn
        self.max_decode_length = max_decode_length
        self.suppress_ids = tuple(suppress_ids)

    def _predict(self, source, lengths):

        valid = lengths >= 1
        lengths = tf.maximum(lengths, 1)
        source = serving.at_least_one_step(source)
        memory, state = self.encode_fn(source, lengths)
        ids = greedy_decode(self.step_fn, memory, state, lengths,
                            max_length=self.max_decode_length, bos_id=BOS_ID, eos_id=EOS_ID,
                            suppress_ids=self.suppress_ids)
        translation = self.target_encoder.to_text(ids)
        return {"translation": tf.where(valid, translation, "")}


TASK = Translate()
