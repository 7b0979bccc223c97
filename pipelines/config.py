"""What every text task is configured by: ``TextConfig``, and the batching it asks for.

A task's ``Config`` subclasses ``TextConfig`` and changes only defaults (and adds the few
fields that are its own, e.g. translate's ``source_files``). The binaries map their flags onto
these fields (``scripts/train.py``); the library reads them in one place each:

============================  ========================================================
files and format              ``train_files``, ``eval_files``, ``format``, ``columns``,
                              ``header``; ``files`` (the embedded corpus format)
several corpora               ``train_weights`` or ``mix_temperature``: each of
                              ``train_files`` is a source (``pipelines.mixture``)
hold-out split                ``eval_percent`` (a stable hash of each record)
tokenizer and vocabulary      ``tokenizer``, ``lowercase``, ``vocab_path``, ``vocab_size``,
                              ``vocab_max_lines``, ``min_count``, ``max_vocab``
lengths                       ``max_length``, ``long_examples``, ``max_line_bytes``
batching and budgets          ``batching``, ``batch_size``, ``max_tokens``,
                              ``block_length``, ``max_segments``, ``boundaries``
shuffling                     ``seed``, ``shuffle_shard_bytes``
============================  ========================================================
"""

from __future__ import annotations

import dataclasses

from tfseq.batching import Batching, mode_of
from tfseq.errors import InputError

LONG_EXAMPLES = ("truncate", "drop")


@dataclasses.dataclass(frozen=True)
class TextConfig:
    """The shared configuration of the text tasks (see the module docstring)."""

    train_files: tuple[str, ...] = ()      # user files (globs, .gz); empty: the embedded corpus
    # A mixture: each train_files entry is one source, at these weights (or by temperature).
    train_weights: tuple[float, ...] = ()
    mix_temperature: float | None = None
    # Per source (aligned with train_files; a ``--sources`` file): its format, columns and
    # header; None / () / None: the run's own format, columns and header.
    source_formats: tuple[str | None, ...] = ()
    source_columns: tuple[tuple[str, ...], ...] = ()
    source_headers: tuple[bool | None, ...] = ()
    eval_files: tuple[str, ...] = ()       # empty: hold out eval_percent of train_files
    format: str | None = None              # tsv|csv|text|conll|jsonl|tfrecord; None: extension
    columns: tuple[str, ...] = ()          # field names in order ("_" skips); (): the task's
    header: bool = False                   # skip each file's first line
    files: tuple[str, ...] = ()            # files in the embedded corpus' format; empty: it
    eval_percent: int = 10
    tokenizer: str = "whitespace"
    lowercase: bool = True
    vocab_path: str | None = None          # load this vocab (or SentencePiece .model)
    vocab_size: int | None = None          # learn a wordpiece/sentencepiece vocab of this size
    vocab_max_lines: int = 1_000_000       # lines sampled (uniformly) to learn a vocabulary
    min_count: int = 2
    max_vocab: int = 20000
    max_length: int = 128                  # tokens per example (see long_examples)
    long_examples: str = "truncate"        # "truncate" at max_length (counted) or "drop"
    max_line_bytes: int = 1 << 16
    batching: str = "bucket"               # pad | bucket | pack
    batch_size: int = 64                   # rows per batch for batching="pad"
    max_tokens: int = 2048                 # cells per batch for "bucket" / "pack" (per replica)
    # Row lengths for batching="pack": each example goes into the shortest rows that hold it.
    block_length: int | tuple[int, ...] = (32, 64, 128)
    max_segments: int = 32                 # examples per packed row
    boundaries: tuple[int, ...] = ()       # bucket upper bounds; (): every length its own
    jit_compile: bool = False              # XLA train step; training batches of few shapes
    seed: int = 0
    shuffle_shard_bytes: int = 64 << 20    # memory bound of the line shuffle (text per shard)

    def check(self) -> None:
        """Raises ``InputError`` on a value no run can use, naming it."""
        mode_of(self.batching)
        if self.long_examples not in LONG_EXAMPLES:
            raise InputError(f"long_examples must be one of {LONG_EXAMPLES}; received "
                             f"{self.long_examples!r}")
        for name in ("batch_size", "max_tokens", "max_length", "max_segments", "eval_percent"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (0 if name == "eval_percent" else 1):
                raise InputError(f"{name} must be a positive int; received {value!r}")
        if self.train_weights or self.mix_temperature is not None:
            self._check_mixture()
        for name in ("source_formats", "source_columns", "source_headers"):
            if getattr(self, name) and len(getattr(self, name)) != len(self.train_files):
                raise InputError(f"{name}: {len(getattr(self, name))} entries for "
                                 f"{len(self.train_files)} training sources")
        if list(self.boundaries) != sorted(set(self.boundaries)) or any(
                b < 1 for b in self.boundaries):
            raise InputError(f"boundaries must be ascending positive ints; received "
                             f"{list(self.boundaries)}")

    def _check_mixture(self) -> None:
        if self.train_weights and self.mix_temperature is not None:
            raise InputError("Give weights in --train_files (GLOB@WEIGHT) or --mix_temperature, "
                             "not both")
        entries = getattr(self, "source_files", ()) or self.train_files
        if self.train_weights and len(self.train_weights) != len(entries):
            raise InputError(f"{len(entries)} training sources but "
                             f"{len(self.train_weights)} weights: give each GLOB@WEIGHT")
        if any(not w > 0 for w in self.train_weights):
            raise InputError(f"Weights must be positive; received {list(self.train_weights)}")
        if self.mix_temperature is not None and not self.mix_temperature > 0:
            raise InputError(f"--mix_temperature must be positive; received "
                             f"{self.mix_temperature}")
        if len(entries) < 2:
            raise InputError("A mixture needs at least two sources: --train_files="
                             "'a/*.tsv@0.7,b.tsv@0.3'")


@dataclasses.dataclass(frozen=True)
class GenerativeConfig(TextConfig):
    """``TextConfig`` with the defaults of the tasks that generate tokens (lm, translate):
    a sample of the embedded corpus, a smaller vocabulary, padded batches, long lines
    dropped."""

    max_lines: int = 6000                  # embedded corpus: the first N lines (0: all)
    long_examples: str = "drop"
    max_vocab: int = 3000                  # per vocabulary
    batching: str = "pad"
    batch_size: int = 32
    eval_percent: int = 5


def batching_of(config: TextConfig, *, longest: int, aligned=(), pack_split: bool = False,
                block_length=None) -> Batching:
    """The ``Batching`` a config asks for (``Batching.for_examples``). ``longest``: the longest
    example the task's encoding emits (its budgets must hold one); ``aligned``: per-token
    targets packed with their input; ``pack_split``: split examples longer than a (single)
    row length across rows instead of truncating (lm).

    Raises:
      InputError: a budget that cannot hold one example of ``longest`` tokens, or row lengths
        whose longest is shorter than that (naming the values).
    """
    return Batching.for_examples(
        config.batching, longest=longest, pack_split=pack_split,
        block_length=config.block_length if block_length is None else block_length,
        boundaries=config.boundaries, batch_size=config.batch_size,
        max_tokens=config.max_tokens, max_segments=config.max_segments,
        aligned=tuple(aligned), static_shapes=bool(getattr(config, "jit_compile", False)))
