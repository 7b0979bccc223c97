"""Test-only fault injection for tfseq's commands (never installed, never in the product).

A test runs a command with this folder on ``PYTHONPATH`` and ``TFSEQ_FAULT=<point>:<n>`` (or
``<point>:<n>:TERM`` / ``:INT``): Python imports this module at start-up, and once the command
imports the module of that point, the point is patched in. There the process kills itself
(SIGKILL), or sends itself that signal, as a crash or a scheduler preempting the job would:

* ``before_save:<step>``, ``after_save:<step>``: around the checkpoint written at that global
  step (``tfseq.training.Trainer.save``);
* ``mid_save:<step>``: a checkpoint index cut short on disk, then the kill;
* ``after_step:<step>``: once that global step is trained, before its progress line and
  checkpoint;
* ``setup:0``: at the first progress line of reading the training records (before the first
  step, nothing trained yet).
"""

import importlib.abc
import importlib.util
import os
import signal
import sys

FAULT = os.environ.get("TFSEQ_FAULT", "")


def _parse(fault: str):
    parts = fault.split(":")
    point, number = parts[0], int(parts[1])
    sig = getattr(signal, "SIG" + parts[2]) if len(parts) > 2 else signal.SIGKILL
    return point, number, sig


def _strike(sig) -> None:
    os.kill(os.getpid(), sig)


def _patch_training(module) -> None:
    point, number, sig = _parse(FAULT)
    trainer = module.Trainer
    save, show = trainer.save, trainer._show

    def faulty_save(self):
        step = int(self.global_step.numpy())
        if step == number and point == "before_save":
            _strike(sig)
        if step == number and point == "mid_save" and self.checkpoint_dir:
            os.makedirs(self.checkpoint_dir, exist_ok=True)
            with open(os.path.join(self.checkpoint_dir, f"ckpt-{step}.index"), "wb") as f:
                f.write(b"\x00" * 7)
            _strike(sig)
        path = save(self)
        if step == number and point == "after_save":
            _strike(sig)
        return path

    def faulty_show(self, *args, **kwargs):
        if point == "after_step" and int(self.global_step.numpy()) == number:
            _strike(sig)
        return show(self, *args, **kwargs)

    trainer.save, trainer._show = faulty_save, faulty_show


def _patch_progress(module) -> None:
    _, _, sig = _parse(FAULT)
    update = module.Progress.update

    def faulty_update(self, *args, **kwargs):
        _strike(sig)
        return update(self, *args, **kwargs)

    module.Progress.update = faulty_update


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches a module once it has been executed."""

    def __init__(self, patches):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        if name not in self.patches:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        exec_module, patch = spec.loader.exec_module, self.patches.pop(name)

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if FAULT:
    _point = FAULT.split(":")[0]
    sys.meta_path.insert(0, _AfterImport(
        {"tfseq.progress": _patch_progress} if _point == "setup"
        else {"tfseq.training": _patch_training}))
