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

import importlib

MODULES = {"classify": "classify", "lm": "lm", "translate": "translate", "tag": "tag",
           "documents": "documents", "ctr": "ctr", "lm_tbptt": "lm_tbptt"}
TASKS = sorted(MODULES)


def load(name: str):
    """The task called ``name``.

    Raises:
      ValueError: an unknown task (the message lists the known ones).
    """
    if name not in MODULES:
        raise ValueError(f"Unknown task {name!r}; available: {TASKS}")
    return importlib.import_module(f"tfseq.pipelines.{MODULES[name]}").TASK
