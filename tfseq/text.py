"""Vocabularies and tokenization on tensorflow-text, with in-graph lookup.

Shapes: B = batch, T = tokens.

``Vocab`` maps tokens to int32 ids with reserved ids ``<pad>``=0, ``<unk>``=1, ``<s>``=2,
``</s>``=3; it is built from text (frequency cut-offs), saved as a plain text file of one token
per line (line number = id), and looked up in the graph with a ``tf.lookup.StaticHashTable``.

``tokenize(vocab)`` turns lines into examples::

    "In the beginning"  ->  {"ids": int32 [(T)]}  e.g. [57, 4, 302]
"""

from __future__ import annotations

import collections
import os
import re
from typing import Iterable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

try:  # the kernel's Python binding, for _WhitespaceTokenizer (the public class is the fallback)
    from tensorflow_text.python.ops import whitespace_tokenizer as _tf_text_whitespace
except ImportError:  # pragma: no cover - layout of another tensorflow_text release
    _tf_text_whitespace = None

from tfseq._common import Transform, unbatch

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
RESERVED = (PAD, UNK, BOS, EOS)
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
TOKENIZERS = ("whitespace", "unicode_script", "wordpiece", "sentencepiece")
LEARNED_TOKENIZERS = ("wordpiece", "sentencepiece")


