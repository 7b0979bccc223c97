r"""How fast is Vocab.learn(tokenizer="wordpiece"), and is its vocabulary as good?

Usage:
  python -m benchmarks.vocab --json_out=bench_out/vocab.json
  python -m benchmarks.vocab --files='data/*.tsv.gz' --field=1 --old_lines=2000
  python -m benchmarks.vocab --sample_mb=2 --old_lines=1000   # a quick run

One run, one table, on one text sample split into learning lines and held-out lines (every
``--heldout_every``-th line), ``--vocab_size`` tokens:

- ``new wordpiece``: ``tfseq.Vocab.learn(path, tokenizer="wordpiece")`` (Hugging Face
  ``tokenizers``' Rust trainer) over all the learning lines;
- ``sentencepiece``: ``tfseq.Vocab.learn(path, tokenizer="sentencepiece")`` (unigram) over the
  same lines;
- ``old wordpiece``: tensorflow-text's pure-Python learner
  (``wordpiece_tokenizer_learner_lib.learn`` over ``split_words`` counts, ``lower_thresh=1``,
  as tfseq called it before) on the first ``--old_lines`` learning lines, which it finishes in
  about a minute, and ``new wordpiece`` on that same prefix: the like-for-like speed-up.

Each learner's time is wall seconds for the whole call (the two ``Vocab.learn`` calls on the
file include reading it with ``text_lines`` and sampling it, also timed alone). Quality: the
held-out lines' words (``split_words``, counted with repeats) are tokenized one by one with the
tokenizer each vocabulary is for (``tfseq.tokenize``'s ``"wordpiece"`` or ``"sentencepiece"``):
the fraction without ``<unk>`` and the mean pieces per word.

Default sample: real English text installed from Debian packages and read from disk at run
time (nothing is downloaded): the Python 3 documentation's reStructuredText sources
(``apt-get install python3-doc``: ``/usr/share/doc/python3*/html/_sources``, 11 MB for 3.11)
then Perl's POD documentation (``apt-get install perl-doc``: ``/usr/share/perl/*/pod``,
8.8 MB), in sorted file order, at most ``--sample_mb`` MB: about 18 MB to learn from by
default. Without either package, the embedded corpus (the text field of the ``kjv_en`` and
``rv1909_es`` verses, about 8 MB) is used and the table says so.
"""

from __future__ import annotations

import collections
import glob
import gzip
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags, logging  # noqa: E402

from benchmarks import harness  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("files", None, "Text files or globs (.gz allowed); default: the Debian "
                  "documentation sample (see the module docstring).")
flags.DEFINE_integer("field", -1, "0-based tab-separated field of --files holding the text; "
                     "-1: the whole line.")
flags.DEFINE_float("sample_mb", 20.0, "The most text read (MB of UTF-8, learning and held-out "
                   "lines together) from --files or the default sources.")
flags.DEFINE_integer("vocab_size", 8000, "Target vocabulary size (reserved tokens included).")
flags.DEFINE_integer("old_lines", 5000, "Learning lines given to the old tensorflow-text "
                     "learner (and to the new one, for the like-for-like ratio).")
flags.DEFINE_integer("heldout_every", 10, "Every this-many-th line is held out for coverage.")

PYTHON_DOCS = "/usr/share/doc/python3*/html/_sources/**/*.txt"
PERL_PODS = "/usr/share/perl/*/pod/*.pod"


def read_lines(paths, field: int, max_bytes: int) -> list[str]:
    """The lines of ``paths`` in order (the ``field``-th TSV field, or whole lines for -1), up
    to ``max_bytes`` of UTF-8."""
    lines, size = [], 0
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.rstrip("\r\n")
                if field >= 0:
                    fields = line.split("\t")
                    line = fields[field] if field < len(fields) else ""
                size += len(line.encode("utf-8")) + 1
                if size > max_bytes:
                    return lines
                lines.append(line)
    return lines


def load_sample() -> tuple[str, list[str]]:
    """(a description, the lines) of ``--files`` or the default sample."""
    import tfseq

    max_bytes = int(FLAGS.sample_mb * 1e6)
    if FLAGS.files:
        paths = [p for pattern in FLAGS.files for p in sorted(glob.glob(pattern))]
        if not paths:
            raise FileNotFoundError(f"No file matches --files={FLAGS.files}")
        return f"--files ({len(paths)} files)", read_lines(paths, FLAGS.field, max_bytes)
    python_docs = sorted(glob.glob(PYTHON_DOCS, recursive=True))
    perl_pods = sorted(glob.glob(PERL_PODS))
    if python_docs or perl_pods:
        return (f"Debian python3-doc reST sources ({len(python_docs)} files) + perl-doc POD "
                f"({len(perl_pods)} files)",
                read_lines(python_docs + perl_pods, -1, max_bytes))
    return ("the embedded corpus (kjv_en + rv1909_es verses; python3-doc/perl-doc not "
            "installed)", read_lines([tfseq.corpus_path("kjv_en"), tfseq.corpus_path("rv1909_es")],
                                     3, max_bytes))


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def old_wordpiece(lines: list[str], vocab_size: int):
    """tensorflow-text's learner as tfseq's Vocab.learn called it before."""
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as lib

    import tfseq
    from tfseq.text import RESERVED, split_words

    counts = collections.Counter()
    for line in lines:
        counts.update(split_words(line))
    learned = lib.learn(counts, vocab_size, list(RESERVED), lower_thresh=1)
    tokens = list(RESERVED) + [t for t in learned if t not in RESERVED]
    return tfseq.Vocab(tokens[:vocab_size])


