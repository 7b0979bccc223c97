"""Language modelling with truncated BPTT on the embedded corpus (or any TSV/text files).

Two ways to see the text (``mode``):

- ``"stream"``: the corpus is one long text (every line ends with ``</s>``); it is dealt into
  ``batch_size`` contiguous streams and cut into chunks of ``tbptt`` steps
  (``tfseq.tbptt_stream``). Every token but the first of the split is predicted exactly once
  per epoch.
- ``"sequences"``: every line is a sequence ``<s> w1 .. wn </s>``; lines are shuffled, padded
  into batches of ``batch_size`` and, with ``tbptt`` set, each batch is cut into chunks
  (``tfseq.tbptt_chunks``); with ``tbptt=None`` the model sees whole sequences (full BPTT).
  Long documents: ``join_chapters`` writes the corpus with one chapter per line.

Lines are ``book<TAB>chapter<TAB>verse<TAB>text`` (``text_field=3``) or plain text
(``text_field=None``). A line is held out for evaluation when a hash of its key (the fields
before the text, ``book chapter verse``, as in ``pipelines.lm``; the line itself for plain text)
falls in the first ``eval_percent`` of 100 buckets.

Element spec (train and eval, B = ``batch_size``, C = ``tbptt``; eval is always chunked, with
C = ``tbptt or eval_chunk_length``, so its perplexity is the exact whole-text one)::

    ({"ids":         int32 [B, C],
      "ids_length":  int32 [B],
      "resets":      bool  [B],
      "chunk_index": int64 [B]},
     int32 [B, C])                     # targets: the next token of each step

Full BPTT training batches are ``({"ids": [B, T], "ids_length": [B]}, [B, T])``.

Drop reasons (per split, ``info["counters"][split]``): ``malformed`` (no text field),
``other_split``, the ``filter_lines`` reasons, and ``too_long`` (``max_length``, sequences).
"""

from __future__ import annotations

import dataclasses
import gzip

import tensorflow as tf
import tensorflow_text as tf_text

import tfseq
from tfseq import formats, serving
from tfseq._common import identity
from tfseq.pipelines.replayed import ReplayedTask
from tfseq.replay import ReplayStream, epoch_shuffle
from tfseq.tbptt import CHUNK_INDEX, RESETS, tbptt_chunks, tbptt_stream
from tfseq.text import BOS_ID, EOS_ID

MODES = ("stream", "sequences")
FEATURES = ("ids", "ids_length", RESETS, CHUNK_INDEX)


@dataclasses.dataclass(frozen=True)
class Config:
    files: tuple[str, ...] = ()            # empty: the embedded English corpus
    text_field: int | None = 3             # TSV field with the text; None: the whole line
    vocab_path: str | None = None          # load this vocab instead of building one
    min_count: int = 2
    max_vocab: int = 8000
    lowercase: bool = True
    tokenizer: str = "whitespace"
    mode: str = "stream"
    tbptt: int | None = 64                 # chunk length; None: full BPTT ("sequences" only)
    carry_state: bool = True               # carry the RNN state across chunks (else zero)
    batch_size: int = 32                   # streams, or sequences per batch
    max_length: int | None = None          # "sequences": longer lines are dropped (counted)
    eval_chunk_length: int = 128           # eval chunks when tbptt is None
    max_train_tokens: int | None = None    # stop each training epoch after this many tokens
    eval_percent: int = 5
    shuffle_buffer: int = 10000            # "sequences": lines shuffled before batching
    seed: int = 0
    max_line_bytes: int = 1 << 20


def check_config(config: Config) -> None:
    """Raises ``ValueError`` naming the field for an inconsistent ``config``."""
    if config.mode not in MODES:
        raise ValueError(f"Unknown mode {config.mode!r}; expected one of {MODES}")
    if config.mode == "stream" and not config.tbptt:
        raise ValueError("mode='stream' needs a chunk length: set tbptt (full BPTT over a whole "
                         "corpus is not a thing); received tbptt=None")
    if config.tbptt is not None and config.tbptt <= 0:
        raise ValueError(f"tbptt must be positive or None; received tbptt={config.tbptt}")
    if not 0 <= config.eval_percent < 100:
        raise ValueError(f"eval_percent must be in [0, 100); received {config.eval_percent}")


