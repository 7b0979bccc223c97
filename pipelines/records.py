"""A run's training records, from one source or a mixture of several, behind one interface.

``training_records(task, config)`` is the one place that tells one source from a mixture
(``--train_files='news/*.tsv@0.7,web.jsonl@0.3'`` or ``--mix_temperature``); everything else
asks the object it returns:

=====================  ================================================================
``configs(split)``,    the config and ``Source`` of each source for ``split`` (one for one
``sources(split)``     source), each with its own files and format, read and parsed on its
                       own; ``files`` (training), ``input_files`` (what the run reads)
``shards(...)``        what the training stream reads: the records as shuffle shards
                       (``RecordShards``), or the sources' shards mixed exactly
                       (``tfseq.mixing.MixedRecords``)
``spill(...)``         writes the shards that are not on disk yet; ``pass_shards`` the
                       shards the learning pass writes as it reads
``encode_fn(...)``     records -> examples for the stream (a mixture counts per source)
``report_sources``,    ``report.json``'s ``sources`` and the progress line's shares (a
``shares_note``        mixture's; none for one source)
``check_mode(mode)``   refuses a training mode the records cannot feed (one line)
=====================  ================================================================

``NO_RECORDS`` answers the same for tasks whose epoch is replayed (``replayed.ReplayedTask``).
"""

from __future__ import annotations

import os
from typing import Callable

from tfseq.errors import InputError
from tfseq.mixing import MixedRecords, mixed_encode
from tfseq.pipelines import mixture, sources
from tfseq.pipelines.sources import Source
from tfseq.pipelines.state import PassReport, spill_pass
from tfseq.shuffling import RecordShards, num_shards_for, temporary_directory


class Records:
    """What the runner asks of any task's training records; the defaults are those of a task
    with no records of its own (its epoch replayed from its number)."""

    def report_sources(self, shards, counter, *, epochs_before: int) -> list[dict]:
        """``report.json``'s ``sources``: ``[]`` but for a mixture."""
        return []

    def shares_note(self, counter) -> str:
        """The progress line's note on the sources' shares: ``""`` but for a mixture."""
        return ""

    def check_mode(self, mode: str) -> None:
        """Raises ``InputError`` for a training mode these records cannot feed."""


NO_RECORDS = Records()


class TrainingRecords(Records):
    """The training records of one source: the task's ``train`` ``Source``."""

    def __init__(self, task, config):
        self.task, self.config = task, config

    def configs(self, split: str) -> list:
        return [self.config]

    def sources(self, split: str) -> list[Source]:
        return [self.task.source(c, split) for c in self.configs(split)]

    @property
    def files(self) -> tuple[str, ...]:
        """The training files."""
        return tuple(f for s in self.sources("train") for f in s.files)

    @property
    def input_files(self) -> list[str]:
        """Every file the run reads (training and eval files), sorted."""
        files = list(self.files)
        if getattr(self.config, "eval_files", ()):
            files += [f for s in self.sources("eval") for f in s.files]
        return sorted(set(files))

    def drop_examples(self, limit: int = 5) -> list[str]:
        """The first ``file:line: reason`` of the training files' malformed records."""
        return [line for s in self.sources("train") for line in s.drop_examples(limit)][:limit]

    def pass_shards(self, shards):
        """The shards the learning pass before training writes as it reads (one source's)."""
        return shards

    def shards(self, *, num_workers: int = 1, worker: int = 0,
               directory: str | None = None) -> RecordShards:
        """The records as shuffle shards (``directory``: where shards are spilled when the
        input needs more than one; a temporary one if ``None``)."""
        source = self.task.source(self.config, "train")
        k = num_shards_for(source.files, self.config.shuffle_shard_bytes)
        if k > 1 and directory is None:
            directory = temporary_directory("tfseq_shards_")
        return RecordShards(lambda: source.read(num_workers, worker), num_shards=k,
                            seed=self.config.seed, directory=directory)

    def spill(self, shards: RecordShards, fingerprint, *, write=None) -> PassReport:
        """Writes the shards if there are several and they are not on disk yet (one read of
        the records, learning nothing); the report says whether it read."""
        if shards.num_shards == 1 or shards.ready(fingerprint):
            return PassReport()
        return spill_pass(self.task, self.config, self.task.source(self.config, "train"),
                          shards, fingerprint, write=write)

    def encode_fn(self, state, counter, shards, token_keys=None) -> Callable:
        return self.task.encode_fn(self.config, state, "train", counter)


