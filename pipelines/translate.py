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

Element spec of both datasets (``batching="pad"`` or ``"bucket"``; the eval dataset in every
mode)::

    ({"source": int32 [B, S], "source_length": int32 [B],        # English ids, 0-padded
      "target_in": int32 [B, T], "target_in_length": int32 [B]},  # <s> w1 .. wn
     int32 [B, T],                                                # w1 .. wn </s>
     float32 [B, T])                                              # loss weight, 0 on padding

With ``batching="pack"`` training batches are packed rows (``tfseq.pack`` over the three
sequence features ``source``, ``target_in`` and ``targets`` together, ``block_length`` each), so
segment k of a source row and segment k of the same row of ``target_in``/``targets`` are one
pair::

    ({"source": int32 [B, L], "source_segment_ids": int32 [B, L],
      "target_in": int32 [B, L], "target_in_segment_ids": int32 [B, L]},
     int32 [B, L],                                                # targets, 0 on padding
     float32 [B, L])                                              # 1 on real target tokens

    source                 5  6  7  8  9  0      target_in   2 11 12  2 13  0
    source_segment_ids     1  1  2  2  2  0      targets    11 12  3 13  3  0
    target_in_segment_ids  1  1  1  2  2  0      weights     1  1  1  1  1  0

Held-out batches stay padded (bucketed) in every mode: the eval numbers of a pad and a pack run
are computed the same way, and ``models.translate.decode_examples`` reads padded sources.

Training pairs are read in a global line-pair shuffle, a new order every epoch
(``tfseq.shuffling.shard_shuffle`` over the aligned pairs, or ``text_lines(shuffle_lines=True)``
for a TSV/CSV of pairs; ``shuffle_lines=False`` reads in file order, caches and shuffles
batches); the training counters then count every epoch's lines (``info["reread_each_epoch"]``).

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

BATCHING_MODES = ("pad", "bucket", "pack")
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
    vocab_path: str | None = None          # one vocabulary for both sides (else one per side)
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
    max_tokens: int = 2048                 # budget for batching="bucket" / "pack"
    block_length: int = 64                 # row length per feature for batching="pack"
    eval_percent: int = 5
    shuffle_buffer: int = 10000
    seed: int = 0
    max_line_bytes: int = 1 << 16
    shuffle_lines: bool = True             # training: global line-pair shuffle every epoch
    shuffle_shard_bytes: int = 64 << 20    # memory bound of the line shuffle (text per shard)


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


def _shuffled_pairs(make_pairs, files: list[str], config: Config) -> tf.data.Dataset:
    """Line-pair batches ``(tf.string [n], tf.string [n])`` from ``make_pairs`` (a deterministic
    ``() -> Dataset`` of such batches), globally shuffled, a new order every epoch.

    Each pair travels as one string ``source + "\\n" + target`` (a line never holds ``\\n``)
    through ``tfseq.shuffling.shard_shuffle``, so both sides move together."""
    from tfseq import shuffling

    kinds = ["GZIP" if f.endswith(".gz") else "" for f in files]
    joined = shuffling.shard_shuffle(
        lambda: make_pairs().map(lambda s, t: s + "\n" + t),
        batch_size=verses.READ_BATCH, seed=config.seed,
        num_shards=shuffling.num_shuffle_shards(files, kinds, config.shuffle_shard_bytes))

    def split(lines):
        parts = tf.strings.split(lines, "\n", maxsplit=1).to_tensor("", shape=[None, 2])
        return parts[:, 0], parts[:, 1]

    return joined.map(split, num_parallel_calls=tf.data.AUTOTUNE)


