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

The vocabularies, the label sets and the evaluation split come from all the sources' files
read as one (``eval_percent`` held out of each by the same hash, or ``eval_files``); the
sources must share one format. ``report.json`` gets ``sources`` (``report_sources``).
"""

from __future__ import annotations

import dataclasses
import os

from tfseq import formats
from tfseq.errors import InputError
from tfseq.mixing import MixedRecords, mixed_encode
from tfseq.pipelines import sources


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


def check_sources(task, config) -> None:
    """Every source matches files of the same format.

    Raises:
      InputError: a source without files, or sources of different formats (naming them).
    """
    if pairs(config):  # plain text pairs; each pair is checked when its source is read
        source_configs(config)
        return
    kinds = {}
    for glob, sub in zip(config.train_files, source_configs(config)):
        files = formats.resolve(sub.train_files, f"--train_files source {glob!r}")
        kinds[glob] = formats.infer_format(files, config.format)
    if len(set(kinds.values())) > 1:
        raise InputError("The sources of a mixture must share one format; "
                         + ", ".join(f"{g} is {k}" for g, k in kinds.items())
                         + " (convert them, or give --format)")


def record_shards(task, config, *, num_workers: int = 1, worker: int = 0,
                  directory: str | None = None) -> MixedRecords:
    """Each source's ``RecordShards`` (under ``directory/source-<i>``), mixed."""
    check_sources(task, config)
    parts = [task.record_shards(sub, num_workers=num_workers, worker=worker,
                                directory=os.path.join(directory, f"source-{i}")
                                if directory else None)
             for i, sub in enumerate(source_configs(config))]
    return MixedRecords(parts, names(config), config.train_weights or None,
                        temperature=config.mix_temperature, seed=config.seed)


def spill(task, config, shards: MixedRecords, *, write=None):
    """Spills each source that needs more than one shard (a read of that source each)."""
    from tfseq.pipelines.state import PassReport, spill as spill_one

    report = PassReport()
    for sub, part in zip(source_configs(config), shards.parts):
        files = task.source(sub, "train").files
        done = spill_one(task, sub, part, sources.fingerprint(files), write=write)
        report.passes += done.passes
        report.records += done.records
    return report


def encode_fn(task, config, state, counter, shards: MixedRecords, token_keys=None):
    """The stream's encode for a mixture's blocks (``tfseq.mixing.mixed_encode``)."""
    encodes = [task.encode_fn(sub, state, "train", counter) for sub in source_configs(config)]
    keys = (lambda examples: [k for k in token_keys if k in examples]) if token_keys else None
    return mixed_encode(encodes, shards.chunk.tolist(), shards.names, counter, keys_fn=keys)


def report_sources(task, config, shards: MixedRecords, counter, *,
                   epochs_before: int) -> list[dict]:
    """``report.json``'s ``sources``: per source its files, weight, the examples and tokens of
    the epoch ``counter`` holds (its pools begun) and their share, its drops, and the source
    epochs read: ``epochs_before`` whole mixture epochs and the records of this one."""
    counts = counter.by_source()
    examples = {n: counts.get(n, {}).get("seen", {}).get("examples", 0) for n in shards.names}
    total = sum(examples.values()) or 1
    out = []
    for i, (glob, name) in enumerate(zip(entries(config), shards.names)):
        seen = counts.get(name, {}).get("seen", {})
        read = (int(shards.chunk[i]) * shards.blocks_per_epoch * int(epochs_before)
                + seen.get("lines_read", 0))
        out.append({
            "source": glob, "files": list(task.source(source_configs(config)[i], "train").files),
            "weight": round(float(shards.mixture.weights[i]), 6),
            "records": int(shards.sizes[i]),
            "examples": int(examples[name]), "tokens": int(seen.get("tokens", 0)),
            "share": round(examples[name] / total, 4),
            "source_epochs": round(read / max(1, shards.sizes[i]), 3),
            "drops": dict(counts.get(name, {}).get("drops", {}))})
    return out


def shares_note(config, counter) -> str:
    """``shares news.tsv 0.70, web.tsv 0.30``: each source's share of the epoch's examples so
    far (the progress line's note)."""
    counts = counter.by_source()
    examples = [counts.get(n, {}).get("seen", {}).get("examples", 0) for n in names(config)]
    total = sum(examples)
    if not total:
        return ""
    return "shares " + ", ".join(f"{os.path.basename(g)} {n / total:.2f}"
                                 for g, n in zip(entries(config), examples))


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
