"""Batch inference in input order: ``with_index``, ``restore_order`` and ``predict_in_order``.

Shapes: B = batch (rows), T = time (tokens), W = pool size (examples).

Length bucketing is where inference gains most (no gradients, big budgets), but
``bucket_by_length`` reorders examples inside each pool. These helpers put the order back:

1. ``with_index()`` numbers the examples 0, 1, 2, ... (an int64 scalar feature ``"index"``,
   carried through ``bucket_by_length`` like any other scalar: ``[B]`` in each batch).
2. The model runs on the bucketed batches.
3. ``restore_order`` (or ``predict_in_order``, steps 2 and 3 in one call) takes the
   per-batch predictions with their indices and yields one prediction per example in index
   order, holding back only the rows that arrived ahead of a missing one.

Worked example: six examples, lengths 1..6, ``bucket_by_length(max_tokens=12,
shuffle=False)`` over one pool::

  index        0  1  2  3  4  5          (lengths 1 2 3 4 5 6)
  batches      [5 4]   [3 2 1]   [0]     (longest first)
  emitted      -       -         0 1 2 3 4 5

``bucket_by_length`` emits every batch of a pool before it reads the next pool, so rows are
never held back longer than one pool: the reorder buffer holds at most ``W`` rows (plus the
batches in flight), however long the input. Everything must arrive: an example that is
dropped upstream (``too_long``, a filtered line) leaves a gap, and a gap that is still open
when the buffer holds ``max_buffer`` rows raises an error naming the missing index. For
inference, truncate long inputs instead of dropping them, and keep bad lines as empty
examples flagged invalid (as ``scripts/predict.py`` does).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import tensorflow as tf

from tfseq._common import Transform, is_ragged_batch, require_dict_spec

INDEX_KEY = "index"


def with_index(key: str = INDEX_KEY, *, batched: bool | None = None) -> Transform:
    """Transformation that adds each example's position in the stream, int64 ``key`` = 0, 1, ...

    Takes examples (dicts, or ``tf.string`` lines, which become ``{"text": line}``) or ragged
    batches of them (``tokenize`` on batched lines): a batch of ``n`` examples gets ``[n]``
    consecutive indices, so the numbering is per example either way.

    Args:
      key: the name of the new feature.
      batched: whether each element is a batch of examples (every feature's first axis is
        the batch). ``None``: ragged batches (an int ``RaggedTensor [n, (T)]`` feature) and
        ``tf.string [n]`` lines are batches, anything else is one example.

    Returns:
      A ``Dataset.apply`` transformation adding ``key``: int64 ``[]`` (``[n]`` for batches).

    Raises:
      ValueError: the elements already have a ``key`` feature.
      TypeError: elements that are neither dicts nor ``tf.string`` lines.

    Example:
      >>> ds = tf.data.Dataset.from_tensor_slices({"ids": tf.ragged.constant([[5], [6, 7]])})
      >>> [int(e["index"]) for e in ds.apply(tfseq.with_index())]
      [0, 1]
    """

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        spec = dataset.element_spec
        is_batch = batched
        if isinstance(spec, tf.TensorSpec) and spec.dtype == tf.string:
            if is_batch is None:
                is_batch = spec.shape.rank == 1
            dataset = dataset.map(lambda line: {"text": line})
            spec = dataset.element_spec
        spec = require_dict_spec(spec, "with_index")
        if key in spec:
            raise ValueError(f"with_index: the elements already have a {key!r} feature; "
                             f"pass another key. Features: {sorted(spec)}")
        if is_batch is None:
            is_batch = is_ragged_batch(spec)
        if not is_batch:
            def number(i, example):
                return {**example, key: i}

            return dataset.enumerate().map(number)

        def rows(example):
            first = next(iter(example.values()))
            return (first.nrows(out_type=tf.int64) if isinstance(first, tf.RaggedTensor)
                    else tf.shape(first, out_type=tf.int64)[0])

        def number_batch(state, example):
            n = rows(example)
            return state + n, {**example, key: tf.range(state, state + n)}

        return dataset.scan(tf.constant(0, tf.int64), number_batch)

    return apply


def _split_rows(predictions, n: int) -> list:
    """A batch of predictions (array, or dict/tuple of arrays, first axis ``n``) -> ``n`` rows."""
    if isinstance(predictions, Mapping):
        columns = {k: _split_rows(v, n) for k, v in predictions.items()}
        return [{k: columns[k][i] for k in columns} for i in range(n)]
    if isinstance(predictions, (tuple, list)):
        columns = [_split_rows(v, n) for v in predictions]
        return [type(predictions)(c[i] for c in columns) for i in range(n)]
    array = predictions.numpy() if hasattr(predictions, "numpy") else np.asarray(predictions)
    if array.shape[:1] != (n,):
        rows = array.shape[0] if array.ndim else "no"
        raise ValueError(f"A prediction has {rows} rows for a batch of {n} indices "
                         f"(shape {array.shape}); every output needs the batch's rows first")
    return list(array)


def restore_order(batches: Iterable[tuple[Any, Any]], *, max_buffer: int = 1 << 20,
                  start: int = 0) -> Iterator[tuple[int, Any]]:
    """Per-batch ``(indices, predictions)`` in any order -> ``(index, prediction)`` in order.

    Args:
      batches: an iterable of ``(indices, predictions)``: indices int ``[B]`` (from
        ``with_index``), predictions an array ``[B, ...]`` or a dict/tuple of them.
      max_buffer: the most rows held back waiting for an earlier index; more raises (an
        example went missing upstream). Bucketed inference needs about one pool plus
        bucketing's carried tail (under 9 budgets of cells).
      start: the first index expected.

    Yields:
      ``(index, row)`` for ``index = start, start + 1, ...``; ``row`` is one row of the
      predictions (a numpy value, or a dict/tuple of them).

    Raises:
      ValueError: an index arrives twice or is below the ones already emitted, the buffer
        exceeds ``max_buffer``, or indices are missing when the input ends (each message
        names the first missing index).
    """
    pending: dict[int, Any] = {}
    following = start
    for indices, predictions in batches:
        indices = np.asarray(indices.numpy() if hasattr(indices, "numpy") else indices)
        indices = indices.reshape(-1).tolist()
        for index, row in zip(indices, _split_rows(predictions, len(indices))):
            if index < following or index in pending:
                raise ValueError(f"restore_order: index {index} arrived twice")
            pending[index] = row
        while following in pending:
            yield following, pending.pop(following)
            following += 1
        if len(pending) > max_buffer:
            raise ValueError(
                f"restore_order: {len(pending)} rows wait for index {following}, more than "
                f"max_buffer={max_buffer}; was example {following} dropped upstream (a length "
                "filter, a bad line)? Keep every example, or raise max_buffer")
    if pending:
        raise ValueError(f"restore_order: the input ended with index {following} missing "
                         f"({len(pending)} later rows were never emitted)")


def predict_in_order(model_fn: Callable[[dict], Any], dataset: tf.data.Dataset, *,
                     index_key: str = INDEX_KEY, max_buffer: int = 1 << 20,
                     on_batch: Callable[[dict, Any], None] | None = None
                     ) -> Iterator[tuple[int, Any]]:
    """Runs ``model_fn`` on every batch of ``dataset`` and yields the rows in input order.

    Args:
      model_fn: ``batch -> predictions``; gets each batch without ``index_key`` and returns
        an array ``[B, ...]`` or a dict/tuple of them (e.g. a Keras model's ``predict_on_batch``
        or a SavedModel function).
      dataset: batches with an int64 ``[B]`` ``index_key`` feature, e.g.
        ``lines.apply(with_index()) ... .apply(bucket_by_length(max_tokens=...))``.
      index_key: the index feature's name.
      max_buffer: see ``restore_order``.
      on_batch: ``fn(batch, predictions)`` called per batch (a progress bar, token counts).

    Yields:
      ``(index, prediction row)`` in index order.

    Raises:
      ValueError: ``dataset`` has no ``index_key`` feature, or as in ``restore_order``.

    Example:
      >>> ds = tf.data.Dataset.from_tensor_slices({"ids": tf.ragged.constant([[1], [2, 3, 4]])})
      >>> ds = ds.apply(tfseq.with_index()).apply(tfseq.bucket_by_length(max_tokens=3))
      >>> [(i, int(n)) for i, n in tfseq.predict_in_order(lambda b: b["ids_length"], ds)]
      [(0, 1), (1, 3)]
    """
    spec = require_dict_spec(dataset.element_spec, "predict_in_order")
    if index_key not in spec:
        raise ValueError(f"predict_in_order needs an {index_key!r} feature (apply "
                         f"tfseq.with_index() before batching). Available keys: {sorted(spec)}")

    def run():
        for batch in dataset:
            batch = dict(batch)
            indices = batch.pop(index_key)
            predictions = model_fn(batch)
            if on_batch is not None:
                on_batch(batch, predictions)
            yield indices, predictions

    return restore_order(run(), max_buffer=max_buffer)