class Vocab:
    """A token <-> id mapping with the reserved ids first.

    Args:
      tokens: every token in id order; must start with ``<pad>, <unk>, <s>, </s>`` and be unique.
      sentencepiece_model: the serialized SentencePiece model whose pieces are ``tokens`` (ids
        equal: trained with ``pad_id=0, unk_id=1, bos_id=2, eos_id=3``); ``None`` otherwise.

    Raises:
      ValueError: the reserved tokens are missing or out of place, a token is empty, contains
        whitespace-breaking characters (newline), or appears twice (the message names it and
        its ids).
    """

    def __init__(self, tokens: Sequence[str], *, sentencepiece_model: bytes | None = None):
        self.sentencepiece_model = sentencepiece_model
        tokens = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in tokens]
        if tuple(tokens[: len(RESERVED)]) != RESERVED:
            raise ValueError(f"A vocabulary must start with the reserved tokens {list(RESERVED)}; "
                             f"received {tokens[:len(RESERVED)]}")
        first_id = {}
        for i, token in enumerate(tokens):
            if not token or "\n" in token or "\r" in token:
                raise ValueError(f"Invalid token {token!r} at id {i}: tokens must be non-empty "
                                 "and contain no line breaks")
            if token in first_id:
                raise ValueError(f"Duplicate token {token!r} at ids {first_id[token]} and {i}")
            first_id[token] = i
        self._tokens = tokens
        self._table = None
        self._tokens_tensor = None

    # -- construction --------------------------------------------------------------------
    @classmethod
    def build(cls, lines: tf.data.Dataset | str | Iterable[str], *, tokenizer=None,
              min_count: int = 1, max_size: int | None = None, batch_size: int = 4096) -> "Vocab":
        """Counts tokens over ``lines`` and keeps the frequent ones.

        Args:
          lines: a dataset of ``tf.string`` lines (or of ``[n]`` batches of lines), or file
            paths/globs (read with ``tfseq.text_lines``; no cleaning applied).
          tokenizer: as in ``tokenize``; must be the one used at training time.
          min_count: keep tokens seen at least this often.
          max_size: cap on the vocabulary size including the 4 reserved tokens.
          batch_size: lines tokenized per graph call.

        Returns:
          A ``Vocab`` ordered by decreasing count (ties broken by the token's bytes).
        """
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1; received min_count={min_count}")
        if max_size is not None and max_size <= len(RESERVED):
            raise ValueError(f"max_size must exceed the {len(RESERVED)} reserved tokens; "
                             f"received max_size={max_size}")
        if not isinstance(lines, tf.data.Dataset):
            from tfseq.reading import text_lines
            lines = text_lines(lines)
        tok = get_tokenizer(tokenizer)
        counts: collections.Counter = collections.Counter()
        if lines.element_spec.shape.rank == 0:
            lines = lines.batch(batch_size)
        batches = lines.map(
            lambda b: tok.tokenize(b).flat_values, num_parallel_calls=tf.data.AUTOTUNE)
        for flat in batches.as_numpy_iterator():
            uniq, n = np.unique(flat, return_counts=True)
            counts.update(dict(zip(uniq.tolist(), n.tolist())))
        reserved = {t.encode() for t in RESERVED}
        kept = [(t, c) for t, c in counts.items() if c >= min_count and t not in reserved]
        kept.sort(key=lambda tc: (-tc[1], tc[0]))
        if max_size is not None:
            kept = kept[: max_size - len(RESERVED)]
        return cls(list(RESERVED) + [t.decode("utf-8", errors="replace") for t, _ in kept])

    @classmethod
    def learn(cls, files_or_dataset, *, tokenizer: str = "wordpiece", vocab_size: int = 8000,
              max_lines: int = 1_000_000, lowercase: bool = False, progress_every: int = 100_000,
              **options) -> "Vocab":
        """Learns a subword vocabulary from a uniform sample of the lines of its input.

        The input is read once, whole; ``max_lines`` lines of it are kept, each line equally
        likely (``tfseq.sampling.Reservoir``, seed 0: the same input gives the same sample and
        the same vocabulary), so a file sorted by label or date is sampled from end to end.

        Args:
          files_or_dataset: what to read, one of
            - a dataset of ``tf.string`` lines (scalars or ``[n]`` batches);
            - a file path or glob (``str`` or ``os.PathLike``; ``.gz`` allowed), or a list of
              them: a list/tuple is read as file patterns when its first item is a path object
              or names an existing file or matches a glob (then every item must match a file);
            - any other iterable of ``str`` (or UTF-8 ``bytes``) lines, e.g. a sample collected
              elsewhere.
          tokenizer: ``"wordpiece"`` or ``"sentencepiece"``.
            ``"wordpiece"``: Hugging Face ``tokenizers``' WordPiece trainer (Rust) over the
            words of the sample, split where ``tokenize`` splits them (Unicode White_Space;
            punctuation stays inside words); tokenize with ``tokenizer="wordpiece"``. Ids
            0-3 are ``<pad> <unk> <s> </s>``; then the ``##`` form of every character of the
            sample, the characters themselves, and the learned pieces in the order learned.
            Every character of the sample is covered in both positions, so no word of the
            sample maps to ``<unk>``.
            ``"sentencepiece"``: a unigram model from the ``sentencepiece`` package with
            ``pad/unk/bos/eos`` ids 0-3, so its ids are this vocabulary's ids; tokenize with
            ``tokenizer="sentencepiece"``.
          vocab_size: the most tokens, the 4 reserved ones included (both learners may stay
            below it on a small sample).
          max_lines: the most lines sampled (and held in memory).
          lowercase: case-fold the sample first (then tokenize with ``lowercase=True`` too).
          progress_every: log the lines read every this many lines (absl INFO).
          **options: passed to the trainer: for ``"wordpiece"`` ``min_frequency`` (the least
            count of a pair to merge), ``initial_alphabet`` (characters to cover even if
            unseen) or ``show_progress``; for ``"sentencepiece"`` any
            ``sentencepiece.SentencePieceTrainer.train`` option, e.g. ``model_type="bpe"``.

        Returns:
          A ``Vocab`` of at most ``vocab_size`` tokens; for SentencePiece its
          ``sentencepiece_model`` holds the model bytes.

        Raises:
          ValueError: an unknown ``tokenizer``, ``vocab_size`` <= 4, ``max_lines`` < 1, no
            line to learn from, a dataset of something other than ``tf.string`` lines, or (for
            ``"wordpiece"``) a sample with more distinct characters than ``vocab_size`` can
            cover with their ``##`` forms.
          TypeError: a line that is not ``str``/``bytes``, or a ``"wordpiece"`` option the
            trainer does not take (e.g. ``lower_thresh`` of tensorflow-text's learner).
          FileNotFoundError: a file pattern that matches nothing.

        Example:
          >>> vocab = Vocab.learn(["the walker walked", "the talker talked"] * 10,
          ...                     vocab_size=40)
          >>> vocab.tokens[:4]
          ['<pad>', '<unk>', '<s>', '</s>']
        """
        from absl import logging

        if tokenizer not in LEARNED_TOKENIZERS:
            raise ValueError(f"Vocab.learn: tokenizer must be one of {LEARNED_TOKENIZERS}; "
                             f"received {tokenizer!r}")
        if vocab_size <= len(RESERVED):
            raise ValueError(f"vocab_size must exceed the {len(RESERVED)} reserved tokens; "
                             f"received vocab_size={vocab_size}")
        if tokenizer == "wordpiece":
            _check_wordpiece_options(options)
        lines = _sample_lines(files_or_dataset, max_lines, progress_every, tokenizer)
        if lowercase:
            lines = _case_fold(lines)
        if not lines:
            raise ValueError(f"Vocab.learn: no line to learn a vocabulary from in "
                             f"{_describe(files_or_dataset)}")
        logging.info("Vocab.learn(%s): learning from %d sampled lines", tokenizer, len(lines))
        if tokenizer == "sentencepiece":
            return _learn_sentencepiece(iter(lines), vocab_size, options)
        return _learn_wordpiece(lines, vocab_size, options)

    def save(self, path: str | os.PathLike) -> None:
        """Writes one token per line, UTF-8; line i (0-based) is id i. A SentencePiece
        vocabulary given a ``.model`` path writes the serialized model instead."""
        if os.fspath(path).endswith(".model"):
            if self.sentencepiece_model is None:
                raise ValueError(f"{path}: only a SentencePiece vocabulary saves as .model; "
                                 "use a .txt path")
            with open(path, "wb") as f:
                f.write(self.sentencepiece_model)
            return
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(self._tokens) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocab":
        """Reads a file written by ``save`` (a ``.model`` path: a SentencePiece model).

        Raises:
          FileNotFoundError: no such file.
          ValueError: the file is not a valid vocabulary (message names the file and line).
        """
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"No vocabulary file at {path!r}")
        with open(path, "rb") as f:
            raw = f.read()
        if path.endswith(".model"):
            return _sentencepiece_vocab(raw, path)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw[: e.start].count(b"\n") + 1
            raise ValueError(f"{path}:{line}: invalid UTF-8 in vocabulary file") from e
        tokens = text.split("\n")
        if tokens and tokens[-1] == "":
            tokens.pop()
        tokens = [t[:-1] if t.endswith("\r") else t for t in tokens]
        try:
            return cls(tokens)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e

    # -- use -----------------------------------------------------------------------------
    @property
    def tokens(self) -> list[str]:
        return list(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def size(self) -> int:
        return len(self._tokens)

    def _lookup_table(self) -> tf.lookup.StaticHashTable:
        if self._table is None:
            with tf.init_scope():
                keys = tf.constant(self._tokens)
                values = tf.range(len(self._tokens), dtype=tf.int32)
                self._table = tf.lookup.StaticHashTable(
                    tf.lookup.KeyValueTensorInitializer(keys, values), default_value=UNK_ID)
                self._tokens_tensor = keys
        return self._table

    def lookup(self, tokens):
        """Token strings -> int32 ids (unknown tokens -> 1); any shape, dense or ragged."""
        table = self._lookup_table()
        if isinstance(tokens, tf.RaggedTensor):
            return tokens.with_flat_values(table.lookup(tokens.flat_values))
        return table.lookup(tf.convert_to_tensor(tokens, tf.string))

    def to_tokens(self, ids):
        """int ids -> token strings (ids outside the vocabulary -> ``<unk>``); dense or ragged."""
        self._lookup_table()
        if isinstance(ids, tf.RaggedTensor):
            return ids.with_flat_values(self.to_tokens(ids.flat_values))
        ids = tf.convert_to_tensor(ids)
        ids = tf.where((ids >= 0) & (ids < len(self._tokens)), ids, tf.cast(UNK_ID, ids.dtype))
        return tf.gather(self._tokens_tensor, ids)

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)}, first={self._tokens[4:9]})"


