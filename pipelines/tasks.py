"""Task registry: ``--task`` name -> the task object.

The text tasks (classify, lm, translate, tag) are ``spine.TextTask`` instances: everything a
binary does with them (prepare, train, evaluate, export, predict) goes through that interface.
The other tasks (documents: nested sentences; ctr: MultiSlot slots; lm_tbptt: truncated BPTT
over streams) have pipelines of their own shape, wrapped in ``OwnPipelineTask``: a module with
a ``Config``, ``datasets(config) -> (train_ds, eval_ds, info)`` (``info["train_stream"]``: the
training epochs as a ``tfseq.replay.ReplayStream``, resumed from the epoch and step) and
``serving_module(config, info, model, asset_dir)`` (the export over raw input), and a model
module with ``build_model(config, info, model_config)``. The runner trains them on their own
path (``Runner._train_own``).
"""

from __future__ import annotations

import dataclasses
import importlib

SPINE = {"classify": "classify", "lm": "lm", "translate": "translate", "tag": "tag"}
OWN = {"documents": ("documents", "hierarchical"), "ctr": ("ctr", "ctr"),
       "lm_tbptt": ("lm_tbptt", "stateful_lm")}
TASKS = sorted(SPINE) + sorted(OWN)


@dataclasses.dataclass(frozen=True)
class OwnPipelineTask:
    """A task whose pipeline is not on the spine (see the module docstring)."""

    name: str
    pipeline: object
    model_module: object

    @property
    def Config(self):  # noqa: N802 (the task's config class, as on the spine)
        return self.pipeline.Config

    @property
    def prediction_input(self) -> str:
        """The export's input: ``line`` (ctr: a MultiSlot line) or ``text``."""
        return "line" if self.name == "ctr" else "text"

    def model_config(self, **overrides):
        return dataclasses.replace(self.model_module.ModelConfig(), **overrides)

    def build_model(self, config, info, model_config=None):
        return self.model_module.build_model(config, info,
                                             model_config or self.model_module.ModelConfig())


def load(name: str):
    """The task called ``name``.

    Raises:
      ValueError: an unknown task (the message lists the known ones).
    """
    if name in SPINE:
        return importlib.import_module(f"tfseq.pipelines.{SPINE[name]}").TASK
    if name in OWN:
        pipeline, model = OWN[name]
        return OwnPipelineTask(name, importlib.import_module(f"tfseq.pipelines.{pipeline}"),
                               importlib.import_module(f"tfseq.models.{model}"))
    raise ValueError(f"Unknown task {name!r}; available: {TASKS}")