def user_pairs(config: Config, split: str, counter: tfseq.DropCounter,
               shuffle_lines: bool = False) -> tf.data.Dataset:
    """Batches ``{"source": tf.string [n], "target": tf.string [n]}`` of one split of the user's
    pairs, every drop counted (see ``tfseq.formats``); ``shuffle_lines``: globally shuffled
    pairs, a new order every epoch."""
    if config.train_files and not config.source_files and not config.target_files:
        read = ({"shuffle_lines": True, "seed": config.seed,
                 "shuffle_shard_bytes": config.shuffle_shard_bytes} if shuffle_lines else {})
        ds = sources.user_rows(config, split, counter, required=COLUMNS, allowed=COLUMNS, **read)
    else:
        counter.register("malformed", "invalid_utf8", "empty_text", "other_split")
        files = aligned_files(config)

        def make_pairs():
            parts = [tf.data.Dataset.zip(sources.read_lines([s]), sources.read_lines([t]))
                     for s, t in files]
            ds = parts[0]
            for more in parts[1:]:
                ds = ds.concatenate(more)
            return ds

        ds = (_shuffled_pairs(make_pairs, [f for pair in files for f in pair], config)
              if shuffle_lines else make_pairs())
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


def pairs(config: Config, split: str, counter: tfseq.DropCounter,
          shuffle_lines: bool = False) -> tf.data.Dataset:
    """The pairs of one split: the user's, or the verse corpus'; ``shuffle_lines``: globally
    shuffled, a new order every epoch."""
    if config.train_files or config.source_files or config.target_files:
        return user_pairs(config, split, counter, shuffle_lines=shuffle_lines)
    return verse_pairs(config, split, counter, shuffle_lines=shuffle_lines)


def verse_pairs(config: Config, split: str, counter: tfseq.DropCounter,
                shuffle_lines: bool = False) -> tf.data.Dataset:
    """Batches ``{"source": tf.string [n], "target": tf.string [n]}`` of one split's pairs,
    every drop counted; vectorized, one tf.data call per batch of line pairs.
    ``shuffle_lines``: the (first ``max_lines``) pairs globally shuffled, every epoch anew."""
    source_files = [tfseq.corpus_path("kjv_en")]
    target_files = [tfseq.corpus_path("rv1909_es")]
    counter.register("malformed", "misaligned", "empty_target", "empty_source", "other_split")

    def make_pairs():
        ds = tf.data.Dataset.zip(sources.read_lines(source_files, batch_size=None),
                                 sources.read_lines(target_files, batch_size=None))
        if config.max_lines:
            ds = ds.take(config.max_lines)
        return ds.batch(verses.READ_BATCH)  # zipped line by line (the files may differ)

    ds = (_shuffled_pairs(make_pairs, source_files + target_files, config)
          if shuffle_lines else make_pairs())
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
    """(source, target) vocabularies: one loaded from ``config.vocab_path`` and shared by both
    sides (e.g. a joint SentencePiece model), or each built or learned on its side of the
    training split."""
    if config.vocab_path:
        vocab = sources.build_vocab(config, None)
        return vocab, vocab
    train = pairs(config, "train", tfseq.DropCounter("vocab"))
    return tuple(sources.build_vocab(config, train.map(lambda p, key=key: p[key]), key)
                 for key in COLUMNS)


def _shift(batch):
    """Ragged batch ``{"source", "target": <s> w1 .. wn </s>}`` -> ``{"source", "target_in":
    <s> w1 .. wn, "targets": w1 .. wn </s>}`` (int32 ``[n, (T)]``), for packing."""
    return {"source": batch["source"], "target_in": batch["target"][:, :-1],
            "targets": batch["target"][:, 1:]}


def packed_to_model(batch):
    """A packed batch of ``_shift``ed pairs -> ``(features, targets, weights)`` as in the
    module docstring (targets share the rows and segment ids of ``target_in``)."""
    features = {"source": batch["source"], "source_segment_ids": batch["source_segment_ids"],
                "target_in": batch["target_in"],
                "target_in_segment_ids": batch["target_in_segment_ids"]}
    targets = batch["targets"]
    return features, targets, tf.cast(tf.not_equal(targets, 0), tf.float32)


def padded_to_model(batch):
    """A padded batch ``{"source", "source_length", "target", "target_length"}`` ->
    ``(features, targets, weights)`` as in the module docstring (teacher forcing)."""
    inputs, lengths, targets, weights = verses.shift_targets(batch["target"],
                                                             batch["target_length"])
    features = {"source": batch["source"], "source_length": batch["source_length"],
                "target_in": inputs, "target_in_length": lengths}
    return features, targets, weights