def text(config: Config, split: str, counter: tfseq.DropCounter) -> tf.data.Dataset:
    """``{"text": tf.string}`` for one split, in file order, every drop counted."""
    files = list(config.files) or [tfseq.corpus_path("kjv_en")]
    counter.register("malformed", "other_split")
    want_eval = split == "eval"

    def parse(line):
        if config.text_field is None:
            return {"key": line, "text": line, "ok": tf.constant(True)}
        fields = tf.strings.split(line, "\t")
        ok = tf.size(fields) > config.text_field
        index = tf.minimum(config.text_field, tf.maximum(tf.size(fields) - 1, 0))
        text = tf.where(ok, tf.gather(tf.concat([fields, [""]], 0), index), "")
        key = (tf.strings.reduce_join(fields[:config.text_field], separator=" ")
               if config.text_field > 0 else line)
        return {"key": key, "text": text, "ok": ok}

    def keep(example):
        in_eval = formats.in_eval_split(example["key"], config.eval_percent)
        return counter.keep_if({"malformed": tf.logical_not(example["ok"]),
                                "other_split": tf.not_equal(in_eval, want_eval)})

    ds = tfseq.text_lines(files).apply(counter.tally("lines_read"))
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).filter(keep)
    ds = ds.map(lambda e: {"text": e["text"]})
    return ds.apply(tfseq.filter_lines(key="text", max_line_bytes=config.max_line_bytes,
                                       counter=counter))


def build_vocab(config: Config) -> tfseq.Vocab:
    """Loads ``config.vocab_path`` or builds a vocabulary from the training split."""
    if config.vocab_path:
        return tfseq.Vocab.load(config.vocab_path)
    texts = text(config, "train", tfseq.DropCounter("vocab")).map(lambda e: e["text"])
    if config.lowercase:
        texts = texts.map(tf_text.case_fold_utf8)
    return tfseq.Vocab.build(texts, tokenizer=config.tokenizer, min_count=config.min_count,
                             max_size=config.max_vocab)


def take_tokens(max_tokens: int | None, key: str = "ids"):
    """Transformation keeping whole elements until ``max_tokens`` real tokens have passed.

    The element that crosses the budget is kept, so at least ``max_tokens`` tokens pass when
    the data has them. ``None``: the identity. Elements are ``(features, targets)`` or dicts with
    ``key + "_length"``.
    """
    if max_tokens is None:
        return identity

    def apply(dataset):
        def step(before, element):
            features = element[0] if isinstance(element, tuple) else element
            tokens = tf.reduce_sum(tf.cast(features[key + "_length"], tf.int64))
            return before + tokens, (before, element)

        counted = dataset.scan(tf.constant(0, tf.int64), step)
        return counted.take_while(lambda before, element: before < max_tokens).map(
            lambda before, element: element)

    return apply


def _to_pairs(chunk):
    return {k: chunk[k] for k in FEATURES}, chunk["targets"]


def _shift(example):
    ids = example["ids"]
    return {"ids": ids[:-1], "targets": ids[1:]}


def _sequences(config: Config, split: str, vocab: tfseq.Vocab,
               counter: tfseq.DropCounter) -> tf.data.Dataset:
    """``"sequences"``: ``{"ids", "targets"}`` per kept line, in file order."""
    ds = text(config, split, counter)
    ds = ds.apply(tfseq.tokenize(vocab, tokenizer=config.tokenizer, key="text",
                                 lowercase=config.lowercase, add_bos=True, add_eos=True))
    ds = ds.map(lambda e: {"ids": e["text"]}).map(_shift)
    return ds.apply(tfseq.filter_by_length(min_length=1, max_length=config.max_length,
                                           counter=counter))


