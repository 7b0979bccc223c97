"""Where task examples come from: the user's files (``tfseq.formats``) or the embedded corpus.

Each task pipeline asks for batches of rows with named columns (``{"text": tf.string [n],
"label": tf.string [n]}`` for classify, ``{"text"}`` for lm, ``{"source", "target"}`` for
translate) and does not care which source they come from. Without ``train_files`` (and, for
translate, ``source_files``/``target_files``) the embedded verse corpus is the source
(``pipelines.verses``).
"""

from __future__ import annotations

import tensorflow as tf

import tfseq
from tfseq import formats
from tfseq.formats import InputError

READ_BATCH = formats.READ_BATCH


def read_lines(files, **kwargs) -> tf.data.Dataset:
    """Every pipeline reads its lines through here (``tfseq.formats.read_lines``)."""
    return formats.read_lines(files, **kwargs)


def has_user_files(config) -> bool:
    return bool(getattr(config, "train_files", ()))


def user_format(config, *, required, allowed) -> tuple[list[str], formats.RowFormat]:
    """The resolved training files and their ``RowFormat``.

    Raises:
      InputError: missing or empty files, bad ``columns`` or ``format`` (message names the fix).
    """
    train = formats.resolve(config.train_files, "--train_files")
    fmt = formats.row_format(train, config.format, config.columns or None, config.header,
                             required=required, allowed=allowed)
    return train, fmt


def split_files(config, split: str, train: list[str]) -> tuple[list[str], str | None]:
    """(files, hold-out split or None) for ``split``: ``eval_files`` when given, otherwise the
    ``eval_percent`` hash hold-out of the training files."""
    if config.eval_files:
        if split == "train":
            return train, None
        return formats.resolve(config.eval_files, "--eval_files"), None
    return train, split


def user_rows(config, split: str, counter: tfseq.DropCounter, *, required, allowed,
              **read_kwargs) -> tf.data.Dataset:
    """Batches of rows ``{column: tf.string [n]}`` of ``split`` from the user's files."""
    train, fmt = user_format(config, required=required, allowed=allowed)
    files, hold_out = split_files(config, split, train)
    return formats.read_rows(files, fmt, counter, split=hold_out,
                             eval_percent=config.eval_percent, **read_kwargs)


def drop_examples(config, *, required, allowed, limit: int = 5) -> list[str]:
    """The first ``limit`` malformed lines of the user's files as ``"file:line: reason"``."""
    if not has_user_files(config):
        return []
    train, fmt = user_format(config, required=required, allowed=allowed)
    files = list(train)
    if config.eval_files:
        files += formats.resolve(config.eval_files, "--eval_files")
    return formats.drop_examples(files, fmt, limit=limit)


def build_vocab(config, texts: tf.data.Dataset, what: str = "") -> tfseq.Vocab:
    """The vocabulary: ``config.vocab_path`` loaded, learned (``config.tokenizer`` wordpiece or
    sentencepiece with ``config.vocab_size``), or counted (``Vocab.build``) over ``texts``
    (``tf.string [n]`` batches of training text).

    Raises:
      InputError: ``wordpiece``/``sentencepiece`` without ``vocab_size`` or ``vocab_path``, or no
        token in the training text.
    """
    if config.vocab_path:
        try:
            return tfseq.Vocab.load(config.vocab_path)
        except (ValueError, FileNotFoundError) as e:
            raise InputError(f"--vocab: {e}") from None
    if config.tokenizer in tfseq.text.LEARNED_TOKENIZERS:
        if not config.vocab_size:
            raise InputError(f"--tokenizer={config.tokenizer} needs --vocab_size=N (to learn "
                             "a vocabulary from the training files) or --vocab=PATH")
        vocab = tfseq.Vocab.learn(texts, tokenizer=config.tokenizer, vocab_size=config.vocab_size,
                                  max_lines=config.vocab_max_lines, lowercase=config.lowercase)
    else:
        if config.lowercase:
            import tensorflow_text as tf_text
            texts = texts.map(tf_text.case_fold_utf8)
        vocab = tfseq.Vocab.build(texts, tokenizer=config.tokenizer, min_count=config.min_count,
                                  max_size=config.max_vocab)
    if len(vocab) <= len(tfseq.text.RESERVED):
        raise InputError(f"No {what + ' ' if what else ''}text to build a vocabulary from: no "
                         "training line parsed (check --format, --columns and --header; the "
                         "report's drop counts say why lines were dropped)")
    return vocab


def truncate_or_drop(config, counter: tfseq.DropCounter, key: str, max_length: int,
                     min_length: int = 1):
    """``config.long_examples``: ``"truncate"`` cuts ``key`` (int32 ``[n, (T)]``) to
    ``max_length`` (counted under seen ``truncated``), ``"drop"`` drops longer examples
    (``too_long``); examples shorter than ``min_length`` are dropped (``too_short``)."""
    if config.long_examples not in ("truncate", "drop"):
        raise InputError(f"--long_examples must be truncate or drop; received "
                         f"{config.long_examples!r}")

    def apply(ds):
        if config.long_examples == "truncate":
            def cut(example):
                ids = example[key]
                longer = tf.reduce_sum(tf.cast(ids.row_lengths() > max_length, tf.int64))
                with tf.control_dependencies([counter.note("truncated", longer)]):
                    return {**example, key: ids[:, :max_length]}
            ds = ds.map(cut, num_parallel_calls=tf.data.AUTOTUNE)
            return ds.apply(tfseq.filter_by_length(min_length=min_length, counter=counter))
        return ds.apply(tfseq.filter_by_length(min_length=min_length, max_length=max_length,
                                               counter=counter))

    return apply