# Options of tokenizers.trainers.WordPieceTrainer that Vocab.learn passes on. The others are
# fixed by the contract with FastWordpieceTokenizer (vocab_size, special_tokens,
# continuing_subword_prefix="##", no end_of_word_suffix), or would break the coverage of every
# character (limit_alphabet).
_WORDPIECE_OPTIONS = ("min_frequency", "initial_alphabet", "show_progress")
_SAMPLE_BATCH = 8192  # lines per Reservoir.add / trainer batch


def _check_wordpiece_options(options: dict) -> None:
    unknown = sorted(set(options) - set(_WORDPIECE_OPTIONS))
    if unknown:
        # The trainer would only print "Ignored unknown kwargs option" and go on.
        raise TypeError(f"Vocab.learn(tokenizer='wordpiece') got unknown option(s) {unknown}; "
                        f"it passes only {list(_WORDPIECE_OPTIONS)} to "
                        "tokenizers.trainers.WordPieceTrainer")


def _describe(source) -> str:
    """A short name of a ``Vocab.learn`` input for messages."""
    if isinstance(source, tf.data.Dataset):
        return f"a dataset of {source.element_spec}"
    if isinstance(source, (str, os.PathLike)):
        return repr(os.fspath(source))
    return f"a {type(source).__name__}"