def _batches(config: Config, sequences: tf.data.Dataset, training: bool) -> tf.data.Dataset:
    """``"sequences"``: padded batches, cut into chunks (or whole, full BPTT training)."""
    chunk_length = config.tbptt or config.eval_chunk_length
    ds = sequences.apply(tfseq.pad_batch(config.batch_size, prefetch=False))
    if training:
        ds = ds.apply(take_tokens(config.max_train_tokens))
    if config.tbptt or not training:
        return ds.apply(tbptt_chunks(chunk_length)).map(_to_pairs)
    return ds.map(lambda b: ({"ids": b["ids"], "ids_length": b["ids_length"]}, b["targets"]))


def _stream_chunks(config: Config, split: str, vocab: tfseq.Vocab,
                   counter: tfseq.DropCounter) -> tf.data.Dataset:
    """``"stream"``: the split as ``batch_size`` contiguous streams cut into chunks."""
    ds = text(config, split, counter)
    ds = ds.apply(tfseq.tokenize(vocab, tokenizer=config.tokenizer, key="text",
                                 lowercase=config.lowercase, add_eos=True))
    ds = ds.map(lambda e: {"ids": e["text"]})
    ds = ds.apply(tbptt_stream(config.batch_size, config.tbptt or config.eval_chunk_length))
    ds = ds.map(_to_pairs)
    return ds.apply(take_tokens(config.max_train_tokens)) if split == "train" else ds


def _count(batch):
    """A batch's predicted tokens, cells (rows x steps) and rows."""
    features, _ = batch
    ids = features["ids"]
    return (tf.reduce_sum(tf.cast(features["ids_length"], tf.int64)), tf.size(ids),
            tf.shape(ids)[0])


def train_stream(config: Config, vocab: tfseq.Vocab,
                 counter: tfseq.DropCounter) -> ReplayStream:
    """The training batches as a ``tfseq.replay.ReplayStream``: an epoch rebuilt exactly from
    its number (``"stream"`` reads the corpus in order; ``"sequences"`` shuffles the lines with
    a seed of the epoch alone), so a resumed run skips to its step and the checkpoint holds no
    data state (the model's carried state caches are its own variables)."""
    if config.mode == "stream":
        chunks = _stream_chunks(config, "train", vocab, counter)
        return ReplayStream(lambda epoch: chunks, count=_count, seed=config.seed)
    sequences = _sequences(config, "train", vocab, counter)

    def epoch_batches(epoch):
        return _batches(config, epoch_shuffle(sequences, config.shuffle_buffer, config.seed,
                                              epoch), training=True)

    return ReplayStream(epoch_batches, count=_count, seed=config.seed)


def split_dataset(config: Config, split: str, vocab: tfseq.Vocab, counter: tfseq.DropCounter,
                  stats: tfseq.BatchStats | None = None) -> tf.data.Dataset:
    """The batches of one split (see the module docstring for the element spec); training
    batches draw a new epoch key per iteration (``train_stream`` replays a given epoch)."""
    if split == "train":
        ds = train_stream(config, vocab, counter).dataset()
    elif config.mode == "stream":
        ds = _stream_chunks(config, split, vocab, counter)
    else:
        ds = _batches(config, _sequences(config, split, vocab, counter), training=False)
    if stats is not None:
        ds = ds.apply(stats.track(["ids"]))
    return ds.prefetch(tf.data.AUTOTUNE)



class ServedStreamLM(serving.Served):
    """``text`` -> ``log_likelihood`` float32 [B] (natural log) and ``tokens`` int32 [B], from
    the zero state: ``"sequences"`` scores ``w1 .. wn </s>`` after ``<s>``, as it trained;
    ``"stream"`` scores them after ``</s>`` (a line follows the end of another in the stream).
    """

    def __init__(self, model, encoder: serving.TextEncoder, start_id: int):
        super().__init__(encoder, "truncate")
        self.weights = list(model.variables)  # tracked; the model itself is not (see ctr's)
        self.run = lambda features: model.run(features)[0]
        self.start_id = start_id

    def _predict(self, ids, lengths):
        rows = tf.shape(ids)[0]
        inputs = tf.concat([tf.fill([rows, 1], self.start_id), ids], axis=1)[:, :-1]
        inputs = serving.at_least_one_step(inputs)
        logits = self.run({"ids": inputs, "ids_length": lengths})
        targets = serving.at_least_one_step(ids)
        scores = tf.gather(tf.nn.log_softmax(logits, axis=-1), targets, batch_dims=2)
        real = tf.range(tf.shape(targets)[1])[None, :] < lengths[:, None]
        return {"log_likelihood": tf.reduce_sum(tf.where(real, scores, 0.0), axis=1),
                "tokens": lengths}


