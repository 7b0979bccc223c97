"""Training on a mixture of corpora: MixedRecords, the stream's exact resume, and the binary's
GLOB@WEIGHT and --sources with report.json's sources. (A mixture resumed on another number of
replicas: tests/test_resume.py's elastic test.)"""

import collections
import json
import random
import signal

import keras
import pytest

import cli
from conftest import write_source
import tensorflow as tf

from tfseq.mixing import MixedRecords
from tfseq.resumable import RecordShards

LABELS = ("east", "north", "south", "west")


def strings(prefix, n):
    return lambda: tf.data.Dataset.from_tensor_slices(
        [f"{prefix}{i}" for i in range(n)]).batch(4)


def spilled(tmp_path, prefix, n, num_shards):
    """RecordShards of ``n`` records spilled into ``num_shards`` files."""
    shards = RecordShards(strings(prefix, n), num_shards=num_shards, seed=3,
                          directory=str(tmp_path / prefix))
    writer = shards.spill_writer({"test": prefix})
    for index, batch in enumerate(shards.make_records()):
        writer.write(*[t.numpy() for t in shards.assign(tf.constant(index, tf.int64), batch)])
    writer.close()
    return shards


def epoch_records(mixed, epoch, offset=0):
    out = []
    for records, _, start, _ in mixed.epoch_batches(tf.constant(epoch, tf.int64), 0,
                                                    tf.constant(offset, tf.int64), 0):
        out.append((int(start), [r.decode() for r in records.numpy()]))
    return out


def test_mixed_records_blocks_exact_once_per_source_epoch_and_resume_anywhere(tmp_path):
    a = RecordShards(strings("a", 30), num_shards=1, seed=1)  # in memory
    b = spilled(tmp_path, "b", 21, num_shards=3)              # three files, sizes in manifest
    assert sum(b.shard_sizes()) == 21
    mixed = MixedRecords([a, b], ["a", "b"], [2, 1], seed=0)
    assert mixed.sizes == [30, 21]
    assert mixed.chunk.tolist() == [4, 2] and mixed.block == 6   # 51 // 8 = 6 -> 2 periods
    assert mixed.blocks_per_epoch == 9                           # ceil(51 / 6)
    sequence, read = [], {}
    for epoch in range(3):
        blocks = read[epoch] = epoch_records(mixed, epoch)
        assert [start for start, _ in blocks] == list(range(0, 54, 6))
        for _, records in blocks:
            assert [r[0] for r in records] == ["a"] * 4 + ["b"] * 2
        sequence += [r for _, records in blocks for r in records]
    of_a = [r for r in sequence if r[0] == "a"]  # 3 epochs x 36 = 108: 3.6 epochs of a
    of_b = [r for r in sequence if r[0] == "b"]  # 54: 2.57 epochs of b
    for seq, size in ((of_a, 30), (of_b, 21)):
        epochs = [seq[i:i + size] for i in range(0, len(seq) - size + 1, size)]
        assert all(len(set(e)) == size for e in epochs)      # once per source epoch
        assert len({tuple(e) for e in epochs}) == len(epochs)  # a new order each
    # From any block of any epoch, the rest of the epoch is what an uninterrupted read gave.
    for epoch, offset in ((0, 6), (1, 30), (2, 48)):
        assert epoch_records(mixed, epoch, offset) == [
            (s, r) for s, r in read[epoch] if s >= offset]


def test_a_mixture_needs_records_in_every_source(tmp_path):
    mixed = MixedRecords([RecordShards(strings("a", 3), num_shards=1, seed=0),
                          RecordShards(strings("b", 0), num_shards=1, seed=0)], ["x", "y"])
    with pytest.raises(ValueError, match=r"source \['y'\] has no training record"):
        mixed.block


# ----------------------------------------------------------------------------- the stream