def _names_files(source) -> bool:
    """Whether a list/tuple given to ``Vocab.learn`` is file patterns rather than lines: its
    first item is a path object, or a string naming an existing file or matching a glob."""
    if not isinstance(source, (list, tuple)) or not source:
        return False
    first = source[0]
    if isinstance(first, os.PathLike):
        return True
    if not isinstance(first, str) or not first or "\n" in first:
        return False
    from tfseq.reading import resolve_files
    try:
        return bool(resolve_files([first]))
    except (FileNotFoundError, ValueError, tf.errors.OpError):
        return False


def _line_batches(source):
    """``Vocab.learn``'s input -> an iterator of ``[n]`` batches of lines (numpy ``object``
    arrays of ``bytes``, or lists of ``str``/``bytes``)."""
    if isinstance(source, tf.data.Dataset):
        spec = source.element_spec
        if (not isinstance(spec, tf.TensorSpec) or spec.dtype != tf.string
                or spec.shape.rank not in (0, 1)):
            raise ValueError(f"Vocab.learn needs a dataset of tf.string lines (scalars or [n] "
                             f"batches); received element_spec={spec}")
        if spec.shape.rank == 0:
            source = source.batch(_SAMPLE_BATCH)
        return source.as_numpy_iterator()
    if isinstance(source, (str, os.PathLike)) or _names_files(source):
        from tfseq.reading import text_lines
        return text_lines(source, batch_size=_SAMPLE_BATCH).as_numpy_iterator()
    if isinstance(source, bytes) or not hasattr(source, "__iter__"):
        raise TypeError(f"Vocab.learn takes a dataset, file paths/globs or an iterable of str "
                        f"lines; received {type(source).__name__} {source!r:.80}")
    return _chunks(iter(source))


def _chunks(lines):
    """An iterator of ``str``/``bytes`` lines -> lists of ``_SAMPLE_BATCH`` of them."""
    import itertools

    while chunk := list(itertools.islice(lines, _SAMPLE_BATCH)):
        for line in chunk:
            if not isinstance(line, (str, bytes)):
                raise TypeError(f"Vocab.learn: lines must be str or bytes; received "
                                f"{type(line).__name__} {line!r:.80}")
        yield chunk


def _sample_lines(source, max_lines: int, progress_every: int, what: str) -> list[str]:
    """Reads ``source`` once; returns a uniform sample of at most ``max_lines`` of its lines,
    in input order, as ``str`` (invalid UTF-8 replaced by U+FFFD)."""
    from absl import logging

    from tfseq.sampling import Reservoir

    if isinstance(max_lines, bool) or not isinstance(max_lines, int) or max_lines < 1:
        raise ValueError(f"max_lines must be an int >= 1; received max_lines={max_lines!r}")
    reservoir = Reservoir(max_lines, seed=0)
    logged = 0
    for batch in _line_batches(source):
        reservoir.add(batch)
        if progress_every and reservoir.seen // progress_every > logged:
            logged = reservoir.seen // progress_every
            logging.info("Vocab.learn(%s): %d lines read", what, reservoir.seen)
    logging.info("Vocab.learn(%s): %d lines read, %d sampled", what, reservoir.seen,
                 len(reservoir))
    return [line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line
            for line in reservoir.sample()]


def _case_fold(lines: list[str]) -> list[str]:
    """``tensorflow_text.case_fold_utf8`` (what ``tokenize(lowercase=True)`` applies) on every
    line."""
    folded = []
    for start in range(0, len(lines), _SAMPLE_BATCH):
        batch = tf_text.case_fold_utf8(tf.constant(lines[start:start + _SAMPLE_BATCH]))
        folded += [line.decode("utf-8", errors="replace") for line in batch.numpy().tolist()]
    return folded


