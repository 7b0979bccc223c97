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
import json
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
    plain = dict(train_weights=(), mix_temperature=None, source_formats=(),
                 source_columns=(), source_headers=())
    if not pairs(config):
        return [dataclasses.replace(config, train_files=(glob,), **plain, **own(config, i))
                for i, glob in enumerate(config.train_files)]
    if len(config.target_files) != len(config.source_files):
        raise InputError(f"A mixture of pairs: {len(config.source_files)} --source_files "
                         f"entries but {len(config.target_files)} --target_files entries; "
                         "give one target glob per weighted source glob")
    return [dataclasses.replace(config, source_files=(s,), target_files=(t,), **plain)
            for s, t in zip(config.source_files, config.target_files)]


def own(config, i: int) -> dict:
    """Source ``i``'s own settings (``--sources``): its format, columns and header where it
    gives them."""
    out = {}
    if config.source_formats and config.source_formats[i]:
        out["format"] = config.source_formats[i]
    if config.source_columns and config.source_columns[i]:
        out["columns"] = tuple(config.source_columns[i])
    if config.source_headers and config.source_headers[i] is not None:
        out["header"] = bool(config.source_headers[i])
    return out


def read_sources_file(path: str) -> dict:
    """The ``Config`` fields of a ``--sources`` file (docs/sources.md): ``train_files`` and,
    per source, its weight, format, columns and header.

    The file is JSON: ``{"sources": [{"files": GLOB or [GLOBS], "weight": W, "format": F,
    "columns": "a,b" or [...], "header": true}, ...], "temperature": T}``; every key but
    ``files`` optional (weights: all or none; ``temperature`` instead of weights).

    Raises:
      InputError: an unreadable file, or an entry that does not say what it means (naming
        the entry and the key).
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"--sources={path}: {e}") from None
    entries = data.get("sources") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InputError(f"--sources={path}: expected {{\"sources\": [{{\"files\": ...}}, "
                         "...]}")
    known = {"files", "weight", "format", "columns", "header"}
    files, weights, kinds, columns, headers = [], [], [], [], []
    for i, entry in enumerate(entries):
        where = f"--sources={path}: source {i + 1}"
        if not isinstance(entry, dict) or "files" not in entry:
            raise InputError(f"{where}: an object with \"files\" (a glob or a list of globs)")
        unknown = sorted(set(entry) - known)
        if unknown:
            raise InputError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
        globs = entry["files"] if isinstance(entry["files"], list) else [entry["files"]]
        if not globs or not all(isinstance(g, str) and g for g in globs):
            raise InputError(f"{where}: \"files\" must be a glob or a list of globs")
        files.append(",".join(os.path.abspath(g) for g in globs))
        if "weight" in entry:
            if not isinstance(entry["weight"], (int, float)) or not entry["weight"] > 0:
                raise InputError(f"{where}: \"weight\" must be a positive number")
            weights.append(float(entry["weight"]))
        kinds.append(entry.get("format"))
        cols = entry.get("columns", ())
        columns.append(tuple(c.strip() for c in (cols.split(",") if isinstance(cols, str)
                                                 else cols)))
        headers.append(entry.get("header"))
    if weights and len(weights) != len(entries):
        raise InputError(f"--sources={path}: give every source a \"weight\", or none")
    if len(entries) == 1:  # one source: its settings are the run's
        own_settings = {"format": kinds[0], "columns": columns[0], "header": headers[0]}
        return {"train_files": (files[0],),
                **{k: v for k, v in own_settings.items() if v not in (None, ())}}
    out = {"train_files": tuple(files), "source_formats": tuple(kinds),
           "source_columns": tuple(columns), "source_headers": tuple(headers)}
    if len(entries) > 1:
        if weights:
            out["train_weights"] = tuple(weights)
        elif data.get("temperature") is not None:
            out["mix_temperature"] = float(data["temperature"])
        else:
            out["mix_temperature"] = 1.0  # in proportion to the sources' records
    return out


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
