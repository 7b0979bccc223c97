"""Task registry: ``--task`` name -> (pipeline module, model module).

A pipeline module has a frozen dataclass ``Config`` and ``datasets(config) -> (train_ds,
eval_ds, info)``; a model module has ``build_model(config, info) -> compiled keras.Model``.
"""

from __future__ import annotations

import importlib

TASKS = {
    "classify": ("pipelines.classify", "models.classifier"),
    "lm": ("pipelines.lm", "models.lm"),
    "translate": ("pipelines.translate", "models.translate"),
    "documents": ("pipelines.documents", "models.hierarchical"),
    "ctr": ("pipelines.ctr", "models.ctr"),
    "lm_tbptt": ("pipelines.lm_tbptt", "models.stateful_lm"),  # --task=lm --tbptt=N
}


def load(task: str):
    """Returns ``(pipeline_module, model_module)`` for ``task``.

    Raises:
      ValueError: an unknown task (the message lists the known ones).
    """
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}; available: {sorted(TASKS)}")
    pipeline, model = TASKS[task]
    return importlib.import_module(pipeline), importlib.import_module(model)
