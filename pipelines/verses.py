"""The embedded verse corpus as a source of rows for the classify, lm and translate tasks.

A line is ``book<TAB>chapter<TAB>verse<TAB>text`` (see ``tfseq/data/README.md``). For
classification the label is the book's section of the canon (7 classes,
``tfseq.corpus.SECTION_NAMES``); a verse is held out for evaluation when a hash of ``book
chapter verse`` falls in the first ``eval_percent`` of 100 buckets.
"""

from __future__ import annotations

import tensorflow as tf

import tfseq
from pipelines import sources
from tfseq._common import is_ragged_batch
from tfseq.corpus import BOOK_TO_SECTION, SECTION_NAMES

READ_BATCH = sources.READ_BATCH  # lines per batch on the vectorized path
CLASS_NAMES = SECTION_NAMES


def parse(lines: tf.Tensor) -> dict[str, tf.Tensor]:
    """``tf.string`` line(s), ``[]`` or ``[n]`` -> ``{"key": "book chapter verse", "book",
    "text", "ok"}`` of the same shape (vectorized: one call per batch of lines).

    ``ok`` is false when a line does not have exactly 4 tab-separated fields (the other
    features are then padded with empty strings, so the caller can count and drop it).
    """
    if lines.shape.rank == 0:
        return {k: v[0] for k, v in parse(lines[tf.newaxis]).items()}
    fields = tf.strings.split(lines, "\t")
    ok = tf.equal(fields.row_lengths(), 4)
    fields = fields.to_tensor("", shape=[None, 4])
    return {"key": tf.strings.reduce_join(fields[:, :3], axis=1, separator=" "),
            "book": fields[:, 0], "text": fields[:, 3], "ok": ok}


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
    ``config.max_tokens``; lengths may exceed ``config.max_length`` by the 2 BOS/EOS ids.

    ``ds`` holds examples or ragged batches of them; ``"pad"`` unbatches ragged batches and,
    when training, shuffles the examples (``config.shuffle_buffer``) before padding."""
    if config.batching == "pad":
        if is_ragged_batch(ds.element_spec):
            ds = tfseq.unbatch(ds)
            if training:
                ds = ds.shuffle(config.shuffle_buffer, seed=config.seed,
                                reshuffle_each_iteration=True)
        return ds.apply(tfseq.pad_batch(config.batch_size))
    return ds.apply(tfseq.bucket_by_length(
        max_tokens=config.max_tokens, max_length=config.max_length + 2,
        seed=config.seed if training else None))


def section_table() -> tf.lookup.StaticHashTable:
    """book -> section name (``""`` for an unknown book)."""
    books = sorted(BOOK_TO_SECTION)
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(books), tf.constant([SECTION_NAMES[BOOK_TO_SECTION[b]] for b in books])),
        default_value="")


def classify_rows(files, split: str, counter: tfseq.DropCounter, eval_percent: int,
                  **read_kwargs) -> tf.data.Dataset:
    """Batches ``{"text": tf.string [n], "label": tf.string [n] (section name)}`` of one split
    of the verse files, every drop counted (``malformed``, ``unknown_book``, ``other_split``)."""
    table = section_table()
    counter.register("malformed", "unknown_book", "other_split")
    want_eval = split == "eval"

    def parse_and_keep(lines):
        example = parse(lines)
        labels = table.lookup(example["book"])
        keep = counter.keep_if({
            "malformed": tf.logical_not(example["ok"]),
            "unknown_book": tf.equal(labels, ""),
            "other_split": tf.not_equal(in_eval_split(example["key"], eval_percent), want_eval),
        })
        return {"text": tf.boolean_mask(example["text"], keep),
                "label": tf.boolean_mask(labels, keep)}

    ds = sources.read_lines(files, batch_size=READ_BATCH, **read_kwargs)
    ds = ds.apply(counter.tally("lines_read", rows=True))
    return ds.map(parse_and_keep, num_parallel_calls=tf.data.AUTOTUNE)
