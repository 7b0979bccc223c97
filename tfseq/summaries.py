"""TensorBoard scalars and histograms written with TensorFlow core only.

``tf.summary.scalar`` and ``tf.summary.histogram`` live in the ``tensorboard`` package, which
TensorFlow no longer installs. The on-disk format is plain ``tf.summary.write`` with the
plugin named in the metadata, so tfseq writes that directly: logs need no extra dependency,
and viewing them needs only ``pip install tensorboard``.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2


def _metadata(plugin: str) -> bytes:
    meta = summary_pb2.SummaryMetadata()
    meta.plugin_data.plugin_name = plugin
    meta.plugin_data.content = b""
    return meta.SerializeToString()


_SCALAR = _metadata("scalars")
_HISTOGRAM = _metadata("histograms")


def scalar(name: str, value, step: int) -> None:
    """Writes a float32 scalar under ``name`` to the default summary writer."""
    tf.summary.write(name, tf.constant(float(value), tf.float32), step=step, metadata=_SCALAR)


def histogram(name: str, values, step: int, buckets: int = 30) -> None:
    """Writes a histogram of ``values`` (any shape) as TensorBoard's ``[buckets, 3]`` tensor."""
    values = np.asarray(values, np.float64).ravel()
    if values.size == 0:
        return
    counts, edges = np.histogram(values, bins=buckets)
    table = np.stack([edges[:-1], edges[1:], counts.astype(np.float64)], axis=1)
    tf.summary.write(name, tf.constant(table, tf.float64), step=step, metadata=_HISTOGRAM)
