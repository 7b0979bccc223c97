"""Helpers shared by the transformations: the element contract in code.

Shapes: B = batch, T = time (tokens).

An example is a dict; its *sequence features* are the 1-D integer tensors (``[(T)]``), the
other features are scalars. ``sequence_keys`` reads them off ``dataset.element_spec`` so every
check happens in Python, before any graph runs.

A *ragged batch* of examples (``pad_batch(n, ragged=True)``, or the vectorized stages run
on batched lines) holds B examples at once: sequence features int ``RaggedTensor [B, (T)]``,
scalars ``[B]``. ``example_keys`` accepts either form and says which one it saw, so the
transformations that gather examples anyway (``filter_by_length``, ``bucket_by_length``,
``pack``) take ragged batches as they are and skip one tf.data call per example.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

import tensorflow as tf

Transform = Callable[[tf.data.Dataset], tf.data.Dataset]

LENGTH_SUFFIX = "_length"


def identity(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The transformation that does nothing (returned when there is nothing to do)."""
    return dataset


def require_dict_spec(spec, where: str) -> Mapping[str, tf.TypeSpec]:
    """Returns ``spec`` if it is a dict, else raises a ``TypeError`` naming ``where``."""
    if not isinstance(spec, Mapping):
        raise TypeError(
            f"{where} expects a dataset of dict examples (see the element contract in the README); "
            f"received element_spec={spec!r}")
    return spec


def sequence_keys(spec, where: str = "this transformation") -> list[str]:
    """Names of the sequence features: integer features of rank 1 (unbatched examples).

    Raises:
      TypeError: the elements are not dicts.
      ValueError: there is no sequence feature.
    """
    spec = require_dict_spec(spec, where)
    keys = []
    for key, s in spec.items():
        if isinstance(s, tf.TensorSpec) and s.shape.rank == 1 and s.dtype.is_integer:
            keys.append(key)
    if not keys:
        raise ValueError(
            f"{where} found no sequence feature (a 1-D integer tensor). "
            f"Features: { {k: str(v) for k, v in spec.items()} }")
    return keys


def _is_ragged_rows(s) -> bool:
    return (isinstance(s, tf.RaggedTensorSpec) and s.shape.rank == 2 and s.ragged_rank == 1
            and s.dtype.is_integer)


def is_ragged_batch(spec) -> bool:
    """Whether ``spec`` is a ragged batch of examples: a dict with at least one int
    ``RaggedTensor [B, (T)]`` feature, every other feature a rank-1 ``[B]`` tensor."""
    if not isinstance(spec, Mapping):
        return False
    ragged = [k for k, s in spec.items() if _is_ragged_rows(s)]
    rest_ok = all(isinstance(s, tf.TensorSpec) and s.shape.rank == 1
                  for k, s in spec.items() if k not in ragged)
    return bool(ragged) and rest_ok


def example_keys(spec, where: str = "this transformation") -> tuple[list[str], bool]:
    """``(sequence keys, batched)`` for a dataset of examples or of ragged batches of them.

    Raises:
      TypeError: the elements are not dicts.
      ValueError: there is no sequence feature.
    """
    if is_ragged_batch(spec):
        return [k for k, s in spec.items() if _is_ragged_rows(s)], True
    return sequence_keys(spec, where), False


def check_keys(spec, keys, where: str) -> None:
    """Raises ``ValueError`` naming the first key of ``keys`` that is missing from ``spec``."""
    spec = require_dict_spec(spec, where)
    for key in keys:
        if key not in spec:
            raise ValueError(f"Unknown key {key!r} in {where}. Available keys: {sorted(spec)}")


def example_length(example: Mapping[str, tf.Tensor], keys) -> tf.Tensor:
    """int32 scalar: the max length over the sequence features ``keys`` of one example."""
    lengths = [tf.shape(example[k], out_type=tf.int32)[0] for k in keys]
    return tf.reduce_max(tf.stack(lengths)) if len(lengths) > 1 else lengths[0]


def batch_lengths(batch: Mapping[str, tf.Tensor], keys) -> tf.Tensor:
    """int32 ``[B]``: per example of a ragged batch, the max length over ``keys``."""
    lengths = [tf.cast(batch[k].row_lengths(), tf.int32) for k in keys]
    return tf.reduce_max(tf.stack(lengths), axis=0) if len(lengths) > 1 else lengths[0]


