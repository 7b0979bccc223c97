"""Pools of examples gathered from a stream: the accumulator ``bucket_by_length`` and ``pack``
share.

Shapes: W = rows (examples) in a pool, n = rows in one chunk.

A stream of *chunks* (batches of examples) is gathered into pools. While a pool fills, each of
its components is a ``TensorList`` of the chunks' pieces, so appending a chunk is amortized
O(1) (no copy of the pool so far); the pool is concatenated once, when it closes. A chunk is
any nest (dict, tuple) of

* int ``RaggedTensor [n, (T)]``: kept as its flat values and its int32 row lengths, and
  rebuilt with int32 row splits, ``[W, (T)]``;
* dense tensors whose first dimension grows with the chunk (``[n]``, ``[n, F]``, or the flat
  tokens of several examples): concatenated along it.

Example: ``fill_pools`` over chunks of 2, 3 and 2 examples of 3 tokens each, closing a pool
at ``max_tokens=12``::

    chunk rows      2    3    2
    pool tokens     6   15    6      (the third chunk ends the stream)
    closed pools         [5 rows]  [2 rows]
"""

from __future__ import annotations

from typing import Callable, Mapping

import tensorflow as tf

from tfseq._common import is_ragged_batch, mark_last, require_dict_spec


def _element_shape(spec: tf.TensorSpec) -> list[int]:
    """A dense component's ``TensorList`` element shape: -1 for the growing first dimension
    (and any other unknown one)."""
    return [-1] + [-1 if d is None else d for d in spec.shape.as_list()[1:]]


class PoolLists:
    """The ``TensorList``\\ s a pool is kept in while it fills (see the module docstring).

    Args:
      spec: the chunks' structure, a nest of ``tf.TensorSpec`` (first dimension: the rows or
        tokens of a chunk) and ``tf.RaggedTensorSpec`` ``[n, (T)]`` (ragged rank 1).
    """

    def __init__(self, spec):
        self.spec = spec
        self._specs = tf.nest.flatten(spec)
        self._dtypes, self._shapes = [], []
        for s in self._specs:
            if isinstance(s, tf.RaggedTensorSpec):
                self._dtypes += [s.dtype, tf.int32]
                self._shapes += [[-1], [-1]]
            else:
                self._dtypes.append(s.dtype)
                self._shapes.append(_element_shape(s))

    def empty(self) -> tuple:
        """An empty pool: one empty ``TensorList`` per flat component."""
        return tuple(tf.raw_ops.EmptyTensorList(element_shape=shape, max_num_elements=-1,
                                                element_dtype=dtype)
                     for dtype, shape in zip(self._dtypes, self._shapes))

    def push(self, lists: tuple, chunk) -> tuple:
        """Appends a chunk (a nest like ``spec``) to the pool's lists."""
        return tuple(tf.raw_ops.TensorListPushBack(input_handle=a, tensor=p)
                     for a, p in zip(lists, self._flat(chunk)))

    def concat(self, lists: tuple):
        """The lists -> the pool, a nest like ``spec`` (ragged components with int32 splits)."""
        return self._build([self._concat(a, i) for i, a in enumerate(lists)])

    def concat_both(self, first: tuple, second: tuple):
        """Two pools' lists -> one pool: ``first``'s rows, then ``second``'s."""
        return self.concat(tuple(
            tf.raw_ops.TensorListPushBack(input_handle=a, tensor=self._concat(b, i))
            for i, (a, b) in enumerate(zip(first, second))))

    def _flat(self, chunk) -> list[tf.Tensor]:
        out = []
        for s, value in zip(self._specs, tf.nest.flatten(chunk, expand_composites=False)):
            if isinstance(s, tf.RaggedTensorSpec):
                out += [value.flat_values, tf.cast(value.row_lengths(), tf.int32)]
            else:
                out.append(value)
        return out

    def _concat(self, handle: tf.Tensor, index: int) -> tf.Tensor:
        return tf.raw_ops.TensorListConcatV2(
            input_handle=handle, element_shape=self._shapes[index],
            leading_dims=tf.zeros([0], tf.int64), element_dtype=self._dtypes[index])[0]

    def _build(self, flat: list[tf.Tensor]):
        values, i = [], 0
        for s in self._specs:
            if isinstance(s, tf.RaggedTensorSpec):
                values.append(tf.RaggedTensor.from_row_lengths(flat[i], flat[i + 1],
                                                               validate=False))
                i += 2
            else:
                values.append(flat[i])
                i += 1
        return tf.nest.pack_sequence_as(self.spec, values)


def fill_pools(chunks: tf.data.Dataset, lists: PoolLists,
               measure: Callable[[object], tuple[tf.Tensor, tf.Tensor]], *,
               max_tokens: int | None = None, max_rows: int | None = None) -> tf.data.Dataset:
    """Gathers a stream of chunks into pools (a ``scan`` that only appends).

    A pool closes with the chunk that brings it to ``max_tokens`` tokens or ``max_rows`` rows
    (whichever is given and comes first), or with the last chunk of the stream (found by
    looking one chunk ahead, ``mark_last``, so it also works on the ``tf.data`` service).

    Args:
      chunks: elements ``(chunk, tag)``: ``chunk`` a nest like ``lists.spec``; ``tag`` any
        nest of tensors (e.g. a seed) that travels with it.
      lists: the pools' accumulator.
      measure: ``chunk -> (rows, tokens)``, int64 scalars, what the chunk adds to its pool.
      max_tokens, max_rows: when a pool closes; neither: only at the end of the stream.

    Returns:
      One element per pool, ``(is_last, pool_lists, tag)``: bool scalar, whether the stream
      ends with this pool; the pool's lists (``lists.concat`` them); the tag of its last chunk.
    """
    zero = tf.constant(0, tf.int64)
    plain = tf.autograph.experimental.do_not_convert

    def step(state, inputs):
        rows, tokens, pool = state
        is_last, (chunk, tag) = inputs
        pool = lists.push(pool, chunk)
        chunk_rows, chunk_tokens = measure(chunk)
        rows += chunk_rows
        tokens += chunk_tokens
        ready = is_last | (tokens >= max_tokens if max_tokens else False)
        if max_rows is not None:
            ready |= rows >= max_rows
        state = tf.cond(ready, lambda: (zero, zero, lists.empty()), lambda: (rows, tokens, pool))
        return state, (ready, (is_last, pool, tag))

    return (mark_last(chunks).scan((zero, zero, lists.empty()), plain(step))
            .filter(plain(lambda ready, closed: ready))
            .map(plain(lambda ready, closed: closed)))


def check_pool(pool: Mapping[str, tf.Tensor], where: str) -> dict:
    """A pool handed to a pool-level entry point, checked: a dict of int ``RaggedTensor
    [W, (T)]`` (at least one) and ``[W]`` tensors. Returns it with int32 row splits.

    Raises:
      TypeError: ``pool`` is not a dict.
      ValueError: no ragged sequence feature, or a feature of another shape.
    """
    spec = require_dict_spec({k: tf.type_spec_from_value(v) for k, v in pool.items()}
                             if isinstance(pool, Mapping) else pool, where)
    if not is_ragged_batch(spec):
        received = {k: str(s) for k, s in spec.items()}
        raise ValueError(f"{where} takes a dict of int RaggedTensor [W, (T)] sequence features "
                         f"and [W] scalar features; received {received}")
    return {k: v.with_row_splits_dtype(tf.int32) if isinstance(v, tf.RaggedTensor) else v
            for k, v in pool.items()}