def coverage(vocab, tokenizer: str, words: collections.Counter) -> tuple[float, float]:
    """(fraction of word occurrences without <unk>, mean pieces per word occurrence)."""
    import numpy as np
    import tensorflow as tf

    from tfseq.text import UNK_ID, get_tokenizer

    tok = get_tokenizer(tokenizer, vocab)
    distinct = list(words)
    counts = np.array([words[w] for w in distinct], dtype=np.float64)
    known, pieces = [], []
    for start in range(0, len(distinct), 8192):
        ids = vocab.lookup(tok.tokenize(tf.constant(distinct[start:start + 8192])))
        known.append(tf.reduce_all(ids != UNK_ID, axis=1).numpy())
        pieces.append(ids.row_lengths().numpy())
    known, pieces = np.concatenate(known), np.concatenate(pieces)
    return float((counts * known).sum() / counts.sum()), float((counts * pieces).sum()
                                                               / counts.sum())


def main(argv):
    del argv
    if not FLAGS["verbosity"].present:  # Vocab.learn's INFO lines would split the table
        logging.set_verbosity(logging.WARNING)
    import tfseq
    from tfseq.sampling import Reservoir
    from tfseq.text import split_words

    description, lines = load_sample()
    every = FLAGS.heldout_every
    learn_lines = [line for i, line in enumerate(lines) if i % every != every - 1]
    held_out = [line for i, line in enumerate(lines) if i % every == every - 1]
    words = collections.Counter(w for line in held_out for w in split_words(line))
    directory = tempfile.mkdtemp(prefix="tfseq_bench_vocab_")
    path = os.path.join(directory, "learn.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(learn_lines) + "\n")
    mb = os.path.getsize(path) / 1e6
    old_n = min(FLAGS.old_lines, len(learn_lines))
    prefix = learn_lines[:old_n]

    def read_and_sample():
        reservoir = Reservoir(1_000_000)
        for batch in tfseq.text_lines(path, batch_size=8192).as_numpy_iterator():
            reservoir.add(batch)
        return reservoir

    runs = [  # (name, lines, learner's tokenizer, call)
        ("new wordpiece (tokenizers)", len(learn_lines), "wordpiece",
         lambda: tfseq.Vocab.learn(path, tokenizer="wordpiece", vocab_size=FLAGS.vocab_size)),
        ("sentencepiece (unigram)", len(learn_lines), "sentencepiece",
         lambda: tfseq.Vocab.learn(path, tokenizer="sentencepiece",
                                   vocab_size=FLAGS.vocab_size)),
        ("old wordpiece (tf-text lib)", old_n, "wordpiece",
         lambda: old_wordpiece(prefix, FLAGS.vocab_size)),
        ("new wordpiece, same prefix", old_n, "wordpiece",
         lambda: tfseq.Vocab.learn(prefix, tokenizer="wordpiece", vocab_size=FLAGS.vocab_size)),
    ]
    _, read_seconds = timed(read_and_sample)
    print(f"sample: {description}")
    print(f"  {mb:.1f} MB learned from ({len(learn_lines):,} lines), {len(held_out):,} lines "
          f"held out (every {every}th: {sum(words.values()):,} words, {len(words):,} distinct); "
          f"vocab_size={FLAGS.vocab_size}; {os.cpu_count()} cores; wall seconds of one run")
    print(f"  reading + sampling the file alone (text_lines + Reservoir, part of the two "
          f"Vocab.learn(path) times): {read_seconds:.1f} s")
    print(f"{'learner':30} {'lines':>9} {'seconds':>8} {'vocab':>6} {'words w/o <unk>':>16} "
          f"{'pieces/word':>12}")
    rows, seconds_of = [], []
    for name, n, tokenizer, call in runs:
        vocab, seconds = timed(call)
        seconds_of.append(seconds)
        known, pieces = coverage(vocab, tokenizer, words)
        rows.append({"learner": name, "lines": n, "seconds": round(seconds, 2),
                     "vocab_size": len(vocab), "heldout_words_without_unk": round(known, 4),
                     "pieces_per_word": round(pieces, 3)})
        print(f"{name:30} {n:9,} {seconds:8.1f} {len(vocab):6} {known:16.2%} {pieces:12.2f}",
              flush=True)
    new, spm, old, new_prefix = seconds_of
    ratios = {"sentencepiece_over_new_wordpiece": round(spm / new, 2),
              "old_over_new_wordpiece_same_prefix": round(old / new_prefix, 1)}
    print(f"ratios: sentencepiece / new wordpiece time on {len(learn_lines):,} lines: "
          f"{ratios['sentencepiece_over_new_wordpiece']:.2f}; old / new wordpiece time on the "
          f"same {old_n:,} lines: {ratios['old_over_new_wordpiece_same_prefix']:.1f}x")
    harness.write_json({"sample": description, "learn_mb": round(mb, 2),
                        "learn_lines": len(learn_lines), "heldout_lines": len(held_out),
                        "heldout_words": sum(words.values()), "heldout_distinct_words": len(words),
                        "vocab_size": FLAGS.vocab_size, "old_lines": old_n,
                        "read_and_sample_seconds": round(read_seconds, 2), "results": rows,
                        "ratios": ratios, "argv": sys.argv})
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    harness.run(main)