def _learn_wordpiece(lines: list[str], vocab_size: int, options: dict) -> Vocab:
    """A ``##`` WordPiece vocabulary of ``lines`` from ``tokenizers.trainers.WordPieceTrainer``
    (a BPE trainer whose merges become the pieces; ``FastWordpieceTokenizer`` then splits
    words greedily, longest piece first)."""
    from absl import logging
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    chars = set()
    for start in range(0, len(lines), _SAMPLE_BATCH):
        chars.update("".join(lines[start:start + _SAMPLE_BATCH]))
    chars.update(c[0] for c in options.get("initial_alphabet", ()) if c)
    chars = sorted(c for c in chars if not _WHITE_SPACE_RUN.match(c))
    if not chars:
        raise ValueError("Vocab.learn: no words in the sample to learn a vocabulary from")
    needed = len(RESERVED) + 2 * len(chars)
    if needed > vocab_size:
        raise ValueError(f"Vocab.learn(tokenizer='wordpiece'): the sample has {len(chars)} "
                         f"distinct characters, which need {needed} tokens with their ## forms "
                         f"and the reserved tokens; received vocab_size={vocab_size}. Raise "
                         "vocab_size (or use tokenizer='sentencepiece' with "
                         "character_coverage < 1 to map rare characters to <unk>)")
    # The trainer gives a character a "##" form when it first meets it inside a word, in hash
    # map order: ids, and the merges that tie on count (broken by id), would change from run
    # to run. Given first, in code point order, as special tokens, every "##" form has a fixed
    # id, so the same sample gives the same vocabulary; and every character is also covered
    # inside words, where it may occur in text the sample did not hold.
    suffixes = ["##" + c for c in chars]
    tokenizer = Tokenizer(models.WordPiece(unk_token=UNK, continuing_subword_prefix="##"))
    # Splits where split_words (and the whitespace tokenizer) split, at Unicode White_Space
    # (Rust's char::is_whitespace; checked on every code point): punctuation stays in words.
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordPieceTrainer(**{
        "show_progress": False, **options, "vocab_size": vocab_size,
        "special_tokens": list(RESERVED) + suffixes, "continuing_subword_prefix": "##"})
    tokenizer.train_from_iterator(
        (lines[start:start + _SAMPLE_BATCH] for start in range(0, len(lines), _SAMPLE_BATCH)),
        trainer=trainer, length=len(lines))
    ids = tokenizer.get_vocab(with_added_tokens=True)
    tokens = sorted(ids, key=ids.get)
    # Drop what the Vocab constructor rejects (empty tokens, line breaks). Words hold no line
    # break (the pre-tokenizer splits there) but initial_alphabet may bring one. Tokens are
    # unique: they are the keys of the trainer's vocabulary.
    rejected = [t for t in tokens if not t or "\n" in t or "\r" in t]
    if rejected:
        logging.warning("Vocab.learn(wordpiece): dropped %d tokens that hold a line break: %r",
                        len(rejected), rejected[:10])
        tokens = [t for t in tokens if t and "\n" not in t and "\r" not in t]
    logging.info("Vocab.learn(wordpiece): %d tokens (%d characters with their ## forms) from "
                 "%d lines", len(tokens), len(chars), len(lines))
    return Vocab(tokens)


def _learn_sentencepiece(sentences, vocab_size: int, options: dict) -> Vocab:
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    params = dict(model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                  pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_piece=PAD,
                  unk_piece=UNK, bos_piece=BOS, eos_piece=EOS, minloglevel=2)
    params.update(options)
    spm.SentencePieceTrainer.train(sentence_iterator=sentences, model_writer=model,
                                   vocab_size=vocab_size, **params)
    return _sentencepiece_vocab(model.getvalue(), "<learned>")


def _sentencepiece_vocab(model: bytes, where: str) -> Vocab:
    """A ``Vocab`` of a serialized SentencePiece model's pieces (ids must put the reserved
    tokens first: ``pad_id=0, unk_id=1, bos_id=2, eos_id=3``)."""
    import sentencepiece as spm

    try:
        processor = spm.SentencePieceProcessor(model_proto=model)
    except Exception as e:  # the package raises RuntimeError/OSError on a bad proto
        raise ValueError(f"{where}: not a SentencePiece model ({e})") from None
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    try:
        return Vocab(pieces, sentencepiece_model=model)
    except ValueError as e:
        raise ValueError(f"{where}: {e} (train SentencePiece with pad_id=0, unk_id=1, bos_id=2, "
                         "eos_id=3 and pieces <pad> <unk> <s> </s>)") from None


