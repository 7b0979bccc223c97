"""One definition per concept: each test fails when a second definition of a concept appears
outside its home (read from the source, with ``ast``), or when the task layer's imports form
a cycle or hide in functions.

============================  ===========================================================
batching modes                ``tfseq/batching.py`` (``MODES``): no mode name compared
                              anywhere else
one source or a mixture       ``pipelines/records.py``: ``is_mixture`` asked there only,
                              no ``isinstance`` of a mixture type elsewhere
the commands' flags           ``scripts/flag_table.py``: the shared flags defined there only
the evaluation, report and    ``pipelines/runner.py``: one ``make_report`` and one export
export of a run               per run, whatever the strategy
the task contract             every task answers the same methods with the same arguments
============================  ===========================================================
"""

import ast
import inspect
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRODUCT = ("tfseq", "pipelines", "models", "scripts")
# Function-level imports allowed in pipelines/: optional dependencies only.
OPTIONAL = {"pyarrow", "keras_hub"}


def sources(folders=PRODUCT):
    """``(relative path, ast)`` of every product module."""
    out = []
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for filename in sorted(filenames):
                if filename.endswith(".py"):
                    path = os.path.join(dirpath, filename)
                    with open(path, encoding="utf-8") as f:
                        out.append((os.path.relpath(path, ROOT), ast.parse(f.read())))
    return out


def test_batching_modes_are_compared_only_in_the_batching_module():
    from tfseq.batching import MODES

    found = []
    for path, tree in sources():
        if path == os.path.join("tfseq", "batching.py"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                names = [c for c in [node.left, *node.comparators]
                         if isinstance(c, ast.Constant) and c.value in MODES]
                names += [e for c in node.comparators if isinstance(c, (ast.Tuple, ast.List,
                                                                          ast.Set))
                          for e in c.elts if isinstance(e, ast.Constant) and e.value in MODES]
                if names:
                    found.append(f"{path}:{node.lineno}")
    assert found == []


def test_only_the_records_module_tells_one_source_from_a_mixture():
    asked, checked = [], []
    for path, tree in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                    node.func, "id", "")
                if name == "is_mixture":
                    asked.append(path)
                if name == "isinstance" and "Mixed" in ast.unparse(node.args[1]):
                    checked.append(f"{path}:{node.lineno}")
    assert asked == [os.path.join("pipelines", "records.py")]
    assert checked == []


def test_the_shared_flags_are_defined_once():
    from tfseq.scripts.flag_table import FLAGS_TABLE

    defined = []
    for path, tree in sources(["scripts", "pipelines", "tfseq"]):
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr.startswith("DEFINE_") and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in FLAGS_TABLE):
                defined.append(f"{path}: --{node.args[0].value}")
    assert defined == []  # all through flag_table.define


def test_a_run_is_reported_and_exported_in_one_place():
    calls = {"make_report": [], "export_run": []}
    for path, tree in sources(["pipelines", "scripts"]):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                    node.func, "id", "")
                if name in calls:
                    calls[name].append(path)
    assert calls == {"make_report": [os.path.join("pipelines", "runner.py")],
                     "export_run": [os.path.join("pipelines", "runner.py"),
                                    os.path.join("scripts", "export.py")]}


CONTRACT = ("prepare", "datasets", "open", "training_stream", "eval_dataset", "records",
            "build_model", "model_config", "export_module", "saved_state", "built",
            "baselines", "sample_lines", "drop_examples", "prediction_line", "batching")


def test_every_task_answers_one_contract():
    from tfseq.pipelines import tasks

    signatures = {}
    for name in tasks.TASKS:
        task = tasks.load(name)
        assert task.name == name
        signatures[name] = {method: list(inspect.signature(getattr(task, method)).parameters)
                            for method in CONTRACT}
    first = signatures[tasks.TASKS[0]]
    for name, methods in signatures.items():
        for method in CONTRACT:
            # a task may take more keyword arguments, never other positional ones
            assert methods[method][:len(first[method])] == first[method] or \
                first[method][:len(methods[method])] == methods[method], (name, method)
    for method in ("prepare", "datasets", "training_stream", "eval_dataset"):
        assert len({tuple(m[method][:3]) for m in signatures.values()}) == 1, method


def _pipelines_imports(tree):
    """The ``tfseq.pipelines`` modules a module imports at its top level, and the function-
    level imports it makes."""
    top, nested = set(), []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "tfseq.pipelines"):
            if node.module == "tfseq.pipelines":
                top.update(a.name for a in node.names)
            else:
                top.add(node.module.split(".")[2])
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    names = ([inner.module or ""] if isinstance(inner, ast.ImportFrom)
                             else [a.name for a in inner.names])
                    nested += [n for n in names if n.split(".")[0] not in OPTIONAL]
    return top, nested


def test_the_task_layer_has_no_import_cycle_and_no_hidden_imports():
    graph, hidden = {}, []
    for path, tree in sources(["pipelines"]):
        name = os.path.splitext(os.path.basename(path))[0]
        graph[name], nested = _pipelines_imports(tree)
        hidden += [f"{path}: {n}" for n in nested]
    assert hidden == []
    visiting, done = set(), set()

    def visit(node, trail):
        assert node not in visiting, " -> ".join(trail + [node])
        if node in done:
            return
        visiting.add(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, trail + [node])
        visiting.discard(node)
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
