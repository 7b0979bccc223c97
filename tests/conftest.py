"""Shared test helpers: quiet TensorFlow and turn datasets into Python lists."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402


def to_python(value):
    """Converts tensors (dense or ragged), numpy values and containers into plain Python."""
    if isinstance(value, tf.RaggedTensor):
        return to_python(value.to_list())
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return to_python(value.numpy())
    if isinstance(value, np.ndarray):
        return to_python(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_python(v) for v in value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    return value


def to_list(dataset):
    """Every element of ``dataset`` as plain Python (lists, dicts, ints, floats, str)."""
    return [to_python(element) for element in dataset]


@pytest.fixture
def as_list():
    return to_list