def serving_module(config: Config, info: dict, model, asset_dir: str):
    """``(ServedStreamLM, serving.json fields)`` for an export of a trained model."""
    encoder = serving.TextEncoder(info["vocab"], asset_dir, tokenizer=config.tokenizer,
                                  lowercase=config.lowercase, add_eos=True)
    start = BOS_ID if config.mode == "sequences" else EOS_ID
    return ServedStreamLM(model, encoder, start), {
        "input": "text", "outputs": ["log_likelihood", "tokens"], "mode": config.mode,
        "text_field": config.text_field}


class StreamLMTask(ReplayedTask):
    """``--task=lm --tbptt=N``: a stateful language model trained by truncated BPTT.

    ``"stream"`` reads the corpus in order every epoch; ``"sequences"`` shuffles the lines
    with a seed of the epoch alone: an epoch is rebuilt exactly from its number. Its streams
    carry their state from chunk to chunk on one device, so it trains on one replica.
    ``info`` (``learn``): ``vocab``, ``vocab_size``.
    """

    name = "lm_tbptt"
    Config = Config
    model_module = "tfseq.models.stateful_lm"
    modes = ("single",)
    tracked = ("ids",)  # TaskData.stats: real tokens = predicted tokens

    def check(self, config):
        check_config(config)

    def learn(self, config):
        check_config(config)
        vocab = build_vocab(config)
        return {"vocab": vocab, "vocab_size": vocab.size, "passes": 0 if config.vocab_path else 1}

    def input_files(self, config):
        files = super().input_files(config)
        return files or [tfseq.corpus_path("kjv_en")]

    def replay(self, config, info, counter):
        return train_stream(config, info["vocab"], counter)

    def held_out(self, config, info, counter):
        return split_dataset(config, "eval", info["vocab"], counter)

    def serving_module(self, config, info, model, asset_dir):
        return serving_module(config, info, model, asset_dir)

    def prediction_inputs(self, info, paths):
        """A line's text (its ``text_field`` of a TSV line, as it trained), ``tf.string
        [n]`` batches in file order."""
        lines = tfseq.text_lines(paths)
        field = info.get("text_field")
        if field is not None:
            def text_of(line):
                fields = tf.strings.split(line, "\t")
                return tf.gather(tf.concat([fields, [""]], 0), tf.minimum(field, tf.size(fields)))

            lines = lines.map(text_of)
        return lines.batch(512)

    def prediction_line(self, row):
        return f"{float(row['log_likelihood']):.6f}\t{int(row['tokens'])}"


TASK = StreamLMTask()


def join_chapters(src: str, dst: str) -> tuple[int, int]:
    """Writes the verses of ``src`` (TSV, gzip or not) as one line per book+chapter to ``dst``.

    Each output line is ``book<TAB>chapter<TAB>0<TAB>verse texts joined by spaces``, so the
    default ``text_field=3`` reads it. Consecutive verses with the same book and chapter are
    joined, in file order. A one-off file preparation step (plain Python, not the data path).

    Returns:
      ``(chapters written, malformed lines skipped)``.
    """
    opener = gzip.open if src.endswith(".gz") else open
    chapters, skipped, current, texts = 0, 0, None, []
    with opener(src, "rt", encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as out:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 4:
                skipped += 1
                continue
            key = (fields[0], fields[1])
            if key != current and texts:
                out.write(f"{current[0]}\t{current[1]}\t0\t{' '.join(texts)}\n")
                chapters += 1
                texts = []
            current = key
            texts.append(fields[3])
        if texts:
            out.write(f"{current[0]}\t{current[1]}\t0\t{' '.join(texts)}\n")
            chapters += 1
    return chapters, skipped
