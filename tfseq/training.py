"""A resumable, exactly-once training loop for Keras models over tf.data pipelines.

``model.fit`` owns its dataset iterator, so its position cannot be saved. ``Trainer`` owns the
iterator instead and steps the compiled model with ``train_on_batch``, so one
``tf.train.Checkpoint`` holds the model, the optimizer, the *iterator* (with its shuffle,
bucketing and prefetch buffers) and any counters. Resuming from ``model_dir`` continues
mid-epoch with no example lost or repeated: the resumed epoch delivers exactly the batches the
interrupted one had left, in the same order. Later epochs are reshuffled as usual.

The training numbers of an epoch (the progress bar and ``history``) are means over the epoch's
real examples: each step's loss and metrics are weighted by the sample weight summed over the
batch (the real segments of a packed batch, the real tokens of an lm batch), or by the number of
labels when there are no weights. ``train_on_batch`` alone reports the last batch only (it
resets the metrics every call), which on a small last batch can read 0.000.

Checkpoints are written every ``checkpoint_every`` steps, at each epoch end, and when SIGINT or
SIGTERM arrives (the loop finishes the current step, saves, and returns ``interrupted=True``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import time
from typing import Callable, Mapping

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tfseq.progress import heartbeat


@dataclasses.dataclass
class TrainResult:
    epochs_done: int
    steps_done: int
    interrupted: bool
    history: list[dict]
    train_seconds: float  # wall time in this call, evaluation excluded
    signal: str | None = None  # "SIGTERM" or "SIGINT" when a signal stopped it


def batch_weight(batch) -> float:
    """The number of real examples a ``(features, labels[, weights])`` batch counts for: its
    sample weights summed, or the number of label entries when it has none."""
    if len(batch) > 2 and batch[2] is not None:
        return float(sum(float(tf.reduce_sum(tf.cast(w, tf.float64)))
                         for w in tf.nest.flatten(batch[2])))
    labels = tf.nest.flatten(batch[1])
    return float(tf.size(labels[0]).numpy()) if labels else 0.0


def _graph_batch_weight(batch) -> tf.Tensor:
    """``batch_weight`` in the graph: float64 scalar."""
    if len(batch) > 2 and batch[2] is not None:
        return tf.add_n([tf.reduce_sum(tf.cast(w, tf.float64)) for w in tf.nest.flatten(batch[2])])
    labels = tf.nest.flatten(batch[1])
    return tf.cast(tf.size(labels[0]), tf.float64) if labels else tf.constant(0.0, tf.float64)


class _EpochMeans:
    """Running weighted means of the per-step logs over one epoch."""

    def __init__(self):
        self.sums, self.total = {}, 0.0

    def add_sums(self, sums: dict, weight: float) -> dict:
        """Several steps at once: ``sums`` holds each log times its step's weight, summed;
        ``weight`` the steps' weights summed."""
        if weight > 0:
            self.total += weight
            for k, v in sums.items():
                self.sums[k] = self.sums.get(k, 0.0) + v
        return {k: v / self.total for k, v in self.sums.items()} if self.total else {}

    def add(self, logs: dict, weight: float) -> dict:
        if weight > 0:
            self.total += weight
            for k, v in logs.items():
                self.sums[k] = self.sums.get(k, 0.0) + v * weight
        if not self.total:
            return dict(logs)
        return {k: v / self.total for k, v in self.sums.items()}


