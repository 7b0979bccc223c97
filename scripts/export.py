r"""Export a trained run as a SavedModel that takes raw text (``tfseq.serving``).

Usage:
  python scripts/export.py --model_dir=runs/demo                 # writes runs/demo/export
  python scripts/export.py --model_dir=runs/demo --export_dir=/srv/models/demo/1

``scripts/train.py`` calls ``export_run`` at the end of every finished run, so this binary is
for runs trained before that existed, or to export again elsewhere. It reads the run's
``report.json`` (task and config), rebuilds the vocabulary and the model as training did, and
restores the newest weights: the ``ckpt/`` checkpoint of a single-device run, or
``weights.weights.h5`` of a ``--num_replicas`` run. A ``--batching=pack`` run is served the
same way as the others: each input line is one padded row (one segment).

The export holds a graph that runs when loaded: export and serve only model directories you
trust.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402

FLAGS = flags.FLAGS
EXPORTABLE = ("classify", "lm", "translate")

if __name__ == "__main__":
    flags.DEFINE_string("model_dir", None, "A scripts/train.py model directory.", required=True)
    flags.DEFINE_string("export_dir", None, "Where to write the SavedModel "
                        "(default: <model_dir>/export).")


def load_run(model_dir: str):
    """``(task, config)`` of a training run, from its ``report.json``.

    Raises:
      FileNotFoundError: no ``report.json`` (the run never finished a first step's report).
      ValueError: a task that cannot be exported.
    """
    from pipelines import tasks

    path = os.path.join(model_dir, "report.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"No {path}: export needs a model directory written by "
                                "scripts/train.py (its report.json names the task and config)")
    with open(path) as f:
        report = json.load(f)
    task = report["task"]
    if task not in EXPORTABLE or "tbptt" in report["config"]:
        raise ValueError(f"{model_dir}: task {task!r} cannot be exported; exportable tasks: "
                         f"{list(EXPORTABLE)}")
    pipeline, _ = tasks.load(task)
    fields = {f.name for f in dataclasses.fields(pipeline.Config)}
    values = {k: tuple(v) if isinstance(v, list) else v
              for k, v in report["config"].items() if k in fields}
    return task, pipeline.Config(**values)


def restore_model(model_dir: str, task: str, config):
    """Rebuilds the vocabulary and model of a run and loads its newest weights.

    Returns:
      ``(model, info)`` as ``pipeline.datasets``/``build_model`` give them.

    Raises:
      FileNotFoundError: neither a checkpoint nor ``weights.weights.h5`` in ``model_dir``.
    """
    import tensorflow as tf

    from pipelines import tasks

    pipeline, model_module = tasks.load(task)
    _, _, info = pipeline.datasets(config)
    model = model_module.build_model(config, info)
    latest = tf.train.latest_checkpoint(os.path.join(model_dir, "ckpt"))
    weights = os.path.join(model_dir, "weights.weights.h5")
    if latest:
        tf.train.Checkpoint(model=model).restore(latest).expect_partial()
    elif os.path.exists(weights):
        model.load_weights(weights)
    else:
        raise FileNotFoundError(f"No checkpoint in {model_dir}/ckpt and no {weights}: "
                                "nothing to export")
    return model, info


def _translate_fns(model):
    """(encode_fn, step_fn) for ``tfseq.serving.ServedTranslator``: the ``encode`` and
    ``decode_step`` of ``models.translate.Translator`` (the steps of its ``greedy_decode``)."""
    return model.encode, model.decode_step


def export_run(model_dir: str, task: str, config, model, info: dict,
               export_dir: str | None = None) -> str | None:
    """Writes the SavedModel of a trained model to ``export_dir`` (``<model_dir>/export``).

    Args:
      model_dir: the run's directory.
      task: ``classify``, ``lm`` or ``translate`` (other tasks: nothing is written).
      config: the task's pipeline ``Config`` (tokenizer, lowercase, max_length,
        long_examples).
      model: the trained Keras model (its weights are copied into a fresh single-device
        model, so a model built under a distribution strategy exports the same way).
      info: the pipeline's ``info`` (vocabularies, class names).
      export_dir: where to write; replaced if it exists.

    Returns:
      The export directory, or ``None`` for a task that has no export.
    """
    import shutil

    from pipelines import tasks
    from tfseq import serving

    if task not in EXPORTABLE or hasattr(config, "tbptt"):
        logging.warning("No export for task %s (exportable: %s)", task, EXPORTABLE)
        return None
    export_dir = export_dir or os.path.join(model_dir, "export")
    _, model_module = tasks.load(task)
    served_model = model_module.build_model(config, info)  # outside any strategy scope
    served_model.set_weights(model.get_weights())
    tokenizer = getattr(config, "tokenizer", "whitespace")
    lowercase = getattr(config, "lowercase", False)
    long_examples = getattr(config, "long_examples", "truncate")
    max_length = getattr(config, "max_length", None)
    asset_dir = os.path.join(model_dir, ".export_assets")
    os.makedirs(asset_dir, exist_ok=True)
    meta = {"task": task, "tokenizer": tokenizer, "lowercase": lowercase,
            "max_length": max_length, "long_examples": long_examples,
            "batching": getattr(config, "batching", "pad")}
    if getattr(config, "columns", None):  # user-file runs: predict.py's default --columns
        columns = config.columns
        meta["columns"] = columns.split(",") if isinstance(columns, str) else list(columns)
    if task == "classify":
        labels = list(info.get("labels") or info["class_names"])
        encoder = serving.TextEncoder(info["vocab"], asset_dir, tokenizer=tokenizer,
                                      lowercase=lowercase, max_length=max_length)
        module = serving.ServedClassifier(serving.keras_model_fn(served_model, task=task),
                                          encoder, labels, asset_dir, long_examples)
        meta.update(input="text", outputs=["label", "probabilities"], num_labels=len(labels))
    elif task == "lm":
        encoder = serving.TextEncoder(info["vocab"], asset_dir, tokenizer=tokenizer,
                                      lowercase=lowercase, max_length=max_length,
                                      add_bos=True, add_eos=True)
        module = serving.ServedLanguageModel(serving.keras_model_fn(served_model, task=task),
                                             encoder, long_examples)
        meta.update(input="text", outputs=["log_likelihood", "tokens"])
    else:
        source = serving.TextEncoder(info["source_vocab"], asset_dir, tokenizer=tokenizer,
                                     lowercase=lowercase, max_length=max_length,
                                     name="source_vocab.txt")
        target = serving.TextEncoder(info["target_vocab"], asset_dir, tokenizer=tokenizer,
                                     lowercase=lowercase, name="target_vocab.txt")
        encode_fn, step_fn = _translate_fns(served_model)
        module = serving.ServedTranslator(encode_fn, step_fn, source, target,
                                          max_decode_length=info["max_length"],
                                          long_examples=long_examples)
        meta.update(input="source", outputs=["translation"])
    module.keras_model = served_model
    try:
        serving.save(module, export_dir, meta)
    finally:
        shutil.rmtree(asset_dir, ignore_errors=True)
    print(f"Served model ({task}, input `{meta['input']}`): {export_dir}")
    return export_dir


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    try:
        task, config = load_run(FLAGS.model_dir)
    except (FileNotFoundError, ValueError) as e:
        raise app.UsageError(str(e))
    model, info = restore_model(FLAGS.model_dir, task, config)
    export_run(FLAGS.model_dir, task, config, model, info, FLAGS.export_dir)


if __name__ == "__main__":
    app.run(main)
