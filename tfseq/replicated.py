"""``train.py``'s replicated training: a resumable ``ReplicaTrainer`` run and its report.

Kept out of ``scripts/train.py`` so the binary only parses flags and dispatches.
"""

from __future__ import annotations

import dataclasses
import json
import os

import tensorflow as tf

from tfseq.training import ReplicaTrainer, trainer_input_context


def multi_worker_strategy() -> tf.distribute.MultiWorkerMirroredStrategy:
    """``MultiWorkerMirroredStrategy`` from ``TF_CONFIG``; call it before any other TF op.

    Raises:
      ValueError: ``TF_CONFIG`` is not set.
    """
    if not os.environ.get("TF_CONFIG"):
        raise ValueError("--strategy=multi_worker needs TF_CONFIG, e.g. "
                         '{"cluster": {"worker": ["localhost:12345", "localhost:12346"]}, '
                         '"task": {"type": "worker", "index": 0}}')
    return tf.distribute.MultiWorkerMirroredStrategy()


def train_resumable(flags, pipeline, config, info, model, strategy, format_report,
                    counter_vars, *, eval_ds=None, local_model_fn=None) -> dict:
    """Trains ``model`` (built in ``strategy.scope()``) with a checkpointed iterator.

    At the end of a finished run the chief evaluates: on one worker through the strategy; on
    several, where an evaluation under the strategy would need every worker (its metric sums
    are collective), a single-device copy of the model (``local_model_fn``) on the whole of
    ``eval_ds``.

    Args:
      flags: train.py's absl FLAGS (``model_dir``, ``epochs``, ``checkpoint_every``,
        ``max_steps``, ``verbose``, ``task``).
      pipeline: the task's pipeline module (``replica_dataset_fn``).
      config, info: the task's Config and the ``info`` of ``pipeline.datasets``.
      model: the compiled Keras model.
      strategy: a single-worker strategy.
      format_report: ``fn(report) -> str``.
      counter_vars: ``fn(counters) -> {name: tf.Variable}`` saved with the checkpoint.
      eval_ds: the single-device eval dataset (``pipeline.datasets``), for several workers.
      local_model_fn: ``() -> keras.Model`` built outside any strategy scope and compiled as
        ``model`` is, for several workers.

    Returns:
      The report written to ``model_dir/report.json``.
    """
    replicas = strategy.num_replicas_in_sync
    parts_ds = pipeline.replica_dataset_fn(config, info, replicas)(
        trainer_input_context(strategy))
    counters = info.get("counters", {})
    trainer = ReplicaTrainer(model, strategy, parts_ds, model_dir=flags.model_dir,
                             checkpoint_every=flags.checkpoint_every,
                             trackables={f"counter_{k}": v
                                         for k, v in counter_vars(counters).items()})
    if trainer.restore() and flags.verbose:
        print(f"Resuming from {flags.model_dir}: epoch {int(trainer.epoch.numpy()) + 1}, "
              f"step {int(trainer.step_in_epoch.numpy())} of that epoch")
    chief = trainer.task_id == 0
    num_workers = trainer.num_workers
    result = trainer.fit(flags.epochs, verbose=flags.verbose if chief else 0,
                         max_steps=flags.max_steps)
    report = {"task": flags.task, "config": dataclasses.asdict(config), "replicas": replicas,
              "data_service": None, "epochs": result.epochs_done, "steps": result.steps_done,
              "interrupted": result.interrupted, "chief": chief,
              "workers": num_workers, "train_seconds": result.train_seconds,
              "real_tokens_per_second": 0.0,
              # per metric, one value per epoch (the shape of model.fit's history)
              "history": {k: [record[k] for record in result.history]
                          for k in (result.history[0] if result.history else {})},
              "counters": {k: {"seen": c.seen(), "drops": c.drops()}
                           for k, c in counters.items()}}
    if not chief:  # the chief writes the weights and the report; others their own counts
        worker_dir = os.path.join(flags.model_dir, "workers", str(trainer.task_id))
        os.makedirs(worker_dir, exist_ok=True)
        with open(os.path.join(worker_dir, "report.json"), "w") as f:
            json.dump(report, f, indent=2, default=str)
        return report
    model.save_weights(os.path.join(flags.model_dir, "weights.weights.h5"))
    if not result.interrupted and num_workers == 1:
        eval_dist = strategy.distribute_datasets_from_function(
            pipeline.replica_dataset_fn(config, info, replicas, split="eval"))
        report["eval"] = {k: float(v) for k, v in
                          model.evaluate(eval_dist, verbose=0, return_dict=True).items()}
    elif not result.interrupted and eval_ds is not None and local_model_fn is not None:
        local = local_model_fn()
        local.set_weights(model.get_weights())  # reads this worker's copy: no collective
        report["eval"] = {k: float(v) for k, v in
                          local.evaluate(eval_ds, verbose=0, return_dict=True).items()}
    with open(os.path.join(flags.model_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    print(format_report(report))
    return report
