"""The classify task in every batching mode: exactly-once examples and a finite training step."""

import dataclasses
import math

import numpy as np
import pytest

from tfseq.models import classifier
from tfseq.pipelines import classify

BOOKS = ["Gen", "Ps", "Isa", "Matt", "Rom", "Rev", "Josh"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "tiny.tsv"
    lines = [f"{BOOKS[i % 7]}\t{i // 20 + 1}\t{i % 20 + 1}\t" +
             " ".join(f"w{(i * j) % 11}" for j in range(i % 13 + 1)) for i in range(300)]
    lines += ["no tabs here", "Gen\t1\t1\t", "Xyz\t1\t1\tunknown book"]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("batching", ["pad", "bucket", "pack"])
def test_every_kept_example_is_batched_once_and_a_step_is_finite(corpus, batching):
    config = classify.Config(files=(corpus,), batching=batching, batch_size=16, max_tokens=96,
                             max_length=24, block_length=24, max_segments=8, min_count=1)
    train, _, info = classify.datasets(config)
    total = 0
    for batch in train:
        if batching == "pack":
            total += int(np.sum(batch[2].numpy()))           # segments present
            assert batch[0]["ids"].shape[1] == 24
        else:
            total += int(batch[1].shape[0])
            assert math.prod(batch[0]["ids"].shape) <= (96 if batching == "bucket" else 10**9)
    counts = info["counters"]["train"]
    assert counts.seen()["lines_read"] == 303
    drops = counts.drops()
    assert drops["malformed"] == 1 and drops["unknown_book"] == 1 and drops["empty"] == 1
    assert total == 303 - sum(drops.values())
    model = classifier.build_model(config, info)
    logs = model.train_on_batch(*next(iter(train)), return_dict=True)
    assert np.isfinite(logs["loss"])
    assert 0.0 <= info["stats"]["train"].padding_efficiency() <= 1.0


def test_unknown_batching_is_rejected():
    with pytest.raises(ValueError, match="Unknown batching 'sorted'"):
        classify.datasets(dataclasses.replace(classify.Config(), batching="sorted"))
