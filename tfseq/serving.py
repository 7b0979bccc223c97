"""SavedModels that take raw text: tokenizer, vocabulary and labels ship inside the model.

Shapes: B = batch (lines), T = time (tokens), C = classes, V = vocabulary.

A served model is a ``tf.Module`` whose ``serving_default`` signature runs the same
tokenization as training (``tfseq.tokenize``: optional case folding, the tokenizer, vocabulary
lookup with ``<unk>`` = 1, ``<s>``/``</s>`` where the task adds them), pads the batch exactly as
the padded training pipelines do and calls the Keras model. The vocabulary file,
``labels.txt`` and a SentencePiece ``.model`` are ``tf.saved_model.Asset``s, and the graph
uses only TensorFlow and tensorflow-text ops, so the export loads without tfseq::

    import tensorflow as tf, tensorflow_text  # noqa: F401  (registers the text ops)
    model = tf.saved_model.load("runs/demo/export")
    out = model.signatures["serving_default"](text=tf.constant(["In the beginning"]))
    out["label"], out["probabilities"]

Signatures and functions of each export (``export_dir/assets/serving.json`` names the task and
the tokenization settings):

==========  ==================  ====================================================
classify    ``text`` [B]        ``label`` tf.string [B], ``probabilities`` float32 [B, C]
                                (columns in ``labels.txt`` order)
lm          ``text`` [B]        ``log_likelihood`` float32 [B] (natural log, summed over the
                                line's tokens and ``</s>``), ``tokens`` int32 [B] (that count)
translate   ``source`` [B]      ``translation`` tf.string [B] (greedy, bounded length)
tag         ``text`` [B]        ``tags`` tf.string [B] (one tag per whitespace-separated
                                token, space-joined; ``tags.txt`` holds the tag set)
==========  ==================  ====================================================

Every export also has ``encode(text) -> {"ids": int32 RaggedTensor [B, (T)], "truncated":
bool [B]}`` and ``predict_ids(ids int32 [B, T], ids_length int32 [B])``, the two halves of
``serving_default``, so batch inference can tokenize in ``tf.data``, bucket by length and run
only the model on the padded batches (``scripts/predict.py``).

Long inputs follow the training run's ``long_examples`` policy: ``"truncate"`` keeps the first
``max_length`` tokens; ``"drop"`` gives the line an empty prediction (label ``""`` and zero
probabilities, log-likelihood 0 over 0 tokens, an empty translation). A line with no tokens gets
the same empty prediction for classify and translate (lm scores ``</s>`` alone).

Loading a SavedModel runs its graph: export and serve only models you trust.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Callable

import tensorflow as tf
import tensorflow_text as tf_text

from tfseq.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID, get_tokenizer

LONG_EXAMPLES = ("truncate", "drop")
ASSET_VOCAB = "vocab.txt"
ASSET_LABELS = "labels.txt"
ASSET_TAGS = "tags.txt"
ASSET_SPM = "sentencepiece.model"
ASSET_INFO = "serving.json"

# fn(ids int32 [B, T], lengths int32 [B]) -> model output (logits)
ModelFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def _token_to_id_table(asset: tf.saved_model.Asset) -> tf.lookup.StaticHashTable:
    """Line i of the asset -> id i (int64); unknown -> ``<unk>``."""
    return tf.lookup.StaticHashTable(
        tf.lookup.TextFileInitializer(
            asset, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
            tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER), default_value=UNK_ID)


def id_to_line_table(asset: tf.saved_model.Asset) -> tf.lookup.StaticHashTable:
    """id i (int64) -> line i of the asset; unknown -> ``""``."""
    return tf.lookup.StaticHashTable(
        tf.lookup.TextFileInitializer(
            asset, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER,
            tf.string, tf.lookup.TextFileIndex.WHOLE_LINE), default_value="")


class TextEncoder(tf.Module):
    """In-graph ``tf.string [B]`` -> ids, the same as ``tfseq.tokenize`` at training time.

    Args:
      vocab: a ``tfseq.Vocab`` (written as an asset; a SentencePiece vocab's
        ``sentencepiece_model`` bytes too).
      asset_dir: a directory for the asset files until the export is written.
      tokenizer: ``"whitespace"``, ``"unicode_script"``, ``"wordpiece"`` or
        ``"sentencepiece"`` (SentencePiece ids are the vocab's ids).
      lowercase: case-fold before tokenizing.
      max_length: tokens kept per line (not counting ``<s>``/``</s>``); ``None`` keeps all.
      add_bos, add_eos: add ``<s>`` (2) / ``</s>`` (3) as the task's pipeline does.
      name: the vocab asset's file name.

    Tokenization uses the training pipeline's tokenizer (``tfseq.text.get_tokenizer``), or
    ``tensorflow_text.SentencepieceTokenizer`` for a vocab that carries a SentencePiece model.
    Token strings are looked up in the vocabulary asset; a tokenizer that emits ids directly is
    taken as is.

    Raises:
      ValueError: an unknown tokenizer, or ``"sentencepiece"`` without a SentencePiece vocab.
    """

    def __init__(self, vocab, asset_dir: str, *, tokenizer: str = "whitespace",
                 lowercase: bool = False, max_length: int | None = None,
                 add_bos: bool = False, add_eos: bool = False, name: str = ASSET_VOCAB):
        super().__init__()
        vocab_path = os.path.join(asset_dir, name)
        vocab.save(vocab_path)
        self.vocab_file = tf.saved_model.Asset(vocab_path)
        self.table = _token_to_id_table(self.vocab_file)
        self.id_to_token = id_to_line_table(self.vocab_file)
        spm = getattr(vocab, "sentencepiece_model", None)
        tokenizer = tokenizer or "whitespace"
        self.sentencepiece = None
        if tokenizer == "sentencepiece" or spm is not None:
            if spm is None:
                raise ValueError("tokenizer='sentencepiece' needs a vocab with a "
                                 "sentencepiece_model (serialized model bytes)")
            spm_path = os.path.join(asset_dir, name.replace("vocab.txt", "") + ASSET_SPM)
            with open(spm_path, "wb") as f:
                f.write(spm)
            self.spm_file = tf.saved_model.Asset(spm_path)
            # The op takes the model as an attribute, so the graph carries its bytes too; the
            # asset is the same file, for tools outside TensorFlow.
            self.sentencepiece = tf_text.SentencepieceTokenizer(model=spm, out_type=tf.int32)
        else:
            # The training pipeline's own tokenizer object (tfseq.text.get_tokenizer), so a
            # change there reaches serving too. Its ops are TensorFlow / tensorflow-text ops;
            # its tables and sub-tokenizers are tracked here so they are saved with the graph.
            self.splitter = get_tokenizer(tokenizer, vocab)
            if not isinstance(self.splitter, tf.Module):
                self.splitter_parts = [v for v in vars(self.splitter).values()
                                       if isinstance(v, tf.Module)]
        self.tokenizer = tokenizer
        self.lowercase = lowercase
        self.max_length = max_length
        self.add_bos = add_bos
        self.add_eos = add_eos

    def __call__(self, text: tf.Tensor):
        """tf.string [B] -> (ids int32 RaggedTensor [B, (T)], truncated bool [B])."""
        if self.lowercase:
            text = tf_text.case_fold_utf8(text)
        if self.sentencepiece is not None:
            ids = tf.cast(self.sentencepiece.tokenize(text), tf.int32)
        else:
            tokens = self.splitter.tokenize(text)
            if tokens.dtype == tf.string:  # token strings: look up in the vocabulary asset
                tokens = tokens.with_flat_values(self.table.lookup(tokens.flat_values))
            ids = tf.cast(tokens, tf.int32)
        truncated = tf.zeros(tf.shape(text), tf.bool)
        if self.max_length is not None:
            truncated = ids.row_lengths() > self.max_length
            ids = ids[:, :self.max_length]
        rows = tf.shape(text)[0]
        parts = []
        if self.add_bos:
            parts.append(tf.RaggedTensor.from_tensor(tf.fill([rows, 1], BOS_ID)))
        parts.append(ids)
        if self.add_eos:
            parts.append(tf.RaggedTensor.from_tensor(tf.fill([rows, 1], EOS_ID)))
        ids = tf.concat(parts, axis=1) if len(parts) > 1 else ids
        return ids, truncated

    def to_text(self, ids: tf.Tensor) -> tf.Tensor:
        """int32 [B, T] ids (0-padded) -> tf.string [B]: the tokens joined by spaces, special
        ids (``<pad>``, ``<unk>``, ``<s>``, ``</s>``) left out."""
        keep = ids > EOS_ID
        tokens = self.id_to_token.lookup(tf.cast(ids, tf.int64))
        tokens = tf.ragged.boolean_mask(tokens, keep)
        if self.sentencepiece is not None:
            return self.sentencepiece.detokenize(tf.ragged.boolean_mask(ids, keep))
        return tf.strings.reduce_join(tokens, axis=1, separator=" ")


def keras_model_fn(model) -> ModelFn:
    """Adapts a task's Keras model to ``fn(ids [B, T], lengths [B]) -> logits``.

    Feeds the model what the padded pipelines feed it, ``{"ids", "ids_length"}``; a functional
    model trained on packed rows (inputs ``ids_segment_ids``/``ids_resets``/``ids_positions``)
    gets each line as a row holding one segment.
    """
    try:  # a functional model names its inputs; a subclassed one takes the padded dict
        names = [t.name for t in model.inputs]
    except (AttributeError, ValueError):
        names = ["ids", "ids_length"]

    def fn(ids, lengths):
        positions = tf.range(tf.shape(ids)[1], dtype=tf.int32)[None, :]
        real = positions < lengths[:, None]
        candidates = {
            "ids": ids, "ids_length": lengths,
            "ids_segment_ids": tf.cast(real, tf.int32),
            "ids_positions": positions * tf.cast(real, tf.int32),
            "ids_resets": tf.cast(tf.equal(positions, 0) & real, tf.int32),
        }
        missing = [n for n in names if n not in candidates]
        if missing:
            raise ValueError(f"keras_model_fn: the model wants inputs {missing}, which a "
                             f"padded batch does not have (it has {sorted(candidates)})")
        return tf.cast(model({n: candidates[n] for n in names}, training=False), tf.float32)

    return fn


def padded(ids: tf.RaggedTensor):
    """int32 RaggedTensor [B, (T)] -> (int32 [B, T] 0-padded, lengths int32 [B])."""
    return ids.to_tensor(PAD_ID), tf.cast(ids.row_lengths(), tf.int32)


def at_least_one_step(ids: tf.Tensor) -> tf.Tensor:
    """int32 [B, T] -> [B, max(T, 1)]: a batch of empty lines still gives the model a step."""
    return tf.pad(ids, [[0, 0], [0, 1 - tf.minimum(tf.shape(ids)[1], 1)]])


class Served(tf.Module):
    """A served task: ``serve``, ``encode`` and ``predict_ids`` (see the module docstring),
    written once here; a task's subclass supplies ``_predict`` and, if its input is not
    ``text``, ``input_name``.

    Args:
      encoder: the ``TextEncoder`` of the input.
      long_examples: ``"truncate"`` or ``"drop"`` (a dropped line's outputs are all zero:
        ``""`` for strings, 0 for numbers).
    """

    input_name = "text"

    def __init__(self, encoder: TextEncoder, long_examples: str):
        super().__init__()
        if long_examples not in LONG_EXAMPLES:
            raise ValueError(f"Unknown long_examples {long_examples!r}; expected one of "
                             f"{LONG_EXAMPLES}")
        self.encoder = encoder
        self.drop_long = long_examples == "drop"
        text = [tf.TensorSpec([None], tf.string, name="text")]
        self.serve = tf.function(self._serve, input_signature=[
            tf.TensorSpec([None], tf.string, name=self.input_name)])
        self.encode = tf.function(self._encode, input_signature=text)
        self.predict_ids = tf.function(self._predict, input_signature=[
            tf.TensorSpec([None, None], tf.int32, name="ids"),
            tf.TensorSpec([None], tf.int32, name="ids_length")])

    def _encode(self, text):
        ids, truncated = self.encoder(text)
        return {"ids": ids, "truncated": truncated}

    def _serve(self, text):
        encoded = self._encode(text)
        ids, lengths = padded(encoded["ids"])
        out = self._predict(ids, lengths)
        if not self.drop_long:
            return out
        keep = tf.logical_not(encoded["truncated"])

        def blank(value):
            mask = tf.reshape(keep, tf.concat([tf.shape(keep), tf.ones(
                [tf.rank(value) - 1], tf.int32)], 0))
            return tf.where(mask, value, tf.zeros_like(value))

        return {k: blank(v) for k, v in out.items()}

    def _predict(self, ids, lengths) -> dict:
        """int32 [B, T] ids (0-padded), int32 [B] lengths -> the task's outputs."""
        raise NotImplementedError


def save(module: Served, export_dir: str, info: dict) -> str:
    """Writes ``module`` as a SavedModel at ``export_dir`` (replacing it) with ``info`` as the
    ``serving.json`` asset; returns ``export_dir``."""
    scratch = tempfile.mkdtemp(prefix="tfseq_export_")
    try:
        info_path = os.path.join(scratch, ASSET_INFO)
        with open(info_path, "w") as f:
            json.dump(info, f, indent=2, sort_keys=True)
        module.info_file = tf.saved_model.Asset(info_path)
        staging = export_dir.rstrip("/") + ".tmp"
        if tf.io.gfile.exists(staging):
            tf.io.gfile.rmtree(staging)
        tf.saved_model.save(module, staging, signatures={"serving_default": module.serve})
        if tf.io.gfile.exists(export_dir):
            tf.io.gfile.rmtree(export_dir)
        tf.io.gfile.rename(staging, export_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return export_dir


def read_info(export_dir: str) -> dict:
    """The ``serving.json`` of an export: task, tokenizer settings, label count.

    Raises:
      FileNotFoundError: ``export_dir`` is not a tfseq export (names the missing file).
    """
    path = os.path.join(export_dir, "assets", ASSET_INFO)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"No {path}: {export_dir!r} is not a tfseq export "
                                "(scripts/export.py --model_dir=DIR writes DIR/export)")
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)
