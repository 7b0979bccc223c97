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

import dataclasses
import os
import signal
import time
from typing import Callable, Mapping

import keras
import tensorflow as tf
from absl import logging


@dataclasses.dataclass
class TrainResult:
    epochs_done: int
    steps_done: int
    interrupted: bool
    history: list[dict]
    train_seconds: float  # wall time in this call, evaluation excluded


def batch_weight(batch) -> float:
    """The number of real examples a ``(features, labels[, weights])`` batch counts for: its
    sample weights summed, or the number of label entries when it has none."""
    if len(batch) > 2 and batch[2] is not None:
        return float(sum(float(tf.reduce_sum(tf.cast(w, tf.float64)))
                         for w in tf.nest.flatten(batch[2])))
    labels = tf.nest.flatten(batch[1])
    return float(tf.size(labels[0]).numpy()) if labels else 0.0


class _EpochMeans:
    """Running weighted means of the per-step logs over one epoch."""

    def __init__(self):
        self.sums, self.total = {}, 0.0

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
    """Runs epochs of ``train_on_batch`` over ``train_ds`` with resumable checkpoints.

    Args:
      model: a compiled Keras model.
      train_ds: one epoch of ``(features, labels)`` or ``(features, labels, weights)`` batches.
      model_dir: where checkpoints go (``model_dir/ckpt``); ``None`` disables checkpointing.
      checkpoint_every: save every N steps (0: only at epoch ends and on signals).
      trackables: extra objects saved with the checkpoint, e.g. ``{"counter": DropCounter}``
        variables, so counts survive a resume.
      on_step: ``fn(step, logs)`` called after every step (logging, summaries).
      on_batch: ``fn(batch)`` called with every batch before it is trained on (tests use it
        to record example ids).
      on_epoch_start: ``fn(epoch)`` called before the first step of each epoch (not when a
        resume continues one mid-way), e.g. to reset per-pass counters.
    """

    def __init__(self, model: keras.Model, train_ds: tf.data.Dataset, *, model_dir: str | None,
                 checkpoint_every: int = 0, trackables: Mapping[str, object] | None = None,
                 max_to_keep: int = 2, on_step: Callable | None = None,
                 on_batch: Callable | None = None, on_epoch_start: Callable | None = None):
        self.model = model
        # Drop counters update tf.Variables from inside the pipeline; tf.data calls that
        # "external state" and refuses to serialize the iterator. The counters are saved in the
        # same checkpoint as variables (pass them in ``trackables``), so it is safe to ignore.
        options = tf.data.Options()
        options.experimental_external_state_policy = (
            tf.data.experimental.ExternalStatePolicy.IGNORE)
        self.train_ds = train_ds.with_options(options)
        self.model_dir = model_dir
        self.checkpoint_every = checkpoint_every
        self.trackables = dict(trackables or {})
        self.max_to_keep = max_to_keep
        self.on_step = on_step
        self.on_batch = on_batch
        self.on_epoch_start = on_epoch_start
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.step_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="step_in_epoch")
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        # Steps in the last complete epoch: the progress bar's target once known.
        self.last_epoch_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="last_epoch_steps")
        self._iterator = None
        self._manager = None

    # -- checkpoints ---------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> str | None:
        return os.path.join(self.model_dir, "ckpt") if self.model_dir else None

    def _checkpoint(self) -> tf.train.Checkpoint:
        return tf.train.Checkpoint(
            model=self.model, optimizer=self.model.optimizer, iterator=self._iterator,
            epoch=self.epoch, step_in_epoch=self.step_in_epoch, global_step=self.global_step,
            last_epoch_steps=self.last_epoch_steps,
            **self.trackables)

    def _new_epoch_iterator(self):
        self._iterator = iter(self.train_ds)
        if self.checkpoint_dir:
            self._manager = tf.train.CheckpointManager(
                self._checkpoint(), self.checkpoint_dir, max_to_keep=self.max_to_keep)

    def save(self) -> str | None:
        """Writes a checkpoint now; returns its path (None without ``model_dir``)."""
        if not self._manager:
            return None
        path = self._manager.save(checkpoint_number=int(self.global_step.numpy()))
        logging.info("Saved checkpoint %s (epoch %d, step %d in epoch)", path,
                     int(self.epoch.numpy()), int(self.step_in_epoch.numpy()))
        return path

    def restore(self) -> bool:
        """Restores the latest checkpoint in ``model_dir``, if any. Returns whether it did."""
        latest = tf.train.latest_checkpoint(self.checkpoint_dir) if self.checkpoint_dir else None
        if not latest:
            self._new_epoch_iterator()
            return False
        # The epoch counter first, so the iterator slot is the right epoch's.
        tf.train.Checkpoint(epoch=self.epoch).restore(latest).expect_partial()
        self._new_epoch_iterator()
        # expect_partial: the optimizer's slots are restored when its first step creates
        # them; a run that ends before any step would otherwise warn about each one at exit.
        self._checkpoint().restore(latest).assert_existing_objects_matched().expect_partial()
        logging.info("Resumed from %s at epoch %d, step %d in epoch", latest,
                     int(self.epoch.numpy()), int(self.step_in_epoch.numpy()))
        return True

    def _next_batch(self):
        """The next training batch; raises ``StopIteration`` at the end of the epoch."""
        return next(self._iterator)

    def _batch_weight(self, batch) -> float:
        """How many real examples ``batch`` counts for in the epoch means."""
        return batch_weight(batch)

    def _train_step(self, batch) -> dict:
        """Trains on one batch and returns its logs as floats."""
        logs = self.model.train_on_batch(*batch, return_dict=True)
        return {k: float(v) for k, v in logs.items()}

    # -- the loop ------------------------------------------------------------------------
    def fit(self, epochs: int, *, verbose: int = 1, eval_fn: Callable | None = None,
            max_steps: int | None = None) -> TrainResult:
        """Trains until ``epochs`` epochs are done (counting epochs done before a resume).

        Args:
          epochs: total epochs.
          verbose: 1 shows a Keras progress bar per epoch.
          eval_fn: ``fn(epoch) -> dict`` run after each epoch; its numbers join the history.
          max_steps: stop (with a checkpoint) after this many steps in this call; for tests
            and time-boxed runs.

        Returns:
          ``TrainResult``; ``interrupted`` is true when a signal or ``max_steps`` stopped it.
        """
        if self._iterator is None:
            self.restore()
        history, steps_this_call, start = [], 0, time.perf_counter()
        with _SignalFlag() as flag:
            while int(self.epoch.numpy()) < epochs:
                epoch = int(self.epoch.numpy())
                target = int(self.last_epoch_steps.numpy()) or None
                # The logs are already epoch means: shown as given (stateful), not re-averaged.
                bar = keras.utils.Progbar(target, verbose=verbose, unit_name="step",
                                          stateless_metrics=())
                if verbose:
                    print(f"Epoch {epoch + 1}/{epochs}")
                logs = {}
                if self.on_epoch_start and int(self.step_in_epoch.numpy()) == 0:
                    self.on_epoch_start(epoch)
                # After a resume the epoch's means cover the steps since the resume.
                means = _EpochMeans()
                while True:
                    if flag.raised or (max_steps is not None and steps_this_call >= max_steps):
                        path = self.save()
                        if flag.raised:
                            logging.warning("%s received: saved %s and stopped", flag.raised, path)
                        return TrainResult(epoch, int(self.global_step.numpy()), True, history,
                                           time.perf_counter() - start)
                    try:
                        batch = self._next_batch()
                    except StopIteration:
                        break
                    if self.on_batch:
                        self.on_batch(batch)
                    logs = means.add(self._train_step(batch), self._batch_weight(batch))
                    self.step_in_epoch.assign_add(1)
                    self.global_step.assign_add(1)
                    steps_this_call += 1
                    bar.update(int(self.step_in_epoch.numpy()), list(logs.items()))
                    if self.on_step:
                        self.on_step(int(self.global_step.numpy()), logs)
                    if self.checkpoint_every and int(self.global_step.numpy()) % self.checkpoint_every == 0:
                        self.save()
                steps = int(self.step_in_epoch.numpy())
                if verbose and steps != target:  # Progbar finalizes itself on reaching target
                    bar.update(steps, list(logs.items()), finalize=True)
                record = {"epoch": epoch + 1, **logs}
                if eval_fn:
                    eval_start = time.perf_counter()
                    record.update(eval_fn(epoch + 1))
                    start += time.perf_counter() - eval_start  # train_seconds excludes eval
                history.append(record)
                self.epoch.assign_add(1)
                self.last_epoch_steps.assign(self.step_in_epoch)
                self.step_in_epoch.assign(0)
                self._new_epoch_iterator()
                self.save()
        return TrainResult(int(self.epoch.numpy()), int(self.global_step.numpy()), False, history,
                           time.perf_counter() - start)


