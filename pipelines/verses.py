"""Reading the embedded corpus format shared by the lm and translate pipelines.

A line is ``book<TAB>chapter<TAB>verse<TAB>text`` (see ``tfseq/data/README.md``).
"""

from __future__ import annotations

import tensorflow as tf

import tfseq


def parse(line: tf.Tensor) -> dict[str, tf.Tensor]:
    """One ``tf.string`` line -> ``{"key": "book chapter verse", "text", "ok"}``.

    ``ok`` is false when the line does not have exactly 4 tab-separated fields (the other
    features are then padded with empty strings, so the caller can count and drop it).
    """
    fields = tf.strings.split(line, "\t")
    ok = tf.size(fields) == 4
    fields = tf.pad(fields, [[0, tf.maximum(0, 4 - tf.size(fields))]])
    return {"key": tf.strings.reduce_join(fields[:3], separator=" "), "text": fields[3], "ok": ok}


def in_eval_split(key: tf.Tensor, eval_percent: int) -> tf.Tensor:
    """bool scalar: whether the verse ``key`` is held out (a stable hash in the first
    ``eval_percent`` of 100 buckets, as in ``pipelines.classify``)."""
    return tf.strings.to_hash_bucket_fast(key, 100) < eval_percent


def shift_targets(ids: tf.Tensor, lengths: tf.Tensor):
    """Teacher forcing on a padded batch of ``<s> ... </s>`` rows.

    Args:
      ids: int32 ``[B, T]`` padded with 0, each row ``<s> w1 .. wn </s>``.
      lengths: int32 ``[B]`` row lengths (``n + 2``).

    Returns:
      ``(inputs [B, T-1], input_lengths [B], targets [B, T-1], weights float32 [B, T-1])``:
      inputs are ``<s> w1 .. wn``, targets ``w1 .. wn </s>``, weights 1 on real targets and 0
      on padding.

    Example::

        ids      [[2, 7, 8, 3], [2, 9, 3, 0]]   lengths [4, 3]
        inputs   [[2, 7, 8],    [2, 9, 3]]      input_lengths [3, 2]
        targets  [[7, 8, 3],    [9, 3, 0]]      weights [[1, 1, 1], [1, 1, 0]]
    """
    targets = ids[:, 1:]
    return ids[:, :-1], lengths - 1, targets, tf.cast(tf.not_equal(targets, 0), tf.float32)


def batch(ds: tf.data.Dataset, config, *, training: bool) -> tf.data.Dataset:
    """``config.batching``: ``"pad"`` (``config.batch_size``) or ``"bucket"`` under
    ``config.max_tokens``; lengths may exceed ``config.max_length`` by the 2 BOS/EOS ids."""
    if config.batching == "pad":
        return ds.apply(tfseq.pad_batch(config.batch_size))
    return ds.apply(tfseq.bucket_by_length(
        max_tokens=config.max_tokens, max_length=config.max_length + 2,
        seed=config.seed if training else None))