class MixedTrainingRecords(TrainingRecords):
    """The records of several sources (``mixture.source_configs``), each a
    ``TrainingRecords`` with its own files and format, mixed exactly. Evaluation reads each
    source's held-out records, or the ``eval_files`` (in the first source's format, unless
    ``--format`` says).

    Raises:
      InputError: a source whose glob matches no file (naming it).
    """

    def __init__(self, task, config):
        super().__init__(task, config)
        self.parts = [TrainingRecords(task, sub) for sub in mixture.source_configs(config)]
        self.names = mixture.names(config)
        self.entries = mixture.entries(config)
        mixture.check_sources(config)

    def configs(self, split: str) -> list:
        if split == "eval" and getattr(self.config, "eval_files", ()):
            return [self.parts[0].config]
        return [part.config for part in self.parts]

    def pass_shards(self, shards):
        return None  # each source spills in a pass of its own (``spill``)

    def shards(self, *, num_workers: int = 1, worker: int = 0,
               directory: str | None = None) -> MixedRecords:
        """Each source's ``RecordShards`` (under ``directory/source-<i>``), mixed."""
        parts = [part.shards(num_workers=num_workers, worker=worker,
                             directory=os.path.join(directory, f"source-{i}")
                             if directory else None)
                 for i, part in enumerate(self.parts)]
        return MixedRecords(parts, self.names, self.config.train_weights or None,
                            temperature=self.config.mix_temperature, seed=self.config.seed)

    def spill(self, shards: MixedRecords, fingerprint, *, write=None) -> PassReport:
        """Spills each source that needs more than one shard (a read of that source each)."""
        report = PassReport()
        for part, part_shards in zip(self.parts, shards.parts):
            done = part.spill(part_shards, sources.fingerprint(part.files), write=write)
            report.passes += done.passes
            report.records += done.records
        return report

    def encode_fn(self, state, counter, shards: MixedRecords, token_keys=None) -> Callable:
        """The stream's encode for a mixture's blocks (``tfseq.mixing.mixed_encode``)."""
        encodes = [part.encode_fn(state, counter, None) for part in self.parts]
        keys = (lambda examples: [k for k in token_keys if k in examples]) if token_keys \
            else None
        return mixed_encode(encodes, shards.chunk.tolist(), shards.names, counter, keys_fn=keys)

    def report_sources(self, shards: MixedRecords, counter, *, epochs_before: int
                       ) -> list[dict]:
        """Per source its files, weight, the examples and tokens of the epoch ``counter``
        holds and their share, its drops, and the source epochs read: ``epochs_before``
        whole mixture epochs and the records of this one."""
        counts = counter.by_source()
        examples = {n: counts.get(n, {}).get("seen", {}).get("examples", 0) for n in self.names}
        total = sum(examples.values()) or 1
        out = []
        for i, (entry, name, part) in enumerate(zip(self.entries, self.names, self.parts)):
            seen = counts.get(name, {}).get("seen", {})
            read = (int(shards.chunk[i]) * shards.blocks_per_epoch * int(epochs_before)
                    + seen.get("lines_read", 0))
            out.append({
                "source": entry, "files": list(part.files),
                "weight": round(float(shards.mixture.weights[i]), 6),
                "records": int(shards.sizes[i]),
                "examples": int(examples[name]), "tokens": int(seen.get("tokens", 0)),
                "share": round(examples[name] / total, 4),
                "source_epochs": round(read / max(1, shards.sizes[i]), 3),
                "drops": dict(counts.get(name, {}).get("drops", {}))})
        return out

    def shares_note(self, counter) -> str:
        """``shares news.tsv 0.70, web.tsv 0.30``: each source's share of the epoch's
        examples so far."""
        counts = counter.by_source()
        examples = [counts.get(n, {}).get("seen", {}).get("examples", 0) for n in self.names]
        total = sum(examples)
        if not total:
            return ""
        return "shares " + ", ".join(f"{os.path.basename(e)} {n / total:.2f}"
                                     for e, n in zip(self.entries, examples))

    def check_mode(self, mode: str) -> None:
        if mode == "data_service":
            raise InputError("--data_service reads one source: a mixture of --train_files "
                             "(GLOB@WEIGHT or --mix_temperature) trains without it")


def training_records(task, config) -> TrainingRecords | MixedTrainingRecords:
    """The training records of ``config``: a mixture when it gives weights or a temperature
    (``mixture.is_mixture``), else one source."""
    if mixture.is_mixture(config):
        return MixedTrainingRecords(task, config)
    return TrainingRecords(task, config)


__all__ = ["NO_RECORDS", "MixedTrainingRecords", "Records", "TrainingRecords",
           "training_records"]
