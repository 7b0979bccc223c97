"""A new user's first hour: the commands on hand-made JSONL, TSV and CoNLL files, as a user
runs them (the installed console scripts, in their own processes, in a user's environment).

Each refusal is one line ``tfseq-<command>: error: ...`` and exit status 2; a signal before
training is one line saying what was kept and 130/143; nothing of TensorFlow's own logging
reaches stderr; the reports' counts add up (lines read = examples + drops by reason). The
trained runs are made once for the module and shared by its tests.
"""

import json
import os
import random

import pytest

import cli

TOPICS = {"pos": "good great fine nice", "neg": "bad awful poor sad"}
TAGS = {"the": "DET", "a": "DET", "cat": "NOUN", "dog": "NOUN", "runs": "VERB", "sits": "VERB"}


def write_data(folder):
    """Hand-made files: JSON Lines with nested extras and escapes, a 2-column TSV, and CoNLL."""
    rng = random.Random(0)
    with open(folder / "texts.jsonl", "w", encoding="utf-8") as f:
        for i in range(160):
            label = "pos" if i % 2 else "neg"
            words = " ".join(rng.choice(TOPICS[label].split()) for _ in range(5))
            f.write(json.dumps({"label": label, "text": f'{words} "q" \\ é',
                                "meta": {"n": i, "tags": ["x", "y"]}}, ensure_ascii=i % 3 == 0)
                    + "\n")
    for name, n in (("a.tsv", 120), ("b.tsv", 60)):
        with open(folder / name, "w", encoding="utf-8") as f:
            for i in range(n):
                label = "pos" if i % 2 else "neg"
                f.write(label + "\t" + " ".join(rng.choice(TOPICS[label].split())
                                                for _ in range(4)) + "\n")
    with open(folder / "more.jsonl", "w", encoding="utf-8") as f:
        for i in range(30):
            f.write(json.dumps({"label": "pos", "text": "good fine"}) + "\n")
    with open(folder / "train.conll", "w", encoding="utf-8") as f:
        for _ in range(60):
            for word in rng.choice([["the", "cat", "runs"], ["a", "dog", "sits"],
                                    ["the", "dog", "runs"]]):
                f.write(f"{word}\t_\t_\t{TAGS[word]}\n")
            f.write("\n")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user")
    write_data(folder)
    return folder


def train(data, model_dir, *flags):
    return cli.run("train", f"--model_dir={model_dir}", "--epochs=1", *flags, cwd=data)


@pytest.fixture(scope="module")
def jsonl_run(data):
    """classify on JSON Lines (keys label, text; nested extras), one epoch."""
    flags = ("--task=classify", "--train_files=texts.jsonl", "--columns=label,text")
    out = train(data, "runs/jsonl", *flags)
    assert out.returncode == 0, out.stderr[-3000:]
    return data / "runs/jsonl", out, flags


@pytest.fixture(scope="module")
def conll_run(data):
    out = train(data, "runs/tag", "--task=tag", "--train_files=train.conll", "--format=conll",
                "--columns=token,_,_,tag")
    assert out.returncode == 0, out.stderr[-3000:]
    return data / "runs/tag", out


@pytest.fixture(scope="module")
def mixture_run(data):
    out = train(data, "runs/mix", "--task=classify", "--train_files=a.tsv@0.7,b.tsv@0.3",
                "--columns=label,text", "--eval_percent=20", "--noexport")
    assert out.returncode == 0, out.stderr[-3000:]
    return data / "runs/mix", out


def report_of(run_dir):
    with open(os.path.join(run_dir, "report.json")) as f:
        return json.load(f)


def assert_counts_add_up(report):
    """Per split: lines read = examples + drops by reason (held-out routing is a reason)."""
    for split, counts in report["counters"].items():
        examples = counts["seen"]["lines_read"] - sum(counts["drops"].values())
        assert examples >= 0, (split, counts)
        if split == "train":
            assert report["examples_trained"] == examples