class _SignalFlag:
    """Turns SIGINT/SIGTERM into a flag checked between steps (main thread only)."""

    def __init__(self):
        self.raised = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no handler, no interruption
                pass
        return self

    def _handle(self, signum, frame):
        self.raised = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Trainer:
    """Runs epochs of ``train_on_batch`` with resumable checkpoints.

    Each step is the model's ``train_step`` in one ``tf.function`` traced once, on the
    input's relaxed batch spec (Keras' own ``train_on_batch`` traces a bucketed run three
    times); a model made in a ``tf.distribute`` strategy's scope steps through
    ``train_on_batch`` itself.

    Args:
      model: a compiled Keras model.
      data: one epoch of ``(features, labels)`` or ``(features, labels, weights)`` batches:
        either a ``tf.data.Dataset`` (its iterator, buffers included, goes into the
        checkpoint), or a ``tfseq.resumable.ResumableStream`` (only its position and its
        counter's counts do: a few integers, whatever the corpus; its ``epoch`` is this
        trainer's), or a ``tfseq.replay.ReplayStream`` (nothing does: a restore rebuilds the
        epoch and skips the steps taken).
      model_dir: where checkpoints go (``model_dir/ckpt``); ``None`` disables checkpointing.
      checkpoint_every: save every N steps (0: only at epoch ends and on signals).
      trackables: extra objects saved with the checkpoint, e.g. ``{"counter": DropCounter}``
        variables, so counts survive a resume.
      on_step: ``fn(step, logs)`` called after every step (logging, summaries).
      on_batch: ``fn(batch)`` called with every batch before it is trained on (tests use it
        to record example ids).
      on_epoch_start: ``fn(epoch)`` called before the first step of each epoch (not when a
        resume continues one mid-way), e.g. to reset per-pass counters.
      stats: a ``tfseq.BatchStats`` that a stream's batches are added to as they are taken.
      jit_compile: run each step as one XLA program (``tf.function(jit_compile=True)``), one
        compiled program per distinct batch shape: feed batches of a few shapes
        (``bucket_by_length(pad_to_boundary=True, fill_rows=True)``, or ``pack``), or every
        new shape compiles again. ``compiled_shapes`` counts the programs compiled so far.
      steps_per_execution: steps run per Python call (after the first step of each ``fit``):
        the batches are taken, trained on, counted and the stream's cursor advanced inside
        one ``tf.function``, so a small model on a fast device is not held back by Python per
        step. Checkpoints, ``max_steps``, signals, progress and ``on_step`` come between
        executions (``checkpoint_every`` and ``max_steps`` are still hit exactly: an
        execution stops at them); ``on_batch`` needs 1.
    """

    def __init__(self, model: keras.Model, data, *, model_dir: str | None,
                 checkpoint_every: int = 0, trackables: Mapping[str, object] | None = None,
                 max_to_keep: int = 2, on_step: Callable | None = None,
                 on_batch: Callable | None = None, on_epoch_start: Callable | None = None,
                 stats=None, epoch_note: Callable[[], str] | None = None,
                 jit_compile: bool = False, steps_per_execution: int = 1):
        from tfseq.replay import ReplayStream
        from tfseq.resumable import ResumableStream

        self.model = model
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.step_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="step_in_epoch")
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        # Steps in the last complete epoch: the progress bar's target once known.
        self.last_epoch_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="last_epoch_steps")
        self.stream = data if isinstance(data, ResumableStream) else None
        self.replay = data if isinstance(data, ReplayStream) else None
        if self.stream is not None:
            self.stream.epoch = self.epoch
            self.train_ds = self.stream.dataset()
        elif self.replay is not None:  # rebuilt from (epoch, steps taken): nothing saved
            self.train_ds = self.replay.dataset(self.epoch, self.step_in_epoch)
        else:
            # Drop counters update tf.Variables from inside the pipeline; tf.data calls that
            # "external state" and refuses to serialize the iterator. The counters are saved
            # in the same checkpoint as variables (``trackables``), so it is safe to ignore.
            options = tf.data.Options()
            options.experimental_external_state_policy = (
                tf.data.experimental.ExternalStatePolicy.IGNORE)
            self.train_ds = data.with_options(options)
        self.model_dir = model_dir
        self.checkpoint_every = checkpoint_every
        self.trackables = dict(trackables or {})
        self.max_to_keep = max_to_keep
        self.on_step = on_step
        self.on_batch = on_batch
        self.on_epoch_start = on_epoch_start
        self.epoch_note = epoch_note  # () -> text appended to each epoch's progress line
        self.stats = stats
        self._iterator = None
        self._manager = None
        self._taken = None  # the meta of the stream batch being trained on
        # Seconds spent writing each checkpoint, restoring, and waiting for the first batch
        # after a restore (rebuilding the input's position).
        self.timings = {"save": [], "restore": None, "first_batch": None}
        self.jit_compile = jit_compile
        self._compiled_step = None  # with jit_compile: the XLA step
        self._step_fn = None        # without: the step, traced once
        if (isinstance(steps_per_execution, bool) or not isinstance(steps_per_execution, int)
                or steps_per_execution < 1):
            raise ValueError("steps_per_execution must be a positive int; received "
                             f"{steps_per_execution!r}")
        if steps_per_execution > 1 and on_batch is not None:
            raise ValueError("on_batch sees every batch in Python: it needs "
                             "steps_per_execution=1")
        self.steps_per_execution = steps_per_execution
        self._log_keys = None     # the step's log names, from the first step
        self._run_steps = None    # the traced multi-step function

    # -- checkpoints ---------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> str | None:
        return os.path.join(self.model_dir, "ckpt") if self.model_dir else None

    def _checkpoint(self) -> tf.train.Checkpoint:
        position = {"iterator": self._iterator}
        if self.replay is not None:  # the epoch and step counters are its position
            position = {}
        elif self.stream is not None:  # the cursor, and the counts of the batches taken
            position = {**self.stream.variables(), **{
                f"counter_{k}": v for k, v in self.stream.counter.variables().items()}}
        return tf.train.Checkpoint(
            model=self.model, optimizer=self.model.optimizer, epoch=self.epoch,
            step_in_epoch=self.step_in_epoch, global_step=self.global_step,
            last_epoch_steps=self.last_epoch_steps, **position, **self.trackables)

    def _new_epoch_iterator(self, resumed: bool = False):
        if self.stream is not None and not resumed:
            self.stream.reset()
        self._iterator = iter(self.train_ds)
        if self.checkpoint_dir:
            self._manager = tf.train.CheckpointManager(
                self._checkpoint(), self.checkpoint_dir, max_to_keep=self.max_to_keep)

    def save(self) -> str | None:
        """Writes a checkpoint now; returns its path (None without ``model_dir``)."""
        if not self._manager:
            return None
        step = int(self.global_step.numpy())
        start = time.perf_counter()
        path = self._manager.save(checkpoint_number=step)
        self.timings["save"].append(time.perf_counter() - start)
        logging.info("Saved checkpoint %s (epoch %d, step %d in epoch)", path,
                     int(self.epoch.numpy()), int(self.step_in_epoch.numpy()))
        return path

    def restore(self) -> bool:
        """Restores the newest complete checkpoint in ``model_dir``, if any; returns whether
        it did. A checkpoint that cannot be read (a write cut short) is skipped with a warning
        naming it, and the one before it is used."""
        candidates = checkpoints_newest_first(self.checkpoint_dir) if self.checkpoint_dir else []
        start = time.perf_counter()
        for path in candidates:
            try:
                # The epoch counter first: a dataset's iterator slot is the right epoch's.
                tf.train.Checkpoint(epoch=self.epoch).restore(path).expect_partial()
                self._new_epoch_iterator(resumed=True)
                # expect_partial: the optimizer's slots are restored when its first step
                # creates them; a run that ends before any step would warn about each one.
                self._checkpoint().restore(path).assert_existing_objects_matched() \
                    .expect_partial()
                if self.replay is not None:  # it reads the restored epoch and step
                    self._iterator = iter(self.train_ds)
            except (tf.errors.OpError, ValueError) as e:
                logging.warning("Skipping checkpoint %s: it cannot be read (%s); trying the "
                                "one before it", path, str(e).splitlines()[0][:200])
                continue
            logging.info("Resumed from %s at epoch %d, step %d in epoch", path,
                         int(self.epoch.numpy()), int(self.step_in_epoch.numpy()))
            self.timings["restore"] = time.perf_counter() - start
            self._awaiting_first = time.perf_counter()
            return True
        self.epoch.assign(0)
        self._new_epoch_iterator()
        return False

    def _next_batch(self):
        """The next training batch; raises ``StopIteration`` at the end of the epoch. A
        stream's empty batches (a pool left with no example) only bring counts: taken here."""
        if self.replay is not None and self.replay.count is not None:
            batch, meta = next(self._iterator)
            self._taken = {k: v.numpy() for k, v in meta.items()}
            return batch
        if self.stream is None:
            return next(self._iterator)
        while True:
            batch, meta = next(self._iterator)
            meta = {k: v.numpy() for k, v in meta.items()}
            if meta["examples"] > 0:
                self._taken = meta
                return batch
            self.stream.advance(meta)

    def _took(self) -> None:
        """After a step: the stream's position moves past the batch, its counts are added."""
        if self._taken is not None:
            if self.stream is not None:
                self.stream.advance(self._taken)
            if self.stats is not None:
                self.stats.add(self._taken["tokens"], self._taken["cells"],
                               self._taken["examples"])
            self._taken = None

    def _batch_weight(self, batch) -> float:
        """How many real examples ``batch`` counts for in the epoch means."""
        return batch_weight(batch)

    def _train_step(self, batch) -> dict:
        """Trains on one batch and returns its logs as floats."""
        if self.jit_compile or _default_strategy(self.model):
            logs = self._graph_train_step(batch)
        else:  # a model made in a strategy's scope: Keras runs its step through the strategy
            logs = {k: float(v) for k, v in
                    self.model.train_on_batch(*batch, return_dict=True).items()}
        self._log_keys = self._log_keys or tuple(logs)
        return logs

    def _show(self, bar, logs: dict, epoch: int, epoch_start: float, last_line: float,
              verbose: int) -> float:
        """Progress after a step (or an execution of several): the bar on a terminal, else a
        line after ``FIRST_PROGRESS`` s and every ``PROGRESS_SECONDS``; returns when the last
        line was written."""
        if bar is not None:
            with contextlib.redirect_stdout(sys.stderr):  # progress: on stderr
                bar.update(int(self.step_in_epoch.numpy()), list(logs.items()))
        elif verbose and time.perf_counter() - last_line >= (
                PROGRESS_SECONDS if last_line > epoch_start else FIRST_PROGRESS):
            last_line = time.perf_counter()
            means_now = ", ".join(f"{k} {v:.4f}" for k, v in logs.items())
            _progress(f"epoch {epoch + 1}: step {int(self.step_in_epoch.numpy())}, "
                      f"{last_line - epoch_start:.0f} s; {means_now}")
        return last_line

    # -- several steps per Python call -------------------------------------------------
    def _steps_graph(self, iterator, k):
        """Up to ``k`` (int64 scalar) training steps on ``iterator``'s next batches, in one
        graph: each batch trained on (a stream's empty batches only advance its cursor),
        counted, and the stream's cursor, counts and ``stats`` advanced as ``_took`` does.

        Returns:
          ``(steps, ended, weight, sums)``: int64 steps trained, bool whether the epoch's
          batches ran out, float64 the batches' summed weight (``batch_weight``), float64
          ``[len(log keys)]`` each log times its batch's weight, summed.
        """
        keys, stream, model = self._log_keys, self.stream, self.model
        zero = tf.constant(0.0, tf.float64)

        def train(batch):
            model.reset_metrics()  # each step's logs are its own, as train_on_batch gives
            logs = (self._compiled_step(tuple(batch)) if self.jit_compile
                    else model.train_step(tuple(batch)))
            weight = _graph_batch_weight(batch)
            return (tf.constant(1, tf.int64), weight,
                    tf.stack([tf.cast(logs[key], tf.float64) * weight for key in keys]))

        def skip():
            return tf.constant(0, tf.int64), zero, tf.zeros([len(keys)], tf.float64)

        def take(element):
            if self.replay is not None and self.replay.count is not None:
                batch, meta = element
                steps, weight, sums = train(batch)
                updates = []
                if self.stats is not None:
                    with tf.control_dependencies([steps]):
                        updates = [self.stats.real_tokens.assign_add(meta["tokens"]),
                                   self.stats.cells.assign_add(meta["cells"]),
                                   self.stats.examples.assign_add(meta["examples"]),
                                   self.stats.batches.assign_add(steps)]
                with tf.control_dependencies(updates):
                    return tf.identity(steps), tf.identity(weight), tf.identity(sums)
            if stream is None:
                return train(element)
            batch, meta = element
            steps, weight, sums = tf.cond(meta["examples"] > 0, lambda: train(batch), skip)
            with tf.control_dependencies([steps]):
                updates = [stream.shard.assign(meta["shard"]),
                           stream.offset.assign(meta["offset"]),
                           stream.batches.assign(meta["index"] + 1)]
                updates += [stream.counter.variable(key).assign_add(meta["counts"][i])
                            for i, key in enumerate(stream.count_keys)]
                if self.stats is not None:
                    updates += [self.stats.real_tokens.assign_add(meta["tokens"]),
                                self.stats.cells.assign_add(meta["cells"]),
                                self.stats.examples.assign_add(meta["examples"]),
                                self.stats.batches.assign_add(steps)]
            with tf.control_dependencies(updates):
                return tf.identity(steps), tf.identity(weight), tf.identity(sums)

        def body(done, ended, weight, sums):
            optional = iterator.get_next_as_optional()
            steps, w, s = tf.cond(optional.has_value(), lambda: take(optional.get_value()),
                                  skip)
            with tf.control_dependencies([steps]):
                counted = [self.step_in_epoch.assign_add(steps),
                           self.global_step.assign_add(steps)]
            with tf.control_dependencies(counted):
                return (done + steps, tf.logical_not(optional.has_value()), weight + w,
                        sums + s)

        return tf.while_loop(
            lambda done, ended, weight, sums: (done < k) & tf.logical_not(ended), body,
            (tf.constant(0, tf.int64), tf.constant(False), zero,
             tf.zeros([len(keys)], tf.float64)))

    def _steps(self, k: int):
        """Runs ``_steps_graph`` for up to ``k`` steps; returns ``(steps, ended, weight,
        {log: weighted sum})``."""
        if self._run_steps is None:
            if self.stream is not None:  # counter variables made outside the trace
                for key in self.stream.count_keys:
                    self.stream.counter.variable(key)
            self._run_steps = tf.function(self._steps_graph, autograph=False)
        steps, ended, weight, sums = self._run_steps(self._iterator, tf.constant(k, tf.int64))
        return (int(steps), bool(ended), float(weight),
                dict(zip(self._log_keys, sums.numpy().tolist())))

    @property
    def compiled_shapes(self) -> int:
        """With ``jit_compile``: the XLA programs compiled so far (one per distinct batch
        shape: the step is traced without shape relaxation, so each trace is one program)."""
        if self._compiled_step is None:
            return 0
        return self._compiled_step.experimental_get_tracing_count()

    def _batch_spec(self):
        """The spec of the training batches, as the input pipeline declares it (a bucketed
        batch's rows and length are ``None``)."""
        spec = self.train_ds.element_spec
        if self.stream is not None or (self.replay is not None and self.replay.count is not None):
            spec = spec[0]  # (batch, meta)
        return tuple(spec)

    def _graph_train_step(self, batch) -> dict:
        """``train_on_batch(*batch)`` with the model's ``train_step`` traced once: the metrics
        are reset, the step runs, and its logs come back as floats.

        Keras' own function is traced twice on its first call (its compiled metrics create
        variables there) and once more at the first new batch shape. Here every variable is
        made before the trace, and the one trace takes the pipeline's relaxed batch spec. A
        model Keras cannot build from specs (ragged inputs, layers built at their first call)
        makes its variables in that trace, which tf.function then repeats once. With
        ``jit_compile`` a new shape is a new trace instead (one XLA program each).
        """
        model = self.model
        step = self._compiled_step if self.jit_compile else self._step_fn
        if step is None:
            if self.jit_compile:
                _build_from_specs(model, batch, strict=True)
                # reduce_retracing=False: a new shape is a new trace (and one compilation),
                # never a shape-relaxed trace that XLA would compile again per shape unseen.
                step = self._compiled_step = tf.function(
                    lambda data: model.train_step(data), jit_compile=True,
                    reduce_retracing=False, autograph=False)
            else:
                # Where Keras cannot build the model from specs, the first call makes its
                # variables (traced twice, as Keras' own function is, both on this spec).
                # The model's own jit_compile, as Keras' function takes it ("auto": XLA on
                # a GPU, none on CPU).
                _build_from_specs(model, batch)
                step = self._step_fn = tf.function(
                    lambda data: model.train_step(data), input_signature=[self._batch_spec()],
                    jit_compile=bool(model.jit_compile), autograph=False)
        model.reset_metrics()
        logs = step(tuple(batch))
        return {k: float(v) for k, v in logs.items()}

    # -- the loop ------------------------------------------------------------------------
    def fit(self, epochs: int, *, verbose: int = 1, eval_fn: Callable | None = None,
            max_steps: int | None = None) -> TrainResult:
        """Trains until ``epochs`` epochs are done (counting epochs done before a resume).

        Args:
          epochs: total epochs.
          verbose: 1 shows progress on stderr: a Keras progress bar per epoch on a terminal
            (otherwise a line after 5 s, then every 30 s), and one line per epoch (its steps,
            seconds, means and ``eval_fn``'s numbers).
          eval_fn: ``fn(epoch) -> dict`` run after each epoch; its numbers join the history.
          max_steps: stop (with a checkpoint) after this many steps in this call; for tests
            and time-boxed runs.

        Returns:
          ``TrainResult``; ``interrupted`` is true when a signal or ``max_steps`` stopped it,
          ``signal`` names the signal.
        """
        if self._iterator is None:
            self.restore()
        history, steps_this_call, start = [], 0, time.perf_counter()
        show_bar = bool(verbose) and _interactive()  # else lines, every so often
        with _SignalFlag() as flag:
            while int(self.epoch.numpy()) < epochs:
                epoch = int(self.epoch.numpy())
                target = int(self.last_epoch_steps.numpy()) or None
                # The logs are already epoch means: shown as given (stateful), not re-averaged.
                # No target for the bar: an epoch of bucketed or packed batches may take a step
                # more or less than the last one (the bar would end twice); a bar only on a
                # terminal (piped, it would be carriage returns and escape codes).
                bar = keras.utils.Progbar(None, verbose=1, unit_name="step",
                                          stateless_metrics=()) if show_bar else None
                if show_bar:
                    about = f" (about {target} steps)" if target else ""
                    _progress(f"Epoch {epoch + 1}/{epochs}{about}")
                epoch_start = last_line = time.perf_counter()
                logs = {}
                if self.on_epoch_start and int(self.step_in_epoch.numpy()) == 0:
                    self.on_epoch_start(epoch)
                # After a resume the epoch's means cover the steps since the resume.
                means = _EpochMeans()
                while True:
                    if flag.raised or (max_steps is not None and steps_this_call >= max_steps):
                        path = self.save()
                        if flag.raised:
                            logging.info("%s received: saved %s and stopped", flag.raised, path)
                        return TrainResult(epoch, int(self.global_step.numpy()), True, history,
                                           time.perf_counter() - start, flag.raised)
                    if self.steps_per_execution > 1 and steps_this_call and self._log_keys:
                        k = self.steps_per_execution
                        if max_steps is not None:
                            k = min(k, max_steps - steps_this_call)
                        if self.checkpoint_every:
                            k = min(k, self.checkpoint_every
                                    - int(self.global_step.numpy()) % self.checkpoint_every)
                        steps, ended, weight, sums = self._steps(k)
                        if steps:
                            logs = means.add_sums(sums, weight)
                            steps_this_call += steps
                            last_line = self._show(bar, logs, epoch, epoch_start, last_line,
                                                   verbose)
                            if self.on_step:
                                self.on_step(int(self.global_step.numpy()), logs)
                            if self.checkpoint_every and int(
                                    self.global_step.numpy()) % self.checkpoint_every == 0:
                                self.save()
                        if ended:
                            break
                        continue
                    try:
                        batch = self._next_batch()
                    except StopIteration:
                        break
                    if getattr(self, "_awaiting_first", None) is not None:
                        self.timings["first_batch"] = time.perf_counter() - self._awaiting_first
                        self._awaiting_first = None
                    if self.on_batch:
                        self.on_batch(batch)
                    if steps_this_call == 0:  # it traces the step: seconds, with a heartbeat
                        with heartbeat("the first step (building the training graph)",
                                       _progress if verbose else None, every=5):
                            step_logs = self._train_step(batch)
                    else:
                        step_logs = self._train_step(batch)
                    logs = means.add(step_logs, self._batch_weight(batch))
                    self._took()
                    self.step_in_epoch.assign_add(1)
                    self.global_step.assign_add(1)
                    steps_this_call += 1
                    last_line = self._show(bar, logs, epoch, epoch_start, last_line, verbose)
                    if self.on_step:
                        self.on_step(int(self.global_step.numpy()), logs)
                    if self.checkpoint_every and int(self.global_step.numpy()) % self.checkpoint_every == 0:
                        self.save()
                steps = int(self.step_in_epoch.numpy())
                if show_bar:
                    with contextlib.redirect_stdout(sys.stderr):
                        bar.update(steps, list(logs.items()), finalize=True)
                record = {"epoch": epoch + 1, **logs}
                seconds = time.perf_counter() - epoch_start
                if eval_fn:
                    if verbose:
                        _progress(f"epoch {epoch + 1}: evaluating on the held-out data ...")
                    eval_start = time.perf_counter()
                    record.update(eval_fn(epoch + 1))
                    start += time.perf_counter() - eval_start  # train_seconds excludes eval
                history.append(record)
                if verbose:
                    note = self.epoch_note() if self.epoch_note else ""
                    _progress(_epoch_line(epoch + 1, epochs, steps, seconds, record)
                              + (f"; {note}" if note else ""))
                self.epoch.assign_add(1)
                self.last_epoch_steps.assign(self.step_in_epoch)
                self.step_in_epoch.assign(0)
                self._new_epoch_iterator()
                self.save()
        return TrainResult(int(self.epoch.numpy()), int(self.global_step.numpy()), False, history,
                           time.perf_counter() - start)


