"""Next-token language modelling: one example per line of the user's text files
(``--train_files``, ``--format=text``, or a ``text`` column of TSV/CSV), or, by default, the
verses of one side of the embedded corpus (English).

Each line becomes ``<s> w1 .. wn </s>``; the model reads ``<s> w1 .. wn`` and predicts
``w1 .. wn </s>``. Without ``eval_files`` a line is held out for evaluation by a stable hash
(of the line; of ``book chapter verse`` for the verse corpus).

Element spec of both datasets (padded batches)::

    ({"ids": int32 [B, T], "ids_length": int32 [B]},   # <s> w1 .. wn, padded with 0
     int32 [B, T],                                      # w1 .. wn </s>, padded with 0
     float32 [B, T])                                    # loss weight: 1 real target, 0 pad

Drop reasons (per split in ``info["counters"][split]``): the source's (``malformed``,
``invalid_utf8``, ``empty_text``, ``other_split``), the ``filter_lines`` reasons (``empty``
...) and ``too_short``/``too_long`` (``long_examples="truncate"``: cut, counted ``truncated``).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

import tfseq
from pipelines import sources, verses

BATCHING_MODES = ("pad", "bucket", "pack")
COLUMNS = ("text",)


@dataclasses.dataclass(frozen=True)
class Config:
    train_files: tuple[str, ...] = ()      # user files (globs, .gz); empty: the verse corpus
    eval_files: tuple[str, ...] = ()       # empty: hold out eval_percent of train_files
    format: str | None = None              # "text" | "tsv" | "csv"; None: from the extension
    columns: tuple[str, ...] = ()          # for tsv/csv: field names, one must be "text"
    header: bool = False                   # skip each file's first line
    files: tuple[str, ...] = ()            # verse-format files; empty: the embedded corpus
    corpus: str = "kjv_en"                 # "kjv_en" or "rv1909_es"
    max_lines: int = 6000                  # verse corpus: read only the first N lines (0: all)
    vocab_path: str | None = None          # load this vocab (or SentencePiece .model)
    vocab_size: int | None = None          # learn a wordpiece/sentencepiece vocab of this size
    vocab_max_lines: int = 1_000_000       # lines read to learn a vocabulary
    long_examples: str = "drop"            # "drop" (counted too_long) or "truncate"
    min_count: int = 2
    max_vocab: int = 3000
    lowercase: bool = True
    tokenizer: str = "whitespace"
    max_length: int = 48                   # tokens, not counting <s> and </s>
    batching: str = "pad"
    batch_size: int = 32                   # for batching="pad"
    # Budget for batching="bucket" / "pack": ~950-1,010 real tokens per step, about the 871 of
    # the default pad batch (32 rows x ~45 padded). With 2048 they took half pad's steps per
    # epoch and trailed it; with 1024 both end below pad:32's held-out loss and bucket reaches
    # it in 0.46x its CPU time (scripts/bench_convergence.py, README "Time to accuracy").
    max_tokens: int = 1024
    # Row lengths for batching="pack": each example goes into the shortest rows that hold it
    # (tfseq.pack), so the recurrent model steps through 32 tokens, not 128, for most batches.
    # One int: rows of that length, longer examples split across batches.
    block_length: int | tuple[int, ...] = (32, 64, 128)
    eval_percent: int = 5
    shuffle_buffer: int = 10000
    seed: int = 0
    max_line_bytes: int = 1 << 16


def texts(config: Config, split: str, counter: tfseq.DropCounter,
          shuffle_lines: bool = False) -> tf.data.Dataset:
    """``tf.string [n]`` batches of the texts of one split (``"train"``, ``"eval"``), every
    drop counted: the user's files, or the verse corpus. ``shuffle_lines``: globally
    shuffled lines, a new order every epoch (not with ``max_lines``, which takes the first
    lines)."""
    if not sources.has_user_files(config):
        return verse_text(config, split, counter, shuffle_lines=shuffle_lines)
    ds = sources.user_rows(config, split, counter, required=COLUMNS, allowed=COLUMNS,
                           **({"shuffle_lines": True, "seed": config.seed}
                              if shuffle_lines else {}))
    return ds.map(lambda r: r["text"]).apply(
        tfseq.filter_lines(max_line_bytes=config.max_line_bytes, counter=counter))


def verse_text(config: Config, split: str, counter: tfseq.DropCounter,
               shuffle_lines: bool = False) -> tf.data.Dataset:
    """``tf.string [n]`` batches of the verse texts of one split (``"train"``, ``"eval"``),
    every drop counted; vectorized, one tf.data call per batch of lines."""
    files = list(config.files) or [tfseq.corpus_path(config.corpus)]
    counter.register("malformed", "other_split")
    if config.max_lines:  # exact: the first max_lines lines, then batched
        ds = sources.read_lines(files, batch_size=None).take(config.max_lines).batch(
            verses.READ_BATCH)
    elif shuffle_lines:
        ds = sources.read_lines(files, batch_size=verses.READ_BATCH, shuffle_lines=True,
                                seed=config.seed)
    else:
        ds = sources.read_lines(files, batch_size=verses.READ_BATCH)
    ds = ds.apply(counter.tally("lines_read", rows=True))
    want_eval = split == "eval"

    def parse_and_keep(lines):
        example = verses.parse(lines)
        keep = counter.keep_if({
            "malformed": tf.logical_not(example["ok"]),
            "other_split": tf.not_equal(verses.in_eval_split(example["key"], config.eval_percent),
                                        want_eval),
        })
        return tf.boolean_mask(example["text"], keep)

    ds = ds.map(parse_and_keep, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.apply(tfseq.filter_lines(max_line_bytes=config.max_line_bytes, counter=counter))


def build_vocab(config: Config) -> tfseq.Vocab:
    """The vocabulary: loaded from ``config.vocab_path`` or built on the training split."""
    return sources.build_vocab(config, texts(config, "train", tfseq.DropCounter("vocab")))


def packed_to_model(batch):
    """A packed batch -> ``({"ids", "ids_segment_ids", "ids_resets" (int32 0/1)}, targets,
    weights)``, all ``[B, L]``: next-token targets that never cross a segment boundary
    (``tfseq.lm_targets``)."""
    features, targets, weights = tfseq.lm_targets(batch)
    return ({"ids": features["ids"], "ids_segment_ids": features["ids_segment_ids"],
             "ids_resets": tf.cast(features["ids_resets"], tf.int32)}, targets, weights)


def datasets(config: Config = Config(), counters: dict | None = None):
    """Builds the train and eval datasets for ``model.fit``.

    Returns:
      ``(train_ds, eval_ds, info)``; ``info`` has ``vocab``, ``counters``
      (``{"train": DropCounter, "eval": DropCounter}``) and ``stats`` (``BatchStats`` per split).

    Raises:
      ValueError: unknown ``config.batching``, or several ``block_length`` whose longest is
        shorter than an example may be (``max_length + 2``).
    """
    if config.batching not in BATCHING_MODES:
        raise ValueError(f"Unknown batching {config.batching!r} for the lm task; expected one "
                         f"of {BATCHING_MODES}")
    if (config.batching == "pack" and not isinstance(config.block_length, int)
            and max(config.block_length) < config.max_length + 2):
        raise ValueError(f"block_length={config.block_length}: the longest row is shorter than "
                         f"an example may be (max_length + 2 = {config.max_length + 2} tokens "
                         "with <s> and </s>); add a longer row or give one int (split rows)")
    counters = counters or {"train": tfseq.DropCounter("train"), "eval": tfseq.DropCounter("eval")}
    vocab = build_vocab(config)
    stats = {"train": tfseq.BatchStats(), "eval": tfseq.BatchStats()}
    out = {}
    for split in ("train", "eval"):
        training = split == "train"
        counter = counters[split]
        # Training lines come globally shuffled, a new order every epoch (then not cached);
        # with max_lines (the first lines of the corpus) the batches are shuffled instead.
        shuffled = training and (sources.has_user_files(config) or not config.max_lines)
        ds = texts(config, split, counter, shuffle_lines=shuffled)
        ds = ds.apply(tfseq.tokenize(vocab, tokenizer=config.tokenizer, add_bos=True,
                                     add_eos=True, lowercase=config.lowercase))
        # Lengths count <s> and </s>: 1..max_length words.
        ds = ds.apply(sources.truncate_or_drop(config, counter, "ids", config.max_length + 2,
                                               min_length=3))
        if not shuffled:
            ds = ds.cache()
        if training and not shuffled:  # whole ragged batches; pools shuffle inside too
            ds = ds.shuffle(-(-config.shuffle_buffer // verses.READ_BATCH), seed=config.seed,
                            reshuffle_each_iteration=True)
        if config.batching == "pack":
            if training and not shuffled:
                # The first max_lines lines, cached in corpus order: shuffle the examples (as
                # "pad" does), not only whole batches of lines, or a packed batch holds
                # neighbouring verses (scripts/bench_convergence.py, 2,000 lines, 3 seeds: the
                # held-out loss is 0.035-0.047 lower after each of 4 epochs with this shuffle).
                ds = tfseq.unbatch(ds).shuffle(
                    config.shuffle_buffer, seed=config.seed, reshuffle_each_iteration=True
                ).ragged_batch(verses.READ_BATCH)
            several = not isinstance(config.block_length, int)
            ds = ds.apply(tfseq.pack(config.block_length, max_tokens=config.max_tokens,
                                     long_examples="truncate" if several else "split",
                                     seed=config.seed if training else None, counter=counter))
            out[split] = (ds.apply(stats[split].track(["ids"])).map(packed_to_model)
                          .prefetch(tf.data.AUTOTUNE))
            continue
        ds = verses.batch(ds, config, training=training)
        ds = ds.apply(stats[split].track(["ids"]))

        def to_model(batch):
            inputs, lengths, targets, weights = verses.shift_targets(batch["ids"],
                                                                     batch["ids_length"])
            return {"ids": inputs, "ids_length": lengths}, targets, weights

        out[split] = ds.map(to_model).prefetch(tf.data.AUTOTUNE)
    out = {k: v.with_options(tfseq.pipeline_options()) for k, v in out.items()}
    info = {"vocab": vocab, "counters": counters, "stats": stats,
            # training lines are read (shuffled) every epoch, or cached after the first
            "reread_each_epoch": sources.has_user_files(config) or not config.max_lines,
            "drop_examples": lambda: sources.drop_examples(config, required=COLUMNS,
                                                           allowed=COLUMNS)}
    return out["train"], out["eval"], info