def mask_batch(batch, keep: tf.Tensor):
    """The rows of a batch (a tensor, ragged tensor or dict of them) where ``keep`` (bool
    ``[B]``) is true, in order. Most batches keep every row: those pass through uncopied."""

    def mask(value):
        if isinstance(value, tf.RaggedTensor):
            return tf.ragged.boolean_mask(value, keep)
        return tf.boolean_mask(value, keep)

    return tf.cond(tf.reduce_all(keep), lambda: batch,
                   lambda: tf.nest.map_structure(mask, batch, expand_composites=False))


def check_positive_int(name: str, value, allow_none: bool = False) -> None:
    """Raises ``TypeError``/``ValueError`` naming ``name`` unless ``value`` is a positive int."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int; received {name}={value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be positive; received {name}={value!r}")


def unbatch(batched: tf.data.Dataset) -> tf.data.Dataset:
    """``Dataset.unbatch`` that gives 1-D ragged rows back as plain ``tf.Tensor`` features.

    Ragged batches of examples -> examples (``tfseq.unbatch``), for the steps that need one
    example at a time (``pad_batch``, ``Dataset.shuffle``).

    Vectorized steps batch examples (``ragged_batch``), work on ``[B, (T)]`` and unbatch;
    ``unbatch`` alone leaves a ragged-rank-0 ``RaggedTensorSpec``, which the identity map
    turns back into the ``TensorSpec([None])`` of the element contract.
    """
    out = batched.unbatch()
    specs = tf.nest.flatten(out.element_spec, expand_composites=False)
    if any(isinstance(s, tf.RaggedTensorSpec) for s in specs):
        out = out.map(lambda example: example)
    return out


def pipeline_options() -> tf.data.Options:
    """``tf.data.Options`` for tfseq pipelines: ``map_fusion`` on (off by default in
    ``tf.data``), so consecutive vectorized steps (field split, cleaning, tokenizing) run as
    one function per batch and pay a ``tf.data`` step's fixed cost once. Apply with
    ``ds.with_options(tfseq.pipeline_options())``; options set later override these."""
    options = tf.data.Options()
    options.experimental_optimization.map_fusion = True
    return options



# Parallelism of the stages that work on whole pools or parts and of the resumable stream's
# encoding; None: the defaults. Set only by ``tfseq.experimental.parallelism``.
_PARALLELISM = {"pools_and_parts": None, "encode_calls": None}


def parallel_calls() -> int:
    """Parallel calls for a stage that works on whole pools or parts: the cores this process
    may use (its affinity mask, as TensorFlow's thread pools see it), 2 to 16, unless
    ``tfseq.experimental.parallelism`` says otherwise. Such stages are deterministic maps, so
    this changes their speed, never their output."""
    if _PARALLELISM["pools_and_parts"] is not None:
        return _PARALLELISM["pools_and_parts"]
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    return max(2, min(16, cores))


def encode_calls() -> int:
    """Parallel calls of the resumable stream's encoding map: ``tf.data.AUTOTUNE``, unless
    ``tfseq.experimental.parallelism`` says otherwise (a deterministic map: speed only)."""
    return _PARALLELISM["encode_calls"] or tf.data.AUTOTUNE


def lazy_cond(pred: tf.Tensor, true_fn: Callable, false_fn: Callable):
    """``tf.cond`` whose branches stay functions of their own instead of being inlined.

    Inside a graph ``tf.cond`` is lowered: both branches are inlined into the caller. tf.data
    instantiates every function of a pipeline again for each new iterator (each epoch of
    ``model.fit``) and runs Grappler over it, at a cost per node, so a large branch costs that
    every epoch even if it rarely runs. Kept as a functional ``If`` op, the branches are left
    out of that pass and instantiated as plain functions when the ``If`` first runs (``pack``'s
    split path). Use it for large branches of functions that run a few times per pass: each
    call of an ``If`` costs a function call, and its branches are not optimized with the
    caller. Outside a graph it is ``tf.cond``.
    """
    if tf.executing_eagerly():
        return tf.cond(pred, true_fn, false_fn)
    graph = tf.compat.v1.get_default_graph()
    known = {op.name for op in graph.get_operations()}
    out = tf.cond(pred, true_fn, false_fn)
    for op in graph.get_operations():
        if op.name not in known and op.type in ("If", "StatelessIf"):
            # The attribute cond_v2 sets to true; false keeps the op functional.
            op._set_attr("_lower_using_switch_merge", tf.compat.v1.AttrValue(b=False))
    return out


def mark_last(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Pairs every element with whether it is the last one: ``x -> (is_last, x)``.

    A stateful step (a ``scan`` that fills a pool or a buffer) needs the end of its input to
    flush what it holds. Appending a marker element with ``concatenate`` does not work on the
    ``tf.data`` service: there the marker is a split of its own, handed to one worker (or
    none before another's data ends), so the other workers never flush and their tails are
    lost. This looks one element ahead instead, inside each worker's own stream: every
    element is wrapped as a scalar variant (no copy of its data), stacked twice, and
    ``unbatch -> skip(1) -> batch(2)`` gives pairs ``(x_i, x_i+1)`` whose last one is the
    single ``(x_n)``. Costs a few hundred microseconds per element, so apply it to batches
    of examples, not to single examples. Iterators stay checkpointable.

    Args:
      dataset: any dataset (tensors, ragged tensors, nested structures).

    Returns:
      A dataset of ``(is_last: bool scalar, element)`` with the same elements, in order.

    Example::

        Dataset.range(3)  ->  (False, 0), (False, 1), (True, 2)
    """
    spec = dataset.element_spec
    component_specs = tf.nest.flatten(spec, expand_composites=True)
    plain = tf.autograph.experimental.do_not_convert

    def wrap(*element):
        components = tf.nest.flatten(element, expand_composites=True)
        wrapped = []
        for c in components:
            v = tf.raw_ops.RaggedTensorToVariant(rt_nested_splits=[],
                                                 rt_dense_values=c[tf.newaxis],
                                                 batched_input=False)
            wrapped.append(tf.stack([v, v]))
        return tuple(wrapped)

    def unwrap(*wrapped):
        is_last = tf.equal(tf.shape(wrapped[0])[0], 1)
        components = []
        for v, s in zip(wrapped, component_specs):
            _, values = tf.raw_ops.RaggedTensorFromVariant(
                encoded_ragged=v[0], input_ragged_rank=0, output_ragged_rank=0,
                Tvalues=s.dtype, Tsplits=tf.int64)
            components.append(tf.ensure_shape(values[0], s.shape))
        return is_last, tf.nest.pack_sequence_as(spec, components, expand_composites=True)

    return dataset.map(plain(wrap)).unbatch().skip(1).batch(2).map(plain(unwrap))


def trace_own_functions_as_written() -> None:
    """Lets AutoGraph leave tfseq's own functions as written, as it leaves TensorFlow's and
    Keras' (its ``DO_NOT_CONVERT`` rules, matched by module name).

    tfseq's data functions branch only on Python values (every data-dependent choice is a tf
    op), so converting their source changes nothing but costs seconds of every pipeline's
    construction (~3 of the 10 CPU s of a small run in one process). Functions a caller hands
    to tfseq keep the caller's conversion (``user_function``). A TensorFlow without these
    rules: converted as before.
    """
    try:
        from tensorflow.python.autograph.core import config
    except ImportError:
        return
    rules = tuple(config.CONVERSION_RULES)
    if not any(isinstance(r, config.DoNotConvert) and r._prefix == "tfseq" for r in rules):
        config.CONVERSION_RULES = (config.DoNotConvert("tfseq"),) + rules


def user_function(fn: Callable | None) -> Callable | None:
    """``fn``, a function a caller hands to tfseq, converted by AutoGraph as the caller's
    ``Dataset.map`` would convert it (tfseq's own functions are not converted, so a call from
    one would otherwise reach ``fn`` as written); ``None`` stays ``None``."""
    if fn is None:
        return None
    autograph = tf.__internal__.autograph
    return autograph.tf_convert(fn, autograph.control_status_ctx())
