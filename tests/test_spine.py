"""The task spine: config -> batching seam, the learned state's files, the run's settings and
what a resume compares."""

import dataclasses

import pytest

import tfseq
from tfseq.batching import Batching
from tfseq.errors import InputError
from tfseq.pipelines import classify, documents, lm, runs, tag, tasks, translate
from tfseq.pipelines.state import TaskState


def test_the_registry_gives_the_task_objects():
    assert tasks.TASKS == ["classify", "ctr", "documents", "keras_hub_classify", "lm",
                           "lm_tbptt", "tag", "translate"]
    assert tasks.load("classify") is classify.TASK and tasks.load("tag") is tag.TASK
    assert tasks.load("documents") is documents.TASK
    assert tasks.load("documents").Config.__module__ == "tfseq.pipelines.documents"
    with pytest.raises(ValueError, match="Unknown task 'nope'; available: "):
        tasks.load("nope")


def test_each_task_asks_the_seam_for_its_batching():
    assert classify.TASK.batching(classify.Config(batching="bucket", boundaries=(8, 16, 200))) \
        == Batching("bucket", max_tokens=2048, max_length=128, block_length=(32, 64, 128),
                    max_segments=32, boundaries=(8, 16))
    # lm: one row length shorter than a line: lines are split across rows, targets aligned.
    assert lm.TASK.batching(lm.Config(batching="pack", block_length=32)) == Batching(
        "pack", batch_size=32, max_tokens=1024, max_length=49, block_length=32,
        max_segments=32, long_examples="split", aligned=(("targets", "ids"),))
    assert translate.TASK.batching(translate.Config(batching="pad")).batch_size == 32
    assert tag.TASK.batching(tag.Config(batching="pack")).aligned == (("tags", "ids"),)


@pytest.mark.parametrize("change, message", [
    ({"batching": "pack", "block_length": (16, 32)},
     "block_length=(16, 32): the longest row is shorter than an example may be (128 tokens)"),
    ({"batching": "bucket", "max_tokens": 64},
     "max_tokens=64 cannot hold one example of 128 tokens"),
    ({"batching": "sorted"}, "Unknown batching 'sorted'"),
    ({"long_examples": "cut"}, "long_examples must be one of ('truncate', 'drop')"),
    ({"boundaries": (16, 8)}, "boundaries must be ascending positive ints; received [16, 8]"),
])
def test_a_config_no_run_can_use_is_named(change, message):
    config = dataclasses.replace(classify.Config(), **change)
    with pytest.raises(InputError) as error:
        config.check()
        classify.TASK.batching(config)
    assert message in str(error.value)


def test_the_learned_state_round_trips_through_the_run_directory(tmp_path):
    vocab = tfseq.Vocab(list(tfseq.text.RESERVED) + ["a", "b"])
    state = TaskState({"source": vocab, "target": vocab}, {"tags": ("B-X", "O")})
    assert sorted(state.save(str(tmp_path))) == ["source_vocab.txt", "tags.txt",
                                                 "target_vocab.txt"]
    assert (tmp_path / "tags.txt").read_text() == "B-X\nO\n"
    loaded = TaskState.load(str(tmp_path), ["source", "target"], ["tags"])
    assert loaded.labels == {"tags": ("B-X", "O")}
    assert loaded.vocabs["target"].tokens == ["<pad>", "<unk>", "<s>", "</s>", "a", "b"]
    with pytest.raises(FileNotFoundError, match="No vocab.txt"):
        TaskState.load(str(tmp_path), ["vocab"], [])