def config_of(news, web, **changes):
    from tfseq.pipelines import classify

    fields = dict(train_files=(news, web), train_weights=(0.7, 0.3), columns=("label", "text"),
                  eval_percent=0, min_count=1, batching="bucket", max_tokens=96, max_length=12,
                  shuffle_shard_bytes=4096)
    return classify.Config(**{**fields, **changes})


def example_ids(batch, tokens):
    parts = batch if isinstance(batch[0], tuple) else (batch,)
    found = []
    for x, _, weights in parts:
        ids = x["ids"].numpy()
        real = weights.numpy().reshape(ids.shape[0], -1).max(axis=1) > 0
        found += [int(tokens[t][1:]) for t in ids[real, 0].tolist()]
    return found


def run_trainer(config, state, shards, model_dir, *, max_steps=None, steps=None):
    import tfseq
    from tfseq.pipelines import classify
    from tfseq.training import Trainer

    steps = [] if steps is None else steps
    counter = tfseq.DropCounter("train")
    stream = classify.TASK.training_stream(config, state, counter, shards)
    keras.utils.set_random_seed(0)
    model = classify.TASK.build_model(config, state, classify.TASK.model_config(
        embedding_dim=4, hidden_dim=4))
    trainer = Trainer(model, stream, model_dir=str(model_dir), checkpoint_every=3,
                      on_batch=lambda b: steps.append(example_ids(b, state.vocab.tokens)),
                      on_epoch_start=lambda epoch: counter.reset())
    trainer.restore()
    return trainer.fit(1, verbose=0, max_steps=max_steps), steps, counter


@pytest.mark.slow
def test_a_mixture_stream_trains_the_weights_and_resumes_exactly(tmp_path):
    import tfseq
    from tfseq.pipelines import classify, sources
    from tfseq.pipelines.spine import committed
    from tfseq.training import checkpoints_newest_first, data_state_bytes

    news = write_source(tmp_path / "news.tsv", 0, 600)
    web = write_source(tmp_path / "web.tsv", 10_000, 300)
    config = config_of(news, web)
    task = classify.TASK
    shards = task.record_shards(config, directory=str(tmp_path / "shards"))
    state, setup = task.prepare(config, shards=shards,
                                fingerprint=sources.fingerprint([news, web]))
    # One read of each source to learn, one more each to write its shards.
    assert [p.num_shards for p in shards.parts] == [7, 4] and setup.passes == 4
    assert shards.sizes == [600, 300] and shards.block == 120  # >= 900 // 8: 12 periods of 10
    # The uninterrupted epoch's batches and counts, from the stream itself (no training;
    # ``spine.committed`` adds the counts and skips batches with no example).
    counter = tfseq.DropCounter("train")
    stream = task.training_stream(config, state, counter, shards,
                                  epoch=tf.Variable(0, dtype=tf.int64))
    steps = [example_ids(batch, state.vocab.tokens) for batch in committed(stream)]
    ids = [i for step in steps for i in step]
    of_news = [i for i in ids if i < 10_000]
    of_web = [i for i in ids if i >= 10_000]
    # An epoch: 8 blocks of 84 + 36 records; every example of news once (and 72 again).
    assert (len(of_news), len(of_web)) == (672, 288)
    twice = collections.Counter(collections.Counter(of_news).values())
    assert sorted(set(of_news)) == list(range(600)) and twice == {1: 528, 2: 72}
    assert len(set(of_web)) == 288
    by_source = counter.by_source()
    assert by_source["s0"]["seen"]["examples"] == 672
    assert by_source["s1"]["seen"]["examples"] == 288
    assert by_source["s0"]["seen"]["lines_read"] == 672
    cut = len(steps) // 2 + 1
    part, cut_steps, _ = run_trainer(config, state, shards, tmp_path / "cut", max_steps=cut)
    assert part.interrupted and part.steps_done == cut
    assert data_state_bytes(checkpoints_newest_first(str(tmp_path / "cut" / "ckpt"))[0]) < 1024
    rest, cut_steps, rest_counter = run_trainer(config, state, shards, tmp_path / "cut",
                                                steps=cut_steps)
    assert not rest.interrupted and rest.steps_done == len(steps)
    assert cut_steps == steps  # the same batches in the same order
    assert rest_counter.by_source() == by_source


