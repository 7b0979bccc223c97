"""A trained run -> a SavedModel that answers on raw text (``tfseq.serving``), for any task.

The task supplies its serving module (``TextTask.serving_module``: the signature, the
tokenizer and vocabulary assets); this module copies the weights into a single-device model,
writes ``serving.json`` (task, tokenization settings, the columns predict reads) and saves.
``restore_model`` rebuilds a run's model from its directory: ``run.json`` for the task and
config, the saved vocabularies and labels, and the newest checkpoint (or the weights file of
a data-service run).

The export holds a graph that runs when loaded: export and serve only runs you trust.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile

from absl import logging

from tfseq import serving
from tfseq.pipelines import tasks
from tfseq.pipelines.runs import RUN_FILE
from tfseq.pipelines.spine import TextTask
from tfseq.pipelines.state import TaskState


def export_run(model_dir: str, task, config, state: TaskState, model,
               export_dir: str | None = None) -> str | None:
    """Writes the SavedModel of a trained ``model`` to ``export_dir`` (``<model_dir>/export``,
    replaced if it exists); returns it (``None`` for a task without an export)."""
    if isinstance(task, tasks.OwnPipelineTask):  # ``state``: the pipeline's info
        return export_own(model_dir, task, config, state, model, export_dir)
    if not isinstance(task, TextTask):
        logging.warning("No export for task %s", task.name)
        return None
    export_dir = export_dir or os.path.join(model_dir, "export")
    served_model = task.build_model(config, state)  # outside any strategy scope
    served_model.set_weights(model.get_weights())
    asset_dir = tempfile.mkdtemp(prefix="tfseq_assets_")
    try:
        module, meta = task.serving_module(config, state, served_model, asset_dir)
        meta.update(task=task.name, tokenizer=config.tokenizer, lowercase=config.lowercase,
                    max_length=config.max_length, long_examples=config.long_examples,
                    batching=config.batching)
        if config.columns:  # user files: predict's default --columns
            meta["columns"] = list(config.columns)
            meta["format"] = config.format
            meta["header"] = bool(config.header)
        module.keras_model = served_model
        serving.save(module, export_dir, meta)
    finally:
        shutil.rmtree(asset_dir, ignore_errors=True)
    return export_dir


def export_own(model_dir: str, task, config, info: dict, model,
               export_dir: str | None = None) -> str:
    """Writes the SavedModel of a trained documents, ctr or lm_tbptt ``model`` (the pipeline's
    ``serving_module``) to ``export_dir`` (``<model_dir>/export``, replaced); returns it."""
    export_dir = export_dir or os.path.join(model_dir, "export")
    asset_dir = tempfile.mkdtemp(prefix="tfseq_assets_")
    try:  # these tasks train on one device: the trained model is served as it is
        module, meta = task.pipeline.serving_module(config, info, model, asset_dir)
        meta.update(task=task.name)
        serving.save(module, export_dir, meta)
    finally:
        shutil.rmtree(asset_dir, ignore_errors=True)
    return export_dir


def load_run(model_dir: str):
    """``(task, config, saved settings)`` of a training run, from its ``run.json`` (the
    config's budgets are left at their defaults: serving does not batch by them).

    Raises:
      FileNotFoundError: no ``run.json`` (not a run directory, or one that never started).
    """
    path = os.path.join(model_dir, RUN_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No {path}: export needs a directory written by tfseq-train")
    with open(path) as f:
        saved = json.load(f)
    task = tasks.load(saved["task"])
    fields = {f.name for f in dataclasses.fields(task.Config)}
    values = {k: tuple(v) if isinstance(v, list) else v
              for k, v in saved["config"].items() if k in fields}
    return task, task.Config(**values), saved


def _restore_own(model_dir: str, task, config, model_config):
    """A documents, ctr or lm_tbptt run's model with its newest weights, and the pipeline's
    ``info`` (its vocabulary is learned again from the same files: the same one)."""
    import tensorflow as tf

    from tfseq.training import checkpoints_newest_first

    checkpoints = checkpoints_newest_first(os.path.join(model_dir, "ckpt"))
    if not checkpoints:
        raise FileNotFoundError(f"No checkpoint in {model_dir}/ckpt: nothing to export")
    _, eval_ds, info = task.pipeline.datasets(config)
    model = task.build_model(config, info, model_config)
    if not model.built:  # a subclassed model makes its weights on its first call
        model(next(iter(eval_ds))[0], training=False)
    tf.train.Checkpoint(model=model).restore(checkpoints[0]).expect_partial()
    return model, info


def restore_model(model_dir: str, task, config, saved: dict):
    """The run's model with its newest weights, and its ``TaskState`` (a documents, ctr or
    lm_tbptt run: the pipeline's ``info``).

    Raises:
      FileNotFoundError: neither a checkpoint nor ``weights.weights.h5`` in ``model_dir``.
    """
    import tensorflow as tf

    from tfseq.training import checkpoints_newest_first

    model_config = task.model_config(**saved.get("model", {}))
    if isinstance(task, tasks.OwnPipelineTask):
        return _restore_own(model_dir, task, config, model_config)
    state = TaskState.load(model_dir, list(task.vocab_columns), list(task.label_columns))
    model = task.build_model(config, state, model_config)
    checkpoints = checkpoints_newest_first(os.path.join(model_dir, "ckpt"))
    weights = os.path.join(model_dir, "weights.weights.h5")
    if checkpoints:
        tf.train.Checkpoint(model=model).restore(checkpoints[0]).expect_partial()
    elif os.path.exists(weights):
        model.load_weights(weights)
    else:
        raise FileNotFoundError(f"No checkpoint in {model_dir}/ckpt and no {weights}: "
                                "nothing to export")
    return model, state
