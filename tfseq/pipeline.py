"""One call from the user's files to a dataset ``model.fit`` takes (``training_pipeline``).

The steps are the library's own: ``tfseq.formats.read_rows`` (TSV/CSV/text in graph, every
drop counted) -> label lookup -> ``tfseq.tokenize`` -> truncate or drop long examples ->
shuffle -> ``bucket_by_length`` or ``pad_batch``.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tfseq import formats
from tfseq._common import pipeline_options, unbatch
from tfseq.batching import pad_batch
from tfseq.bucketing import bucket_by_length
from tfseq.filtering import filter_by_length
from tfseq.stats import DropCounter, resolve_counter
from tfseq.text import Vocab, tokenize


def training_pipeline(files, vocab: Vocab, *, columns: Sequence[str] = ("label", "text"),
                      labels: Sequence[str] | None = None, format: str | None = None,
                      header: bool = False, batching: str = "bucket", max_tokens: int = 2048,
                      batch_size: int = 64, max_length: int = 128, tokenizer=None,
                      lowercase: bool = False, long_examples: str = "truncate",
                      training: bool = True, shuffle_buffer: int = 20000, seed: int | None = 0,
                      counter: DropCounter | None = None) -> tf.data.Dataset:
    """User files -> batches for ``model.fit``.

    Args:
      files: paths or globs (``.gz`` allowed), or a comma-separated string of them.
      vocab: the ``Vocab`` (e.g. from ``Vocab.learn``).
      columns: field names in order (``_`` skips one); must hold ``text``; with ``label``,
        ``labels`` is required.
      labels: class names; label id = index. A row with another label is dropped
        (``unknown_label``).
      format, header: see ``tfseq.formats`` (format from the extension by default).
      batching: ``"bucket"`` (``max_tokens`` cells per batch) or ``"pad"`` (``batch_size``).
      max_tokens, batch_size: the budget of the chosen mode.
      max_length: tokens per example; ``long_examples="truncate"`` cuts longer ones (seen
        ``truncated``), ``"drop"`` drops them (``too_long``).
      tokenizer, lowercase: as in ``tfseq.tokenize``.
      training: shuffle (seeded by ``seed``) when true; arrival order otherwise.
      counter: where lines read and drops are counted (default: ``tfseq.default_counter()``).

    Returns:
      ``({"ids": int32 [B, T]}, label int32 [B])`` with labels, ``{"ids": int32 [B, T]}``
      without.

    Raises:
      tfseq.formats.InputError: missing/empty files, bad columns, labels missing.
      ValueError: an unknown ``batching`` or ``long_examples``.
    """
    if batching not in ("bucket", "pad"):
        raise ValueError(f"training_pipeline: batching must be 'bucket' or 'pad'; received "
                         f"{batching!r}")
    if long_examples not in ("truncate", "drop"):
        raise ValueError(f"long_examples must be 'truncate' or 'drop'; received {long_examples!r}")
    counter = resolve_counter(counter)
    paths = formats.resolve(files, "files")
    names = tuple(c for c in columns if c != "_")
    fmt = formats.row_format(paths, format, columns, header, required=("text",),
                             allowed=("label", "text"))
    with_labels = "label" in names
    if with_labels and not labels:
        raise formats.InputError("columns has a 'label' field: pass labels=[...] (the class "
                                 "names; tfseq.formats.discover_labels finds them)")
    ds = formats.read_rows(paths, fmt, counter)
    if with_labels:
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(list(labels)),
                                                tf.range(len(labels), dtype=tf.int32)), -1)
        counter.register("unknown_label")

        def to_ids(rows):
            ids = table.lookup(tf.strings.strip(rows["label"]))
            keep = counter.keep_if({"unknown_label": ids < 0})
            return {"text": tf.boolean_mask(rows["text"], keep),
                    "label": tf.boolean_mask(ids, keep)}

        ds = ds.map(to_ids, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        ds = ds.map(lambda rows: {"text": rows["text"]})
    ds = ds.apply(tokenize(vocab, tokenizer=tokenizer, key="text", lowercase=lowercase))
    ds = ds.map(lambda e: {"ids" if k == "text" else k: v for k, v in e.items()})
    if long_examples == "truncate":
        def cut(example):
            ids = example["ids"]
            longer = tf.reduce_sum(tf.cast(ids.row_lengths() > max_length, tf.int64))
            with tf.control_dependencies([counter.note("truncated", longer)]):
                return {**example, "ids": ids[:, :max_length]}
        ds = ds.map(cut, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.apply(filter_by_length(min_length=1, counter=counter))
    else:
        ds = ds.apply(filter_by_length(min_length=1, max_length=max_length, counter=counter))
    if batching == "pad":
        ds = unbatch(ds)
        if training:
            ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        ds = ds.apply(pad_batch(batch_size))
    else:
        if training:  # whole ragged batches; bucketing also shuffles inside its pools
            ds = ds.shuffle(max(1, shuffle_buffer // formats.READ_BATCH), seed=seed,
                            reshuffle_each_iteration=True)
        ds = ds.apply(bucket_by_length(max_tokens=max_tokens, max_length=max_length,
                                       seed=seed if training else None))
    if with_labels:
        ds = ds.map(lambda b: ({"ids": b["ids"]}, b["label"]))
    else:
        ds = ds.map(lambda b: {"ids": b["ids"]})
    return ds.prefetch(tf.data.AUTOTUNE).with_options(pipeline_options())
