"""The installable package: one top-level package (``tfseq``), the commands, and the task
pipelines without repeated code."""

import glob
import io
import os
import re
import subprocess
import sys
import sysconfig
import tokenize
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK_PIPELINES = ["classify", "lm", "translate", "tag", "documents", "ctr", "lm_tbptt"]


@pytest.mark.slow
def test_the_wheel_installs_the_commands_and_only_the_tfseq_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                    str(tmp_path / "dist"), ROOT], check=True, timeout=600)
    [wheel] = glob.glob(str(tmp_path / "dist" / "tfseq-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"tfseq"}
    for module in ("tfseq/pipelines/classify.py", "tfseq/models/tagger.py",
                   "tfseq/scripts/train.py", "tfseq/data/kjv_en.tsv.gz"):
        assert module in names
    # The product only: the five commands and their flag table in tfseq/scripts, no
    # benchmark or developer tool.
    assert sorted(n for n in names if n.startswith("tfseq/scripts/")) == [
        f"tfseq/scripts/{m}.py" for m in ("__init__", "data_service", "export", "flag_table",
                                          "predict", "profile", "train")]
    assert [n for n in names if os.path.basename(n).startswith(("bench_", "diag_"))
            or {"benchmarks", "tools"} & set(n.split("/")[:-1])] == []
    assert "tfseq/experimental.py" in names and "tfseq/lanes.py" not in names
    [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
    metadata = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License: Apache-2.0" in metadata and "Version: 0.1.0" in metadata
    assert "Variable-length sequences into TensorFlow models" in metadata  # the README
    assert sorted(re.sub(r"[<>=;, ].*", "", line.split(": ", 1)[1])
                  for line in metadata.splitlines() if line.startswith("Requires-Dist: ")
                  and "extra ==" not in line) == [
        "absl-py", "numpy", "sentencepiece", "tensorflow", "tensorflow-text", "tokenizers"]

    # Outside the checkout and without its PYTHONPATH: there pip would see the checkout's
    # tfseq.egg-info and call tfseq "already satisfied", installing no commands.
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300,
                   cwd=empty, env=env)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", wheel],
                   check=True, timeout=600, cwd=empty, env=env)
    assert (venv / "bin" / "tfseq-train").exists()
    # The dependencies (Requires-Dist above) come from this environment's site-packages,
    # added after the new venv's own (a path in a .pth file: its .pth files, the checkout's
    # editable tfseq among them, stay unread). Installing them again would unpack
    # TensorFlow for ~90 s of CI time to test pip.
    [site] = glob.glob(str(venv / "lib" / "python*" / "site-packages"))
    with open(os.path.join(site, "dependencies.pth"), "w") as f:
        f.write("\n".join(sorted({sysconfig.get_paths()["purelib"],
                                  sysconfig.get_paths()["platlib"]})) + "\n")

    def command(name, *args):
        return subprocess.run([str(venv / "bin" / name), *args], cwd=empty, env=env,
                              capture_output=True, text=True, timeout=900)

    out = command("tfseq-train", "--task=classify", "--epochs=1", "--max_steps=30",
                  f"--model_dir={empty / 'run'}", "--verbose=0")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "interrupted: run the same command again to resume" in out.stdout
    # --max_steps exported the model at that step: predict needs no tfseq-export.
    (empty / "in.txt").write_text("In the beginning God created the heaven\n\nAmen\n")
    out = command("tfseq-predict", f"--model_dir={empty / 'run'}", f"--files={empty / 'in.txt'}",
                  f"--output={empty / 'out.txt'}", "--verbose=0")
    assert out.returncode == 0, out.stderr[-3000:]
    out = command("tfseq-export", f"--model_dir={empty / 'run'}")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = (empty / "out.txt").read_text().split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    assert lines[0].split("\t")[0] in ("Law", "History", "Wisdom", "Prophets",
                                       "Gospels and Acts", "Epistles", "Revelation")
    for name, flag in (("tfseq-profile", "--model_step_ms"), ("tfseq-data-service", "--role"),
                       ("tfseq-train", "--max_tokens"), ("tfseq-predict", "--output")):
        out = command(name, "--helpshort")
        assert out.returncode == 0 and flag in out.stdout, (name, out.stdout[-2000:],
                                                            out.stderr[-2000:])
        assert f"  {name} " in out.stdout and "python scripts/" not in out.stdout
    out = command("tfseq-export", "--model_dir=nowhere")
    assert (out.returncode, out.stderr.strip().splitlines()[-1]) == (
        2, "tfseq-export: error: No nowhere/run.json: export needs a directory written by "
           "tfseq-train"), out.stderr[-2000:]
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import tfseq; print(tfseq.__version__, tfseq.__file__)"],
                         cwd=empty, env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["0.1.0", os.path.join(site, "tfseq", "__init__.py")], \
        out.stderr[-2000:]
    for package in ("models", "pipelines", "scripts"):
        out = subprocess.run([str(venv / "bin" / "python"), "-c", f"import {package}"],
                             cwd=empty, env=env, capture_output=True, text=True)
        assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr, package


def code_lines(path):
    """The lines of code of ``path``, each reduced to its shape: whitespace dropped, strings
    and numbers replaced by placeholders; docstrings, comments and imports left out."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    lines: dict[int, list[str]] = {}
    previous = None
    for token in tokens:
        kind, text = token.type, token.string
        if kind in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                    tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER):
            previous = kind if kind in (tokenize.NEWLINE, tokenize.INDENT,
                                        tokenize.DEDENT) else previous
            continue
        if kind == tokenize.STRING and previous in (None, tokenize.NEWLINE, tokenize.INDENT,
                                                    tokenize.DEDENT):
            continue  # a docstring (a string statement)
        previous = kind
        shape = {tokenize.STRING: "S", tokenize.NUMBER: "N"}.get(kind, text)
        lines.setdefault(token.start[0], []).append(shape)
    out = []
    for number in sorted(lines):
        line = " ".join(lines[number])
        if not re.match(r"(from|import) ", line):
            out.append(line)
    return out


def test_no_two_task_pipelines_share_a_block_of_six_lines():
    windows = {}
    for name in TASK_PIPELINES:
        lines = code_lines(os.path.join(ROOT, "pipelines", f"{name}.py"))
        for i in range(len(lines) - 5):
            windows.setdefault(tuple(lines[i:i + 6]), set()).add(name)
    shared = {block: files for block, files in windows.items() if len(files) > 1}
    assert not shared, "\n\n".join(f"{sorted(files)}:\n" + "\n".join(block)
                                   for block, files in shared.items())
