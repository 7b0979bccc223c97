"""A training run's directory: what it learned, what it was started with, checks on a resume.

``open_run(model_dir, task, config, ...)`` is the first thing a training run does:

* a new run (no ``run.json``): reads the training records once (``TaskState``: vocabularies and
  label sets, and the line-shuffle shards when the input needs more than one), writes the
  vocabularies and label sets into ``model_dir`` (``vocab.txt`` / ``.model``, ``labels.txt``,
  ``tags.txt``), the shards into ``model_dir/data/``, and ``run.json``: the settings that
  define the run (task, config, model size, the global token budget, workers, and a
  fingerprint of every input file);
* a resumed run (``run.json`` exists): compares its settings with the saved ones and raises
  ``ChangedRun`` naming every difference, or loads the saved vocabularies and labels (never
  learned again; the export uses the same files).

The global budget is what a resume keeps: ``replicas x max_tokens`` (``replicas x
batch_size`` for ``pad``), so a run checkpointed on N replicas resumes on M at the same global
budget (2 x 2048 as 4 x 1024) and continues the same sequence of global batches.

Layout of ``model_dir`` (besides the binary's own ``flags.txt``, ``report.json``, ``logs/``)::

    run.json          the settings (``settings``)
    vocab.txt|.model  (translate: source_vocab.*, target_vocab.*), labels.txt, tags.txt
    data/shuffle/     the training stream's shards (inputs over one shard's size)
    ckpt/             checkpoints: model, optimizer, the stream's position, the counters
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time

from tfseq.batching import mode_of
from tfseq.pipelines import sources
from tfseq.pipelines.records import NO_RECORDS, Records
from tfseq.pipelines.state import PassReport, TaskState
from tfseq.shuffling import RecordShards

RUN_FILE = "run.json"


@dataclasses.dataclass(frozen=True)
class Change:
    """One setting that differs between a run's ``run.json`` and the resumed command."""

    setting: str
    saved: object
    new: object


class ChangedRun(Exception):
    """A resume whose settings differ from the run's; ``changes`` lists each."""

    def __init__(self, model_dir: str, changes: list[Change]):
        self.model_dir = model_dir
        self.changes = changes
        super().__init__(f"{model_dir}: changed settings " + ", ".join(
            f"{c.setting} (saved {c.saved!r}, new {c.new!r})" for c in changes))


@dataclasses.dataclass
class Run:
    """An opened run: its learned state, its training shards and records (``records``:
    ``pipelines.records``) and how it was set up."""

    state: TaskState
    shards: RecordShards | None
    setup: PassReport
    settings: dict
    resumed: bool
    records: Records = NO_RECORDS


def settings(task, config, *, model_config, replicas: int, workers: int) -> dict:
    """What defines a run: compared on every resume (``compare``)."""
    fields = dataclasses.asdict(config)
    name = mode_of(config.batching).budget  # what a resume keeps per replica
    budgets = {name: fields.pop(name) * replicas}
    return {"task": task.name, "config": _jsonable(fields), "global_budget": budgets,
            "model": _jsonable(dataclasses.asdict(model_config)), "workers": workers,
            "input": sources.fingerprint(task.records(config).input_files)}


def compare(saved: dict, new: dict, defaults: dict | None = None) -> list[Change]:
    """The settings that differ (``config.<field>``, ``global_budget.<name>``, ``model.<field>``,
    ``workers``, ``input``: the files whose size or content changed). ``defaults``: the
    config's default values (as saved): a field a run saved before it existed is its default."""
    changes = []
    if saved["task"] != new["task"]:
        changes.append(Change("task", saved["task"], new["task"]))
    for group in ("config", "global_budget", "model"):
        for key in sorted(set(saved[group]) | set(new[group])):
            if (group == "config" and defaults and key not in saved[group]
                    and key in defaults and new[group].get(key) == defaults[key]):
                continue  # a field added since the run started, left at its default
            if saved[group].get(key) != new[group].get(key):
                changes.append(Change(f"{group}.{key}", saved[group].get(key),
                                      new[group].get(key)))
    if saved["workers"] != new["workers"]:
        changes.append(Change("workers", saved["workers"], new["workers"]))
    before = {f["path"]: f for f in saved["input"]}
    after = {f["path"]: f for f in new["input"]}
    for path in sorted(set(before) | set(after)):
        old, now = before.get(path), after.get(path)
        if old == now:
            continue
        if old and now:
            what = (f"size {old['bytes']:,} -> {now['bytes']:,} bytes"
                    if old["bytes"] != now["bytes"] else "content changed, same size")
        else:
            what = "new file" if now else "no longer read"
        changes.append(Change("input", path, what))
    return changes


