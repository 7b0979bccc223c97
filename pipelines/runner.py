"""The runner: one task's training run end to end, for every task and mode.

``Runner(task, config, settings).run()`` opens or resumes the run in ``settings.model_dir``,
builds the training stream, trains (single device, replicas, multi-worker or the tf.data
service), evaluates, writes ``report.json`` and exports. The binaries only parse their flags
into a task ``Config`` and a ``RunSettings`` and call it (``scripts/train.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import random
import sys
import time
from typing import Callable

import keras
import tensorflow as tf
from absl import logging

import tfseq
from tfseq import summaries
from tfseq.errors import InputError
from tfseq.pipelines import exporting
from tfseq.pipelines.report import (
    drop_examples_of, format_report, make_report, noop_report, write_report)
from tfseq.stats import BatchStats, DropCounter
from tfseq.training import (
    ReplicaTrainer, Trainer, TrainResult, checkpoints_newest_first, data_state_bytes)


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
        self.writer = tf.summary.create_file_writer(logdir)
        self.stats, self.counters = stats, counters
        self.started = time.perf_counter()
        self.lengths = []

    def on_batch(self, batch):
        """Keeps the real length of each row of ``(inputs, targets, weights)`` batches (or
        tuples of such parts) with dense ``[B, T]`` inputs; other batches have none."""
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

    def _check_mode(self, task, config) -> None:
        """Refuses a mode the task does not train in (``task.modes``) or its records cannot
        feed (a mixture through the data service), in one line, before anything is written."""
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
            raise SetupError(f"{flag} is not supported by --task={task.name} (it trains in: "
                             f"{', '.join(task.modes)}); drop {flag}")
        try:
            task.records(config).check_mode(mode)
        except InputError as e:
            raise SetupError(str(e)) from e

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
        """Opens the run, trains, then evaluates, reports and exports (``_finish``)."""
        self._check_mode(task, config)
        strategy, mode, local, workers, worker = self._strategy()
        chief = worker == 0
        model_config = self._model_config(task)
        jit = bool(getattr(config, "jit_compile", False))
        if jit and (strategy is not None or self.settings.data_service):
            raise SetupError("--jit_compile trains on one replica from files: drop it, or "
                             "--num_replicas/--strategy/--data_service")
        if self.settings.steps_per_execution > 1 and (strategy is not None
                                                      or self.settings.data_service):
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
                print("building the model ...", file=sys.stderr, flush=True)
        logging.info("config: %s", config)
        training = _Training(task, config, run, mode, local, workers, worker, strategy,
                             counters={"train": DropCounter("train"),
                                       "eval": DropCounter("eval")},
                             stats=BatchStats())
        scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
        # The initial weights follow --seed: Keras draws an initializer's seed from Python's
        # `random` (TensorFlow's global seed is left alone: it would change the data's order).
        random.seed(getattr(config, "seed", 0))
        with scope:
            training.model = task.build_model(config, run.state, model_config)
        training.local_model = (training.model if strategy is None else
                                task.build_model(config, run.state, model_config))
        fit = self._fit_on_service if mode == "data_service" else self._fit
        if not fit(training):
            return None  # a finished run: nothing trained
        if not training.result.signal:  # a signal stops training with its checkpoint saved
            self.phase = "finishing"
        self._finish(training)
        return training.result

    def _fit(self, t: "_Training") -> bool:
        """Trains with a ``Trainer`` (a ``ReplicaTrainer`` under a strategy), from the newest
        checkpoint; False when the run had already done its epochs."""
        chief = t.worker == 0
        several = self.settings.steps_per_execution > 1
        if chief and self.settings.verbose:  # seconds on a mixture: a line of its own
            print("building the training input ...", file=sys.stderr, flush=True)
        stream = t.task.training_stream(t.config, t.run.state, t.counters["train"], t.run.shards,
                                        replicas=t.local, parts=t.strategy is not None)
        summaries = self._summaries(t.stats, t.counters)

        def on_step(step, logs):
            t.first_step_seconds = t.first_step_seconds or round(
                time.perf_counter() - self.settings.started, 3)
            if chief:
                summaries.on_step(step, logs)

        options = dict(model_dir=self.settings.model_dir,
                       checkpoint_every=self.settings.checkpoint_every, on_step=on_step,
                       # per-batch row lengths for TensorBoard: Python per step
                       on_batch=summaries.on_batch if chief and not several else None,
                       on_epoch_start=lambda epoch: t.counters["train"].reset(), stats=t.stats,
                       epoch_note=lambda: t.run.records.shares_note(t.counters["train"]))
        jit = bool(getattr(t.config, "jit_compile", False))
        trainer = (ReplicaTrainer(t.model, t.strategy, stream, **options)
                   if t.strategy is not None
                   else Trainer(t.model, stream, jit_compile=jit,
                                steps_per_execution=self.settings.steps_per_execution,
                                **options))
        resumed = trainer.restore()
        if resumed and self._finished(trainer):
            return False
        t.resumed_at = int(trainer.global_step.numpy()) if resumed else None
        self.phase = "training"
        if resumed and self.settings.verbose and chief:
            print(f"Resuming from {self.settings.model_dir}: "
                  f"epoch {int(trainer.epoch.numpy()) + 1}, "
                  f"step {int(trainer.step_in_epoch.numpy())} of that epoch", file=sys.stderr)

        def eval_fn(epoch):
            results = t.evaluate() if chief else {}
            if chief:
                summaries.on_eval(epoch, results)
            return {f"eval_{k}": v for k, v in results.items()}

        t.result = trainer.fit(self.settings.epochs,
                               verbose=self.settings.verbose if chief else 0,
                               eval_fn=eval_fn if t.workers == 1 and t.held_out else None,
                               max_steps=self.settings.max_steps)
        t.timings = trainer.timings
        checkpoints = trainer.checkpoint_dir and checkpoints_newest_first(
            trainer.checkpoint_dir)
        t.data_state_bytes = data_state_bytes(checkpoints[0]) if checkpoints else 0
        # Whole epochs before the one the counters hold (they restart with each epoch).
        epochs = int(trainer.epoch.numpy())
        before = epochs - 1 if epochs and not int(trainer.step_in_epoch.numpy()) else epochs
        t.sources = t.run.records.report_sources(t.run.shards, t.counters["train"],
                                                 epochs_before=before)
        if jit:
            t.jit = {"shape_budget": t.task.batching(t.config).num_shapes,
                     "compiled_shapes": trainer.compiled_shapes}
        return True

    def _fit_on_service(self, t: "_Training") -> bool:
        """``--data_service``: ``model.fit`` on the service's split batches; the weights are
        saved at each epoch end (``weights.weights.h5``) and a run resumes at epoch
        boundaries."""
        dataset_fn = t.task.replica_dataset_fn(t.config, t.run.state, t.counters["train"],
                                               t.local, data_service=self.settings.data_service,
                                               stats=t.stats)
        dist = t.strategy.distribute_datasets_from_function(dataset_fn)
        weights_path = os.path.join(self.settings.model_dir, "weights.weights.h5")
        self.phase = "training"
        start = time.perf_counter()
        history = t.model.fit(dist, epochs=self.settings.epochs, verbose=self.settings.verbose,
                              callbacks=[keras.callbacks.ModelCheckpoint(
                                  weights_path, save_weights_only=True)])
        seconds = time.perf_counter() - start
        epochs = [{"epoch": i + 1, **{k: float(v[i]) for k, v in history.history.items()}}
                  for i in range(len(history.history.get("loss", [])))]
        t.result = TrainResult(len(epochs), int(t.model.optimizer.iterations.numpy()), False,
                               epochs, seconds)
        return True

    def _finish(self, t: "_Training") -> None:
        """Evaluates, writes ``report.json`` (a worker's own under ``workers/<i>``) and, on
        the chief, prints the report and exports: the same in every mode."""
        chief = t.worker == 0
        finished = not t.result.interrupted
        evaluated = finished and chief and t.held_out
        baselines = t.task.baselines(t.eval_ds()) if evaluated else {}
        eval_results = t.evaluate() if evaluated else {}  # the eval counts: one pass
        report = make_report(
            task_name=t.task.name, config=t.config, mode=t.mode, replicas=t.local,
            workers=t.workers,
            learning_rate=float(keras.ops.convert_to_numpy(t.model.optimizer.learning_rate)),
            result=t.result, stats=t.stats, counters=t.counters, eval_results=eval_results,
            baselines=baselines, setup=t.run.setup, first_step_seconds=t.first_step_seconds,
            timings=t.timings, data_state_bytes=t.data_state_bytes,
            drop_examples=drop_examples_of(t.task, t.config, t.counters),
            data_service=self.settings.data_service, resumed_at_step=t.resumed_at,
            sources=t.sources, jit=t.jit)
        if not chief:
            worker_dir = os.path.join(self.settings.model_dir, "workers", str(t.worker))
            os.makedirs(worker_dir, exist_ok=True)
            write_report(os.path.join(worker_dir, "report.json"), report)
            return
        write_report(os.path.join(self.settings.model_dir, "report.json"), report)
        print(format_report(report))
        if finished and t.held_out:
            for line in t.task.sample_lines(t.config, t.run.state, t.local_model, t.eval_ds()):
                print(line)
        if self.settings.export and not t.result.signal:  # finished, or stopped by max_steps
            if self.settings.verbose:
                print("exporting the model over raw input ...", file=sys.stderr, flush=True)
            t.sync_local_model()
            path = exporting.export_run(self.settings.model_dir, t.task, t.config, t.run.state,
                                        t.local_model)
            if path:
                print(f"Served model ({t.task.name}, input `{t.task.prediction_input}`): {path}")


@dataclasses.dataclass(eq=False)
class _Training:
    """One command's training, from the opened run to what its report needs."""

    task: object
    config: object
    run: object
    mode: str
    local: int
    workers: int
    worker: int
    strategy: object
    counters: dict
    stats: BatchStats
    model: object = None
    local_model: object = None  # a single-device copy under a strategy (no collective op)
    result: TrainResult | None = None
    resumed_at: int | None = None
    first_step_seconds: float | None = None
    timings: dict | None = None
    data_state_bytes: int = 0
    sources: list = dataclasses.field(default_factory=list)
    jit: dict | None = None
    evaluated: tuple | None = None  # (optimizer step, metrics, eval counts) of the last pass

    def sync_local_model(self) -> None:
        if self.local_model is not self.model:
            self.local_model.set_weights(self.model.get_weights())

    @functools.cache
    def eval_ds(self):
        """Built at its first use: a run stopped before any evaluation skips it."""
        return self.task.eval_dataset(self.config, self.run.state, self.counters["eval"])

    @property
    def held_out(self) -> bool:
        """Whether evaluation has records: ``eval_files``, or a share of the training records
        (``eval_percent`` > 0; a task without ``eval_percent`` always holds some out)."""
        return (bool(getattr(self.config, "eval_files", ()))
                or getattr(self.config, "eval_percent", 1) > 0)

    def evaluate(self) -> dict:
        """Held-out metrics of the model now; the eval counters hold that one pass (none, and
        no pass over the training records, when nothing is held out: ``{}``).

        Weights evaluated already (the last epoch's evaluation, then the report's, at the same
        step) are not evaluated again: the same numbers and counts, without a second pass.
        """
        if not self.held_out:
            return {}
        step = int(self.model.optimizer.iterations.numpy())
        counter = self.counters["eval"]
        if self.evaluated is not None and self.evaluated[0] == step:
            _, results, counts = self.evaluated
            for name, variable in counter.variables().items():
                variable.assign(counts.get(name, 0))
            return dict(results)
        self.sync_local_model()
        counter.reset()
        results = {k: float(v) for k, v in self.local_model.evaluate(
            self.eval_ds(), verbose=0, return_dict=True).items()}
        counts = {name: int(v.numpy()) for name, v in counter.variables().items()}
        self.evaluated = (step, results, counts)
        return dict(results)
