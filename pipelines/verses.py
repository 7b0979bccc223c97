"""The embedded verse corpus as the default ``Source`` of the classify, lm and translate tasks.

A line is ``book<TAB>chapter<TAB>verse<TAB>text`` (see ``tfseq/data/README.md``). For
classification the label is the book's section of the canon (7 classes,
``tfseq.corpus.SECTION_NAMES``); a verse is held out for evaluation when a hash of ``book
chapter verse`` falls in the first ``eval_percent`` of 100 buckets (``formats.in_eval_split``).
Line N of the English file translates line N of the Spanish one.

Drop reasons: ``malformed`` (not 4 tab-separated fields), ``unknown_book`` (classify),
``misaligned`` / ``empty_source`` / ``empty_target`` (translate), ``other_split``.
"""

from __future__ import annotations

import tensorflow as tf

import tfseq
from tfseq.pipelines.sources import READ_BATCH, Source
from tfseq import formats
from tfseq.corpus import BOOK_TO_SECTION, SECTION_NAMES

CLASS_NAMES = SECTION_NAMES


def parse(lines: tf.Tensor) -> dict[str, tf.Tensor]:
    """``tf.string`` line(s), ``[]`` or ``[n]`` -> ``{"key": "book chapter verse", "book",
    "text", "ok"}`` of the same shape (vectorized). ``ok`` is false when a line does not have
    exactly 4 tab-separated fields (the other features are then empty strings, so the caller
    can count and drop it)."""
    lines = tf.convert_to_tensor(lines, tf.string)
    if lines.shape.rank == 0:
        return {k: v[0] for k, v in parse(lines[tf.newaxis]).items()}
    fields = tf.strings.split(lines, "\t")
    ok = tf.equal(fields.row_lengths(), 4)
    fields = fields.to_tensor("", shape=[None, 4])
    return {"key": tf.strings.reduce_join(fields[:, :3], axis=1, separator=" "),
            "book": fields[:, 0], "text": fields[:, 3], "ok": ok}


def section_table() -> tf.lookup.StaticHashTable:
    """book -> section name (``""`` for an unknown book)."""
    books = sorted(BOOK_TO_SECTION)
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(books), tf.constant([SECTION_NAMES[BOOK_TO_SECTION[b]] for b in books])),
        default_value="")


def _files(config, name: str = "kjv_en") -> list[str]:
    return list(config.files) or [tfseq.corpus_path(name)]


def _read(files, max_lines: int = 0):
    """``(num_shards, shard_index) -> record batches`` of ``files`` in order (the first
    ``max_lines`` lines only, if set)."""

    def read(num_shards: int = 1, shard_index: int = 0):
        if max_lines:
            ds = tfseq.text_lines(files, num_parallel_reads=1).take(max_lines)
            return ds.shard(num_shards, shard_index).batch(READ_BATCH)
        return tfseq.text_lines(files, batch_size=READ_BATCH, num_parallel_reads=1,
                                num_shards=num_shards, shard_index=shard_index)

    return read


def _other_split(key, config, split):
    return tf.not_equal(formats.in_eval_split(key, config.eval_percent), split == "eval")


def classify_source(config, split: str) -> Source:
    """Rows ``{"text", "label": section name}`` of the verse files of ``split``."""
    files = _files(config)
    table = section_table()

    def parse_rows(lines, counter):
        counter.register("malformed", "unknown_book", "other_split")
        read = counter.note("lines_read", tf.size(lines, out_type=tf.int64))
        verse = parse(lines)
        labels = table.lookup(verse["book"])
        with tf.control_dependencies([read]):
            keep = counter.keep_if({"malformed": tf.logical_not(verse["ok"]),
                                    "unknown_book": tf.equal(labels, ""),
                                    "other_split": _other_split(verse["key"], config, split)})
        return {"text": tf.boolean_mask(verse["text"], keep),
                "label": tf.boolean_mask(labels, keep)}

    return Source(", ".join(files), tuple(files), _read(files), parse_rows)


def text_source(config, split: str) -> Source:
    """Rows ``{"text"}`` of the verses of ``config.corpus`` (the first ``config.max_lines``)."""
    files = _files(config, config.corpus)

    def parse_rows(lines, counter):
        counter.register("malformed", "other_split")
        read = counter.note("lines_read", tf.size(lines, out_type=tf.int64))
        verse = parse(lines)
        with tf.control_dependencies([read]):
            keep = counter.keep_if({"malformed": tf.logical_not(verse["ok"]),
                                    "other_split": _other_split(verse["key"], config, split)})
        return {"text": tf.boolean_mask(verse["text"], keep)}

    return Source(", ".join(files), tuple(files), _read(files, config.max_lines), parse_rows)


def pair_source(config, split: str) -> Source:
    """Rows ``{"source": English verse, "target": Spanish verse}`` (records: the two lines
    joined by ``"\\n"``), held out by the English ``book chapter verse``."""
    files = [tfseq.corpus_path("kjv_en"), tfseq.corpus_path("rv1909_es")]

    def read(num_shards: int = 1, shard_index: int = 0):
        pairs = tf.data.Dataset.zip(*(tfseq.text_lines(f) for f in files))
        if config.max_lines:
            pairs = pairs.take(config.max_lines)
        return pairs.shard(num_shards, shard_index).map(
            lambda s, t: s + "\n" + t).batch(READ_BATCH)

    def parse_rows(records, counter):
        counter.register("malformed", "misaligned", "empty_target", "empty_source",
                         "other_split")
        read_op = counter.note("lines_read", tf.size(records, out_type=tf.int64))
        halves = tf.strings.split(records, "\n", maxsplit=1).to_tensor("", shape=[None, 2])
        source, target = parse(halves[:, 0]), parse(halves[:, 1])
        with tf.control_dependencies([read_op]):
            keep = counter.keep_if({
                "malformed": tf.logical_not(source["ok"] & target["ok"]),
                "misaligned": tf.not_equal(source["key"], target["key"]),
                "empty_target": tf.strings.regex_full_match(target["text"], r"\s*"),
                "empty_source": tf.strings.regex_full_match(source["text"], r"\s*"),
                "other_split": _other_split(source["key"], config, split)})
        return {"source": tf.boolean_mask(source["text"], keep),
                "target": tf.boolean_mask(target["text"], keep)}

    return Source("the embedded English/Spanish corpus", tuple(files), read, parse_rows)
