"""The classify task in every batching mode: exactly-once examples and a finite training step."""

import dataclasses
import math

import numpy as np
import pytest

from tfseq.pipelines import classify, tasks

BOOKS = ["Gen", "Ps", "Isa", "Matt", "Rom", "Rev", "Josh"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "tiny.tsv"
    lines = [f"{BOOKS[i % 7]}\t{i // 20 + 1}\t{i % 20 + 1}\t" +
             " ".join(f"w{(i * j) % 11}" for j in range(i % 13 + 1)) for i in range(100)]
    lines += ["no tabs here", "Gen\t1\t1\t", "Xyz\t1\t1\tunknown book"]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_the_task_is_registered():
    assert tasks.load("classify") is classify.TASK


@pytest.mark.parametrize("batching", ["pad", "bucket", "pack"])
def test_every_kept_example_is_batched_once_and_a_step_is_finite(corpus, batching):
    task = tasks.load("classify")
    config = task.Config(files=(corpus,), batching=batching, batch_size=16, max_tokens=96,
                         max_length=24, block_length=24, max_segments=8, min_count=1)
    data = task.datasets(config)
    total = 0
    for inputs, labels, weights in data.train:
        if batching == "pack":
            total += int(np.sum(weights.numpy()))           # segments present
            assert inputs["ids"].shape[1] == 24
            assert labels.shape[1] == weights.shape[1] == 8
        else:
            total += int(labels.shape[0])
            assert weights.numpy().tolist() == [1.0] * labels.shape[0]
            assert math.prod(inputs["ids"].shape) <= (96 if batching == "bucket" else 10**9)
    counts = data.counters["train"]
    assert counts.seen()["lines_read"] == 103
    drops = counts.drops()
    assert drops["malformed"] == 1 and drops["unknown_book"] == 1 and drops["empty"] == 1
    assert total == 103 - sum(drops.values())
    model = task.build_model(config, data.state)
    logs = model.train_on_batch(*next(iter(data.train)), return_dict=True)
    assert np.isfinite(logs["loss"])
    assert 0.0 <= data.stats["train"].padding_efficiency() <= 1.0


def test_unknown_batching_is_rejected():
    task = tasks.load("classify")
    with pytest.raises(ValueError, match="Unknown batching 'sorted'"):
        task.datasets(dataclasses.replace(task.Config(), batching="sorted"))
