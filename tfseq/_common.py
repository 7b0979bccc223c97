"""Helpers shared by the transformations: the element contract in code.

Shapes: B = batch, T = time (tokens).

An example is a dict; its *sequence features* are the 1-D integer tensors (``[(T)]``), the
other features are scalars. ``sequence_keys`` reads them off ``dataset.element_spec`` so every
check happens in Python, before any graph runs.
"""

from __future__ import annotations

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


def check_positive_int(name: str, value, allow_none: bool = False) -> None:
    """Raises ``TypeError``/``ValueError`` naming ``name`` unless ``value`` is a positive int."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int; received {name}={value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be positive; received {name}={value!r}")


def unbatch_examples(batched: tf.data.Dataset) -> tf.data.Dataset:
    """``unbatch`` that gives 1-D ragged rows back as plain ``tf.Tensor`` features.

    Vectorized steps batch examples (``ragged_batch``), work on ``[B, (T)]`` and unbatch;
    ``unbatch`` alone leaves a ragged-rank-0 ``RaggedTensorSpec``, which the identity map
    turns back into the ``TensorSpec([None])`` of the element contract.
    """
    out = batched.unbatch()
    specs = tf.nest.flatten(out.element_spec, expand_composites=False)
    if any(isinstance(s, tf.RaggedTensorSpec) for s in specs):
        out = out.map(lambda example: example)
    return out