# When stderr is not a terminal: a progress line after FIRST_PROGRESS seconds of an epoch, then
# every PROGRESS_SECONDS.
FIRST_PROGRESS, PROGRESS_SECONDS = 5, 30


def _interactive() -> bool:
    """Whether progress goes to a terminal (a bar) or to a file or pipe (lines)."""
    return hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def _progress(line: str) -> None:
    """A progress line: on stderr (stdout keeps the report)."""
    print(line, file=sys.stderr, flush=True)


def _epoch_line(epoch: int, epochs: int, steps: int, seconds: float, record: dict) -> str:
    """``epoch 1/2: 354 steps in 12.3 s; loss 0.5312, accuracy 0.8120; held-out accuracy
    0.7900, loss 0.6011``."""
    train = ", ".join(f"{k} {v:.4f}" for k, v in record.items()
                      if k != "epoch" and not k.startswith("eval_"))
    held = ", ".join(f"{k[len('eval_'):]} {v:.4f}" for k, v in record.items()
                     if k.startswith("eval_"))
    return (f"epoch {epoch}/{epochs}: {steps} steps in {seconds:.1f} s; {train}"
            + (f"; held-out {held}" if held else ""))


def checkpoints_newest_first(directory: str) -> list[str]:
    """The checkpoints a ``CheckpointManager`` recorded in ``directory``, newest first.

    Files of a checkpoint whose write was cut short (a ``*_temp`` directory, or data files the
    ``checkpoint`` index does not list) are named in a warning and removed.
    """
    import glob
    import shutil

    state = tf.train.get_checkpoint_state(directory) if os.path.isdir(directory) else None
    # get_checkpoint_state already joins relative entries to ``directory`` (relative or not).
    listed = list(state.all_model_checkpoint_paths) if state else []
    newest = max((_number(os.path.basename(p)) for p in listed), default=-1)
    for path in sorted(glob.glob(os.path.join(directory, "ckpt-*"))):
        prefix = os.path.basename(path).split(".")[0]
        if prefix.endswith("_temp") or _number(prefix) > newest:
            logging.warning("Removing %s: a checkpoint written only in part (the run was "
                            "stopped while writing it)", path)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)
    return listed[::-1]