def datasets(config: Config = Config(), counters: dict | None = None):
    """Builds the train and eval datasets for ``model.fit``.

    Returns:
      ``(train_ds, eval_ds, info)``; ``info`` has ``source_vocab``, ``target_vocab``,
      ``counters`` (``{"train": DropCounter, "eval": DropCounter}``), ``stats`` and
      ``reread_each_epoch`` (training pairs are read, shuffled, every epoch).

    Raises:
      ValueError: unknown ``config.batching``, or a ``block_length`` that is not one int or
        is shorter than an example may be (``max_length + 2``).
    """
    if config.batching not in BATCHING_MODES:
        raise ValueError(f"Unknown batching {config.batching!r} for the translate task; "
                         f"expected one of {BATCHING_MODES}")
    if config.batching == "pack" and not isinstance(config.block_length, int):
        raise ValueError(f"block_length={config.block_length!r}: translate packs source and "
                         "target rows together, of one length (give one int)")
    if config.batching == "pack" and config.block_length < config.max_length + 2:
        raise ValueError(f"block_length={config.block_length} is shorter than the longest pair "
                         f"(max_length + 2 = {config.max_length + 2} tokens with <s> and </s>)")
    counters = counters or {"train": tfseq.DropCounter("train"), "eval": tfseq.DropCounter("eval")}
    source_vocab, target_vocab = build_vocabs(config)
    stats = {"train": tfseq.BatchStats(), "eval": tfseq.BatchStats()}
    out = {}
    for split in ("train", "eval"):
        training = split == "train"
        counter = counters[split]
        shuffled = training and config.shuffle_lines
        ds = pairs(config, split, counter, shuffle_lines=shuffled)
        ds = ds.apply(tfseq.tokenize(source_vocab, tokenizer=config.tokenizer, key="source",
                                     lowercase=config.lowercase))
        ds = ds.apply(tfseq.tokenize(target_vocab, tokenizer=config.tokenizer, key="target",
                                     add_bos=True, add_eos=True, lowercase=config.lowercase))
        # The length is the max over source and target (which counts <s> and </s>).
        ds = ds.apply(sources.truncate_or_drop(config, counter, "target", config.max_length + 2))
        if config.long_examples == "truncate":
            ds = ds.apply(sources.truncate_or_drop(config, counter, "source", config.max_length,
                                                   min_length=0))
        if not shuffled:
            ds = ds.cache()
        if training and not shuffled:  # whole ragged batches; bucketing also shuffles inside
            # pools, and verses.batch shuffles examples for batching="pad"
            ds = ds.shuffle(-(-config.shuffle_buffer // verses.READ_BATCH), seed=config.seed,
                            reshuffle_each_iteration=True)
        if training and config.batching == "pack":
            ds = ds.map(_shift).apply(tfseq.pack(
                config.block_length, max_tokens=config.max_tokens, long_examples="drop",
                seed=config.seed, counter=counter))
            ds = ds.apply(stats[split].track(["source", "targets"]))
            out[split] = ds.map(packed_to_model).prefetch(tf.data.AUTOTUNE)
            continue
        batching = config if config.batching != "pack" else dataclasses.replace(
            config, batching="bucket")
        ds = verses.batch(ds, batching, training=training)
        ds = ds.apply(stats[split].track(["source", "target"]))
        out[split] = ds.map(padded_to_model).prefetch(tf.data.AUTOTUNE)
    out = {k: v.with_options(tfseq.pipeline_options()) for k, v in out.items()}
    info = {"source_vocab": source_vocab, "target_vocab": target_vocab, "vocab": target_vocab,
            "bos_id": BOS_ID, "eos_id": EOS_ID, "max_length": config.max_length + 1,
            "counters": counters, "stats": stats,
            # training pairs are read (shuffled) every epoch, or cached after the first
            "reread_each_epoch": config.shuffle_lines,
            "drop_examples": lambda: (sources.drop_examples(config, required=COLUMNS,
                                                            allowed=COLUMNS)
                                      if config.train_files else [])}
    return out["train"], out["eval"], info
