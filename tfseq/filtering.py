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

from tfseq._common import (Transform, batch_lengths, example_keys, example_length, identity,
                           mask_batch, unbatch)
from tfseq.stats import DropCounter, resolve_counter

LINE_REASONS = ("too_many_bytes", "invalid_utf8", "nul_byte", "empty")
DEFAULT_MAX_LINE_BYTES = 1 << 20


# Full match iff the bytes are valid UTF-8 without a NUL: RE2 compiles explicit code point
# ranges to exact UTF-8 byte sequences, so surrogates, overlong forms and code points above
# U+10FFFF fail too (unlike ``.``, which RE2 compiles loosely). One pass, no copy, unlike
# transcoding the line and comparing (tests/test_filtering.py checks it against Python's
# decoder on random bytes).
_VALID_NO_NUL = "[\\x{1}-\\x{D7FF}\\x{E000}-\\x{10FFFF}]*"


_VALID = "[\\x{0}-\\x{D7FF}\\x{E000}-\\x{10FFFF}]*"  # the same, NUL allowed


def valid_utf8(line: tf.Tensor) -> tf.Tensor:
    """bool, same shape as ``tf.string`` ``line``: whether each string is valid UTF-8 (NUL
    bytes allowed; surrogates, overlong forms and code points above U+10FFFF are not), as
    Python's decoder decides. One regex pass, no transcoding."""
    return tf.strings.regex_full_match(line, _VALID)


# Full match iff the line passes every check: valid UTF-8, no NUL, and some character that is
# not RE2 whitespace (``\\s`` = tab, newline, form feed, carriage return, space).
_GOOD_LINE = (_VALID_NO_NUL
              + "[\\x{1}-\\x{8}\\x{B}\\x{E}-\\x{1F}\\x{21}-\\x{D7FF}\\x{E000}-\\x{10FFFF}]"
              + _VALID_NO_NUL)


def line_checks(line: tf.Tensor, max_line_bytes: int | None) -> dict[str, tf.Tensor]:
    """Ordered ``reason -> bool`` (true = drop) for ``tf.string`` lines of any shape."""
    checks = {}
    if max_line_bytes is not None:
        too_big = tf.strings.length(line) > max_line_bytes
        checks["too_many_bytes"] = too_big
        # Skip the costlier checks on a line that is dropped anyway.
        line = tf.where(too_big, tf.zeros_like(line), line)
    shape = tf.shape(line)
    flat = tf.reshape(line, [-1])
    flat_shape = tf.shape(flat, out_type=tf.int64)
    # One pass over every line; only the (rare) lines that fail it are checked reason by
    # reason: the exact UTF-8 check tells a NUL from bad UTF-8.
    suspects = tf.where(tf.logical_not(tf.strings.regex_full_match(flat, _GOOD_LINE)))
    suspect_lines = tf.gather_nd(flat, suspects)
    unclean = tf.logical_not(tf.strings.regex_full_match(suspect_lines, _VALID_NO_NUL))
    invalid = unclean & tf.logical_not(valid_utf8(suspect_lines))

    def back(flags):
        return tf.reshape(tf.scatter_nd(suspects, flags, flat_shape), shape)

    checks["invalid_utf8"] = back(invalid)
    checks["nul_byte"] = back(unclean & tf.logical_not(invalid))
    checks["empty"] = back(tf.strings.regex_full_match(suspect_lines, "\\s*"))
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
        Elements that are batches already (``tf.string [n]``, or dicts whose ``key`` is
        ``[n]``) are filtered as they are and stay batches.

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
                    and spec.shape.rank in (0, 1)):
                raise ValueError(f"filter_lines expects tf.string lines or [n] batches of lines "
                                 f"(or key=... for dicts); received element_spec={spec}")
            batched = spec.shape.rank == 1
            get = lambda batch: batch  # noqa: E731
        else:
            if not isinstance(spec, dict) or key not in spec:
                raise ValueError(f"Unknown key {key!r} in filter_lines. Available keys: "
                                 f"{sorted(spec) if isinstance(spec, dict) else spec}")
            if not (isinstance(spec[key], tf.TensorSpec) and spec[key].dtype == tf.string
                    and spec[key].shape.rank in (0, 1)):
                raise ValueError(f"filter_lines(key={key!r}) needs a tf.string scalar (or [n] "
                                 f"for batched dicts); received {spec[key]}")
            batched = spec[key].shape.rank == 1
            get = lambda batch: batch[key]  # noqa: E731

        def keep_batch(batch):
            return mask_batch(batch, counter.keep_if(line_checks(get(batch), max_line_bytes)))

        # Counting happens in the map, so it must run exactly once per batch: no parallel
        # re-execution issues, and deterministic order keeps the output order.
        if batched:  # batches in, batches out: no per-line tf.data call at all
            return dataset.map(keep_batch, num_parallel_calls=tf.data.AUTOTUNE,
                               deterministic=None)
        grouped = dataset.batch(batch_size) if key is None else dataset.ragged_batch(batch_size)
        return unbatch(grouped.map(keep_batch, num_parallel_calls=tf.data.AUTOTUNE,
                                   deterministic=None))

    return apply


def filter_by_length(*, min_length: int = 1, max_length: int | None = None,
                     counter: DropCounter | None = None) -> Transform:
    """Transformation that drops examples whose length is outside ``[min_length, max_length]``.

    The input holds examples, or ragged batches of them (filtered as batches, kept in order).

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
        keys, batched = example_keys(dataset.element_spec, "filter_by_length")

        def checks_for(length):
            checks = {}
            if min_length > 0:
                checks["too_short"] = length < min_length
            if max_length is not None:
                checks["too_long"] = length > max_length
            return checks

        if batched:  # ragged batches: one vectorized call per batch
            def keep_batch(batch):
                return mask_batch(batch, counter.keep_if(checks_for(batch_lengths(batch, keys))))

            return dataset.map(keep_batch, num_parallel_calls=tf.data.AUTOTUNE,
                               deterministic=None)
        return dataset.filter(lambda example: counter.keep_if(
            checks_for(example_length(example, keys))))

    return apply
