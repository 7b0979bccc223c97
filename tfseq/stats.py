"""Counting: dropped examples by reason, elements seen, and batch efficiency.

Counts live in ``tf.Variable``s updated from inside the tf.data graph, so they are exact,
cost no Python in the data path, and can be read at any time (during or after an epoch)::

    counter = tfseq.DropCounter()
    ds = tfseq.text_lines(files).apply(counter.tally("lines_read"))
    ds = ds.apply(tfseq.filter_lines(counter=counter))
    ...
    counter.drops()   # {"empty": 18, "too_long": 3}
    counter.seen()    # {"lines_read": 31102}

The invariant every pipeline keeps: for one pass over the data,
``lines_read == examples emitted + sum(counter.drops().values())``.

A counter is per process: with the tf.data service the counts stay on the workers.
A dataset that ``cache()``s after a counting step counts the first pass only.

Shapes: B = batch, T = time.
"""

from __future__ import annotations

import contextlib
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from tfseq._common import LENGTH_SUFFIX, Transform, require_dict_spec

SEGMENT_SUFFIX = "_segment_ids"


class CountTape:
    """Counts kept as tensors of a traced function instead of variable updates.

    ``DropCounter.recording(tape)`` routes a counter's updates here; ``vector(keys)`` gives them
    as one int64 ``[len(keys)]`` tensor to return with the data, ``keys`` the
    ``("drops", reason)`` / ``("seen", name)`` pairs recorded so far (sorted).
    """

    def __init__(self):
        self._values: dict[tuple[str, str], tf.Tensor] = {}

    def add(self, key: tuple[str, str], n) -> tf.Tensor:
        n = tf.cast(n, tf.int64)
        self._values[key] = self._values[key] + n if key in self._values else n
        return n

    @property
    def keys(self) -> list[tuple[str, str]]:
        return sorted(self._values)

    def vector(self, keys: Sequence[tuple[str, str]]) -> tf.Tensor:
        """int64 ``[len(keys)]``: each key's count (0 for a key not recorded)."""
        if not keys:
            return tf.zeros([0], tf.int64)
        return tf.stack([tf.reshape(self._values.get(k, tf.constant(0, tf.int64)), [])
                         for k in keys])


