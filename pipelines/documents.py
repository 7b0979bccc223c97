"""Documents of sentences of words: the nested-sequence (LoD level 2) classification task.

Sources:

* document files: plain text where each line is a sentence and a blank line (or the end of the
  file) ends a document. With ``labelled=True`` (the pipeline's format) the first line of each
  document is its class name::

      Law                                   <- label line of document 1
      In the beginning God created ...      <- sentence 1
      And the earth was without form ...    <- sentence 2
                                            <- blank line: end of document 1
      Revelation                            <- label line of document 2
      ...

* the embedded corpus (default): verses grouped by book and chapter into documents (1,189
  chapters), labelled by the book's section of the canon (7 classes). ``write_documents``
  writes it in the file format above.

Grouping lines into documents is a ``Dataset.scan`` over each file's lines (consecutive lines
with the same key form a document), so files stream through the graph and are never loaded
whole.

Element spec of both datasets (B documents, S sentences, W words; id 0 is padding, never used)::

    ({"ids": int32 RaggedTensor [B, (S), (W)]}, int32 [B])

Counting (``info["counters"][split]``): ``seen()["lines_read"]`` and ``seen()["documents"]``;
line drops ``malformed`` (corpus lines without 4 TSV fields), ``unknown_book``; document drops
``unknown_label`` (files), ``other_split``, ``too_many_sentences``, ``too_long_sentence``.
For one pass: documents == emitted + document drops.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import os

import tensorflow as tf
import tensorflow_text as tf_text

import tfseq
from tfseq import formats, serving
from tfseq._common import check_positive_int
from tfseq.corpus import BOOK_TO_SECTION, SECTION_NAMES
from tfseq.reading import resolve_files, verify_gzip
from tfseq.pipelines.replayed import ReplayedTask
from tfseq.replay import ReplayStream, epoch_shuffle
from tfseq.stats import resolve_counter
from tfseq.text import get_tokenizer

_END_KEY = "\x00end"


@dataclasses.dataclass(frozen=True)
class Config:
    files: tuple[str, ...] = ()            # labelled document files; empty: the embedded corpus
    class_names: tuple[str, ...] = SECTION_NAMES
    vocab_path: str | None = None          # load this vocab instead of building one
    min_count: int = 2
    max_vocab: int = 8000
    lowercase: bool = True
    max_sentences: int | None = None       # longer documents are dropped (counted)
    max_words: int | None = None           # documents with a longer sentence are dropped
    batch_size: int = 16                   # documents per batch
    eval_percent: int = 10
    shuffle_buffer: int = 2000
    seed: int = 0
    num_parallel_reads: int | None = None


def group_runs(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``(key, text)`` scalars -> ``(key, texts [(S)])``, one per run of consecutive equal keys.

    Runs in the graph with ``Dataset.scan``; the last run is flushed by an end marker.

    Example (keys / texts in, runs out)::

        "a" "x"   "a" "y"   "b" "z"   ->   ("a", ["x", "y"])   ("b", ["z"])
    """
    end = tf.data.Dataset.from_tensors((tf.constant(_END_KEY), tf.constant("")))

    def step(state, element):
        current, texts = state
        key, text = element
        flush = tf.logical_and(tf.not_equal(key, current), tf.size(texts) > 0)
        kept = texts[:tf.where(flush, 0, tf.size(texts))]
        return (key, tf.concat([kept, tf.reshape(text, [1])], 0)), (flush, current, texts)

    def flushed(flush, key, texts):
        return flush

    def run(flush, key, texts):
        return key, texts

    initial = (tf.constant(_END_KEY), tf.zeros([0], tf.string))
    return dataset.concatenate(end).scan(initial, step).filter(flushed).map(run)