def data_state_bytes(checkpoint: str) -> int:
    """Bytes a checkpoint spends on the input: a stream's cursor, a dataset iterator's saved
    state (the tf.data variant, buffers included) and the drop counters.

    A variant (an iterator's state, as ``tf.train.Checkpoint(iterator=...)`` saves it) cannot
    be read back as an array; its bytes are the data files' size less every other entry's
    (string entries count their bytes, so this is within a few bytes per string entry)."""
    import glob

    reader = tf.train.load_checkpoint(checkpoint)
    total = other = 0
    variants = False
    for name, dtype in reader.get_variable_to_dtype_map().items():
        data_state = name.startswith(("cursor_", "iterator", "counter_"))
        if dtype == tf.variant:
            variants = variants or data_state
            continue
        value = reader.get_tensor(name)
        if getattr(value, "dtype", None) == object:
            size = sum(len(v) for v in np.asarray(value).reshape(-1))
        else:
            size = np.asarray(value).nbytes
        total, other = (total + size, other) if data_state else (total, other + size)
    if variants:
        stored = sum(os.path.getsize(f) for f in glob.glob(checkpoint + ".data-*"))
        total = max(total, stored - other)
    return int(total)


def _number(prefix: str) -> int:
    """``ckpt-12`` / ``ckpt-12_temp`` -> 12 (-1 if none)."""
    digits = prefix[len("ckpt-"):].split("_")[0]
    return int(digits) if digits.isdigit() else -1