def open_run(model_dir: str, task, config, *, model_config, replicas: int = 1,
             workers: int = 1, worker: int = 0, write=None, wait_seconds: float = 600) -> Run:
    """Opens (or starts) the run in ``model_dir``; see the module docstring.

    Args:
      model_dir: the run's directory.
      task, config: the ``TextTask`` and its config.
      model_config: the model's ``ModelConfig`` (its sizes are part of the run).
      replicas: replicas per worker (the global budget is ``replicas x`` the config's).
      workers, worker: several workers each read their own share of the files; worker 0
        learns and writes the state, the others wait for its ``run.json`` (up to
        ``wait_seconds``).
      write: where progress lines go.

    Raises:
      ChangedRun: a resume whose settings differ from the run's.
      InputError: bad input (see ``TextTask.prepare``).
    """
    # Settings no run can use are refused before anything is written: a corrected command in
    # the same model_dir is then a new run, not a changed one.
    config.check()
    task.batching(config)
    new = settings(task, config, model_config=model_config, replicas=replicas, workers=workers)
    path = os.path.join(model_dir, RUN_FILE)
    if worker == 0 and not os.path.exists(path):
        created = not os.path.exists(model_dir)
        try:
            return _new_run(model_dir, task, config, new, workers=workers, worker=worker,
                            write=write)
        except BaseException:
            if created:  # a failed start leaves no directory behind
                shutil.rmtree(model_dir, ignore_errors=True)
            raise
    os.makedirs(model_dir, exist_ok=True)
    shard_dir = os.path.join(model_dir, "data", "shuffle" if workers == 1
                             else f"shuffle-worker-{worker}")
    shards = task.record_shards(config, num_workers=workers, worker=worker, directory=shard_dir)
    if worker > 0:
        _wait_for(path, wait_seconds)
    with open(path) as f:
        saved = json.load(f)
    changes = compare(saved, new, _jsonable(dataclasses.asdict(type(config)())))
    if changes:
        raise ChangedRun(model_dir, changes)
    state = task.saved_state(model_dir, config)
    setup = task.records(config).spill(shards, new["input"], write=write)
    return Run(state, shards, setup, new, resumed=True, records=task.records(config))


def _new_run(model_dir: str, task, config, new: dict, *, workers: int, worker: int,
             write) -> Run:
    """Starts the run: reads the training records once, writes the state and ``run.json``."""
    os.makedirs(model_dir, exist_ok=True)
    shard_dir = os.path.join(model_dir, "data", "shuffle" if workers == 1
                             else f"shuffle-worker-{worker}")
    shards = task.record_shards(config, num_workers=workers, worker=worker, directory=shard_dir)
    spill_here = workers == 1
    state, setup = task.prepare(config, shards=shards if spill_here else None,
                                fingerprint=new["input"], write=write)
    if not spill_here:
        # Each worker spills its own share of the files: one more read of that share.
        setup.passes += task.records(config).spill(shards, new["input"], write=write).passes
    state.save(model_dir)
    _write_json(os.path.join(model_dir, RUN_FILE), new)
    return Run(state, shards, setup, new, resumed=False, records=task.records(config))


def open_replayed_run(model_dir: str, task, config, *, model_config, workers: int = 1) -> Run:
    """Opens (or starts) the run of a ``replayed.ReplayedTask`` (documents, ctr, lm_tbptt) in
    ``model_dir``: checks or records its settings in ``run.json`` and learns what it learns
    before the first step (``task.prepare``: learned again on a resume, from the same files).

    Their position is replayed from the epoch and step (``tfseq.replay``): a resume with
    another batch size, seed or input would skip other examples, so it stops naming each
    change. The replica count may change (the steps are global batches).

    Raises:
      ChangedRun: a resume whose settings differ from the run's.
    """
    task.check(config)
    new = {"task": task.name, "config": _jsonable(dataclasses.asdict(config)),
           "global_budget": {}, "model": _jsonable(dataclasses.asdict(model_config)),
           "workers": workers, "input": sources.fingerprint(task.input_files(config))}
    path = os.path.join(model_dir, RUN_FILE)
    resumed = os.path.exists(path)
    if resumed:
        with open(path) as f:
            saved = json.load(f)
        changes = compare(saved, new, _jsonable(dataclasses.asdict(type(config)())))
        if changes:
            raise ChangedRun(model_dir, changes)
    state, setup = task.prepare(config)
    if not resumed:
        os.makedirs(model_dir, exist_ok=True)
        _write_json(path, new)
    return Run(state, None, setup, new, resumed=resumed, records=NO_RECORDS)


def _wait_for(path: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"No {path} after {seconds:.0f} s: worker 0 writes it once it "
                               "has read the training files")
        time.sleep(0.5)


def _write_json(path: str, value) -> None:
    """Writes ``value`` as JSON atomically (a reader never sees a half-written file)."""
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))
