"""English -> Spanish verse translation on the embedded aligned corpus.

Line N of ``kjv_en.tsv.gz`` pairs with line N of ``rv1909_es.tsv.gz`` (4th TSV field each).
The source is the English verse, the target ``<s> w1 .. wn </s>`` in Spanish; the decoder reads
``<s> w1 .. wn`` (teacher forcing) and predicts ``w1 .. wn </s>``. A pair is held out for
evaluation by a stable hash of its English ``book chapter verse``.

Element spec of both datasets (padded batches)::

    ({"source": int32 [B, S], "source_length": int32 [B],        # English ids, 0-padded
      "target_in": int32 [B, T], "target_in_length": int32 [B]},  # <s> w1 .. wn
     int32 [B, T],                                                # w1 .. wn </s>
     float32 [B, T])                                              # loss weight, 0 on padding

Drop reasons (per split in ``info["counters"][split]``): ``malformed`` (either side not 4
TSV fields), ``misaligned`` (the two lines name different verses), ``empty_target`` (18 Spanish
verses of the embedded corpus are empty), ``empty_source``, ``other_split``, the
``filter_lines`` reasons and ``too_long``.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

import tfseq
from pipelines import verses
from tfseq.text import BOS_ID, EOS_ID

BATCHING_MODES = ("pad", "bucket")


@dataclasses.dataclass(frozen=True)
class Config:
    source_files: tuple[str, ...] = ()     # empty: the embedded English corpus
    target_files: tuple[str, ...] = ()     # empty: the embedded Spanish corpus
    max_lines: int = 6000                  # read only the first N line pairs (0: all)
    min_count: int = 2
    max_vocab: int = 3000                  # per language
    lowercase: bool = True
    tokenizer: str = "whitespace"
    max_length: int = 40                   # words per side, not counting <s> and </s>
    batching: str = "pad"
    batch_size: int = 32                   # for batching="pad"
    max_tokens: int = 2048                 # budget for batching="bucket"
    eval_percent: int = 5
    shuffle_buffer: int = 10000
    seed: int = 0
    max_line_bytes: int = 1 << 16


def verse_pairs(config: Config, split: str, counter: tfseq.DropCounter) -> tf.data.Dataset:
    """Batches ``{"source": tf.string [n], "target": tf.string [n]}`` of one split's pairs,
    every drop counted; vectorized, one tf.data call per batch of line pairs."""
    source_files = list(config.source_files) or [tfseq.corpus_path("kjv_en")]
    target_files = list(config.target_files) or [tfseq.corpus_path("rv1909_es")]
    counter.register("malformed", "misaligned", "empty_target", "empty_source", "other_split")
    ds = tf.data.Dataset.zip(tfseq.text_lines(source_files), tfseq.text_lines(target_files))
    if config.max_lines:
        ds = ds.take(config.max_lines)
    ds = ds.batch(verses.READ_BATCH)  # zipped line by line (the files may differ), then batched
    ds = ds.apply(counter.tally("lines_read", rows=True))
    want_eval = split == "eval"

    def parse_and_keep(source_lines, target_lines):
        source, target = verses.parse(source_lines), verses.parse(target_lines)
        keep = counter.keep_if({
            "malformed": tf.logical_not(tf.logical_and(source["ok"], target["ok"])),
            "misaligned": tf.not_equal(source["key"], target["key"]),
            "empty_target": tf.strings.regex_full_match(target["text"], r"\s*"),
            "empty_source": tf.strings.regex_full_match(source["text"], r"\s*"),
            "other_split": tf.not_equal(verses.in_eval_split(source["key"], config.eval_percent),
                                        want_eval),
        })
        return {"source": tf.boolean_mask(source["text"], keep),
                "target": tf.boolean_mask(target["text"], keep)}

    ds = ds.map(parse_and_keep, num_parallel_calls=tf.data.AUTOTUNE)
    for key in ("source", "target"):
        ds = ds.apply(tfseq.filter_lines(key=key, max_line_bytes=config.max_line_bytes,
                                         counter=counter))
    return ds


def build_vocabs(config: Config) -> tuple[tfseq.Vocab, tfseq.Vocab]:
    """(English, Spanish) vocabularies built on the training split."""
    pairs = verse_pairs(config, "train", tfseq.DropCounter("vocab"))
    vocabs = []
    for key in ("source", "target"):
        texts = pairs.map(lambda p, key=key: p[key])
        if config.lowercase:
            import tensorflow_text as tf_text
            texts = texts.map(tf_text.case_fold_utf8)
        vocabs.append(tfseq.Vocab.build(texts, tokenizer=config.tokenizer,
                                        min_count=config.min_count, max_size=config.max_vocab))
    return vocabs[0], vocabs[1]


def datasets(config: Config = Config(), counters: dict | None = None):
    """Builds the train and eval datasets for ``model.fit``.

    Returns:
      ``(train_ds, eval_ds, info)``; ``info`` has ``source_vocab``, ``target_vocab``,
      ``counters`` (``{"train": DropCounter, "eval": DropCounter}``) and ``stats``.

    Raises:
      ValueError: unknown ``config.batching``.
    """
    if config.batching not in BATCHING_MODES:
        raise ValueError(f"Unknown batching {config.batching!r} for the translate task; "
                         f"expected one of {BATCHING_MODES}")
    counters = counters or {"train": tfseq.DropCounter("train"), "eval": tfseq.DropCounter("eval")}
    source_vocab, target_vocab = build_vocabs(config)
    stats = {"train": tfseq.BatchStats(), "eval": tfseq.BatchStats()}
    out = {}
    for split in ("train", "eval"):
        training = split == "train"
        counter = counters[split]
        ds = verse_pairs(config, split, counter)
        ds = ds.apply(tfseq.tokenize(source_vocab, tokenizer=config.tokenizer, key="source",
                                     lowercase=config.lowercase))
        ds = ds.apply(tfseq.tokenize(target_vocab, tokenizer=config.tokenizer, key="target",
                                     add_bos=True, add_eos=True, lowercase=config.lowercase))
        # The length is the max over source and target (which counts <s> and </s>).
        ds = ds.apply(tfseq.filter_by_length(max_length=config.max_length + 2, counter=counter))
        ds = ds.cache()
        if training:  # whole ragged batches; bucketing also shuffles inside pools, and
            # verses.batch shuffles examples for batching="pad"
            ds = ds.shuffle(-(-config.shuffle_buffer // verses.READ_BATCH), seed=config.seed,
                            reshuffle_each_iteration=True)
        ds = verses.batch(ds, config, training=training)
        ds = ds.apply(stats[split].track(["source", "target"]))

        def to_model(batch):
            inputs, lengths, targets, weights = verses.shift_targets(batch["target"],
                                                                     batch["target_length"])
            features = {"source": batch["source"], "source_length": batch["source_length"],
                        "target_in": inputs, "target_in_length": lengths}
            return features, targets, weights

        out[split] = ds.map(to_model).prefetch(tf.data.AUTOTUNE)
    out = {k: v.with_options(tfseq.pipeline_options()) for k, v in out.items()}
    info = {"source_vocab": source_vocab, "target_vocab": target_vocab, "vocab": target_vocab,
            "bos_id": BOS_ID, "eos_id": EOS_ID, "max_length": config.max_length + 1,
            "counters": counters, "stats": stats}
    return out["train"], out["eval"], info