# ----- what reaches stderr

def test_training_prints_nothing_of_tensorflow(jsonl_run, conll_run, mixture_run):
    for run in (jsonl_run, conll_run, mixture_run):
        assert cli.tf_log_lines(run[1].stderr) == [], run[1].stderr[-3000:]


def test_reports_add_up_in_every_split_and_for_a_mixture(jsonl_run, conll_run, mixture_run):
    for run_dir in (jsonl_run[0], conll_run[0], mixture_run[0]):
        assert_counts_add_up(report_of(run_dir))
    report = report_of(mixture_run[0])
    train_counts = report["counters"]["train"]
    assert train_counts["seen"]["lines_read"] == sum(
        round(row["source_epochs"] * row["records"]) for row in report["sources"])
    assert "(a mixture epoch: a.tsv read" in mixture_run[1].stdout


def test_a_finished_run_run_again_trains_nothing_in_this_command(data, jsonl_run):
    run_dir, first, flags = jsonl_run
    assert "examples trained in this command)" in first.stdout
    again = train(data, "runs/jsonl", *flags)
    assert again.returncode == 0, again.stderr[-3000:]
    line = next(line for line in again.stdout.splitlines() if "training:" in line)
    assert line.strip().startswith(f"training: {report_of(run_dir)['steps']:,} steps in the "
                                   "run, 0 in this command")
    assert line.endswith(", 0 examples trained in this command)")
    assert cli.tf_log_lines(again.stderr) == []


# ----- predict

def test_predict_from_stdin_names_stdin_and_warns_about_the_unusable_line(data, jsonl_run):
    lines = ['{"text": "good great"}', '{"text": "bad sad"}', "not json",
             '{"text": "nice fine"}']
    out = cli.run("predict", f"--model_dir={jsonl_run[0]}", "--files=-", "--format=jsonl",
                  "--columns=text", input="\n".join(lines) + "\n", cwd=data)
    assert out.returncode == 0, out.stderr[-3000:]
    assert cli.first_line(out.stderr) == (
        "tfseq-predict: warning: 1 of 4 lines could not be predicted (empty output lines, e.g. "
        "<stdin>:3 (output line 3): malformed)")
    predictions = out.stdout.splitlines()
    assert [p.split("\t")[0] for p in predictions] == ["pos", "neg", "", "pos"]
    assert cli.tf_log_lines(out.stderr) == []


def test_predict_stops_with_status_2_when_no_line_can_be_predicted(data, jsonl_run):
    out = cli.run("predict", f"--model_dir={jsonl_run[0]}", "--files=more.jsonl",
                  "--format=tsv", "--output=nothing.tsv", cwd=data)
    assert cli.error_line(out) == (
        "tfseq-predict: error: no line of more.jsonl could be predicted: 30 malformed (e.g. "
        "more.jsonl:1 (output line 1): malformed); check --format, --columns and --header")
    assert not (data / "nothing.tsv").exists()


def test_a_tag_model_predicts_a_conll_file_into_a_new_folder(data, conll_run):
    out = cli.run("predict", f"--model_dir={conll_run[0]}", "--files=train.conll",
                  "--output=out/tags.txt", cwd=data)
    assert out.returncode == 0, out.stderr[-3000:]
    tags = (data / "out" / "tags.txt").read_text().splitlines()
    assert len(tags) == 60  # one line per sentence
    assert tags[0] in ("DET NOUN VERB",)
    assert cli.tf_log_lines(out.stderr) == []


def test_export_prints_nothing_of_tensorflow(data, jsonl_run):
    out = cli.run("export", f"--model_dir={jsonl_run[0]}", "--export_dir=export2", cwd=data)
    assert out.returncode == 0, out.stderr[-3000:]
    assert cli.tf_log_lines(out.stderr) == []
    assert (data / "export2" / "saved_model.pb").exists()


