"""Greedy decoding of a sequence model, in the graph: the export and the eval samples share it.

Shapes: B = batch, V = target vocabulary, N = steps taken (at most ``max_length``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf

from tfseq._common import user_function

# step_fn(token int32 [B, 1], state, memory, lengths int32 [B]) -> (logits float32 [B, V], state)
StepFn = Callable


def greedy_decode(step_fn: StepFn, memory, state, lengths: tf.Tensor, *, max_length: int,
                  bos_id: int, eos_id: int, suppress_ids: Sequence[int] = ()) -> tf.Tensor:
    """Generates the most likely token at each step until every row has ended.

    Args:
      step_fn: one decoder step (see ``StepFn``); ``memory``, ``state``: what the encoder gave.
      lengths: int32 [B] source lengths (passed to ``step_fn``).
      max_length: the most tokens generated per row.
      bos_id, eos_id: the start token fed first, and the end token that ends a row (kept).
      suppress_ids: ids never generated (e.g. ``<pad>``, ``<unk>``, ``<s>``: an undertrained
        model otherwise prefers the most frequent one).

    Returns:
      int32 [B, N], 1 <= N <= max_length: the generated ids; after a row's ``eos_id`` every
      id is 0. Runs as a ``tf.while_loop`` in a graph, as a Python loop when eager.
    """
    step_fn = user_function(step_fn)
    rows = tf.shape(lengths)[0]
    token = tf.fill([rows, 1], tf.constant(bos_id, tf.int32))
    done = tf.zeros([rows], tf.bool)
    out = tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[None])
    suppress = list(suppress_ids)

    def body(i, token, state, done, out):
        logits, state = step_fn(token, state, memory, lengths)
        if suppress:
            penalty = tf.scatter_nd([[s] for s in suppress], tf.fill([len(suppress)], -1e9),
                                    tf.shape(logits)[-1:])
            logits += penalty
        next_token = tf.argmax(logits, axis=-1, output_type=tf.int32)
        out = out.write(i, tf.where(done, 0, next_token))
        done = done | tf.equal(next_token, eos_id)
        return i + 1, next_token[:, None], state, done, out

    def cond(i, token, state, done, out):
        # At least one step, so the output is [B, >= 1] even for an empty batch.
        return (i < max_length) & ((i == 0) | tf.logical_not(tf.reduce_all(done)))

    _, _, _, _, out = tf.while_loop(
        cond, body, (tf.constant(0), token, state, done, out),
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, 1]),
                          tf.nest.map_structure(lambda s: s.shape, state),
                          tf.TensorShape([None]), tf.TensorShape(None)))
    return tf.transpose(out.stack())
