"""Several training corpora in one run: each ``train_files`` entry a source, mixed exactly.

``--train_files='news/*.tsv@0.7,web/*.tsv.gz@0.3'`` (``train_weights``) or
``--train_files=a.tsv,b.tsv --mix_temperature=2`` (weights ``∝ records ** (1 / T)``) makes each
entry a *source*; for translate, ``--source_files='a.en@0.7,b.en@0.3' --target_files=a.de,b.de``
makes each file pair one. Its training records become their own ``RecordShards`` (spilled under
``data/shuffle/source-<i>/`` when large), visited epoch after epoch in their own shuffled order;
``tfseq.mixing.MixedRecords`` interleaves the sources' records exactly (every prefix of the
stream within one record of each weight) and ``mixed_encode`` counts each source's drops,
examples and tokens. The training stream, its cursor of three integers, the exact resume
(on any number of replicas) and the pools and batches are the same as for one source.

An epoch of a mixture is as many records as the sources hold together (rounded up to whole
blocks of about 1,024 records): a source of weight above its share of the records is seen
more than once per epoch, one below it less.

The vocabularies and the label sets come from every source's records, each source read in
its own format; evaluation reads each source's held-out records (``eval_percent`` by the same
hash) or the ``eval_files``. ``report.json`` gets ``sources``. ``pipelines.records`` puts the
sources behind the interface every training run reads (``MixedTrainingRecords``); this module
holds what a mixture is made of: its entries, weights and per-source configs.
"""

from __future__ import annotations

import dataclasses
import os

from tfseq import formats
from tfseq.errors import InputError


def is_mixture(config) -> bool:
    return bool(getattr(config, "train_weights", ())) or \
        getattr(config, "mix_temperature", None) is not None


def split_weights(entries, flag: str = "--train_files"
                  ) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """``("news/*.tsv@0.7", "web.tsv@0.3")`` -> the globs and their weights; entries without
    ``@WEIGHT`` give no weights (all of them, or an ``InputError`` naming the entry)."""
    globs, weights = [], []
    for entry in entries:
        glob, at, weight = entry.rpartition("@")
        if not at:
            globs.append(entry)
            continue
        try:
            weights.append(float(weight))
        except ValueError:
            raise InputError(f"{flag} entry {entry!r}: the text after '@' must be a "
                             "weight, e.g. news/*.tsv@0.7") from None
        globs.append(glob)
    if weights and len(weights) != len(globs):
        unweighted = [e for e in entries if "@" not in e]
        raise InputError(f"{flag}: give every entry a weight (GLOB@WEIGHT) or none; "
                         f"{unweighted} has none")
    return tuple(globs), tuple(weights)


def pairs(config) -> bool:
    """Whether the sources are translate's line-aligned file pairs (``source_files`` entry
    ``i`` with ``target_files`` entry ``i``) rather than ``train_files`` entries."""
    return bool(getattr(config, "source_files", ()))


def entries(config) -> tuple[str, ...]:
    """The sources as given: ``train_files`` entries, or ``source_files`` ones for pairs."""
    return tuple(config.source_files) if pairs(config) else tuple(config.train_files)


def source_configs(config) -> list:
    """One config per source: its files as the only training files, no mixture.

    Raises:
      InputError: pairs whose ``target_files`` entries do not match ``source_files`` one to
        one.
    """
    plain = dict(train_weights=(), mix_temperature=None)
    if not pairs(config):
        return [dataclasses.replace(config, train_files=(glob,), **plain)
                for glob in config.train_files]
    if len(config.target_files) != len(config.source_files):
        raise InputError(f"A mixture of pairs: {len(config.source_files)} --source_files "
                         f"entries but {len(config.target_files)} --target_files entries; "
                         "give one target glob per weighted source glob")
    return [dataclasses.replace(config, source_files=(s,), target_files=(t,), **plain)
            for s, t in zip(config.source_files, config.target_files)]


def names(config) -> list[str]:
    """The sources' keys in the counts: ``s0``, ``s1``, ..."""
    return [f"s{i}" for i in range(len(entries(config)))]


def check_sources(config) -> None:
    """Every source matches files (each in its own format, from its extension unless
    ``--format`` says).

    Raises:
      InputError: a source without files (naming it), or pairs that do not match up.
    """
    if pairs(config):  # plain text pairs; each pair is checked when its source is read
        source_configs(config)
        return
    for glob, sub in zip(config.train_files, source_configs(config)):
        formats.resolve(sub.train_files, f"--train_files source {glob!r}")


def format_sources(rows: list[dict]) -> list[str]:
    """The report's lines for the sources of a mixture."""
    lines = ["sources (weight -> share of this epoch's examples, source epochs read):"]
    for row in rows:
        drops = sum(n for reason, n in row["drops"].items() if reason != "other_split")
        lines.append(f"  {row['source']}: weight {row['weight']:.3f} -> share {row['share']:.3f}"
                     f", {row['examples']:,} examples, {row['tokens']:,} tokens, "
                     f"{row['source_epochs']:.2f} epochs of {row['records']:,} records"
                     + (f", {drops:,} dropped" if drops else ""))
    return lines