# Unicode's White_Space set, as (first, last) code point ranges: what the whitespace
# tokenizer's kernel splits on (found by trying every code point). One source for the graph
# (RE2) pattern of its multi-byte members and the Python pattern of the whole set.
_WHITE_SPACE_RANGES = ((0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
                       (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
                       (0x3000, 0x3000))
_MULTIBYTE_SPACE = "".join(
    f"\\x{{{a:X}}}" + (f"-\\x{{{b:X}}}" if b > a else "") for a, b in _WHITE_SPACE_RANGES
    if a >= 0x80)
# str.split() would also split at U+001C-U+001F, which the tokenizer keeps inside words.
_WHITE_SPACE_RUN = re.compile("[" + "".join(
    re.escape(chr(a)) + (f"-{re.escape(chr(b))}" if b > a else "")
    for a, b in _WHITE_SPACE_RANGES) + "]+")


def split_words(line: str) -> list[str]:
    """A Python ``str`` -> its words, split where the whitespace tokenizer splits (Unicode
    White_Space), as ``Vocab.learn``'s wordpiece trainer splits them."""
    return [w for w in _WHITE_SPACE_RUN.split(line) if w]


def ascii_spaces(strings: tf.Tensor) -> tf.Tensor:
    """``tf.string`` of any shape -> the same with every multi-byte Unicode space (no-break
    space, ideographic space, U+2000-U+200A, ...) replaced by an ASCII space.

    Only the strings that need it are rewritten: ASCII strings are recognized by their length
    in characters (one cheap pass), the others are checked with one regex pass.
    """
    shape = tf.shape(strings)
    flat = tf.reshape(strings, [-1])
    non_ascii = tf.where(tf.not_equal(tf.strings.length(flat, unit="UTF8_CHAR"),
                                      tf.strings.length(flat)))
    candidates = tf.gather_nd(flat, non_ascii)
    spaced = tf.gather_nd(non_ascii, tf.where(tf.logical_not(tf.strings.regex_full_match(
        candidates, f"[^{_MULTIBYTE_SPACE}]*"))))
    fixed = tf.strings.regex_replace(tf.gather_nd(flat, spaced), f"[{_MULTIBYTE_SPACE}]", " ")
    return tf.reshape(tf.tensor_scatter_nd_update(flat, spaced, fixed), shape)


class _WhitespaceTokenizer:
    """Splits on Unicode whitespace: ``tensorflow_text.WhitespaceTokenizer``'s kernel, with two
    fixes.

    - Correct tokens next to multi-byte spaces. The kernel (tensorflow-text 2.21) ends a token
      followed by a multi-byte space one byte before that space's last byte, so
      ``"a\\u00a0b"`` gives ``[b"a\\xc2", b"b"]``: a broken UTF-8 token, a different id from
      ``"a"`` (and ``<unk>`` once ``Vocab.build`` has decoded it to ``"a\\ufffd"``).
      Multi-byte spaces become ASCII spaces first (``ascii_spaces``), which splits the same
      places and gives ``[b"a", b"b"]``. Cost: nothing on ASCII lines beyond one length
      count; a regex pass over the others.
    - No ragged validation on ``tf.string [B]``: the kernel's row splits build the
      ``[B, (T)]`` result with ``validate=False``. The public ``tokenize`` also builds the
      offsets it drops and checks all three ragged results: 9 assertion ``If`` ops that run on
      every call (they are stateful, so a graph keeps them). Other ranks, or a
      ``tensorflow_text`` without the kernel's Python binding, use the public method (after
      the same space fix).
    """

    def __init__(self):
        self._public = tf_text.WhitespaceTokenizer()
        self._kernel = getattr(getattr(_tf_text_whitespace, "gen_whitespace_tokenizer_v2", None),
                               "tf_text_whitespace_tokenize_with_offsets_v2", None)
        self._config = getattr(self._public, "_config", None)

    def tokenize(self, lines):
        """``tf.string [B]`` -> ``tf.string RaggedTensor [B, (T)]`` (int64 row splits); other
        shapes as ``tensorflow_text.WhitespaceTokenizer.tokenize``."""
        if isinstance(lines, tf.RaggedTensor):
            return self._public.tokenize(lines.with_flat_values(ascii_spaces(lines.flat_values)))
        lines = ascii_spaces(tf.convert_to_tensor(lines, tf.string))
        if self._kernel is not None and self._config is not None and lines.shape.rank == 1:
            values, row_splits, _, _ = self._kernel(input_values=lines, input_config=self._config)
            return tf.RaggedTensor.from_row_splits(values, row_splits, validate=False)
        return self._public.tokenize(lines)


class _WordpieceTokenizer:
    """Whitespace split, then wordpieces (``FastWordpieceTokenizer``) from the vocabulary's
    ``##`` continuation tokens; ``tokenize`` gives piece strings."""

    def __init__(self, vocab: Vocab):
        self._whitespace = _WhitespaceTokenizer()
        with tf.init_scope():
            self._wordpiece = tf_text.FastWordpieceTokenizer(
                vocab.tokens, suffix_indicator="##", unknown_token=UNK,
                token_out_type=tf.string, no_pretokenization=True)

    def tokenize(self, lines):
        words = self._whitespace.tokenize(lines)
        return self._wordpiece.tokenize(words).merge_dims(-2, -1)


class _SentencepieceTokenizer:
    """``tensorflow_text.SentencepieceTokenizer`` over ``vocab.sentencepiece_model``:
    ``tokenize`` gives piece strings (whose ``Vocab`` ids equal the model's ids) and
    ``detokenize`` takes int ids back to text."""

    def __init__(self, vocab: Vocab):
        with tf.init_scope():
            self._pieces = tf_text.SentencepieceTokenizer(vocab.sentencepiece_model,
                                                          out_type=tf.string)
            self._ids = tf_text.SentencepieceTokenizer(vocab.sentencepiece_model,
                                                       out_type=tf.int32)

    def tokenize(self, lines):
        return self._pieces.tokenize(lines)

    def detokenize(self, ids):
        """int32 ``[..., (T)]`` ids -> ``tf.string [...]`` text."""
        return self._ids.detokenize(ids)


def get_tokenizer(tokenizer=None, vocab: Vocab | None = None):
    """Resolves a tokenizer name or object.

    Args:
      tokenizer: ``None``/``"whitespace"`` (splits on Unicode whitespace:
        ``tensorflow_text.WhitespaceTokenizer``'s kernel, with its tokens next to multi-byte
        spaces such as U+00A0 fixed; see ``_WhitespaceTokenizer``),
        ``"unicode_script"`` (``UnicodeScriptTokenizer``: splits punctuation and scripts),
        ``"wordpiece"`` (whitespace then ``FastWordpieceTokenizer`` over ``vocab``'s ``##``
        pieces), ``"sentencepiece"`` (``SentencepieceTokenizer`` over
        ``vocab.sentencepiece_model``),
        or any object with a ``tokenize(strings) -> RaggedTensor`` method.
      vocab: needed for ``"wordpiece"`` and ``"sentencepiece"``.

    Raises:
      ValueError: an unknown name, or ``"wordpiece"`` without a vocab.
    """
    if tokenizer is None or tokenizer == "whitespace":
        return _WhitespaceTokenizer()
    if tokenizer == "unicode_script":
        return tf_text.UnicodeScriptTokenizer()
    if tokenizer == "wordpiece":
        if vocab is None:
            raise ValueError("tokenizer='wordpiece' needs the wordpiece vocabulary (vocab=...)")
        return _WordpieceTokenizer(vocab)
    if tokenizer == "sentencepiece":
        if vocab is None or vocab.sentencepiece_model is None:
            raise ValueError("tokenizer='sentencepiece' needs a SentencePiece vocabulary (from "
                             "Vocab.learn(..., tokenizer='sentencepiece') or Vocab.load('x.model'))")
        return _SentencepieceTokenizer(vocab)
    if isinstance(tokenizer, str):
        raise ValueError(f"Unknown tokenizer {tokenizer!r}; expected one of {TOKENIZERS} "
                         "or an object with a tokenize() method")
    if not hasattr(tokenizer, "tokenize"):
        raise TypeError(f"tokenizer must be a name or have a tokenize() method; "
                        f"received {tokenizer!r}")
    return tokenizer


def tokenize(vocab: Vocab, *, tokenizer=None, key: str = "ids", add_bos: bool = False,
             add_eos: bool = False, lowercase: bool = False, batch_size: int = 512,
             num_parallel_calls: int | None = None) -> Transform:
    """Transformation: text -> int32 ids.

    Elements may be ``tf.string`` scalars (each becomes ``{key: ids}``) or dicts whose ``key``
    feature is a ``tf.string`` scalar (replaced by its ids in place, so pairs are tokenized by
    two calls, e.g. ``key="source"`` then ``key="target"`` with each side's vocab).

    Batches of lines (``tf.string [n]``, e.g. ``text_lines(..., batch_size=1024)``, or dicts
    whose ``key`` is ``[n]``) become ragged batches of examples, ``{key: int32 [n, (T)]}``,
    with no tf.data call per line; ``bucket_by_length`` and ``pack`` take those directly.

    Args:
      vocab: the ``Vocab`` for lookup (unknown tokens -> ``<unk>`` = 1).
      tokenizer: see ``get_tokenizer``; whitespace by default.
      key: the feature to write (string elements) or to tokenize (dict elements).
      add_bos, add_eos: prepend ``<s>`` (2) / append ``</s>`` (3).
      lowercase: case-fold (``tensorflow_text.case_fold_utf8``) before tokenizing.
      batch_size: lines tokenized per vectorized call (the output is still one example per
        line, in order; batching only amortises the per-call cost).
      num_parallel_calls: batches tokenized at once; default ``tf.data.AUTOTUNE``.

    Returns:
      A ``Dataset.apply`` transformation emitting dicts with ``key``: int32 ``[(T)]``
      (``[n, (T)]`` for batched input).

    Raises:
      ValueError: dict elements without ``key``, or whose ``key`` is not a ``tf.string``
        scalar or vector.

    Example:
      >>> ds = tf.data.Dataset.from_tensor_slices(["a b", "b c c"])
      >>> ds.apply(tfseq.tokenize(vocab))   # {"ids": [4, 5]}, {"ids": [5, 6, 6]}
    """
    tok = get_tokenizer(tokenizer, vocab)
    calls = tf.data.AUTOTUNE if num_parallel_calls is None else num_parallel_calls

    def to_ids(text: tf.Tensor) -> tf.RaggedTensor:
        """tf.string [B] -> int32 RaggedTensor [B, (T)]."""
        if lowercase:
            text = tf_text.case_fold_utf8(text)
        ids = vocab.lookup(tok.tokenize(text))
        rows = tf.shape(text)[0]
        parts = []
        if add_bos:
            parts.append(tf.RaggedTensor.from_tensor(tf.fill([rows, 1], BOS_ID)))
        parts.append(ids)
        if add_eos:
            parts.append(tf.RaggedTensor.from_tensor(tf.fill([rows, 1], EOS_ID)))
        return tf.concat(parts, axis=1) if len(parts) > 1 else ids

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        spec = dataset.element_spec
        if isinstance(spec, tf.TensorSpec):
            if spec.dtype != tf.string or spec.shape.rank not in (0, 1):
                raise ValueError(f"tokenize expects tf.string scalars, [n] batches of them, or "
                                 f"dicts; received {spec}")
            to_example = lambda lines: {key: to_ids(lines)}  # noqa: E731
            if spec.shape.rank == 1:  # batches of lines -> ragged batches of examples
                return dataset.map(to_example, num_parallel_calls=calls,
                                   deterministic=None)
            batched = dataset.batch(batch_size).map(
                to_example, num_parallel_calls=calls, deterministic=None)
            return unbatch(batched)
        if not isinstance(spec, dict):
            raise TypeError(f"tokenize expects tf.string scalars or dict elements; received {spec}")
        if key not in spec:
            raise ValueError(f"Unknown key {key!r} in tokenize. Available keys: {sorted(spec)}")
        if (not isinstance(spec[key], tf.TensorSpec) or spec[key].dtype != tf.string
                or spec[key].shape.rank not in (0, 1)):
            raise ValueError(f"tokenize(key={key!r}) needs a tf.string scalar feature (or [n] "
                             f"in batched dicts); received {spec[key]}")

        def map_batch(batch):
            batch = dict(batch)
            batch[key] = to_ids(batch[key])
            return batch

        if spec[key].shape.rank == 1:  # batched dicts stay batched
            return dataset.map(map_batch, num_parallel_calls=calls, deterministic=None)
        batched = dataset.ragged_batch(batch_size).map(
            map_batch, num_parallel_calls=calls, deterministic=None)
        return unbatch(batched)

    return apply
