"""Knobs for benchmarks and tests, not the public API: they change how fast a stage runs, never
what it emits, and may change or go without notice.
"""

from __future__ import annotations

import contextlib

from tfseq import _common


@contextlib.contextmanager
def parallelism(*, pools_and_parts: int | None = None, encode_calls: int | None = None):
    """Within the block, the pipelines built get these parallelisms (None: the default).

    Args:
      pools_and_parts: pools ``bucket_by_length`` (and a ``ResumableStream``) batch at once
        and parts ``pack`` packs at once (read when the pipeline is built); default the cores
        this process may use, 2 to 16.
      encode_calls: read batches a ``ResumableStream`` encodes at once (read when the stream
        is built); default ``tf.data.AUTOTUNE``, which on 16 cores gave a tokenize map that
        feeds the consumer directly ~3 cores (docs/benchmarks.md).

    All three are deterministic maps: the batches and their order are the same for every
    value, and whatever ``tf.data.Options`` say.

    Raises:
      TypeError / ValueError: a value that is not a positive int (the message names it).

    Example:
      >>> with parallelism(pools_and_parts=1):
      ...     ds = tf.data.Dataset.range(1, 6).map(lambda n: {"ids": tf.ones([n], tf.int32)})
      ...     batches = ds.apply(tfseq.bucket_by_length(max_tokens=8, seed=0))
    """
    _common.check_positive_int("pools_and_parts", pools_and_parts, allow_none=True)
    _common.check_positive_int("encode_calls", encode_calls, allow_none=True)
    saved = dict(_common._PARALLELISM)
    _common._PARALLELISM.update(pools_and_parts=pools_and_parts, encode_calls=encode_calls)
    try:
        yield
    finally:
        _common._PARALLELISM.update(saved)
