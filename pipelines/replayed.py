"""Tasks whose training epoch is replayed from its number: documents, ctr, lm_tbptt.

Their examples are not rows of a text file (documents: nested sentences; ctr: MultiSlot
slots; lm_tbptt: truncated-BPTT chunks of one stream), so they do not batch through the
spine's ``ResumableStream``. Each epoch is rebuilt exactly from its number
(``tfseq.replay.ReplayStream``): the training position is the epoch and the step, two
integers, whatever the corpus.

A ``ReplayedTask`` answers the same task contract as ``spine.TextTask``, with the same names,
arguments and return types (``prepare`` -> ``(state, PassReport)``, ``datasets`` ->
``TaskData``, ``training_stream``, ``eval_dataset``, ``open``, ``export_module``,
``saved_state``, ``baselines``, ``sample_lines``, ``prediction_line``): the runner, the export
and predict call those. A task supplies only what is its own:

=====================  ============================================================
``learn(config)``      what training learns before the first step (``info``: the
                       vocabulary, class names, files), in at most one read
``replay``             ``(config, info, counter) -> ReplayStream`` of global batches
``held_out``           ``(config, info, counter) -> Dataset`` in file order
``serving_module``     ``(config, info, model, asset_dir) -> (tf.Module, fields)``
``input_files``        the files a run reads (fingerprinted in ``run.json``)
``prediction_inputs``  ``(info, paths) -> Dataset`` of ``tf.string [n]``, file order
``prediction_line``    one output line of ``tfseq-predict`` (``""``: unusable input)
=====================  ============================================================

Element spec of ``replay`` and ``held_out``: ``(features, labels)`` as the task's model reads
them (see each task's module).
"""

from __future__ import annotations

import time
from typing import ClassVar

import tensorflow as tf

from tfseq.pipelines import runs
from tfseq.pipelines.state import PassReport
from tfseq.pipelines.task_data import TaskData
from tfseq.pipelines.tasks import Task
from tfseq.reading import resolve_files
from tfseq.replay import ReplayStream
from tfseq.stats import BatchStats, DropCounter


class ReplayedTask(Task):
    """A task trained from a ``ReplayStream``; see the module docstring.

    Class attributes:
      name: the ``--task`` name.
      Config: its config dataclass.
      model_module: the module with ``ModelConfig`` and ``build_model(config, info, mc)``.
      prediction_input: the export's input name (``text`` or ``line``).
      modes: the training modes it supports (``single``, ``replicated``).
      unusable: the reason an unusable prediction input is counted under.
      tracked: the sequence features ``TaskData.stats`` counts (none: not counted).
    """

    name: ClassVar[str]
    Config: ClassVar[type]
    model_module: ClassVar[str]
    prediction_input: ClassVar[str] = "text"
    modes: ClassVar[tuple[str, ...]] = ("single", "replicated")
    unusable: ClassVar[str] = "empty"
    predicts_in_order: ClassVar[bool] = True   # tfseq-predict: no bucketing, input order
    tracked: ClassVar[tuple[str, ...]] = ()

    # ----- what a task supplies

    def learn(self, config) -> dict:
        raise NotImplementedError

    def replay(self, config, info: dict, counter: DropCounter) -> ReplayStream:
        raise NotImplementedError

    def held_out(self, config, info: dict, counter: DropCounter) -> tf.data.Dataset:
        raise NotImplementedError

    def serving_module(self, config, info: dict, model, asset_dir: str):
        raise NotImplementedError

    def input_files(self, config) -> list[str]:
        """The files a run reads (all of them, sorted)."""
        patterns = list(getattr(config, "files", ())) + list(getattr(config, "eval_files", ()))
        return sorted(set(resolve_files(patterns))) if patterns else []

    def prediction_inputs(self, info: dict, paths) -> tf.data.Dataset:
        raise NotImplementedError

    def prediction_line(self, row: dict) -> str:
        raise NotImplementedError

    # ----- the task contract (as ``spine.TextTask``)

    def check(self, config) -> None:
        """Raises ``ValueError`` on a config no run can use (before anything is written)."""

    def prepare(self, config, *, shards=None, fingerprint=None,
                write=None) -> tuple[dict, PassReport]:
        """What the run learns before its first step (``learn``), and the passes it made."""
        started = time.perf_counter()
        info = self.learn(config)
        return info, PassReport(passes=int(info.get("passes", 0)),
                                seconds={"prepare": round(time.perf_counter() - started, 3)})

    def open(self, model_dir: str, config, *, model_config, replicas: int = 1,
             workers: int = 1, worker: int = 0, write=None):
        """Opens (or starts) the run in ``model_dir`` (``runs.open_replayed_run``)."""
        return runs.open_replayed_run(model_dir, self, config, model_config=model_config,
                                      workers=workers)

    def training_stream(self, config, state: dict, counter: DropCounter, shards=None, *,
                        replicas: int = 1, parts: bool = False,
                        epoch: tf.Variable | None = None) -> ReplayStream:
        """The training batches, global (``config.batch_size`` rows); with ``parts`` (a
        ``tf.distribute`` run) each batch split into a tuple of ``replicas`` parts."""
        stream = self.replay(config, state, counter)
        return stream.split(replicas) if parts else stream

    def eval_dataset(self, config, state: dict, counter: DropCounter,
                     stats: BatchStats | None = None) -> tf.data.Dataset:
        """Evaluation batches, in file order."""
        ds = self.held_out(config, state, counter)
        if stats is not None and self.tracked:
            ds = ds.apply(stats.track(list(self.tracked)))
        return ds.prefetch(tf.data.AUTOTUNE)

    def datasets(self, config, state: dict | None = None, *, write=None,
                 counters: dict | None = None) -> TaskData:
        """Everything ``model.fit`` needs, on one device: ``TaskData``; its ``train`` draws a
        new epoch key per iteration, its ``stream`` is the ``ReplayStream`` a ``Trainer``
        resumes from two integers."""
        setup = PassReport()
        if state is None:
            state, setup = self.prepare(config, write=write)
        counters = {split: (counters or {}).get(split) or DropCounter(split)
                    for split in ("train", "eval")}
        stats = {"train": BatchStats(), "eval": BatchStats()}
        stream = self.training_stream(config, state, counters["train"])
        train = stream.dataset()
        if self.tracked:
            train = train.apply(stats["train"].track(list(self.tracked)))
        return TaskData(train.prefetch(tf.data.AUTOTUNE),
                        self.eval_dataset(config, state, counters["eval"], stats["eval"]),
                        state, counters, stats, stream, setup,
                        lambda limit=5: self.drop_examples(config, limit))

    def batching(self, config):
        return None  # batches of config.batch_size rows, no shape budget

    def drop_examples(self, config, limit: int = 5) -> list[str]:
        return []

    def export_module(self, config, state: dict, model, asset_dir: str):
        """``(tf.Module, serving.json fields)``: these tasks train on one device or on
        replicas of one model, so the trained model is served as it is."""
        return self.serving_module(config, state, model, asset_dir)

    def saved_state(self, model_dir: str, config) -> dict:
        """What the run learned before its first step, for an export: learned again from the
        same files (the same vocabulary; ``run.json``'s fingerprint says they did not
        change)."""
        return self.learn(config)

    def built(self, model, config, state: dict):
        """``model`` with its weights made (a subclassed model makes them on its first
        call): called on one evaluation batch."""
        if not model.built:
            features = next(iter(self.held_out(config, state, DropCounter("build"))))[0]
            model(features, training=False)
        return model


__all__ = ["ReplayedTask"]
