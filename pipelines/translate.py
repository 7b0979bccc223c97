"""Translation: ``source -> target`` pairs from the user's files or the embedded corpus.

User pairs come from one file with ``--columns=source,target`` (TSV or CSV), or from two
line-aligned plain-text files ``--source_files``/``--target_files`` (line N pairs with line N;
files of unequal line counts are an error naming both). Without ``eval_files`` a stable hash of
each pair holds out ``eval_percent`` of them.

By default the embedded aligned corpus translates English verses to Spanish: line N of
``kjv_en.tsv.gz`` pairs with line N of ``rv1909_es.tsv.gz`` (4th TSV field each).
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
from pipelines import sources, verses
from tfseq import formats
from tfseq.text import BOS_ID, EOS_ID

BATCHING_MODES = ("pad", "bucket")
COLUMNS = ("source", "target")


@dataclasses.dataclass(frozen=True)
class Config:
    train_files: tuple[str, ...] = ()      # user files of source,target rows (globs, .gz)
    eval_files: tuple[str, ...] = ()       # empty: hold out eval_percent of the pairs
    format: str | None = None              # "tsv" | "csv"; None: from the extension
    columns: tuple[str, ...] = ()          # field names in order ("_" skips); () = source,target
    header: bool = False                   # skip each file's first line
    source_files: tuple[str, ...] = ()     # plain text, line-aligned with target_files
    target_files: tuple[str, ...] = ()     # (both empty, no train_files: the verse corpus)
    max_lines: int = 6000                  # verse corpus: read only the first N pairs (0: all)
    vocab_path: str | None = None          # not supported: each side builds or learns its own
    vocab_size: int | None = None          # learn wordpiece/sentencepiece vocabs of this size
    vocab_max_lines: int = 1_000_000       # lines read to learn a vocabulary
    long_examples: str = "drop"            # "drop" (counted too_long) or "truncate"
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


def count_lines(path: str) -> int:
    """Lines in ``path`` (a pass in graph over its batches)."""
    ds = sources.read_lines([path], batch_size=4096)
    return int(ds.reduce(tf.constant(0, tf.int64),
                         lambda n, b: n + tf.size(b, out_type=tf.int64)).numpy())


def aligned_files(config: Config) -> list[tuple[str, str]]:
    """(source, target) file pairs of ``source_files``/``target_files``, in order.

    Raises:
      InputError: unequal numbers of files, or a pair of files with unequal line counts
        (naming both files and their counts).
    """
    if not (config.source_files and config.target_files):
        raise formats.InputError("--source_files and --target_files go together (line-aligned "
                                 "plain text); or give --train_files with --columns=source,target")
    if config.train_files or config.eval_files:
        raise formats.InputError("--source_files/--target_files replace --train_files/"
                                 "--eval_files (a hashed --eval_percent of the pairs is held out)")
    src = formats.resolve(config.source_files, "--source_files")
    tgt = formats.resolve(config.target_files, "--target_files")
    if len(src) != len(tgt):
        raise formats.InputError(f"--source_files matches {len(src)} files but --target_files "
                                 f"{len(tgt)}; they pair up in sorted order")
    for s, t in zip(src, tgt):
        ns, nt = count_lines(s), count_lines(t)
        if ns != nt:
            raise formats.InputError(f"{s} has {ns} lines but {t} has {nt}: source and target "
                                     "files must be line-aligned")
    return list(zip(src, tgt))


def user_pairs(config: Config, split: str, counter: tfseq.DropCounter) -> tf.data.Dataset:
    """Batches ``{"source": tf.string [n], "target": tf.string [n]}`` of one split of the user's
    pairs, every drop counted (see ``tfseq.formats``)."""
    if config.train_files and not config.source_files and not config.target_files:
        ds = sources.user_rows(config, split, counter, required=COLUMNS, allowed=COLUMNS)
    else:
        counter.register("malformed", "invalid_utf8", "empty_text", "other_split")
        parts = [tf.data.Dataset.zip(sources.read_lines([s]), sources.read_lines([t]))
                 for s, t in aligned_files(config)]
        ds = parts[0]
        for more in parts[1:]:
            ds = ds.concatenate(more)
        ds = ds.apply(counter.tally("lines_read", rows=True))

        def parse_and_keep(source_lines, target_lines):
            row = {"source": source_lines, "target": target_lines}
            ok = tf.ones_like(source_lines, tf.bool)
            checks = {"other_split": tf.not_equal(
                formats.in_eval_split(source_lines + "\t" + target_lines, config.eval_percent),
                split == "eval")}
            checks.update(formats.drop_checks(source_lines + "\t" + target_lines, row, ok))
            keep = counter.keep_if(checks)
            return {k: tf.boolean_mask(v, keep) for k, v in row.items()}

        ds = ds.map(parse_and_keep, num_parallel_calls=tf.data.AUTOTUNE)
    for key in COLUMNS:
        ds = ds.apply(tfseq.filter_lines(key=key, max_line_bytes=config.max_line_bytes,
                                         counter=counter))
    return ds


def pairs(config: Config, split: str, counter: tfseq.DropCounter) -> tf.data.Dataset:
    """The pairs of one split: the user's, or the verse corpus'."""
    if config.train_files or config.source_files or config.target_files:
        return user_pairs(config, split, counter)
    return verse_pairs(config, split, counter)


def verse_pairs(config: Config, split: str, counter: tfseq.DropCounter) -> tf.data.Dataset:
    """Batches ``{"source": tf.string [n], "target": tf.string [n]}`` of one split's pairs,
    every drop counted; vectorized, one tf.data call per batch of line pairs."""
    source_files = [tfseq.corpus_path("kjv_en")]
    target_files = [tfseq.corpus_path("rv1909_es")]
    counter.register("malformed", "misaligned", "empty_target", "empty_source", "other_split")
    ds = tf.data.Dataset.zip(sources.read_lines(source_files, batch_size=None),
                             sources.read_lines(target_files, batch_size=None))
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
    """(source, target) vocabularies built or learned on the training split."""
    if config.vocab_path:
        raise formats.InputError("--vocab is not supported by --task=translate (each side "
                                 "builds its own; use --vocab_size to learn subword vocabularies)")
    train = pairs(config, "train", tfseq.DropCounter("vocab"))
    return tuple(sources.build_vocab(config, train.map(lambda p, key=key: p[key]), key)
                 for key in COLUMNS)


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
        ds = pairs(config, split, counter)
        ds = ds.apply(tfseq.tokenize(source_vocab, tokenizer=config.tokenizer, key="source",
                                     lowercase=config.lowercase))
        ds = ds.apply(tfseq.tokenize(target_vocab, tokenizer=config.tokenizer, key="target",
                                     add_bos=True, add_eos=True, lowercase=config.lowercase))
        # The length is the max over source and target (which counts <s> and </s>).
        ds = ds.apply(sources.truncate_or_drop(config, counter, "target", config.max_length + 2))
        if config.long_examples == "truncate":
            ds = ds.apply(sources.truncate_or_drop(config, counter, "source", config.max_length,
                                                   min_length=0))
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
            "counters": counters, "stats": stats,
            "drop_examples": lambda: (sources.drop_examples(config, required=COLUMNS,
                                                            allowed=COLUMNS)
                                      if config.train_files else [])}
    return out["train"], out["eval"], info