def read_documents(patterns, *, num_parallel_reads: int | None = None,
                   counter: tfseq.DropCounter | None = None) -> tf.data.Dataset:
    """Documents of blank-line-separated text files.

    Lines are stripped of surrounding whitespace (``\\r`` included); a line that is then empty
    ends the current document; several blank lines in a row end it once.

    Args:
      patterns: a path or glob, or a list of them (gzip when the name ends in ``.gz``).
      num_parallel_reads: files read at once, documents interleaved (default: all, at most 16).
      counter: ``DropCounter`` whose ``seen()`` gets ``lines_read`` (default: the process one).

    Returns:
      Dataset of ``{"key": tf.string "<file>:<line>" (the 1-based line number of the
      document's first line), "sentences": tf.string [(S)]}``, S >= 1.

    Raises:
      FileNotFoundError: a pattern matches nothing. ValueError: a truncated gzip file.
    """
    check_positive_int("num_parallel_reads", num_parallel_reads, allow_none=True)
    counter = resolve_counter(counter)
    files = resolve_files(patterns)
    kinds = ["GZIP" if f.endswith(".gz") else "" for f in files]
    for path, kind in zip(files, kinds):
        if kind:
            verify_gzip(path)
    lines_read = counter.tally("lines_read")

    def one_file(path, kind):
        lines = tf.data.TextLineDataset(path, compression_type=kind).apply(lines_read)
        lines = lines.map(lambda line: tf.strings.strip(tf.strings.regex_replace(line, "^\ufeff", "")))

        def number(state, line):
            line_number, start = state
            line_number += 1
            blank = tf.equal(line, "")
            start = tf.where(blank, tf.constant(0, tf.int64),
                             tf.where(tf.equal(start, 0), line_number, start))
            return (line_number, start), (start, line, blank)

        zero = tf.constant(0, tf.int64)
        numbered = lines.scan((zero, zero), number)
        numbered = numbered.filter(lambda start, line, blank: tf.logical_not(blank))
        keyed = numbered.map(lambda start, line, blank: (
            tf.strings.join([path, ":", tf.strings.as_string(start)]), line))
        return group_runs(keyed)

    cycle = num_parallel_reads or min(len(files), 16)
    docs = tf.data.Dataset.from_tensor_slices((files, kinds)).interleave(
        one_file, cycle_length=cycle, num_parallel_calls=cycle if cycle > 1 else None)
    return docs.map(lambda key, sentences: {"key": key, "sentences": sentences})


def _parse_verse(line):
    fields = tf.strings.split(line, "\t")
    ok = tf.equal(tf.size(fields), 4)
    fields = tf.pad(fields, [[0, tf.maximum(0, 4 - tf.size(fields))]])
    return {"key": tf.strings.join([fields[0], " ", fields[1]]), "book": fields[0],
            "text": fields[3], "ok": ok}


def _table(keys, values, default=-1):
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(keys), tf.constant(values, tf.int32)),
        default_value=default)


def corpus_documents(path: str | None = None,
                     counter: tfseq.DropCounter | None = None) -> tf.data.Dataset:
    """Chapters of the embedded corpus as labelled documents of verses.

    Args:
      path: a ``book<TAB>chapter<TAB>verse<TAB>text`` file (default: the English corpus).
      counter: counts ``lines_read`` and the line drops ``malformed``, ``unknown_book``.

    Returns:
      Dataset of ``{"key": "Gen 1", "sentences": tf.string [(S)], "label": int32}`` in corpus
      order; the label indexes ``SECTION_NAMES``.
    """
    counter = resolve_counter(counter)
    counter.register("malformed", "unknown_book")
    books = sorted(BOOK_TO_SECTION)
    sections = _table(books, [BOOK_TO_SECTION[b] for b in books])
    verses = tfseq.text_lines(path or tfseq.corpus_path("kjv_en"))
    verses = verses.apply(counter.tally("lines_read")).map(_parse_verse)
    verses = verses.filter(lambda v: counter.keep_if({
        "malformed": tf.logical_not(v["ok"]),
        "unknown_book": sections.lookup(v["book"]) < 0,
    }))
    chapters = group_runs(verses.map(lambda v: (v["key"], tf.strings.strip(v["text"]))))

    def label(key, sentences):
        book = tf.strings.split(key, " ")[0]
        return {"key": key, "sentences": sentences, "label": sections.lookup(book)}

    return chapters.map(label)


def write_documents(path: str, corpus_path: str | None = None) -> int:
    """Writes the corpus chapters as a labelled document file (the format of this module).

    Each document is its section name, then one verse per line, then a blank line.

    Args:
      path: output file (``.gz`` for gzip).
      corpus_path: the TSV corpus (default: the embedded English corpus).

    Returns:
      The number of documents written.
    """
    corpus_path = corpus_path or tfseq.corpus_path("kjv_en")
    chapters: dict[tuple[str, str], list[str]] = collections.OrderedDict()
    with gzip.open(corpus_path, "rt", encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) == 4 and fields[0] in BOOK_TO_SECTION and fields[3].strip():
                chapters.setdefault((fields[0], fields[1]), []).append(fields[3].strip())
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as out:
        for (book, _), verses in chapters.items():
            out.write(SECTION_NAMES[BOOK_TO_SECTION[book]] + "\n")
            out.write("\n".join(verses) + "\n\n")
    return len(chapters)


