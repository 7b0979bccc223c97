"""One call from the user's files to a dataset ``model.fit`` takes: ``training_pipeline``.

Public as ``tfseq.training_pipeline`` (the package forwards the name here when it is first
used); it lives in the task layer because it is a task's path. It is the path the binaries
take (``tfseq.pipelines.spine``), for Keras users who do not want
to compose the steps: records read (``tfseq.formats``: TSV/CSV/text/CoNLL in graph, every drop
counted), label ids, tokenization, the length policy, the batching seam (pad | bucket | pack,
``tfseq.batching.Batching``) and the model's ``(inputs, targets, weights)``
(``tfseq.model_inputs.ModelFeatures``). Training batches come from the shuffled, resumable
record stream (``tfseq.resumable``; a new order every pass); ``training=False`` keeps file
order.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import tensorflow as tf

from tfseq.errors import InputError
from tfseq.pipelines import tasks
from tfseq.pipelines.state import TaskState
from tfseq.stats import DropCounter, resolve_counter
from tfseq.text import Vocab


def training_pipeline(files, vocab: Vocab, *, task: str = "classify",
                      columns: Sequence[str] | None = None, labels: Sequence[str] | None = None,
                      format: str | None = None, header: bool = False, batching: str = "bucket",
                      max_tokens: int = 2048, batch_size: int = 64, max_length: int = 128,
                      block_length=(32, 64, 128), tokenizer: str = "whitespace",
                      lowercase: bool = False, long_examples: str = "truncate",
                      training: bool = True, seed: int = 0,
                      counter: DropCounter | None = None) -> tf.data.Dataset:
    """User files -> batches ``(inputs, targets, weights)`` for ``model.fit``.

    Args:
      files: paths or globs (``.gz`` allowed), or a comma-separated string of them.
      vocab: the ``Vocab`` (e.g. from ``Vocab.learn``).
      task: ``"classify"``, ``"lm"``, ``"translate"`` or ``"tag"``: what the rows hold and
        what the model learns (``tfseq.pipelines.tasks``).
      columns: field names in order (``_`` skips one); default the task's (``label,text``).
      labels: the class names (classify) or tags (tag); id = index (tag: index + 1). A row
        with another label is dropped (``unknown_label``).
      format, header: see ``tfseq.formats`` (format from the extension by default).
      batching: ``"bucket"`` or ``"pack"`` (``max_tokens`` cells per batch, ``block_length``
        rows for pack) or ``"pad"`` (``batch_size`` rows).
      max_length: tokens per example; ``long_examples="truncate"`` cuts longer ones (seen
        ``truncated``), ``"drop"`` drops them (``too_long``).
      tokenizer, lowercase: as in ``tfseq.tokenize``.
      training: the shuffled stream (seeded by ``seed``, a new order each pass: each
        ``model.fit`` epoch is one pass); else every record in file order. Keras takes the
        first epoch's batch count for every later epoch, and a bucketed or packed epoch can
        differ from the next by a batch or two: Keras then ends an epoch a batch early or
        leaves its last batch unused. Where every epoch must be exact, train with
        ``tfseq.training.Trainer`` (what ``tfseq-train`` does).
      counter: where records read and drops are counted (default:
        ``tfseq.default_counter()``).

    Returns:
      A dataset of ``(inputs, targets, weights)``, e.g. for classify with pad or bucket
      ``({"ids": int32 [B, T], "ids_length": int32 [B]}, label int32 [B], float32 [B])``.

    Raises:
      tfseq.formats.InputError: missing/empty files, bad columns, labels missing.
    """
    spine_task = tasks.load(task)
    files = tuple(files.split(",") if isinstance(files, str) else files)
    config = spine_task.Config(
        train_files=files, eval_files=() if training else files, eval_percent=0,
        format=format, columns=tuple(columns or ()), header=header, batching=batching,
        max_tokens=max_tokens, batch_size=batch_size, max_length=max_length,
        block_length=block_length, tokenizer=tokenizer, lowercase=lowercase,
        long_examples=long_examples, seed=seed)
    config.check()
    names = {"vocab": vocab} if "vocab" in spine_task.vocab_columns else {
        name: vocab for name in spine_task.vocab_columns}
    label_sets = {}
    for column in spine_task.label_columns:
        if not labels:
            raise InputError(f"task={task!r} reads a {column!r} column: pass labels=[...]")
        label_sets[column] = tuple(labels)
    state = TaskState(names, label_sets)
    counter = resolve_counter(counter)
    if not training:
        return spine_task.eval_dataset(config, state, counter,
                                       batching=spine_task.batching(config))
    # Keras cannot know an epoch's length before its end (tf.data's unknown cardinality) and
    # warns at the end of the first epoch that the input "ran out of data": that is the end
    # of the epoch, not a problem to act on. Its `shuffle=True` warning (fit's default, ignored
    # for a dataset) is not one either: this dataset shuffles itself.
    warnings.filterwarnings("ignore", message="Your input ran out of data", category=UserWarning)
    warnings.filterwarnings("ignore", message="`shuffle=True` was passed, but will be ignored",
                            category=UserWarning)
    return spine_task.datasets(config, state, counters={"train": counter}).train