class ReplicaTrainer(Trainer):
    """``Trainer`` for several replicas, with the same exactly-once mid-epoch resume.

    A ``tf.distribute`` iterator cannot be checkpointed, so this trainer never makes one. It
    owns ONE ordinary iterator over the global batches' parts, hands part ``i`` of a step to
    replica ``i`` (``strategy.experimental_distribute_values_from_function``) and
    ``strategy.run`` runs the model's own ``train_step`` on every replica (the optimizer
    all-reduces the gradients; compile with ``tfseq.GlobalWeightedLoss`` so the update equals
    the single-device one). The parts come from a ``ResumableStream`` whose batches are tuples
    of parts (its position is checkpointed, so a resumed epoch, on this number of replicas or
    another at the same global budget, continues the same global batches), or from a dataset
    of parts one after another (``tfseq.replica_dataset_fn``; its iterator, buffers included,
    is checkpointed). A checkpoint is written only between steps.

    Several workers (``MultiWorkerMirroredStrategy``): each worker runs this trainer on its own
    shard; before every step the workers all-reduce whether they still have data, a worker
    whose shard ended feeds copies of its last parts with weight 0 (no effect on the update)
    until every shard has ended, so all workers take the same number of steps per epoch. Each
    worker checkpoints its own iterator: the chief to ``model_dir/ckpt``, worker ``i`` to
    ``model_dir/workers/i/ckpt``.

    Args:
      model: a Keras model built and compiled inside ``strategy.scope()``.
      strategy: ``tfseq.mirrored_strategy(n)``, or a ``MultiWorkerMirroredStrategy``.
      parts_ds: a ``ResumableStream`` or a ``ReplayStream`` (``.split(n)``) of tuples of parts,
        one per LOCAL replica; or a dataset
        of ``(x, y)`` or ``(x, y, sample_weight)`` parts, one per LOCAL replica per step, in
        replica order: ``replica_dataset_fn(...)(trainer_input_context(strategy))``.
      **kwargs: as for ``Trainer`` (``model_dir``, ``checkpoint_every``, ``trackables``,
        ``on_step``; ``on_batch`` receives the tuple of parts of one step).
    """

    def __init__(self, model: keras.Model, strategy: tf.distribute.Strategy,
                 parts_ds: tf.data.Dataset, **kwargs):
        if kwargs.get("steps_per_execution", 1) > 1:
            raise ValueError("steps_per_execution > 1 is supported by Trainer (one replica) "
                             "only")
        if kwargs.get("jit_compile"):
            raise ValueError("jit_compile=True is supported by Trainer (one replica) only; "
                             "ReplicaTrainer steps run without XLA")
        super().__init__(model, parts_ds, **kwargs)
        self.strategy = strategy
        self.num_replicas = strategy.num_replicas_in_sync
        self.num_local = len(strategy.extended.worker_devices)
        self.num_workers = self.num_replicas // self.num_local
        self.task_id = _task_id(strategy)
        self._last_parts = None
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)

        num_local = self.num_local

        @tf.function(reduce_retracing=True)
        def step(parts):
            return strategy.run(model.train_step,
                                args=(_per_replica(strategy, parts, num_local),))

        self._step = step
        self._traced = False
        self._first_step_taken = False  # eagerly: a model not built from specs

    @property
    def checkpoint_dir(self) -> str | None:
        if not self.model_dir or self.task_id == 0:
            return super().checkpoint_dir
        return os.path.join(self.model_dir, "workers", str(self.task_id), "ckpt")

    def _batch_weight(self, batch) -> float:
        return sum(batch_weight(part) for part in batch)

    def _next_batch(self):
        try:
            parts = self._next_local_parts()
        except StopIteration:
            parts = None
        if self.num_workers == 1:
            if parts is None:
                raise StopIteration
            return parts
        flags = self.strategy.experimental_distribute_values_from_function(
            lambda context: tf.constant(0 if parts is None else 1, tf.int32))
        if int(self.strategy.reduce(tf.distribute.ReduceOp.SUM, flags, axis=None)) == 0:
            raise StopIteration  # every worker's shard has ended
        if parts is None:
            if self._last_parts is None:
                raise ValueError(f"worker {self.task_id} has no data at all in this epoch")
            parts = tuple(_zero_weight(p) for p in self._last_parts)
        self._last_parts = parts
        return parts

    def _next_local_parts(self):
        if self.stream is not None or self.replay is not None:
            parts = super()._next_batch()
            if len(parts) != self.num_local:
                raise ValueError(f"The stream's batches have {len(parts)} parts for "
                                 f"{self.num_local} local replicas")
            return tuple(parts)
        first = next(self._iterator)  # StopIteration here: the epoch ended at a step boundary
        parts = [first]
        for i in range(1, self.num_local):
            try:
                parts.append(next(self._iterator))
            except StopIteration:
                raise ValueError(f"parts_ds ended after part {i} of a step of "
                                 f"{self.num_local}: it must emit whole steps (build it "
                                 "with tfseq.replica_dataset_fn for this many replicas)") from None
        return tuple(parts)

    def _train_step(self, batch) -> dict:
        if not self._traced:
            # Every variable (layers, loss, compiled metrics) made before the trace, as
            # Keras' train_on_batch does under a strategy, so the step is traced once, on the
            # input's relaxed spec (a bucketed part's rows and length are None). A model
            # Keras cannot build from specs takes its first step eagerly, which makes them.
            with self.strategy.scope():
                built = self._first_step_taken or _build_from_specs(self.model, batch[0])
            if not built:  # a tf.function with relaxed shapes could not make the variables
                self._first_step_taken = True
                logs = self.strategy.run(self.model.train_step, args=(
                    _per_replica(self.strategy, batch, self.num_local),))
                return {k: float(self.strategy.experimental_local_results(v)[0])
                        for k, v in logs.items()}
            if self.stream is not None or self.replay is not None:
                spec = self._batch_spec()
            else:  # a dataset of parts, num_local of them per step
                spec = (self.train_ds.element_spec,) * self.num_local
            self._step.get_concrete_function(tuple(spec))
            self._traced = True
        logs = self._step(tuple(batch))
        # Keras metrics are synchronised variables: every replica reports the same value.
        return {k: float(self.strategy.experimental_local_results(v)[0])
                for k, v in logs.items()}