# ----- profile

def test_profile_refuses_files_it_cannot_read_in_one_line(data):
    out = cli.run("profile", "--files=a.tsv", cwd=data)
    assert cli.error_line(out) == (
        "tfseq-profile: error: --field=3 (the embedded corpus' text field), but a.tsv:1 has 2 "
        "tab-separated field(s): give --field=1 (0-based) or --field=-1 (the whole line), or "
        "read it as your training files: --train_files=a.tsv --columns=...")
    out = cli.run("profile", "--files=texts.jsonl", "--format=jsonl", "--columns=label,text",
                  cwd=data)
    assert cli.error_line(out) == ("tfseq-profile: error: --format applies to --train_files, "
                                   "which is not given; e.g. --train_files=texts.jsonl")


def test_profile_reads_what_training_reads_with_aligned_rows(data):
    out = cli.run("profile", "--task=tag", "--train_files=train.conll", "--format=conll",
                  "--columns=token,_,_,tag", "--repeats=1", cwd=data)
    assert out.returncode == 0, out.stderr[-3000:]
    assert cli.tf_log_lines(out.stderr) == []
    # While it runs: a line a phase on stderr (the table comes at the end).
    assert out.stderr.splitlines() == [
        "reading the files as the task's training does (labels, vocabulary) ...",
        "timing the stage 'read records' ...", "timing the stage 'encode (tag)' ...",
        "timing the stage 'train stream (bucket)' ..."]
    lines = out.stdout.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("after stage")))
    table = [line.split("  <-")[0] for line in lines[start:start + 4]]
    assert [line[:len(name)] for line, name in zip(table, (
        "after stage", "read records", "encode (tag)", "train stream (bucket)"))] == [
        "after stage", "read records", "encode (tag)", "train stream (bucket)"]
    assert len({len(line) for line in table}) == 1  # the columns line up
    added = [line.split()[-1] for line in table[1:]]  # "stage adds": +ms, or ~0
    assert all(a == "~0" or (a.startswith("+") and float(a) >= 0) for a in added), added


def test_profile_of_a_two_column_tsv_by_its_columns(data):
    out = cli.run("profile", "--train_files=a.tsv", "--columns=label,text", "--repeats=1",
                  cwd=data)
    assert out.returncode == 0, out.stderr[-3000:]
    assert cli.tf_log_lines(out.stderr) == []
    assert "batch (bucket)" in out.stdout
    assert out.stderr.splitlines()[:2] == ["building the vocabulary of the text ...",
                                           "timing the stage 'read' ..."]


# ----- signals before training, the data service

# SIGINT (a user's Ctrl-C); SIGTERM's status and line are the same code's: the SIGTERM tests
# of tests/test_keras_hub_binary.py and tests/test_own_tasks.py stop training runs with it.
@pytest.mark.parametrize("sig,status", [("INT", 130)])
def test_a_signal_while_reading_the_files_is_one_line_and_writes_nothing(data, sig, status):
    out = cli.run("train", "--task=classify", "--train_files=texts.jsonl",
                  "--columns=label,text", f"--model_dir=runs/stopped_{sig}",
                  fault=f"setup:0:{sig}", cwd=data)
    assert cli.error_line(out, status) == (
        f"tfseq-train: stopped by SIG{sig}: nothing was written; run the same command again")
    assert not (data / "runs" / f"stopped_{sig}").exists()


def test_the_data_service_refuses_in_the_commands_one_line(data):
    out = cli.run("data-service", "--role=dispatcher", cwd=data)
    assert cli.error_line(out).startswith(
        "tfseq-data-service: error: refusing to start without --trusted_network: ")


def test_importing_tfseq_prints_nothing(data):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import tfseq; print(tfseq.__version__)"],
                         capture_output=True, text=True, env=cli.environment(), cwd=data,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() and out.stderr == "", out.stderr
