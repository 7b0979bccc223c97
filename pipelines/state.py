"""What a run learns from its training data before the first step, in one read: ``TaskState``.

A task's vocabularies (``vocab``, or ``source`` and ``target``) and label sets (classify's
labels, tag's tags) come from the training records. ``prepare`` reads them ONCE, in graph
batches, and from that one pass takes everything it needs:

* the label sets (the distinct values of each label column of the training rows, sorted);
* per vocabulary, the token counts of its columns (``whitespace`` / ``unicode_script``
  vocabularies: every training row, as ``Vocab.build`` counts) or a uniform sample of at most
  ``vocab_max_lines`` rows (``wordpiece`` / ``sentencepiece``: ``tfseq.sampling.Reservoir``,
  so a file sorted by label still gives a vocabulary of all of it);
* the line-shuffle shards of the training stream, when the input needs more than one
  (``tfseq.shuffling.SpillWriter``).

Then it learns the vocabularies from the sample (``Vocab.learn``). ``TaskState.save`` writes
them to the run's directory (``vocab.txt`` or ``vocab.model``; ``source_vocab.*`` /
``target_vocab.*``; ``labels.txt``, ``tags.txt``: one value per line, line number = id) and a
resumed run loads them from there instead of learning again. Progress of each phase goes to
``write`` (``tfseq.progress``).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from typing import Callable

import tensorflow as tf
import tensorflow_text as tf_text

from tfseq.errors import InputError
from tfseq.progress import Progress, heartbeat
from tfseq.sampling import Reservoir
from tfseq.shuffling import input_bytes
from tfseq.stats import DropCounter
from tfseq.text import LEARNED_TOKENIZERS, RESERVED, Vocab, get_tokenizer

PREPARE_BATCH = 8192  # records per batch of the prepare pass


@dataclasses.dataclass
class TaskState:
    """A run's vocabularies and label sets.

    Attributes:
      vocabs: by name: ``"vocab"``, or ``"source"`` and ``"target"``.
      labels: by label column: e.g. ``{"label": ("neg", "pos")}`` (id = index).
    """

    vocabs: dict[str, Vocab]
    labels: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    @property
    def vocab(self) -> Vocab:
        """The vocabulary of a one-vocabulary task (translate: the target's)."""
        return self.vocabs.get("vocab") or self.vocabs["target"]

    @staticmethod
    def vocab_file(name: str, vocab: Vocab | None = None, sentencepiece: bool = False) -> str:
        stem = "vocab" if name == "vocab" else f"{name}_vocab"
        spm = sentencepiece or (vocab is not None and vocab.sentencepiece_model is not None)
        return stem + (".model" if spm else ".txt")

    @staticmethod
    def label_file(column: str) -> str:
        return {"label": "labels.txt", "tags": "tags.txt"}.get(column, f"{column}.txt")

    def save(self, directory: str) -> list[str]:
        """Writes every vocabulary and label set into ``directory``; returns the file names."""
        os.makedirs(directory, exist_ok=True)
        names = []
        for name, vocab in self.vocabs.items():
            path = os.path.join(directory, self.vocab_file(name, vocab))
            vocab.save(path + ".tmp" if not path.endswith(".model") else path + ".tmp.model")
            os.replace(path + ".tmp" if not path.endswith(".model") else path + ".tmp.model",
                       path)
            names.append(os.path.basename(path))
        for column, values in self.labels.items():
            path = os.path.join(directory, self.label_file(column))
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write("".join(f"{v}\n" for v in values))
            os.replace(path + ".tmp", path)
            names.append(os.path.basename(path))
        return names

    @classmethod
    def load(cls, directory: str, vocab_names, label_columns) -> "TaskState":
        """Reads what ``save`` wrote.

        Raises:
          FileNotFoundError: a file is missing (naming it).
        """
        vocabs = {}
        for name in vocab_names:
            for spm in (False, True):
                path = os.path.join(directory, cls.vocab_file(name, sentencepiece=spm))
                if os.path.exists(path):
                    vocabs[name] = Vocab.load(path)
                    break
            else:
                raise FileNotFoundError(f"No {cls.vocab_file(name)} (or .model) in {directory}")
        labels = {}
        for column in label_columns:
            path = os.path.join(directory, cls.label_file(column))
            if not os.path.exists(path):
                raise FileNotFoundError(f"No {path}")
            with open(path, encoding="utf-8") as f:
                labels[column] = tuple(line.rstrip("\n") for line in f)
        return cls(vocabs, labels)


@dataclasses.dataclass
class PassReport:
    """What ``prepare`` did: passes over the training files and seconds per phase."""

    passes: int = 0
    records: int = 0
    seconds: dict = dataclasses.field(default_factory=dict)


def vocab_from_counts(counts: collections.Counter, *, min_count: int,
                      max_size: int | None) -> Vocab:
    """A ``Vocab`` of the tokens (bytes) counted at least ``min_count`` times, by decreasing
    count (ties by the token's bytes), at most ``max_size`` with the reserved tokens: the rule
    of ``Vocab.build``."""
    reserved = {t.encode() for t in RESERVED}
    kept = [(t, c) for t, c in counts.items() if c >= min_count and t not in reserved]
    kept.sort(key=lambda tc: (-tc[1], tc[0]))
    if max_size is not None:
        kept = kept[: max_size - len(RESERVED)]
    return Vocab(list(RESERVED) + [t.decode("utf-8", errors="replace") for t, _ in kept])


def prepare(task, config, sources, *, shards=None, fingerprint=None,
            write: Callable[[str], None] | None = None) -> tuple[TaskState, PassReport]:
    """The ``TaskState`` of ``config``'s training data, in at most one pass over it.

    Args:
      task: the ``TextTask`` (its ``vocab_columns``, ``label_columns``, ``clean_rows`` and
        ``label_values``).
      config: the task's config.
      sources: the training ``Source`` of each source (several for a mixture: each read and
        parsed in its own format, one after the other, into the same counts).
      shards: the training stream's ``RecordShards`` of one source; spilled in the same pass
        when it has more than one shard and no matching files yet.
      fingerprint: the input's fingerprint (for the shards' manifest).
      write: where progress lines go.

    Raises:
      InputError: no training record parsed, fewer than two labels (classify), a vocabulary
        with no token, files that are not line-aligned (naming them).
    """
    report = PassReport()
    loaded = _loaded_vocabs(task, config)
    fixed = task.fixed_labels(config)
    discover = [c for c in task.label_columns if c not in fixed]
    learn = {n: cols for n, cols in task.vocab_columns.items() if n not in loaded}
    spill = shards is not None and shards.num_shards > 1 and not shards.ready(fingerprint)
    values = {c: collections.Counter() for c in discover}
    tokenizer = None if _learned(config) else get_tokenizer(config.tokenizer)
    samples = {name: Reservoir(config.vocab_max_lines, seed=config.seed)
               for name in learn if tokenizer is None}
    counts = {name: collections.Counter() for name in learn if tokenizer is not None}
    description = ", ".join(source.description for source in sources)
    if discover or learn or spill or any(source.must_check for source in sources):
        for source in sources:
            counter = _read_once(task, config, source, _Learning(
                learn, discover, values, samples, counts, tokenizer), report,
                shards.spill_writer(fingerprint) if spill else None, write)
            check_drops(source, counter, write)
    labels = dict(fixed)
    for column in discover:
        names = sorted(v for v in values[column] if v)
        if not names:
            raise InputError(f"No training record of {description} parsed (check --format, "
                             f"--columns and --header){_first_bad(sources)}")
        labels[column] = tuple(names)
    task.check_labels(labels)
    check_label_values(task, config, {c: values[c] for c in discover}, report.records, write)
    vocabs = dict(loaded)
    for name in learn:
        start = time.perf_counter()
        vocabs[name] = _make_vocab(config, name, samples[name].sample() if name in samples
                                   else None, counts.get(name), write, sources)
        report.seconds["vocab" if name == "vocab" else f"{name}_vocab"] = round(
            time.perf_counter() - start, 3)
    return TaskState(vocabs, labels), report


WARN_DROP_SHARE = 0.05  # a source dropping more of its records is named at start


def check_drops(source, counter: DropCounter, write=None) -> None:
    """After the pass over ``source``: stops when every record was dropped, and names the
    source in a warning line when more than ``WARN_DROP_SHARE`` were (records held out for
    the other split aside).

    Raises:
      InputError: no record of ``source`` was usable (naming it, the reasons and the first
        bad record).
    """
    drops = {k: v for k, v in counter.drops().items() if v and k != "other_split"}
    records = counter.seen().get("lines_read", 0) - counter.drops().get("other_split", 0)
    dropped = sum(drops.values())
    if not records or not dropped:
        return
    reasons = ", ".join(f"{n:,} {reason}" for reason, n in sorted(drops.items()))
    first = source.drop_examples(1)
    example = f"; the first: {first[0]}" if first else ""
    if dropped >= records:
        raise InputError(f"no record of {source.description} is usable: {reasons}{example}; "
                         "check --format, --columns and --header (or that source's entry)")
    if write is not None and dropped > WARN_DROP_SHARE * records:
        write(f"warning: {dropped / records:.0%} of the records of {source.description} are "
              f"dropped ({reasons}){example}")


def spill_pass(task, config, source, shards, fingerprint, *, write=None) -> PassReport:
    """Writes the training stream's shards of ``source`` in one read of its records,
    learning nothing."""
    report = PassReport()
    _read_once(task, config, source, _Learning({}, [], {}, {}, {}, None), report,
               shards.spill_writer(fingerprint), write)
    return report


@dataclasses.dataclass
class _Learning:
    """What the pass learns, and where it puts it: the vocabularies' columns (``learn``:
    name -> columns), the label columns (``discover``) and their value counts (``values``),
    the vocabularies' line samples or token counts, and the tokenizer that counts tokens
    (``None``: a learned vocabulary samples lines)."""

    learn: dict
    discover: list
    values: dict
    samples: dict
    counts: dict
    tokenizer: object


def _first_bad(sources) -> str:
    bad = [line for source in sources for line in source.drop_examples(5)][:5]
    return ". First bad records: " + "; ".join(bad) if bad else ""


def _loaded_vocabs(task, config) -> dict[str, Vocab]:
    if not config.vocab_path:
        return {}
    try:
        vocab = Vocab.load(config.vocab_path)
    except (ValueError, FileNotFoundError) as e:
        raise InputError(f"--vocab: {e}") from None
    return {name: vocab for name in task.vocab_columns}


def _described(sources) -> str:
    return ", ".join(source.description for source in sources)


def _learned(config) -> bool:
    return config.tokenizer in LEARNED_TOKENIZERS


def _read_once(task, config, source, learning: _Learning, report: PassReport, spill,
               write) -> DropCounter:
    """The pass over one source: label values, token counts or samples, and the spill;
    returns the pass' counts of records read and dropped."""
    counter = DropCounter("prepare")
    learn, discover, tokenizer = learning.learn, learning.discover, learning.tokenizer

    def observe(index, records):
        rows = task.clean_rows(config, source.parse(records, counter), counter)
        out = {"records": tf.size(records), "bytes": tf.reduce_sum(tf.strings.length(records))
               + tf.size(records)}
        for column in discover:
            out[f"label/{column}"], _, out[f"label_count/{column}"] = tf.unique_with_counts(
                task.label_values(column, rows[column]))
        for name, columns in learn.items():
            texts = tf.concat([rows[c] for c in columns], 0)
            if config.lowercase:
                texts = tf_text.case_fold_utf8(texts)
            if tokenizer is None:
                out[f"text/{name}"] = texts
            else:
                tokens, _, n = tf.unique_with_counts(tokenizer.tokenize(texts).flat_values)
                out[f"tokens/{name}"], out[f"counts/{name}"] = tokens, n
        if spill is not None:
            out["spill_ids"], out["spill"], out["spill_counts"] = spill.shards.assign(
                index, records)
        return out

    batches = source.read(1, 0).rebatch(PREPARE_BATCH)
    batches = batches.enumerate().map(observe, num_parallel_calls=tf.data.AUTOTUNE)
    total = input_bytes(source.files)
    progress = Progress("reading the training records", write, total_bytes=total)
    try:
        for out in batches.prefetch(2).as_numpy_iterator():
            for column in discover:
                learning.values[column].update(dict(zip(
                    (v.decode("utf-8", errors="replace") for v in out[f"label/{column}"]),
                    out[f"label_count/{column}"].tolist())))
            for name, reservoir in learning.samples.items():
                reservoir.add(out[f"text/{name}"])
            for name, counter_ in learning.counts.items():
                counter_.update(dict(zip(out[f"tokens/{name}"].tolist(),
                                         out[f"counts/{name}"].tolist())))
            if spill is not None:
                spill.write(out["spill_ids"], out["spill"], out["spill_counts"])
            progress.update(int(out["records"]), int(out["bytes"]))
            report.records += int(out["records"])
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
        raise InputError(source.diagnose() or _assertion_message(e)) from None
    if spill is not None:
        spill.close()
    report.passes += 1
    report.seconds["read"] = round(report.seconds.get("read", 0.0) + progress.finish(), 3)
    return counter


def _assertion_message(error: tf.errors.InvalidArgumentError) -> str:
    """The message of a failed ``tf.debugging.Assert`` (e.g. files not line-aligned)."""
    text = str(error.message)
    marker = "assertion failed: "
    if marker not in text:
        return text.splitlines()[0]
    parts = text.split(marker, 1)[1].splitlines()[0]
    return " ".join(p.strip("[] ") for p in parts.split("] [") if p.strip("[] "))


def _make_vocab(config, name, sample, counts, write, sources) -> Vocab:
    what = "" if name == "vocab" else f" {name}"
    if counts is not None:
        vocab = vocab_from_counts(counts, min_count=config.min_count, max_size=config.max_vocab)
    else:
        if not config.vocab_size:
            raise InputError(f"--tokenizer={config.tokenizer} needs --vocab_size=N (to learn "
                             "a vocabulary from the training files) or --vocab=PATH")
        if not sample:
            raise InputError(f"No{what} text to learn a vocabulary from: no training record "
                             f"of {_described(sources)} parsed{_first_bad(sources)}")
        with heartbeat(f"learning a {config.tokenizer} vocabulary of {config.vocab_size:,}"
                       f"{what} from {len(sample):,} lines", write):
            vocab = Vocab.learn([s.decode("utf-8", errors="replace") if isinstance(s, bytes)
                                 else s for s in sample], tokenizer=config.tokenizer,
                                vocab_size=config.vocab_size, max_lines=len(sample),
                                lowercase=False)
    if len(vocab) <= len(RESERVED):
        raise InputError(f"No{what} text to build a vocabulary from: no training record of "
                         f"{_described(sources)} parsed (check --format, --columns and "
                         f"--header; the report's drop counts say why records were dropped)"
                         f"{_first_bad(sources)}")
    if counts is None and write is not None and len(vocab) < config.vocab_size // 2:
        write(f"note: the learned{what} vocabulary has {len(vocab):,} entries, fewer than "
              f"--vocab_size={config.vocab_size:,}: the training text has no more distinct "
              "pieces to learn (a smaller --vocab_size gives the same vocabulary)")
    return vocab


# Labels that say the columns are wrong: more classes than a tenth of the training records
# (and than MIN_SUSPECT_CLASSES), or, for per-token tags, more tags than half the records (and
# than MIN_SUSPECT_TAGS): a text column read as labels (e.g. --columns=text,label).
MIN_SUSPECT_CLASSES = 20
MIN_SUSPECT_TAGS = 100


def check_label_values(task, config, counts: dict, records: int, write=None) -> None:
    """Refuses label sets that say the columns are wrong, before anything is trained.

    Args:
      counts: per label column, a ``Counter`` of its values over the training records.
      records: training records read.
      write: where notes go (eval labels unseen in training, when fewer than half).

    Raises:
      InputError: too many distinct labels for the records (a text column read as labels);
        a label equal to its column's name without ``--header`` (a header line read as a
        record); eval files with more than half of their labels unseen in training.
    """
    for column, found in counts.items():
        names = sorted(v for v in found if v)
        if column in task.token_label_columns:
            limit = max(MIN_SUSPECT_TAGS, records // 2)
        else:
            limit = max(MIN_SUSPECT_CLASSES, records // 10)
        if len(names) > limit:
            examples = ", ".join(repr(n[:40]) for n in names[:3])
            raise InputError(
                f"the {column} column has {len(names):,} distinct values in {records:,} "
                f"training records (e.g. {examples}): that is a text column; check --columns "
                f"(now {','.join(config.columns) or 'the default'})")
        if not config.header and column.lower() in (n.lower() for n in names):
            raise InputError(f"a {column} value is {column!r}, the column's name: the first "
                             "line of a file is a header; add --header")
    if not getattr(config, "eval_files", ()) or not counts:
        return
    held = {c: collections.Counter() for c in counts}
    _read_once(task, config, task.source(config, "eval"),
               _Learning({}, list(counts), held, {}, {}, None), PassReport(), None, None)
    for column, found in counts.items():
        unseen = {v: n for v, n in held[column].items() if v and v not in found}
        if not unseen:
            continue
        share = sum(unseen.values()) / max(1, sum(n for v, n in held[column].items() if v))
        listed = ", ".join(repr(v) for v in sorted(unseen)[:5]) + (
            " ..." if len(unseen) > 5 else "")
        if share > 0.5:
            known = sorted(v for v in found if v)
            trained = ", ".join(repr(v) for v in known[:5]) + (" ..." if len(known) > 5 else "")
            raise InputError(f"{share:.0%} of the eval {column} values never occur in the "
                             f"training files (eval: {listed}; training: {trained}): those "
                             "eval records would be dropped; fix the labels (they are "
                             "case-sensitive)")
        if write is not None:
            write(f"note: {len(unseen)} {column} value(s) of the eval files never occur in "
                  f"the training files ({listed}): those eval records ({share:.0%}) are "
                  "dropped (unknown_label)")