# ----------------------------------------------------------------------------- the binary

def train(*args, fault=None):
    return cli.run("train", *args, fault=fault)


NO_DROPS = {"empty": 0, "empty_text": 0, "invalid_utf8": 0, "malformed": 0, "nul_byte": 0,
            "other_split": 0, "too_many_bytes": 0, "too_short": 0, "unknown_label": 0}


def source_row(path, weight, records, examples, tokens, share, source_epochs, files=None):
    return {"source": path, "files": files or [path], "weight": weight, "records": records,
            "examples": examples, "tokens": tokens, "share": share,
            "source_epochs": source_epochs, "drops": NO_DROPS}


@pytest.mark.slow
def test_weighted_files_train_and_report_each_sources_share(tmp_path):
    # The binary's path in this process; its progress line's shares and a resume after SIGTERM
    # of a mixture: test_a_sources_file_mixes_jsonl_tsv_and_parquet_and_resumes_after_sigterm.
    news = write_source(tmp_path / "news.tsv", 0, 120)
    web = write_source(tmp_path / "web.tsv", 10_000, 120)
    _, _, config = cli.flag_config(f"--train_files={news}@0.8,{web}@0.2", "--columns=label,text")
    assert (config.train_files, config.train_weights) == ((news, web), (0.8, 0.2))
    result = cli.train_in_process(f"--train_files={news}@0.8,{web}@0.2", "--columns=label,text",
                            "--epochs=1", "--max_tokens=32", "--max_length=12",
                            "--eval_percent=0", "--checkpoint_every=10",
                            f"--model_dir={tmp_path / 'run'}")
    assert not result.interrupted
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    # 49 steps; 0.8 x 240 = 192 examples of news: 1.6 of its epochs, each example of a source
    # epoch once.
    assert report["steps"] == 49
    assert report["sources"] == [source_row(news, 0.8, 120, 192, 1151, 0.8, 1.6),
                                 source_row(web, 0.2, 120, 48, 284, 0.2, 0.4)]


