"""Task registry: ``--task`` name -> the task object (each task module's ``TASK``).

Every task answers one interface, what the runner, the export and predict call (``open``,
``training_stream``, ``eval_dataset``, ``build_model``, ``export_module``, ``saved_state``,
...):

* the text tasks (classify, lm, translate, tag) are ``spine.TextTask`` instances: rows of the
  user's files, batched by the spine's resumable shuffled stream (``tfseq.resumable``);
* documents (nested sentences), ctr (MultiSlot slots) and lm_tbptt (truncated BPTT over
  streams) are ``replayed.ReplayedTask`` instances: each epoch rebuilt from its number
  (``tfseq.replay``).

A new task is one module here with a ``TASK`` (and its model in ``tfseq.models``), and one
line below.
"""

from __future__ import annotations

import dataclasses
import importlib

from tfseq.pipelines.records import NO_RECORDS, Records

MODULES = {"classify": "classify", "lm": "lm", "translate": "translate", "tag": "tag",
           "documents": "documents", "ctr": "ctr", "lm_tbptt": "lm_tbptt",
           "keras_hub_classify": "keras_hub_classify"}
TASKS = sorted(MODULES)


class Task:
    """What every task has the same way: its model (``model_module``: ``ModelConfig`` and
    ``build_model(config, state, model_config)``) and the report's defaults (no baseline, no
    sample lines). ``spine.TextTask`` and ``replayed.ReplayedTask`` build on it."""

    model_module: str
    # Fields of its Config that the task does not read, with why: the flags that set them are
    # refused in one line ("--tokenizer does not apply with --keras_hub: ...").
    refused: dict[str, str] = {}

    def model_config(self, **overrides):
        module = importlib.import_module(self.model_module)
        return dataclasses.replace(module.ModelConfig(), **overrides)

    def build_model(self, config, state, model_config=None):
        module = importlib.import_module(self.model_module)
        return module.build_model(config, state, model_config or module.ModelConfig())

    def baselines(self, eval_ds) -> dict[str, float]:
        """Held-out scores of trivial predictors, for the report (``{}``: none)."""
        return {}

    def sample_lines(self, config, state, model, eval_ds) -> list[str]:
        """Lines shown after training (e.g. a few translations); none by default."""
        return []

    def records(self, config) -> Records:
        """The training records behind the runner's interface (``pipelines.records``); a
        task whose epoch is replayed from its number has none of its own."""
        return NO_RECORDS


def load(name: str):
    """The task called ``name``.

    Raises:
      ValueError: an unknown task (the message lists the known ones).
    """
    if name not in MODULES:
        raise ValueError(f"Unknown task {name!r}; available: {TASKS}")
    return importlib.import_module(f"tfseq.pipelines.{MODULES[name]}").TASK
