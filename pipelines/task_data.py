"""What every task's ``datasets`` returns: ``TaskData``."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import tensorflow as tf

from tfseq.pipelines.state import PassReport
from tfseq.stats import BatchStats, DropCounter


@dataclasses.dataclass
class TaskData:
    """A task's datasets for ``model.fit`` and what they were built from.

    Attributes:
      train: training batches (a text task's ``(inputs, targets, weights)``), shuffled anew
        every epoch.
      eval: evaluation batches, in file order.
      state: what the task learned before training: a text task's ``TaskState``
        (vocabularies and label sets), a replayed task's ``info`` dict.
      counters: ``{"train": DropCounter, "eval": DropCounter}``: records read and dropped.
      stats: ``{"train": BatchStats, "eval": BatchStats}`` of the batches delivered.
      stream: the training stream a ``tfseq.training.Trainer`` resumes (``ResumableStream``,
        or a replayed task's ``ReplayStream``); ``train`` is its batches.
      setup: the ``PassReport`` of the reading done before the first step.
      drop_examples: ``(limit) -> ["file:line: reason", ...]`` of the training files.
    """

    train: tf.data.Dataset
    eval: tf.data.Dataset
    state: Any
    counters: dict[str, DropCounter]
    stats: dict[str, BatchStats]
    stream: Any
    setup: PassReport
    drop_examples: Callable[[int], list[str]]
