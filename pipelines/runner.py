"""The runner: one task's training run end to end, for every task and mode.

``Runner(task, config, settings).run()`` opens or resumes the run in ``settings.model_dir``,
builds the training stream, trains (single device, replicas, multi-worker or the tf.data
service), evaluates, writes ``report.json`` and exports. The binaries only parse their flags
into a task ``Config`` and a ``RunSettings`` and call it (``scripts/train.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time
from typing import Callable

from absl import logging

from tfseq.errors import InputError
from tfseq.pipelines import mixture
from tfseq.pipelines.report import (
    drop_examples_of, format_report, make_report, noop_report, write_report)
from tfseq.training import TrainResult


class SetupError(Exception):
    """The run cannot start: bad input, missing files or a refused setting (one line)."""


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """How a run trains, apart from the task's ``Config`` (what it trains on)."""

    model_dir: str = "runs/default"
    epochs: int = 2
    max_steps: int | None = None          # stop after this many steps in this run (resumable)
    checkpoint_every: int = 200           # steps; 0: epoch ends only
    steps_per_execution: int = 1          # training steps per Python call (one replica)
    num_replicas: int = 1
    strategy: str = "mirrored"            # mirrored | multi_worker (TF_CONFIG)
    data_service: str | None = None       # a tf.data service address
    learning_rate: float | None = None    # None: the model's
    verbose: int = 1                      # 0: only the report; 1: progress; 2: INFO logs
    export: bool = True                   # write <model_dir>/export at the end
    started: float = dataclasses.field(default_factory=time.perf_counter)  # process start


class Summaries:
    """TensorBoard logs every 50 steps: losses, real tokens/s, padding efficiency, drop counts,
    real lengths per row."""

    def __init__(self, logdir, stats, counters):
        import tensorflow as tf

        self.writer = tf.summary.create_file_writer(logdir)
        self.stats, self.counters = stats, counters
        self.started = time.perf_counter()
        self.lengths = []

    def on_batch(self, batch):
        """Keeps the real length of each row of ``(inputs, targets, weights)`` batches (or
        tuples of such parts) with dense ``[B, T]`` inputs; other batches have none."""
        import tensorflow as tf

        parts = batch if isinstance(batch[0], tuple) else (batch,)
        for part in parts:
            if len(part) != 3:
                continue
            x, _, weights = part
            first = next(iter(x.values()))
            if not isinstance(first, tf.RaggedTensor) and first.shape.rank == 2:
                self.lengths.extend(int(n) for n, w in zip(
                    (first.numpy() != 0).sum(axis=1), weights.numpy().reshape(
                        first.shape[0], -1).max(axis=1)) if w > 0)

    def on_step(self, step, logs):
        from tfseq import summaries

        if step % 50:
            return
        with self.writer.as_default():
            for k, v in logs.items():
                summaries.scalar(f"train/{k}", v, step)
            summaries.scalar("input/padding_efficiency", self.stats.padding_efficiency(), step)
            seconds = time.perf_counter() - self.started
            summaries.scalar("input/real_tokens_per_second",
                             int(self.stats.real_tokens.numpy()) / max(seconds, 1e-9), step)
            for split, counter in self.counters.items():
                for reason, n in counter.drops().items():
                    summaries.scalar(f"drops_{split}/{reason}", n, step)
            summaries.histogram("input/real_length_per_row", self.lengths, step)
        self.lengths.clear()

    def on_eval(self, epoch, results):
        from tfseq import summaries

        with self.writer.as_default():
            for k, v in results.items():
                summaries.scalar(f"eval/{k}", v, epoch)