class DropCounter:
    """Named int64 counters for dropped examples (by reason) and for elements seen.

    Reasons are registered in Python when a transformation is built, so every reason a
    pipeline can drop for is listed (with 0) before the first element is read.
    """

    def __init__(self, name: str = "counter"):
        self.name = name
        self._drops: dict[str, tf.Variable] = {}
        self._seen: dict[str, tf.Variable] = {}
        self._by_source: dict[str, tf.Variable] = {}  # "<source>/<drops|seen>/<name>"
        self._tape: CountTape | None = None

    @staticmethod
    def _variable(table: dict, key: str, prefix: str) -> tf.Variable:
        if key not in table:
            with tf.init_scope():
                table[key] = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name=f"{prefix}_{key}".replace(" ", "_"))
        return table[key]

    def variable(self, key: tuple[str, str]) -> tf.Variable:
        """The variable of ``("drops", reason)``, ``("seen", name)`` or ``("source",
        "<source>/<drops|seen>/<name>")`` (made if new)."""
        kind, name = key
        table = {"drops": self._drops, "source": self._by_source}.get(kind, self._seen)
        return self._variable(table, name, kind)

    def forward(self, tape: "CountTape", source: str | None = None,
                extra: Mapping[str, tf.Tensor] | None = None) -> None:
        """Adds what ``tape`` recorded to this counter (to the tape being recorded, if any),
        and with ``source`` also under that source's name (``by_source``), with ``extra``
        ``seen`` counts kept for the source only (e.g. its examples and tokens)."""
        for kind, name in tape.keys:
            n = tape.vector([(kind, name)])[0]
            (self.count if kind == "drops" else self.note)(name, n)
            if source is not None:
                self._add(("source", f"{source}/{kind}/{name}"), n)
        for name, n in (extra or {}).items():
            self._add(("source", f"{source}/seen/{name}"), n)

    def _add(self, key: tuple[str, str], n):
        var = self.variable(key)
        if self._tape is not None:
            return self._tape.add(key, n)
        return var.assign_add(tf.cast(n, tf.int64))

    def by_source(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{source: {"drops": {reason: n}, "seen": {name: n}}}`` of the counts that
        ``forward`` kept per source (a mixture's sources)."""
        out: dict = {}
        for key, v in sorted(self._by_source.items()):
            source, kind, name = key.rsplit("/", 2)
            out.setdefault(source, {"drops": {}, "seen": {}})[kind][name] = int(v.numpy())
        return out

    def register(self, *reasons: str) -> None:
        """Declares drop reasons up front so they are reported even when their count is 0."""
        for reason in reasons:
            self._variable(self._drops, reason, "drops")

    def count(self, reason: str, n=1):
        """Adds ``n`` (int scalar tensor or int) to the drop count of ``reason``; returns the op
        (inside ``recording``: the tensor ``n``, kept on the tape instead)."""
        var = self._variable(self._drops, reason, "drops")
        if self._tape is not None:
            return self._tape.add(("drops", reason), n)
        return var.assign_add(tf.cast(n, tf.int64))

    def note(self, name: str, n=1):
        """Adds ``n`` to the ``seen`` count ``name``: examples changed but still emitted
        (e.g. ``"split"``, ``"truncated"``), which must not count as drops. Returns the op
        (inside ``recording``: the tensor ``n``, kept on the tape instead)."""
        var = self._variable(self._seen, name, "seen")
        if self._tape is not None:
            return self._tape.add(("seen", name), n)
        return var.assign_add(tf.cast(n, tf.int64))

    @contextlib.contextmanager
    def recording(self, tape: "CountTape"):
        """Within the block, ``count``/``note``/``keep_if`` add to ``tape`` (tensors of the
        function being traced) instead of updating the variables.

        The counts then travel with the data (e.g. a vector per batch, ``tape.vector``) and are
        added to the variables when a consumer takes that batch (``commit``): exact at any
        point of a pipeline that reads ahead, which a resumable input needs (``tfseq.resumable``).
        """
        previous, self._tape = self._tape, tape
        try:
            yield tape
        finally:
            self._tape = previous

    def commit(self, keys: Sequence[tuple[str, str]], values) -> None:
        """Adds ``values`` (int ``[len(keys)]``, e.g. a ``CountTape.vector``) to the variables
        named by ``keys`` (``("drops", reason)`` or ``("seen", name)``)."""
        values = [int(v) for v in np.asarray(values).reshape(-1)]
        if len(values) != len(keys):
            raise ValueError(f"commit: {len(values)} values for {len(keys)} keys {list(keys)}")
        for key, value in zip(keys, values):
            if value:
                self.variable(key).assign_add(value)

    def keep_if(self, checks: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """Filter predicate: counts the first failing check and returns whether all passed.

        Args:
          checks: ordered mapping ``reason -> bool`` (a scalar, or ``[B]`` for a batch of
            elements), true meaning *drop for this reason*. The first true reason is the one
            counted, so each dropped element counts once.

        Returns:
          bool of the checks' shape: true where no check fired (keep the element).
        """
        dropped = None
        updates = []
        for reason, fires in checks.items():
            first = fires if dropped is None else tf.logical_and(fires, tf.logical_not(dropped))
            updates.append(self.count(reason, tf.reduce_sum(tf.cast(first, tf.int64))))
            dropped = fires if dropped is None else tf.logical_or(dropped, fires)
        if dropped is None:
            return tf.constant(True)
        with tf.control_dependencies(updates):
            return tf.logical_not(tf.identity(dropped))

    def tally(self, name: str, *, rows: bool = False) -> Transform:
        """Transformation that counts the elements passing through under ``name``.

        With ``rows=True`` it counts the rows of each element instead (the leading dimension
        of its first component): lines in ``tf.string [n]`` batches, examples in ragged batches.
        """

        def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
            self._variable(self._seen, name, "seen")

            def count(*element):
                if rows:
                    first = tf.nest.flatten(element, expand_composites=False)[0]
                    size = (first.nrows() if isinstance(first, tf.RaggedTensor)
                            else tf.shape(first, out_type=tf.int64)[0])
                else:
                    size = 1
                with tf.control_dependencies([self.note(name, size)]):
                    out = tf.nest.map_structure(tf.identity, element)
                return out if len(out) > 1 else out[0]

            return dataset.map(count)

        return apply

    def drops(self) -> dict[str, int]:
        """``{reason: count}`` for every registered reason (read now; works mid-epoch)."""
        return {k: int(v.numpy()) for k, v in sorted(self._drops.items())}

    def seen(self) -> dict[str, int]:
        """``{name: count}`` for every ``tally`` point."""
        return {k: int(v.numpy()) for k, v in sorted(self._seen.items())}

    def variables(self) -> dict[str, tf.Variable]:
        """Every counter variable by a unique name, e.g. to save them in a ``tf.train.Checkpoint``."""
        out = {f"drops_{k}": v for k, v in self._drops.items()}
        out.update({f"seen_{k}": v for k, v in self._seen.items()})
        out.update({f"source_{k}": v for k, v in self._by_source.items()})
        return {k.replace(" ", "_"): v for k, v in out.items()}

    def total_dropped(self) -> int:
        return sum(self.drops().values())

    def reset(self) -> None:
        for v in [*self._drops.values(), *self._seen.values(), *self._by_source.values()]:
            v.assign(0)

    def __repr__(self) -> str:
        return f"DropCounter(name={self.name!r}, seen={self.seen()}, drops={self.drops()})"


_DEFAULT: DropCounter | None = None


def default_counter() -> DropCounter:
    """The process-wide counter used by transformations given ``counter=None``."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = DropCounter("default")
    return _DEFAULT


def resolve_counter(counter: DropCounter | None) -> DropCounter:
    return default_counter() if counter is None else counter


class BatchStats:
    """Accumulates real tokens, tensor cells, examples and batches of padded or packed batches.

    ``ds.apply(stats.track())`` on a padded-batch dataset (dense ``[B, T]`` features with
    ``<name>_length``) adds each batch's numbers; ``padding_efficiency()`` is then
    real tokens / tensor cells over every batch that went through, e.g. all batches a model
    trained on.
    """

    def __init__(self):
        with tf.init_scope():
            self.real_tokens = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.cells = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.examples = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.batches = tf.Variable(0, dtype=tf.int64, trainable=False)

    def track(self, keys=None) -> Transform:
        """Transformation that counts each padded batch; ``keys`` defaults to every ``*_length``."""

        def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
            spec = dataset.element_spec
            names = keys or sequence_names(spec[0] if isinstance(spec, tuple) else spec)

            def count(*element):
                real, cells, rows = batch_counts(element[0], names)
                ops = [self.real_tokens.assign_add(real), self.cells.assign_add(cells),
                       self.examples.assign_add(rows), self.batches.assign_add(1)]
                with tf.control_dependencies(ops):
                    out = tf.nest.map_structure(tf.identity, element)
                return out if len(out) > 1 else out[0]

            return dataset.map(count)

        return apply

    def add(self, real_tokens: int, cells: int, examples: int, batches: int = 1) -> None:
        """Adds one consumed batch's numbers (``batch_counts``), e.g. from a training loop."""
        for var, n in ((self.real_tokens, real_tokens), (self.cells, cells),
                       (self.examples, examples), (self.batches, batches)):
            var.assign_add(int(n))

    def padding_efficiency(self) -> float:
        cells = int(self.cells.numpy())
        return int(self.real_tokens.numpy()) / cells if cells else 0.0

    def as_dict(self) -> dict:
        return {"real_tokens": int(self.real_tokens.numpy()), "cells": int(self.cells.numpy()),
                "examples": int(self.examples.numpy()), "batches": int(self.batches.numpy()),
                "padding_efficiency": self.padding_efficiency()}

    def reset(self) -> None:
        for v in (self.real_tokens, self.cells, self.examples, self.batches):
            v.assign(0)


def sequence_names(features_spec) -> list[str]:
    """The sequence features of a padded (``<name>_length``) or packed (``<name>_segment_ids``)
    batch spec: packed ones if any, else padded ones.

    Raises:
      ValueError: neither kind of feature (the message lists the keys).
    """
    features_spec = require_dict_spec(features_spec, "BatchStats.track")
    packed = [k[: -len(SEGMENT_SUFFIX)] for k in features_spec
              if k.endswith(SEGMENT_SUFFIX) and k[: -len(SEGMENT_SUFFIX)] in features_spec]
    padded = [k[: -len(LENGTH_SUFFIX)] for k in features_spec
              if k.endswith(LENGTH_SUFFIX) and k[: -len(LENGTH_SUFFIX)] in features_spec]
    if not (packed or padded):
        raise ValueError("BatchStats.track needs padded batches ('<name>_length' keys) or "
                         "packed ones ('<name>_segment_ids'); available keys: "
                         f"{sorted(features_spec)}")
    return packed or padded


def batch_counts(features: Mapping[str, tf.Tensor], names) -> tuple[tf.Tensor, tf.Tensor,
                                                                     tf.Tensor]:
    """``(real tokens, cells, examples)``, int64 scalars, of one padded or packed batch over
    the sequence features ``names`` (examples: rows, or segment starts when packed)."""

    def real_tokens(name):
        if name + SEGMENT_SUFFIX in features:
            return tf.math.count_nonzero(features[name + SEGMENT_SUFFIX], dtype=tf.int64)
        return tf.reduce_sum(tf.cast(features[name + LENGTH_SUFFIX], tf.int64))

    real = tf.add_n([real_tokens(n) for n in names])
    cells = tf.add_n([tf.cast(tf.size(features[n]), tf.int64) for n in names])
    first = names[0]
    if first + SEGMENT_SUFFIX in features:  # examples = segment starts
        rows = tf.math.count_nonzero(features[first + "_resets"], dtype=tf.int64)
    elif "weight" in features:  # rows added by bucket_by_length(fill_rows=True) are not
        # examples: weight 0 and no token in any feature
        added = tf.equal(tf.cast(features["weight"], tf.float32), 0.0)
        for name in names:
            added &= tf.equal(features[name + LENGTH_SUFFIX], 0)
        rows = tf.cast(tf.shape(features[first])[0], tf.int64) - tf.math.count_nonzero(
            added, dtype=tf.int64)
    else:
        rows = tf.cast(tf.shape(features[first])[0], tf.int64)
    return real, cells, rows


def step_efficiency(real_tokens: int, batches: int, max_tokens: int) -> float:
    """``ceil(real_tokens / max_tokens) / batches``: 1.0 means no batch could have been saved."""
    if batches <= 0:
        return 0.0
    return -(-real_tokens // max_tokens) / batches
