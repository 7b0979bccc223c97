"""Verse -> section of the canon: the classification task on the embedded corpus.

Input lines are ``book<TAB>chapter<TAB>verse<TAB>text``. The label is the book's section
(7 classes, ``tfseq.corpus.SECTION_NAMES``). A verse is held out for evaluation when a hash of
``book chapter verse`` falls in the first ``eval_percent`` of 100 buckets, so the split is
stable across runs and machines.

Element spec of both datasets (``batching="pad"`` or ``"bucket"``)::

    ({"ids": int32 [B, T]}, int32 [B])

With ``batching="pack"`` the features are packed rows (see ``tfseq.pack``)::

    ({"ids": int32 [B, L], "ids_segment_ids": int32 [B, L], "ids_resets": int32 [B, L] (0/1)},
     label int32 [B, S], weight float32 [B, S])

one label per segment (verse), weight 0 on the label table's empty columns.

Drop reasons (counted per split in ``info["counters"][split]``): ``malformed`` (not 4 TSV
fields), ``unknown_book``, ``other_split`` (the line belongs to the other split), the
``filter_lines`` reasons and ``too_short``/``too_long``.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

import tfseq
from pipelines import verses
from tfseq.corpus import BOOK_TO_SECTION, SECTION_NAMES

BATCHING_MODES = ("pad", "bucket", "pack")


@dataclasses.dataclass(frozen=True)
class Config:
    files: tuple[str, ...] = ()            # empty: the embedded English corpus
    vocab_path: str | None = None          # load this vocab instead of building one
    min_count: int = 2
    max_vocab: int = 20000
    lowercase: bool = True
    tokenizer: str = "whitespace"
    max_length: int = 128
    batching: str = "bucket"
    batch_size: int = 64                   # for batching="pad"
    max_tokens: int = 2048                 # budget for "bucket" / "pack"
    block_length: int = 128                # for batching="pack"
    max_segments: int = 32                 # verses per packed row (the label table's width)
    eval_percent: int = 10
    shuffle_buffer: int = 20000
    seed: int = 0
    max_line_bytes: int = 1 << 16


def section_table() -> tf.lookup.StaticHashTable:
    books = sorted(BOOK_TO_SECTION)
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(books), tf.constant([BOOK_TO_SECTION[b] for b in books], tf.int32)),
        default_value=-1)


def labelled_text(config: Config, split: str, counter: tfseq.DropCounter,
                  shuffle_files: bool = False, num_shards: int = 1,
                  shard_index: int = 0) -> tf.data.Dataset:
    """Batches of ``{"text": tf.string [n], "label": int32 [n]}`` of one split, every drop
    counted; vectorized, one tf.data call per batch of lines."""
    files = list(config.files) or [tfseq.corpus_path("kjv_en")]
    table = section_table()
    counter.register("malformed", "unknown_book", "other_split")
    want_eval = split == "eval"

    def parse_and_keep(lines):
        example = verses.parse(lines)
        labels = table.lookup(example["book"])
        keep = counter.keep_if({
            "malformed": tf.logical_not(example["ok"]),
            "unknown_book": labels < 0,
            "other_split": tf.not_equal(verses.in_eval_split(example["key"], config.eval_percent),
                                        want_eval),
        })
        return {"text": tf.boolean_mask(example["text"], keep),
                "label": tf.boolean_mask(labels, keep)}

    ds = tfseq.text_lines(files, shuffle_files=shuffle_files, seed=config.seed,
                          num_shards=num_shards, shard_index=shard_index,
                          batch_size=verses.READ_BATCH)
    ds = ds.apply(counter.tally("lines_read", rows=True))
    ds = ds.map(parse_and_keep, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.apply(tfseq.filter_lines(key="text", max_line_bytes=config.max_line_bytes,
                                       counter=counter))


def batch(ds: tf.data.Dataset, config: Config, *, training: bool) -> tf.data.Dataset:
    """Batches ragged batches of examples by ``config.batching`` (shuffled when ``training``).

    ``bucket`` and ``pack`` take the ragged batches whole; ``pad`` unbatches them and, when
    training, shuffles the examples (``config.shuffle_buffer``) before padding."""
    if config.batching == "pad":
        ds = tfseq.unbatch(ds)
        if training:
            ds = ds.shuffle(config.shuffle_buffer, seed=config.seed, reshuffle_each_iteration=True)
        return ds.apply(tfseq.pad_batch(config.batch_size))
    if config.batching == "bucket":
        return ds.apply(tfseq.bucket_by_length(
            max_tokens=config.max_tokens, max_length=config.max_length,
            seed=config.seed if training else None))
    if config.batching == "pack":
        return ds.apply(tfseq.pack(config.block_length, max_tokens=config.max_tokens,
                                   max_segments=config.max_segments, long_examples="truncate",
                                   seed=config.seed if training else None))
    raise ValueError(f"Unknown batching {config.batching!r}; expected one of {BATCHING_MODES}")


def examples(config: Config, split: str, counter: tfseq.DropCounter, vocab: tfseq.Vocab,
             num_shards: int = 1, shard_index: int = 0) -> tf.data.Dataset:
    """Ragged batches ``{"ids": int32 [n, (T)], "label": int32 [n]}`` of one split.

    The examples are small, so they are cached after the first pass (the counters then count
    one pass); for training the batches are reshuffled every epoch (a buffer of
    ``config.shuffle_buffer`` examples, in whole batches) and ``batch`` shuffles inside pools.
    """
    ds = labelled_text(config, split, counter, num_shards=num_shards, shard_index=shard_index)
    ds = ds.apply(tfseq.tokenize(vocab, tokenizer=config.tokenizer, key="text",
                                 lowercase=config.lowercase))
    ds = ds.map(lambda e: {"ids": e["text"], "label": e["label"]})
    ds = ds.apply(tfseq.filter_by_length(min_length=1, max_length=config.max_length,
                                         counter=counter))
    ds = ds.cache()
    if split == "train":
        ds = ds.shuffle(-(-config.shuffle_buffer // verses.READ_BATCH), seed=config.seed,
                        reshuffle_each_iteration=True)
    return ds


def replica_dataset_fn(config: Config, info: dict, num_replicas: int,
                       data_service: str | None = None, split: str = "train"):
    """``dataset_fn`` for ``strategy.distribute_datasets_from_function``: batches of
    ``num_replicas`` times the per-replica budget, split in-graph (balanced by tokens, dummy rows
    of weight 0 so no replica is ever empty), as ``({"ids"}, label, weight)`` parts.

    Use it for evaluation too (``split="eval"``): Keras' own distribution of a plain dataset
    hands replicas uneven (or empty) parts of the last batch.
    """
    counter = tfseq.DropCounter(f"{split}_replicas") if split == "eval" else info["counters"][split]

    def make_dataset(num_shards, shard_index):
        return examples(config, split, counter, info["vocab"], num_shards, shard_index)

    def batch_fn(n):
        scaled = dataclasses.replace(config, max_tokens=config.max_tokens * n,
                                     batch_size=config.batch_size * n)
        return lambda ds: batch(ds, scaled, training=split == "train")

    def to_keras(part):
        if config.batching == "pack":  # per-segment weights, times the row's (dummy: 0) weight
            features, labels, weights = packed_to_keras(part)
            return features, labels, weights * part["weight"][:, None]
        return {"ids": part["ids"]}, part["label"], part["weight"]

    return tfseq.replica_dataset_fn(
        make_dataset, batch_fn, balance="tokens",
        data_service=data_service if split == "train" else None, map_fn=to_keras)


def datasets(config: Config = Config(), counters: dict | None = None):
    """Builds the train and eval datasets for ``model.fit``.

    Returns:
      ``(train_ds, eval_ds, info)``; ``info`` has ``vocab``, ``num_classes``,
      ``class_names``, ``counters`` (``{"train": DropCounter, "eval": DropCounter}``) and
      ``stats`` (``{"train": BatchStats, "eval": BatchStats}``) for the batches delivered.
    """
    if config.batching not in BATCHING_MODES:
        raise ValueError(f"Unknown batching {config.batching!r}; expected one of {BATCHING_MODES}")
    counters = counters or {"train": tfseq.DropCounter("train"), "eval": tfseq.DropCounter("eval")}
    if config.vocab_path:
        vocab = tfseq.Vocab.load(config.vocab_path)
    else:
        texts = labelled_text(config, "train", tfseq.DropCounter("vocab")).map(
            lambda e: e["text"])
        if config.lowercase:
            import tensorflow_text as tf_text
            texts = texts.map(tf_text.case_fold_utf8)
        vocab = tfseq.Vocab.build(texts, tokenizer=config.tokenizer, min_count=config.min_count,
                                  max_size=config.max_vocab)
    stats = {"train": tfseq.BatchStats(), "eval": tfseq.BatchStats()}
    out = {}
    for split in ("train", "eval"):
        training = split == "train"
        ds = examples(config, split, counters[split], vocab)
        ds = batch(ds, config, training=training)
        ds = ds.apply(stats[split].track(["ids"]))
        if config.batching == "pack":
            ds = ds.map(packed_to_keras)
        else:
            ds = ds.map(lambda b: ({"ids": b["ids"]}, b["label"]))
        out[split] = ds.prefetch(tf.data.AUTOTUNE)
    out = {k: v.with_options(tfseq.pipeline_options()) for k, v in out.items()}
    info = {"vocab": vocab, "num_classes": len(SECTION_NAMES), "class_names": SECTION_NAMES,
            "counters": counters, "stats": stats}
    return out["train"], out["eval"], info


def packed_to_keras(batch):
    """A packed batch -> ``(features, label [B, S], weight [B, S])``: one label per segment,
    weight 1 on the segments a row holds and 0 on the empty columns of the label table."""
    segment_ids = batch["ids_segment_ids"]
    num_segments = tf.shape(batch["label"])[1]
    present = tf.range(num_segments)[None, :] < tf.reduce_max(segment_ids, axis=1)[:, None]
    # Resets as int32: Keras sums a first batch across replicas to build a model, and bool
    # tensors cannot be summed.
    features = {"ids": batch["ids"], "ids_segment_ids": segment_ids,
                "ids_resets": tf.cast(batch["ids_resets"], tf.int32)}
    return features, batch["label"], tf.cast(present, tf.float32)


def majority_baseline(eval_ds: tf.data.Dataset) -> float:
    """Accuracy of always predicting the most frequent label of ``eval_ds``."""
    counts = tf.zeros([len(SECTION_NAMES)], tf.int64)
    for _, labels, *weights in eval_ds:
        labels = tf.cast(labels, tf.int32)
        if weights:  # packed: only the segments present
            labels = tf.boolean_mask(labels, weights[0] > 0)
        counts += tf.math.bincount(tf.reshape(labels, [-1]), minlength=len(SECTION_NAMES),
                                   maxlength=len(SECTION_NAMES), dtype=tf.int64)
    total = int(tf.reduce_sum(counts))
    return int(tf.reduce_max(counts)) / total if total else 0.0