class Runner:
    """Runs one task's training end to end: open or resume the run in ``settings.model_dir``,
    build the stream, train, evaluate, report, export, in every mode (single, replicas,
    multi-worker, data service).

    Raises (from ``run``):
      SetupError: the run cannot start (bad input, files not found, a refused setting); raised
        before anything is trained, with one line that names the fix.
      runs.ChangedRun: ``model_dir`` holds a run started with other settings.
    """

    def __init__(self, task, config, settings: RunSettings, *,
                 on_opened: Callable[[], None] | None = None):
        """``on_opened``: called on the chief once the run is opened and valid (the binary
        records its command line there), before the first step."""
        self.task, self.config, self.settings = task, config, settings
        self.on_opened = on_opened or (lambda: None)
        self.phase = "setup"  # setup -> opened -> training -> finishing (``kept``)
        self.resuming = os.path.exists(os.path.join(settings.model_dir, "run.json"))

    def kept(self) -> str:
        """What a signal that stops the command now leaves behind, in one sentence."""
        model_dir = self.settings.model_dir
        if self.phase == "setup":
            if self.resuming:
                return (f"{model_dir} is as it was; run the same command again to resume")
            return "nothing was written; run the same command again"
        if self.phase == "opened":
            return (f"{model_dir} holds the run's settings and what it learned before training; "
                    "run the same command again to train")
        if self.phase == "training":
            return (f"the newest checkpoint in {model_dir} is kept; run the same command again "
                    "to resume")
        return (f"the run is trained and checkpointed in {model_dir}, but its report or export "
                f"was not written: tfseq-export --model_dir={model_dir} writes the export")

    def run(self) -> TrainResult | None:
        """Trains; returns how this run ended (``result.interrupted``, ``result.signal``), or
        None when ``model_dir`` holds a run that already did its epochs (nothing trained)."""
        return self._train(self.task, self.config)

    def _progress(self):
        """Where setup progress lines go: stderr, unless ``verbose=0``."""
        if not self.settings.verbose:
            return None
        return lambda line: print(line, file=sys.stderr, flush=True)

    def _summaries(self, stats, counters):
        return Summaries(os.path.join(self.settings.model_dir, "logs"), stats, counters)

    def _strategy(self):
        """``(strategy or None, mode, local replicas, workers, worker index)``; before any other
        TensorFlow op (logical CPU devices must be set up first)."""
        import tfseq

        if self.settings.strategy == "multi_worker":
            strategy = tfseq.distribute.multi_worker_strategy()
            local = len(strategy.extended.worker_devices)
            workers = strategy.num_replicas_in_sync // local
            resolver = strategy.cluster_resolver
            return strategy, "multi_worker", local, workers, int(resolver.task_id or 0)
        if self.settings.num_replicas > 1 or self.settings.data_service:
            mode = "data_service" if self.settings.data_service else "replicated"
            replicas = self.settings.num_replicas
            return tfseq.mirrored_strategy(replicas), mode, replicas, 1, 0
        return None, "single", 1, 1, 0

    def _check_mode(self, task) -> None:
        """Refuses a mode the task does not train in (``task.modes``), in one line."""
        settings = self.settings
        if settings.data_service:
            mode, flag = "data_service", "--data_service"
        elif settings.strategy == "multi_worker":
            mode, flag = "multi_worker", "--strategy=multi_worker"
        elif settings.num_replicas > 1:
            mode, flag = "replicated", "--num_replicas"
        else:
            return
        if mode not in task.modes:
            name = "lm --tbptt" if task.name == "lm_tbptt" else task.name
            raise SetupError(f"{flag} is not supported by --task={name} (it trains in: "
                             f"{', '.join(task.modes)}); drop {flag}")

    def _model_config(self, task):
        """The task model's ``ModelConfig``, with ``--learning_rate`` if given."""
        overrides = {}
        if self.settings.learning_rate is not None:
            overrides["learning_rate"] = self.settings.learning_rate
        return task.model_config(**overrides)

    def _finished(self, trainer) -> bool:
        """A run that already did its ``--epochs``: say so and show the saved report."""
        if int(trainer.epoch.numpy()) < self.settings.epochs:
            return False
        model_dir, epochs = self.settings.model_dir, self.settings.epochs
        print(f"{model_dir} holds a finished run ({int(trainer.epoch.numpy())} epochs, "
              f"--epochs={epochs}): nothing to train. Use another --model_dir (or delete "
              f"this one) to train again, or raise --epochs to continue.")
        saved = os.path.join(model_dir, "report.json")
        if os.path.exists(saved):
            with open(saved) as f:
                print(format_report(noop_report(json.load(f))))
        return True

    def _train(self, task, config) -> TrainResult | None:
        """Opens the run, streams, trains, evaluates, reports, exports."""
        import contextlib

        import keras

        import tfseq
        from tfseq.pipelines import exporting
        from tfseq.training import ReplicaTrainer, Trainer, data_state_bytes

        self._check_mode(task)
        strategy, mode, local, workers, worker = self._strategy()
        chief = worker == 0
        model_config = self._model_config(task)
        jit = bool(getattr(config, "jit_compile", False))
        if jit and (strategy is not None or self.settings.data_service):
            raise SetupError("--jit_compile trains on one replica from files: drop it, or "
                             "--num_replicas/--strategy/--data_service")
        several = self.settings.steps_per_execution > 1
        if several and (strategy is not None or self.settings.data_service):
            raise SetupError("--steps_per_execution trains on one replica from files: drop "
                             "it, or --num_replicas/--strategy/--data_service")
        try:
            run = task.open(self.settings.model_dir, config, model_config=model_config,
                            replicas=local, workers=workers, worker=worker,
                            write=self._progress() if chief else None)
        except (InputError, FileNotFoundError, ValueError) as e:
            raise SetupError(str(e)) from e
        if not self.resuming:
            self.phase = "opened"
        if chief:
            self.on_opened()
            if self.settings.verbose:
                print("building the model and the training input ...", file=sys.stderr,
                      flush=True)
        logging.info("config: %s", config)
        counters = {"train": tfseq.DropCounter("train"), "eval": tfseq.DropCounter("eval")}
        stats = tfseq.BatchStats()
        scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
        with scope:
            model = task.build_model(config, run.state, model_config)
        if mode == "data_service":
            if mixture.is_mixture(config):
                raise SetupError("--data_service reads one source: a mixture of --train_files "
                                 "(GLOB@WEIGHT or --mix_temperature) trains without it")
            return self._train_on_service(task, config, run, model, strategy, counters, stats,
                                          local)
        stream = task.training_stream(config, run.state, counters["train"], run.shards,
                                      replicas=local, parts=strategy is not None)
        summaries = self._summaries(stats, counters)
        first_step = {}

        def on_step(step, logs):
            first_step.setdefault("seconds", round(time.perf_counter() - self.settings.started, 3))
            if chief:
                summaries.on_step(step, logs)

        options = dict(model_dir=self.settings.model_dir,
                       checkpoint_every=self.settings.checkpoint_every,
                       on_step=on_step,
                       # per-batch row lengths for TensorBoard: Python per step
                       on_batch=summaries.on_batch if chief and not several else None,
                       on_epoch_start=lambda epoch: counters["train"].reset(), stats=stats,
                       epoch_note=(lambda: mixture.shares_note(config, counters["train"]))
                       if mixture.is_mixture(config) else None)
        trainer = (ReplicaTrainer(model, strategy, stream, **options) if strategy is not None
                   else Trainer(model, stream, jit_compile=jit,
                                steps_per_execution=self.settings.steps_per_execution,
                                **options))
        resumed = trainer.restore()
        if resumed and self._finished(trainer):
            return None
        resumed_at = int(trainer.global_step.numpy()) if resumed else None
        self.phase = "training"
        if resumed and self.settings.verbose and chief:
            print(f"Resuming from {self.settings.model_dir}: "
                  f"epoch {int(trainer.epoch.numpy()) + 1}, "
                  f"step {int(trainer.step_in_epoch.numpy())} of that epoch", file=sys.stderr)
        local_model = (model if strategy is None
                       else task.build_model(config, run.state, model_config))

        @functools.cache
        def eval_ds():  # built at its first use: a run stopped before any evaluation skips it
            return task.eval_dataset(config, run.state, counters["eval"])

        def evaluate():
            if local_model is not model:  # a single-device copy: no collective op
                local_model.set_weights(model.get_weights())
            counters["eval"].reset()
            return {k: float(v) for k, v in
                    local_model.evaluate(eval_ds(), verbose=0, return_dict=True).items()}

        def eval_fn(epoch):
            results = evaluate() if chief else {}
            if chief:
                summaries.on_eval(epoch, results)
            return {f"eval_{k}": v for k, v in results.items()}

        result = trainer.fit(self.settings.epochs, verbose=self.settings.verbose if chief else 0,
                             eval_fn=eval_fn if workers == 1 else None,
                             max_steps=self.settings.max_steps)
        if not result.signal:  # a signal stops training with its checkpoint saved
            self.phase = "finishing"
        finished = not result.interrupted
        baselines = task.baselines(eval_ds()) if finished and chief else {}
        eval_results = evaluate() if finished and chief else {}  # the eval counts: one pass
        checkpoints = trainer.checkpoint_dir and tfseq.training.checkpoints_newest_first(
            trainer.checkpoint_dir)
        report = make_report(
            task_name=task.name, config=config, mode=mode, replicas=local, workers=workers,
            learning_rate=float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
            result=result, stats=stats, counters=counters, eval_results=eval_results,
            baselines=baselines, setup=run.setup, first_step_seconds=first_step.get("seconds"),
            timings=trainer.timings,
            data_state_bytes=data_state_bytes(checkpoints[0]) if checkpoints else 0,
            drop_examples=drop_examples_of(task, config, counters),
            data_service=self.settings.data_service, resumed_at_step=resumed_at,
            sources=self._mixture_sources(task, config, stream, trainer, counters),
            jit={"shape_budget": task.batching(config).num_shapes,
                 "compiled_shapes": trainer.compiled_shapes} if jit else None)
        if not chief:
            worker_dir = os.path.join(self.settings.model_dir, "workers", str(worker))
            os.makedirs(worker_dir, exist_ok=True)
            write_report(os.path.join(worker_dir, "report.json"), report)
            return result
        write_report(os.path.join(self.settings.model_dir, "report.json"), report)
        print(format_report(report))
        if finished:
            for line in task.sample_lines(config, run.state, local_model, eval_ds()):
                print(line)
        if self.settings.export and not result.signal:  # finished, or stopped by max_steps
            if self.settings.verbose:
                print("exporting the model over raw input ...", file=sys.stderr, flush=True)
            if local_model is not model:  # stopped by max_steps: no evaluation copied them
                local_model.set_weights(model.get_weights())
            path = exporting.export_run(self.settings.model_dir, task, config, run.state,
                                        local_model)
            if path:
                print(f"Served model ({task.name}, input `{task.prediction_input}`): {path}")
        return result

    @staticmethod
    def _mixture_sources(task, config, stream, trainer, counters) -> list[dict]:
        """``report.json``'s ``sources`` of a mixture (``[]`` for one source)."""
        if not mixture.is_mixture(config):
            return []
        # Whole epochs before the one the counters hold (they restart with each epoch).
        epochs = int(trainer.epoch.numpy())
        before = epochs - 1 if epochs and not int(trainer.step_in_epoch.numpy()) else epochs
        return mixture.report_sources(task, config, stream.shards, counters["train"],
                                      epochs_before=before)

    def _train_on_service(self, task, config, run, model, strategy, counters, stats,
                          local) -> TrainResult:
        """``--data_service``: ``model.fit`` on the service's split batches; the weights are
        saved at each epoch end (``weights.weights.h5``) and a run resumes at epoch boundaries."""
        import keras

        from tfseq.pipelines import exporting

        dataset_fn = task.replica_dataset_fn(config, run.state, counters["train"], local,
                                             data_service=self.settings.data_service, stats=stats)
        dist = strategy.distribute_datasets_from_function(dataset_fn)
        weights_path = os.path.join(self.settings.model_dir, "weights.weights.h5")
        start = time.perf_counter()
        history = model.fit(dist, epochs=self.settings.epochs, verbose=self.settings.verbose,
                            callbacks=[keras.callbacks.ModelCheckpoint(weights_path,
                                                                       save_weights_only=True)])
        seconds = time.perf_counter() - start
        records = [{"epoch": i + 1, **{k: float(v[i]) for k, v in history.history.items()}}
                   for i in range(len(history.history.get("loss", [])))]
        result = TrainResult(len(records), int(model.optimizer.iterations.numpy()), False, records,
                             seconds)
        local_model = task.build_model(config, run.state, self._model_config(task))
        local_model.set_weights(model.get_weights())
        eval_ds = task.eval_dataset(config, run.state, counters["eval"])
        eval_results = {k: float(v) for k, v in
                        local_model.evaluate(eval_ds, verbose=0, return_dict=True).items()}
        report = make_report(
            task_name=task.name, config=config, mode="data_service", replicas=local, workers=1,
            learning_rate=float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
            result=result, stats=stats, counters=counters, eval_results=eval_results,
            baselines=task.baselines(eval_ds), setup=run.setup, data_state_bytes=0,
            drop_examples=drop_examples_of(task, config, counters),
            data_service=self.settings.data_service)
        write_report(os.path.join(self.settings.model_dir, "report.json"), report)
        print(format_report(report))
        if self.settings.export:
            exporting.export_run(self.settings.model_dir, task, config, run.state, local_model)
        return result