def test_a_resume_compares_the_global_budget_and_names_every_change(tmp_path):
    corpus = tmp_path / "c.tsv"
    corpus.write_text("a\tx y\nb\tz\n")
    task = classify.TASK
    config = classify.Config(train_files=(str(corpus),), max_tokens=2048)
    model_config = task.model_config()
    saved = runs.settings(task, config, model_config=model_config, replicas=2, workers=1)
    assert saved["global_budget"] == {"max_tokens": 4096}
    assert saved["input"][0]["bytes"] == 10
    # 4 replicas x 1024 cells: the same global budget, the same run.
    same = runs.settings(task, dataclasses.replace(config, max_tokens=1024),
                         model_config=model_config, replicas=4, workers=1)
    assert runs.compare(saved, same) == []
    changed = runs.settings(task, dataclasses.replace(config, seed=1, max_length=64),
                            model_config=task.model_config(hidden_dim=8), replicas=1,
                            workers=1)
    corpus.write_text("a\tx y\nb\tw\n")  # same size, other content
    changed["input"] = runs.settings(task, config, model_config=model_config, replicas=1,
                                     workers=1)["input"]
    assert runs.compare(saved, changed) == [
        runs.Change("config.max_length", 128, 64), runs.Change("config.seed", 0, 1),
        runs.Change("global_budget.max_tokens", 4096, 2048),
        runs.Change("model.hidden_dim", 64, 8),
        runs.Change("input", str(corpus), "content changed, same size")]
    # A run saved before a config field existed resumes when the field is at its default,
    # and is a change when it is not.
    older = {**saved, "config": {k: v for k, v in saved["config"].items()
                                 if k not in ("train_weights", "mix_temperature")}}
    defaults = runs._jsonable(dataclasses.asdict(classify.Config()))
    assert runs.compare(older, same, defaults) == []
    weighted = runs.settings(
        task, dataclasses.replace(config, max_tokens=1024, mix_temperature=2.0),
        model_config=model_config, replicas=4, workers=1)
    weighted["input"] = same["input"]  # the file was rewritten above
    assert runs.compare(older, weighted, defaults) == [
        runs.Change("config.mix_temperature", None, 2.0)]


def _classify_files(tmp_path, train_lines, eval_lines=None, **changes):
    train = tmp_path / "train.tsv"
    train.write_text("".join(line + "\n" for line in train_lines))
    fields = {"train_files": (str(train),), "columns": ("label", "text")}
    if eval_lines is not None:
        held = tmp_path / "eval.tsv"
        held.write_text("".join(line + "\n" for line in eval_lines))
        fields["eval_files"] = (str(held),)
    return classify.Config(**{**fields, **changes})


def test_swapped_columns_are_refused_naming_the_column(tmp_path):
    lines = [f"{'pos' if i % 2 else 'neg'}\tsentence number {i} here" for i in range(300)]
    config = _classify_files(tmp_path, lines, columns=("text", "label"))
    with pytest.raises(InputError) as error:
        classify.TASK.prepare(config)
    assert str(error.value).startswith(
        "the label column has 264 distinct values in 300 training records (e.g. 'sentence "
        "number 0 here', 'sentence number 10 here', 'sentence number 100 here'): that is a "
        "text column; check --columns (now text,label)")  # 264: the rest are held out


def test_a_header_read_as_a_record_is_refused(tmp_path):
    lines = ["label\ttext"] + [f"{'pos' if i % 2 else 'neg'}\tw{i % 3} x" for i in range(20)]
    with pytest.raises(InputError, match="a label value is 'label', the column's name: the "
                                         "first line of a file is a header; add --header"):
        classify.TASK.prepare(_classify_files(tmp_path, lines))
    state, _ = classify.TASK.prepare(_classify_files(tmp_path, lines, header=True))
    assert state.labels == {"label": ("neg", "pos")}


def test_eval_labels_that_never_occur_in_training_are_named(tmp_path):
    train = [f"{'tech' if i % 2 else 'sport'}\tw{i} x" for i in range(20)]
    config = _classify_files(tmp_path, train, ["TECH\tw1 x", "SPORT\tw2 x"])
    with pytest.raises(InputError) as error:
        classify.TASK.prepare(config)
    assert str(error.value) == (
        "100% of the eval label values never occur in the training files (eval: 'SPORT', "
        "'TECH'; training: 'sport', 'tech'): those eval records would be dropped; fix the "
        "labels (they are case-sensitive)")
    notes = []
    config = _classify_files(tmp_path, train, ["tech\tw1 x", "TECH\tw2 x"])
    state, _ = classify.TASK.prepare(config, write=notes.append)
    assert state.labels == {"label": ("sport", "tech")}
    assert ("note: 1 label value(s) of the eval files never occur in the training files "
            "('TECH'): those eval records (50%) are dropped (unknown_label)") in notes


def test_a_refused_budget_writes_nothing_into_the_model_dir(tmp_path):
    config = _classify_files(tmp_path, ["a\tx y", "b\tz"], batching="bucket", max_tokens=64)
    model_dir = tmp_path / "run"
    with pytest.raises(InputError, match="max_tokens=64 cannot hold one example of 128"):
        runs.open_run(str(model_dir), classify.TASK, config,
                      model_config=classify.TASK.model_config())
    assert not model_dir.exists()
    # A failed start (an unreadable file) removes the directory it created.
    config = dataclasses.replace(config, max_tokens=2048, columns=("label", "text", "extra"))
    with pytest.raises(InputError):
        runs.open_run(str(model_dir), classify.TASK, config,
                      model_config=classify.TASK.model_config())
    assert not model_dir.exists()
