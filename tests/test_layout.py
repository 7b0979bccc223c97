"""The checkout imports as the wheel does, with no import tricks.

``make`` installs the checkout in editable mode (PEP 660): ``pipelines/``, ``models/`` and
``scripts/`` are ``tfseq.pipelines``, ``tfseq.models`` and ``tfseq.scripts`` through the
``package_dir`` mapping in ``setup.py``, with no ``PYTHONPATH`` and no ``sys.path`` edits.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"tfseq": "tfseq", "tfseq.pipelines": "pipelines", "tfseq.models": "models",
            "tfseq.scripts": "scripts"}


def checkout_modules():
    """Every module of the checkout, by its ``tfseq.*`` name."""
    names = []
    for package, folder in PACKAGES.items():
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
            prefix = package if rel == "." else f"{package}.{rel.replace(os.sep, '.')}"
            for filename in sorted(filenames):
                if filename.endswith(".py"):
                    stem = filename[:-3]
                    names.append(prefix if stem == "__init__" else f"{prefix}.{stem}")
    return names


IMPORT_ALL = r"""
import importlib, sys
from absl import flags
root, names = sys.argv[1], sys.argv[2:]
for name in names:
    before = set(flags.FLAGS)
    module = importlib.import_module(name)
    assert module.__file__.startswith(root + "/"), (name, module.__file__)
    for flag in set(flags.FLAGS) - before:  # each binary defines its own flags
        delattr(flags.FLAGS, flag)
print(len(names), "imported")
"""


def test_every_module_imports_on_a_plain_interpreter(tmp_path):
    names = checkout_modules()
    assert {"tfseq.pipelines.tag", "tfseq.models.tagger", "tfseq.scripts.train",
            "tfseq.layers.masked_softmax"} <= set(names)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, ROOT, *names], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(len(names)), "imported"]


def test_binaries_run_as_modules(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run([sys.executable, "-m", "tfseq.scripts.export", "--helpshort"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "--model_dir" in done.stdout + done.stderr, done.stderr[-3000:]


EDIT = r"sys\.path\.(insert|append)|PYTHONPATH[\"']?\s*[:=]\s*ROOT"


def test_no_sys_path_edits_anywhere():
    edits = []
    for folder in [*PACKAGES.values(), "benchmarks", "tools", "tests"]:
        for dirpath, _, filenames in os.walk(os.path.join(ROOT, folder)):
            for filename in filenames:
                if filename.endswith(".py"):
                    path = os.path.join(dirpath, filename)
                    with open(path, encoding="utf-8") as f:
                        text = f.read()
                    if filename != "test_layout.py" and re.search(EDIT, text):
                        edits.append(os.path.relpath(path, ROOT))
    assert edits == []


def test_the_library_never_imports_the_layers_above_it():
    """``tfseq/`` (the library) imports nothing of ``tfseq.pipelines``, ``tfseq.models`` or
    ``tfseq.scripts``; only the package's ``__getattr__`` forwards ``training_pipeline``."""
    import ast

    upward = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, "tfseq")):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for filename in filenames:
            if not filename.endswith(".py"):
                continue
            path = os.path.join(dirpath, filename)
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                         else [a.name for a in node.names] if isinstance(node, ast.Import)
                         else [])
                for name in names:
                    if name.split(".")[:2] in (["tfseq", "pipelines"], ["tfseq", "models"],
                                               ["tfseq", "scripts"]):
                        upward.append(f"{os.path.relpath(path, ROOT)} {name}")
    assert upward == ["tfseq/__init__.py tfseq.pipelines.fit"]