class ReplicaTrainer(Trainer):
    """``Trainer`` for several replicas, with the same exactly-once mid-epoch resume.

    A ``tf.distribute`` iterator cannot be checkpointed, so this trainer never makes one. It
    owns ONE ordinary iterator over ``parts_ds``, the dataset ``tfseq.replica_dataset_fn``
    builds (the parts of every split global batch, one after another), takes
    ``num_replicas`` consecutive parts per step and hands part ``i`` to replica ``i``
    (``strategy.experimental_distribute_values_from_function``); ``strategy.run`` then runs
    the model's own ``train_step`` on every replica (the optimizer all-reduces the gradients;
    compile with ``tfseq.GlobalWeightedLoss`` so the update equals the single-device one). The
    iterator, with its shuffle and bucketing/packing buffers, sits in the checkpoint, and a
    checkpoint is written only between steps, so a resumed epoch delivers exactly the parts
    the interrupted one had left.

    Several workers (``MultiWorkerMirroredStrategy``): each worker runs this trainer on its own
    shard; before every step the workers all-reduce whether they still have data, a worker
    whose shard ended feeds copies of its last parts with weight 0 (no effect on the update)
    until every shard has ended, so all workers take the same number of steps per epoch. Each
    worker checkpoints its own iterator: the chief to ``model_dir/ckpt``, worker ``i`` to
    ``model_dir/workers/i/ckpt``.

    Args:
      model: a Keras model built and compiled inside ``strategy.scope()``.
      strategy: ``tfseq.mirrored_strategy(n)``, or a ``MultiWorkerMirroredStrategy``.
      parts_ds: ``(x, y)`` or ``(x, y, sample_weight)`` parts, one per LOCAL replica per step,
        in replica order: ``replica_dataset_fn(...)(trainer_input_context(strategy))``.
      **kwargs: as for ``Trainer`` (``model_dir``, ``checkpoint_every``, ``trackables``,
        ``on_step``; ``on_batch`` receives the tuple of parts of one step).
    """

    def __init__(self, model: keras.Model, strategy: tf.distribute.Strategy,
                 parts_ds: tf.data.Dataset, **kwargs):
        super().__init__(model, parts_ds, **kwargs)
        self.strategy = strategy
        self.num_replicas = strategy.num_replicas_in_sync
        self.num_local = len(strategy.extended.worker_devices)
        self.num_workers = self.num_replicas // self.num_local
        self.task_id = _task_id(strategy)
        self._last_parts = None
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)

        @tf.function(reduce_retracing=True)
        def step(per_replica):
            return strategy.run(model.train_step, args=(per_replica,))

        self._step = step
        self._variables_created = False

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
        per_replica = self.strategy.experimental_distribute_values_from_function(
            lambda context: batch[context.replica_id_in_sync_group % self.num_local])
        if not self._variables_created:
            # The first step runs eagerly: Keras creates its metric variables there, which a
            # tf.function with relaxed shapes cannot do.
            logs = self.strategy.run(self.model.train_step, args=(per_replica,))
            self._variables_created = True
        else:
            logs = self._step(per_replica)
        # Keras metrics are synchronised variables: every replica reports the same value.
        return {k: float(self.strategy.experimental_local_results(v)[0])
                for k, v in logs.items()}


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
