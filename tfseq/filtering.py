"""Dropping bad lines and out-of-range examples, each drop counted by reason.

Two transformations, each a ``Dataset.apply`` step that counts what it drops in a
``tfseq.DropCounter`` (the process default when ``counter=None``):

=====================  ==================================================================
``filter_lines``       raw lines: ``too_many_bytes`` > ``max_line_bytes``; ``invalid_utf8``;
                       ``nul_byte`` (a ``\\0`` byte); ``empty`` (nothing but whitespace)
``filter_by_length``   examples: ``too_short`` < ``min_length``; ``too_long`` > ``max_length``
=====================  ==================================================================

The length of an example is the max over its sequence features (DESIGN.md).
"""

from __future__ import annotations

import tensorflow as tf

from tfseq._common import Transform, example_length, identity, sequence_keys, unbatch_examples
from tfseq.stats import DropCounter, resolve_counter

LINE_REASONS = ("too_many_bytes", "invalid_utf8", "nul_byte", "empty")
DEFAULT_MAX_LINE_BYTES = 1 << 20


def line_checks(line: tf.Tensor, max_line_bytes: int | None) -> dict[str, tf.Tensor]:
    """Ordered ``reason -> bool`` (true = drop) for ``tf.string`` lines of any shape."""
    checks = {}
    if max_line_bytes is not None:
        too_big = tf.strings.length(line) > max_line_bytes
        checks["too_many_bytes"] = too_big
        # Skip the costlier checks on a line that is dropped anyway.
        line = tf.where(too_big, tf.zeros_like(line), line)
    valid = tf.equal(tf.strings.unicode_transcode(
        line, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD), line)
    checks["invalid_utf8"] = tf.logical_not(valid)
    checks["nul_byte"] = tf.strings.regex_full_match(line, "(?s).*\\x00.*")
    checks["empty"] = tf.strings.regex_full_match(line, "\\s*")
    return checks


def filter_lines(*, max_line_bytes: int | None = DEFAULT_MAX_LINE_BYTES, key: str | None = None,
                 counter: DropCounter | None = None, batch_size: int = 512) -> Transform:
    """Transformation that drops unusable text lines, counting each by reason.

    Args:
      max_line_bytes: lines longer than this (in bytes) are dropped as ``too_many_bytes``;
        ``None`` for no limit.
      key: for dict elements, the ``tf.string`` feature to check; ``None`` for string elements.
      counter: where drops are counted (default: ``tfseq.stats.default_counter()``).
      batch_size: lines checked per vectorized call (order and elements are unchanged).

    Returns:
      A transformation keeping the elements whose line is non-empty, valid UTF-8, NUL-free and
      within the byte limit.

    Example:
      lines ``["ok", "", "bad\\xff", "a\\x00b"]`` -> ``["ok"]`` and drops
      ``{"empty": 1, "invalid_utf8": 1, "nul_byte": 1, "too_many_bytes": 0}``.
    """
    counter = resolve_counter(counter)
    counter.register(*(r for r in LINE_REASONS if max_line_bytes is not None or r != "too_many_bytes"))

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        spec = dataset.element_spec
        if key is None:
            if not (isinstance(spec, tf.TensorSpec) and spec.dtype == tf.string
                    and spec.shape.rank == 0):
                raise ValueError(f"filter_lines expects tf.string lines (or key=... for dicts); "
                                 f"received element_spec={spec}")
            get = lambda batch: batch  # noqa: E731
            batched = dataset.batch(batch_size)
        else:
            if not isinstance(spec, dict) or key not in spec:
                raise ValueError(f"Unknown key {key!r} in filter_lines. Available keys: "
                                 f"{sorted(spec) if isinstance(spec, dict) else spec}")
            get = lambda batch: batch[key]  # noqa: E731
            batched = dataset.ragged_batch(batch_size)

        def keep_batch(batch):
            keep = counter.keep_if(line_checks(get(batch), max_line_bytes))
            return tf.nest.map_structure(lambda t: tf.boolean_mask(t, keep), batch)

        # Counting happens in the map, so it must run exactly once per batch: no parallel
        # re-execution issues, and deterministic order keeps the output order.
        return unbatch_examples(batched.map(keep_batch, num_parallel_calls=tf.data.AUTOTUNE,
                                            deterministic=None))

    return apply


def filter_by_length(*, min_length: int = 1, max_length: int | None = None,
                     counter: DropCounter | None = None) -> Transform:
    """Transformation that drops examples whose length is outside ``[min_length, max_length]``.

    Args:
      min_length: shorter examples are dropped as ``too_short`` (0 or less: no lower bound).
      max_length: longer examples are dropped as ``too_long`` (``None``: no upper bound).
      counter: where drops are counted (default: ``tfseq.stats.default_counter()``).

    Returns:
      The transformation, or the identity when there is nothing to filter.

    Raises:
      ValueError: ``max_length < min_length``, or (when applied) no sequence feature.

    Example:
      ids lengths ``[0, 2, 5, 9]`` with ``min_length=1, max_length=5`` -> lengths ``[2, 5]``;
      drops ``{"too_short": 1, "too_long": 1}``.
    """
    if max_length is not None and max_length < max(min_length, 0):
        raise ValueError(f"max_length must be >= min_length; received min_length={min_length}, "
                         f"max_length={max_length}")
    if min_length <= 0 and max_length is None:
        return identity
    counter = resolve_counter(counter)
    reasons = (["too_short"] if min_length > 0 else []) + (["too_long"] if max_length is not None else [])
    counter.register(*reasons)

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        keys = sequence_keys(dataset.element_spec, "filter_by_length")

        def keep(example):
            length = example_length(example, keys)
            checks = {}
            if min_length > 0:
                checks["too_short"] = length < min_length
            if max_length is not None:
                checks["too_long"] = length > max_length
            return counter.keep_if(checks)

        return dataset.filter(keep)

    return apply