def labelled_documents(config: Config, counter: tfseq.DropCounter) -> tf.data.Dataset:
    """``{"key", "sentences", "label"}`` from ``config.files`` (label line first) or the corpus."""
    if not config.files:
        return corpus_documents(counter=counter).apply(counter.tally("documents"))
    counter.register("unknown_label")
    names = _table(list(config.class_names), list(range(len(config.class_names))))
    docs = read_documents(list(config.files), num_parallel_reads=config.num_parallel_reads,
                          counter=counter).apply(counter.tally("documents"))
    docs = docs.map(lambda d: {"key": d["key"], "sentences": d["sentences"][1:],
                               "label": names.lookup(d["sentences"][0])})
    # A document that is only a label line has no sentence: counted with unknown_label.
    return docs.filter(lambda d: counter.keep_if({
        "unknown_label": (d["label"] < 0) | (tf.size(d["sentences"]) == 0)}))


def split_documents(config: Config, split: str, counter: tfseq.DropCounter) -> tf.data.Dataset:
    """The labelled documents of one split (a stable hash of the key decides), counted."""
    docs = labelled_documents(config, counter)
    counter.register("other_split")
    want_eval = split == "eval"
    return docs.filter(lambda d: counter.keep_if({
        "other_split": tf.not_equal(formats.in_eval_split(d["key"], config.eval_percent),
                                    want_eval)}))


def encode(vocab: tfseq.Vocab, *, lowercase: bool = True, tokenizer=None):
    """``tf.string [(S)]`` sentences -> int32 RaggedTensor ``[(S), (W)]`` of vocab ids."""
    tok = get_tokenizer(tokenizer, vocab)

    def apply(sentences):
        if lowercase:
            sentences = tf_text.case_fold_utf8(sentences)
        return vocab.lookup(tok.tokenize(sentences))

    return apply


def build_vocab(config: Config) -> tfseq.Vocab:
    """A vocabulary over the training split's sentences (or ``config.vocab_path``)."""
    if config.vocab_path:
        return tfseq.Vocab.load(config.vocab_path)
    docs = split_documents(config, "train", tfseq.DropCounter("vocab"))
    sentences = docs.flat_map(lambda d: tf.data.Dataset.from_tensor_slices(d["sentences"]))
    if config.lowercase:
        sentences = sentences.map(tf_text.case_fold_utf8)
    return tfseq.Vocab.build(sentences, min_count=config.min_count, max_size=config.max_vocab)


def _count(batch):
    """A batch's real tokens (words), cells (the same: ragged) and examples (documents)."""
    features, labels = batch
    words = tf.size(features["ids"].flat_values)
    return words, words, tf.size(labels)


def check_config(config: Config) -> None:
    """Raises ``ValueError`` naming a setting no run can use."""
    check_positive_int("batch_size", config.batch_size)
    check_positive_int("max_sentences", config.max_sentences, allow_none=True)
    check_positive_int("max_words", config.max_words, allow_none=True)


def examples(config: Config, split: str, vocab: tfseq.Vocab,
             counter: tfseq.DropCounter) -> tf.data.Dataset:
    """``{"ids": int32 [(S), (W)], "label": int32}`` documents of ``split``, in file order,
    every drop counted."""
    to_ids = encode(vocab, lowercase=config.lowercase)
    counter.register("too_many_sentences", "too_long_sentence")
    docs = split_documents(config, split, counter)
    docs = docs.map(lambda d: {"ids": to_ids(d["sentences"]), "label": d["label"]},
                    num_parallel_calls=tf.data.AUTOTUNE)

    def keep(d):
        checks = {}
        if config.max_sentences:
            checks["too_many_sentences"] = d["ids"].nrows() > config.max_sentences
        if config.max_words:
            checks["too_long_sentence"] = tf.reduce_max(
                tf.concat([d["ids"].row_lengths(), [0]], 0)) > config.max_words
        return counter.keep_if(checks)

    return docs.filter(keep) if config.max_sentences or config.max_words else docs


def _batches(config: Config, docs: tf.data.Dataset) -> tf.data.Dataset:
    docs = docs.ragged_batch(config.batch_size)
    return docs.map(lambda b: ({"ids": b["ids"]}, b["label"]))


