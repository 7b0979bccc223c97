"""Shared test helpers: quiet TensorFlow and turn datasets into Python lists."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI replays the same draws on every run (derandomize), so a submission never fails on a draw
# that the developer's run did not make; local runs keep exploring new draws. A failing draw
# found anywhere goes into its test as an @example. The profile is loaded here, before any test
# module is imported, so every @settings(...) in the tests inherits it.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def to_python(value):
    """Converts tensors (dense or ragged), numpy values and containers into plain Python."""
    if isinstance(value, tf.RaggedTensor):
        return to_python(value.to_list())
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return to_python(value.numpy())
    if isinstance(value, np.ndarray):
        return to_python(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_python(v) for v in value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    return value


def to_list(dataset):
    """Every element of ``dataset`` as plain Python (lists, dicts, ints, floats, str)."""
    return [to_python(element) for element in dataset]


@pytest.fixture
def as_list():
    return to_list


# --- tiny trained models and their exports (tests/test_serving.py, tests/test_predict.py)
SERVING_BOOKS = ["Gen", "Ps", "Isa", "Matt", "Rom", "Rev", "Josh"]


def write_tiny_corpus(path, lines=280):
    """A verse-format TSV where each book has its own words: learnable in a few steps."""
    rows = []
    for i in range(lines):
        book = SERVING_BOOKS[i % len(SERVING_BOOKS)]
        words = " ".join(f"{book.lower()}{j % 5}" for j in range(i % 9 + 2))
        rows.append(f"{book}\t{i // 30 + 1}\t{i % 30 + 1}\t{words}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def write_source(path, first_id, lines, seed=0, labels=("east", "north", "south", "west")):
    """``label<TAB>t<id> words``, ``labels`` in turn: ids ``first_id ..`` (unique across the
    sources of a mixture, so each example is known by its first word)."""
    import random

    rng = random.Random(seed + first_id)
    rows = []
    for i in range(lines):
        label = labels[i % len(labels)]
        words = " ".join(f"{label}{rng.randrange(6)}" for _ in range(i % 9 + 1))
        rows.append(f"{label}\tt{first_id + i} {words}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def train_tiny(task_name, model_dir, steps=3, **config):
    """Trains ``task_name`` for a few steps on the tiny corpus; returns ``(task, config, model,
    state)``."""
    from tfseq.pipelines import tasks

    task = tasks.load(task_name)
    config = task.Config(**config)
    data = task.datasets(config)
    model = task.build_model(config, data.state)
    for batch in data.train.take(steps):
        model.train_on_batch(*batch)
    return task, config, model, data.state


@pytest.fixture(scope="session")
def tiny_exports(tmp_path_factory):
    """Classify and lm models trained a few steps on the tiny corpus and exported:
    ``{task: (model_dir, config, model, state)}``."""
    from tfseq.pipelines.exporting import export_run

    base = tmp_path_factory.mktemp("serving")
    corpus = write_tiny_corpus(base / "tiny.tsv")
    runs = {}
    for name, extra in (("classify", {"max_length": 12}), ("lm", {"max_lines": 0,
                                                                   "max_length": 10})):
        task, config, model, state = train_tiny(name, None, files=(corpus,), min_count=1,
                                                **extra)
        model_dir = str(base / name)
        export_run(model_dir, task, config, state, model)
        runs[name] = (model_dir, config, model, state)
    runs["corpus"] = corpus
    return runs
