"""Shared test helpers: quiet TensorFlow and turn datasets into Python lists."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI replays the same draws on every run (derandomize), so a submission never fails on a draw
# that the developer's run did not make; local runs keep exploring new draws. A failing draw
# found anywhere goes into its test as an @example. The profile is loaded here, before any test
# module is imported, so every @settings(...) in the tests inherits it.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


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