class DocumentsTask(ReplayedTask):
    """``--task=documents``: a document's class from its sentences (hierarchical model).

    The training documents are read again every epoch and shuffled with a seed of the epoch
    alone (``tfseq.replay.epoch_seed``), so an epoch is rebuilt exactly from its number.
    ``info`` (``learn``): ``vocab``, ``num_classes``, ``class_names``.
    """

    name = "documents"
    Config = Config
    model_module = "tfseq.models.hierarchical"

    def check(self, config):
        check_config(config)

    def learn(self, config):
        check_config(config)
        return {"vocab": build_vocab(config), "num_classes": len(config.class_names),
                "class_names": tuple(config.class_names),
                "passes": 0 if config.vocab_path else 1}

    def replay(self, config, info, counter):
        docs = examples(config, "train", info["vocab"], counter)

        def train_epoch(epoch):
            return _batches(config, epoch_shuffle(docs, config.shuffle_buffer, config.seed,
                                                  epoch))

        return ReplayStream(train_epoch, count=_count, seed=config.seed)

    def held_out(self, config, info, counter):
        return _batches(config, examples(config, "eval", info["vocab"], counter).cache())

    def serving_module(self, config, info, model, asset_dir):
        return serving_module(config, info, model, asset_dir)

    def baselines(self, eval_ds):
        return {"majority-class": majority_baseline(eval_ds)}

    def prediction_inputs(self, info, paths):
        """Documents of blank-line-separated files (no label line), their sentences joined by
        ``\\n``, ``tf.string [n]`` batches in file order."""
        docs = read_documents(paths, num_parallel_reads=1,
                              counter=tfseq.DropCounter("predict"))
        return docs.map(lambda d: tf.strings.reduce_join(d["sentences"], separator="\n")) \
            .batch(256)

    def prediction_line(self, row):
        label = row["label"].decode("utf-8")
        return f"{label}\t{float(row['probabilities'].max()):.6f}" if label else ""


TASK = DocumentsTask()



class ServedDocuments(tf.Module):
    """``text`` tf.string [B], one document each (its sentences one per line, ``\n``-separated;
    blank lines and surrounding whitespace ignored, no label line) -> ``label`` tf.string [B]
    and ``probabilities`` float32 [B, C] (``labels.txt`` order). A document with no sentence
    gets label ``""`` and zero probabilities.

    Args:
      model: the trained hierarchical classifier (``{"ids": int32 [B, (S), (W)]}`` -> logits).
      encoder: a ``tfseq.serving.TextEncoder`` with the training vocabulary and case folding.
      class_names: the labels, in the model's output order.
      asset_dir: where ``labels.txt`` is written until the export is saved.
    """

    def __init__(self, model, encoder, class_names, asset_dir: str):
        super().__init__()
        # The model's variables are tracked, the model itself is not: a Keras model saved as
        # a child would add its own signature, which cannot take ragged inputs.
        self.weights = list(model.variables)
        self.model = lambda inputs: model(inputs, training=False)
        self.encoder = encoder
        path = os.path.join(asset_dir, serving.ASSET_LABELS)
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(f"{name}\n" for name in class_names))
        self.labels_file = tf.saved_model.Asset(path)
        self.labels = tf.constant(list(class_names))
        self.serve = tf.function(self._serve, input_signature=[
            tf.TensorSpec([None], tf.string, name="text")])

    def _serve(self, text):
        lines = tf.strings.split(text, "\n")
        lines = lines.with_flat_values(tf.strings.strip(lines.flat_values))
        sentences = tf.ragged.boolean_mask(lines, tf.strings.length(lines) > 0)
        words, _ = self.encoder(sentences.flat_values)
        ids = tf.RaggedTensor.from_row_splits(words, sentences.row_splits)
        probabilities = tf.nn.softmax(tf.cast(self.model({"ids": ids}),
                                              tf.float32), axis=-1)
        some = (sentences.row_lengths() > 0)[:, None]
        probabilities = tf.where(some, probabilities, tf.zeros_like(probabilities))
        label = tf.where(some[:, 0], tf.gather(self.labels, tf.argmax(probabilities, -1)), "")
        return {"label": label, "probabilities": probabilities}


def serving_module(config: Config, info: dict, model, asset_dir: str):
    """``(ServedDocuments, serving.json fields)`` for an export of a trained model."""
    encoder = serving.TextEncoder(info["vocab"], asset_dir, lowercase=config.lowercase)
    module = ServedDocuments(model, encoder, info["class_names"], asset_dir)
    return module, {"input": "text", "outputs": ["label", "probabilities"],
                    "num_classes": info["num_classes"]}


def majority_baseline(eval_ds: tf.data.Dataset) -> float:
    """Accuracy of always predicting the most frequent label of ``eval_ds``."""
    counts = collections.Counter()
    for _, labels in eval_ds:
        counts.update(labels.numpy().tolist())
    total = sum(counts.values())
    return max(counts.values()) / total if total else 0.0


__all__ = ["Config", "TASK", "ServedDocuments", "serving_module", "read_documents",
           "corpus_documents", "write_documents", "group_runs", "encode", "majority_baseline"]