def write_three_formats(tmp_path, lines):
    """A JSON Lines source (keys ``category``/``body``, numeric labels), a TSV source and a
    Parquet source of ``lines`` rows each, ids unique across them, and their sources file
    at 0.5 / 0.3 / 0.2."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = {}
    for name, first in (("web", 0), ("ours", 10_000), ("hub", 20_000)):
        rng = random.Random(first)
        rows[name] = [(str(i % 2), f"t{first + i} " + " ".join(
            f"w{i % 2}{rng.randrange(6)}" for _ in range(i % 9 + 1))) for i in range(lines)]
    with open(tmp_path / "web.jsonl", "w") as f:
        for label, text in rows["web"]:
            f.write(json.dumps({"category": int(label), "body": text, "meta": {"n": 1}}) + "\n")
    (tmp_path / "ours.tsv").write_text("label\ttext\n" + "".join(
        f"{label}\t{text}\n" for label, text in rows["ours"]))
    pq.write_table(pa.table({"label": [label for label, _ in rows["hub"]],
                             "text": [text for _, text in rows["hub"]]}),
                   str(tmp_path / "hub.parquet"), row_group_size=40)
    sources = {"sources": [
        {"files": str(tmp_path / "web.jsonl"), "weight": 0.5,
         "columns": "label=category,text=body"},
        {"files": [str(tmp_path / "ours.tsv")], "weight": 0.3, "format": "tsv",
         "columns": ["label", "text"], "header": True},
        {"files": str(tmp_path / "hub.parquet"), "weight": 0.2}]}
    (tmp_path / "sources.json").write_text(json.dumps(sources))
    return str(tmp_path / "sources.json")


@pytest.mark.slow
def test_a_sources_file_mixes_jsonl_tsv_and_parquet_and_resumes_after_sigterm(tmp_path):
    sources = write_three_formats(tmp_path, 100)
    flags = [f"--sources={sources}", "--columns=label,text", "--epochs=1", "--max_tokens=32",
             "--max_length=12", "--eval_percent=0", "--export=false",
             "--checkpoint_every=10", f"--model_dir={tmp_path / 'run'}"]
    cut = train(*flags, "--verbose=0", fault="after_step:25:TERM")
    assert cut.returncode == 128 + signal.SIGTERM, cut.stderr[-3000:]
    rest = train(*flags, "--verbose=1")
    assert rest.returncode == 0, rest.stderr[-3000:]
    # The epoch's progress line and the report's summary name each source's share.
    assert "; shares web.jsonl 0.50, ours.tsv 0.30, hub.parquet 0.20" in rest.stderr
    assert "share 0.50" in rest.stdout and "share 0.20" in rest.stdout
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    # What the uninterrupted run reports (65 steps, shares 0.5 / 0.3 / 0.2, no drop): the
    # resumed run trained the same examples of every source, each once.
    assert report["steps"] == 65
    assert report["sources"] == [
        source_row(str(tmp_path / "web.jsonl"), 0.5, 100, 160, 969, 0.5, 1.6),
        source_row(str(tmp_path / "ours.tsv"), 0.3, 100, 96, 566, 0.3, 0.96),
        source_row(str(tmp_path / "hub.parquet"), 0.2, 100, 64, 363, 0.2, 0.64)]


def test_weights_and_temperature_flags_are_checked(tmp_path):
    from absl import app

    news = write_source(tmp_path / "news.tsv", 0, 20)
    web = write_source(tmp_path / "web.jsonl", 100, 20)
    common = ["--columns=label,text", f"--model_dir={tmp_path / 'run'}"]
    # The flag table's checks, in this process (the command prints them as its one line).
    for args, message in [((f"--train_files={news}@0.7,{web}",), "give every entry a weight"),
                          ((f"--train_files={news}@0.7,{web}@x",), "must be a weight"),
                          ((f"--train_files={news}@0.7,{web}@0.3", "--mix_temperature=2"),
                           "give one")]:
        with pytest.raises(app.UsageError, match=message):
            cli.flag_config(*args, *common)
    # A source in the wrong format (TSV lines in a .jsonl file): every record dropped.
    out = train(f"--train_files={news}@0.7,{web}@0.3", *common)
    assert cli.error_line(out).startswith(
        f"tfseq-train: error: no record of {web} is usable: 20 malformed; the first: {web}:1:")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_translate_mixes_weighted_file_pairs(tmp_path):
    from tfseq.pipelines.runner import SetupError

    def pair(name, n, word):
        src, tgt = tmp_path / f"{name}.en", tmp_path / f"{name}.de"
        src.write_text("".join(f"{word} {i} the thing\n" for i in range(n)))
        tgt.write_text("".join(f"{word.upper()} {i} das ding\n" for i in range(n)))
        return str(src), str(tgt)

    (a_en, a_de), (b_en, b_de) = pair("a", 100, "alpha"), pair("b", 100, "beta")
    cli.train_in_process("--task=translate", f"--source_files={a_en}@3,{b_en}@1", "--eval_percent=0",
                   f"--target_files={a_de},{b_de}", "--epochs=1",
                   f"--model_dir={tmp_path / 'run'}")
    rows = json.loads((tmp_path / "run" / "report.json").read_text())["sources"]
    assert [r["source"] for r in rows] == [a_en, b_en]
    assert [r["files"] for r in rows] == [[a_en, a_de], [b_en, b_de]]
    assert abs(rows[0]["share"] - 0.75) <= 0.01 and abs(rows[1]["share"] - 0.25) <= 0.01
    with pytest.raises(SetupError, match="but 1 --target_files entries"):
        cli.train_in_process("--task=translate", f"--source_files={a_en}@3,{b_en}@1",
                       f"--target_files={a_de}", f"--model_dir={tmp_path / 'bad'}")
