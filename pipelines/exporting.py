"""A trained run -> a SavedModel that answers on raw text (``tfseq.serving``), for any task.

The task supplies its serving module (``task.export_module``: the signature, the tokenizer and
vocabulary assets, a text task's weights copied into a single-device model and the columns
predict reads); this module writes ``serving.json`` (the task and those fields) and saves.
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

import tensorflow as tf

from tfseq import serving
from tfseq.pipelines import tasks
from tfseq.pipelines.runs import RUN_FILE
from tfseq.training import checkpoints_newest_first


def export_run(model_dir: str, task, config, state, model,
               export_dir: str | None = None) -> str:
    """Writes the SavedModel of a trained ``model`` (the task's ``export_module`` over the
    run's ``state``) to ``export_dir`` (``<model_dir>/export``, replaced if it exists);
    returns it."""
    export_dir = export_dir or os.path.join(model_dir, "export")
    asset_dir = tempfile.mkdtemp(prefix="tfseq_assets_")
    try:
        module, meta = task.export_module(config, state, model, asset_dir)
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


def restore_model(model_dir: str, task, config, saved: dict):
    """The run's model with its newest weights, and its state (``task.saved_state``).

    Raises:
      FileNotFoundError: neither a checkpoint nor ``weights.weights.h5`` in ``model_dir``.
    """
    model_config = task.model_config(**saved.get("model", {}))
    state = task.saved_state(model_dir, config)
    model = task.build_model(config, state, model_config)
    checkpoints = checkpoints_newest_first(os.path.join(model_dir, "ckpt"))
    weights = os.path.join(model_dir, "weights.weights.h5")
    if checkpoints:
        model = task.built(model, config, state)
        tf.train.Checkpoint(model=model).restore(checkpoints[0]).expect_partial()
    elif os.path.exists(weights):
        model.load_weights(weights)
    else:
        raise FileNotFoundError(f"No checkpoint in {model_dir}/ckpt and no {weights}: "
                                "nothing to export")
    return model, state
