"""Text classification: ``text -> label`` over rows from the user's files or the embedded corpus.

Rows come from ``--train_files`` (TSV, CSV or text with ``--columns`` naming ``label`` and
``text``, see ``tfseq.formats``) or, by default, from the embedded verse corpus labelled by
section of the canon (``pipelines.verses``). Labels are discovered from the training rows and
sorted (``info["class_names"]``, written to ``<model_dir>/labels.txt`` by ``scripts/train.py``);
without ``eval_files`` a stable hash of each line holds out ``eval_percent`` of them.

Element spec of both datasets (``batching="pad"`` or ``"bucket"``)::

    ({"ids": int32 [B, T]}, int32 [B])

With ``batching="pack"`` the features are packed rows (see ``tfseq.pack``)::

    ({"ids": int32 [B, L], "ids_segment_ids": int32 [B, L], "ids_resets": int32 [B, L] (0/1)},
     label int32 [B, S], weight float32 [B, S])

one label per segment (example), weight 0 on the label table's empty columns. ``L`` is one
of ``block_length`` (default rows of 32, 64 or 128: each example in the shortest that holds
it), one per batch.

Drop reasons (counted per split in ``info["counters"][split]``): the source's (``malformed``,
``invalid_utf8``, ``empty_text``, ``other_split``; ``unknown_book`` for the verse corpus),
``unknown_label`` (an eval label never seen in training), the ``filter_lines`` reasons and
``too_short``/``too_long``. ``long_examples="truncate"`` (the default) cuts examples to
``max_length`` tokens instead of dropping them, counted under seen ``truncated``.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

import tfseq
from pipelines import sources, verses

BATCHING_MODES = ("pad", "bucket", "pack")
COLUMNS = ("label", "text")


@dataclasses.dataclass(frozen=True)
class Config:
    train_files: tuple[str, ...] = ()      # user files (globs, .gz); empty: the verse corpus
    eval_files: tuple[str, ...] = ()       # empty: hold out eval_percent of train_files
    format: str | None = None              # "tsv" | "csv" | "text"; None: from the extension
    columns: tuple[str, ...] = ()          # field names in order ("_" skips); () = label,text
    header: bool = False                   # skip each file's first line
    files: tuple[str, ...] = ()            # verse-format files; empty: the embedded corpus
    vocab_path: str | None = None          # load this vocab (or SentencePiece .model)
    vocab_size: int | None = None          # learn a wordpiece/sentencepiece vocab of this size
    vocab_max_lines: int = 1_000_000       # lines read to learn a vocabulary
    long_examples: str = "truncate"        # "truncate" at max_length (counted) or "drop"
    min_count: int = 2
    max_vocab: int = 20000
    lowercase: bool = True
    tokenizer: str = "whitespace"
    max_length: int = 128
    batching: str = "bucket"
    batch_size: int = 64                   # for batching="pad"
    max_tokens: int = 2048                 # budget for "bucket" / "pack"
    # Row lengths for batching="pack": each verse goes into the shortest rows that hold it
    # (tfseq.pack), so a recurrent model steps through 32 tokens, not 128, for most batches.
    block_length: int | tuple[int, ...] = (32, 64, 128)
    max_segments: int = 32                 # verses per packed row (the label table's width)
    eval_percent: int = 10
    shuffle_buffer: int = 20000
    seed: int = 0
    max_line_bytes: int = 1 << 16


def labelled_text(config: Config, split: str, counter: tfseq.DropCounter,
                  class_names=None, shuffle_files: bool = False, num_shards: int = 1,
                  shard_index: int = 0, shuffle_lines: bool = False) -> tf.data.Dataset:
    """Batches of ``{"text": tf.string [n], "label": int32 [n]}`` of one split, every drop
    counted; vectorized, one tf.data call per batch of lines. ``class_names`` (the label ids'
    order) is required to get ids; without it labels stay ``tf.string``. ``shuffle_lines``:
    the global line shuffle of ``text_lines`` (a new order every epoch)."""
    read = dict(shuffle_files=shuffle_files, seed=config.seed, num_shards=num_shards,
                shard_index=shard_index)
    if shuffle_lines:
        read["shuffle_lines"] = True
    if sources.has_user_files(config):
        ds = sources.user_rows(config, split, counter, required=COLUMNS, allowed=COLUMNS, **read)
        ds = ds.map(lambda r: {"text": r["text"], "label": tf.strings.strip(r["label"])})
    else:
        ds = verses.classify_rows(list(config.files) or [tfseq.corpus_path("kjv_en")], split,
                                  counter, config.eval_percent, **read)
    if class_names is not None:
        table = label_table(class_names)
        counter.register("unknown_label")

        def to_ids(rows):
            ids = table.lookup(rows["label"])
            keep = counter.keep_if({"unknown_label": ids < 0})
            return {"text": tf.boolean_mask(rows["text"], keep),
                    "label": tf.boolean_mask(ids, keep)}

        ds = ds.map(to_ids, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.apply(tfseq.filter_lines(key="text", max_line_bytes=config.max_line_bytes,
                                       counter=counter))


def label_table(class_names) -> tf.lookup.StaticHashTable:
    """label string -> int32 id (its index in ``class_names``; -1 if unknown)."""
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(list(class_names)), tf.range(len(class_names), dtype=tf.int32)),
        default_value=-1)


def class_names_of(config: Config) -> list[str]:
    """The classes: discovered from the user's training rows (sorted), or the verse sections.

    Raises:
      InputError: no training line parsed (the message gives the first malformed lines).
    """
    if not sources.has_user_files(config):
        return list(verses.CLASS_NAMES)
    rows = labelled_text(config, "train", tfseq.DropCounter("labels"))
    names = [n for n in tfseq.formats.discover_labels(rows) if n]
    if not names:
        examples = sources.drop_examples(config, required=COLUMNS, allowed=COLUMNS)
        raise sources.InputError(
            f"No training line of {', '.join(config.train_files)} parsed into "
            f"--columns={','.join(config.columns or COLUMNS)} with --format="
            f"{config.format or 'from the extension'}: check --format, --columns and --header"
            + (". First bad lines: " + "; ".join(examples) if examples else ""))
    if len(names) < 2:
        raise sources.InputError(f"Only one label ({names[0]!r}) in the training files: "
                                 "classification needs at least two")
    return names


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
             num_shards: int = 1, shard_index: int = 0, class_names=None,
             shuffle_lines: bool | None = None) -> tf.data.Dataset:
    """Ragged batches ``{"ids": int32 [n, (T)], "label": int32 [n]}`` of one split.

    Training reads its lines globally shuffled, a new order every epoch
    (``text_lines(shuffle_lines=True)``: files sorted by label still give mixed batches), and
    ``batch`` shuffles inside pools; the counters then count every epoch's lines. Evaluation
    (and training with ``shuffle_lines=False``) reads in file order and caches the examples
    after the first pass (the counters count one pass).
    """
    if shuffle_lines is None:
        shuffle_lines = split == "train"
    ds = labelled_text(config, split, counter, class_names or class_names_of(config),
                       num_shards=num_shards, shard_index=shard_index,
                       shuffle_lines=shuffle_lines)
    ds = ds.apply(tfseq.tokenize(vocab, tokenizer=config.tokenizer, key="text",
                                 lowercase=config.lowercase))
    ds = ds.map(lambda e: {"ids": e["text"], "label": e["label"]})
    ds = ds.apply(sources.truncate_or_drop(config, counter, "ids", config.max_length))
    if shuffle_lines:
        return ds
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
        # No line shuffle on the tf.data service: its sources would be split among workers.
        return examples(config, split, counter, info["vocab"], num_shards, shard_index,
                        info["class_names"],
                        shuffle_lines=split == "train" and data_service is None)

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
    class_names = class_names_of(config)
    texts = labelled_text(config, "train", tfseq.DropCounter("vocab")).map(lambda e: e["text"])
    vocab = sources.build_vocab(config, texts)
    stats = {"train": tfseq.BatchStats(), "eval": tfseq.BatchStats()}
    out = {}
    for split in ("train", "eval"):
        training = split == "train"
        ds = examples(config, split, counters[split], vocab, class_names=class_names)
        ds = batch(ds, config, training=training)
        ds = ds.apply(stats[split].track(["ids"]))
        if config.batching == "pack":
            ds = ds.map(packed_to_keras)
        else:
            ds = ds.map(lambda b: ({"ids": b["ids"]}, b["label"]))
        out[split] = ds.prefetch(tf.data.AUTOTUNE)
    out = {k: v.with_options(tfseq.pipeline_options()) for k, v in out.items()}
    info = {"vocab": vocab, "num_classes": len(class_names), "class_names": list(class_names),
            "counters": counters, "stats": stats,
            "reread_each_epoch": True,  # training lines are read (shuffled) every epoch
            "drop_examples": lambda: sources.drop_examples(config, required=COLUMNS,
                                                           allowed=COLUMNS)}
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


def majority_baseline(eval_ds: tf.data.Dataset, num_classes: int | None = None) -> float:
    """Accuracy of always predicting the most frequent label of ``eval_ds``."""
    if num_classes is None:
        num_classes = max(int(tf.reduce_max(b[1])) for b in eval_ds) + 1
    counts = tf.zeros([num_classes], tf.int64)
    for _, labels, *weights in eval_ds:
        labels = tf.cast(labels, tf.int32)
        if weights:  # packed: only the segments present
            labels = tf.boolean_mask(labels, weights[0] > 0)
        counts += tf.math.bincount(tf.reshape(labels, [-1]), minlength=num_classes,
                                   maxlength=num_classes, dtype=tf.int64)
    total = int(tf.reduce_sum(counts))
    return int(tf.reduce_max(counts)) / total if total else 0.0