def _per_replica(strategy: tf.distribute.Strategy, parts, num_local: int):
    """``parts`` (one per local replica) as one distributed value: part ``i`` on replica
    ``i``."""
    return strategy.experimental_distribute_values_from_function(
        lambda context: parts[context.replica_id_in_sync_group % num_local])


def _build_from_specs(model: keras.Model, batch, strict: bool = False) -> bool:
    """Makes the variables of ``model``, its loss, compiled metrics and optimizer from the
    specs of ``batch`` (Keras' own build, what ``train_on_batch`` does under a strategy), so
    a traced step creates none. Returns False for a model with layers not built yet (one
    building a layer at its first call, as a stateful LM's recurrent cell, is not built
    right from specs; nothing is tried) or that Keras cannot call on symbolic inputs (ragged
    inputs): the first traced call makes what is missing. ``strict``: tries it anyway and
    raises."""
    build = getattr(model, "_symbolic_build", None)  # Keras 3's own (not public) method
    if build is None and strict:
        raise ValueError("jit_compile needs Keras 3's Model._symbolic_build to build the "
                         "model before the compiled step; this Keras has none")
    if build is None or not (strict or all(layer.built for layer in model._flatten_layers())):
        return False
    try:
        build(data_batch=tuple(batch) + (None,) * (3 - len(batch)))
    except (RuntimeError, ValueError):  # Keras: "Unable to automatically build the model",
        # or the model's own ValueError on inputs with unknown dimensions
        if strict:
            raise
        return False
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return True


def _default_strategy(model: keras.Model) -> bool:
    """Whether ``model`` was made outside any ``tf.distribute`` strategy's scope."""
    return getattr(model, "_distribute_strategy", None) is None


def _task_id(strategy: tf.distribute.Strategy) -> int:
    resolver = getattr(strategy, "cluster_resolver", None)
    return int(getattr(resolver, "task_id", 0) or 0) if resolver is not None else 0


def _zero_weight(part):
    """``part`` ``(x, y, w)`` with every sample weight 0 (a dummy step's input)."""
    if not isinstance(part, tuple) or len(part) != 3:
        raise ValueError("multi-worker parts need a sample weight: (x, y, weight) tuples")
    x, y, w = part
    return x, y, tf.nest.map_structure(tf.zeros_like, w)


def trainer_input_context(strategy: tf.distribute.Strategy) -> tf.distribute.InputContext:
    """The ``InputContext`` of this worker, for ``replica_dataset_fn(...)(context)``."""
    local = len(strategy.extended.worker_devices)
    return tf.distribute.InputContext(
        num_input_pipelines=strategy.num_replicas_in_sync // local,
        input_pipeline_id=_task_id(strategy), num_replicas_in_sync=strategy.num_replicas_in_sync)
