"""Training speed at one token budget: plain padding vs tfseq bucketing, same model and data.

Every scheme trains a fresh copy of the same small classifier (Embedding(mask_zero) -> GRU or
LSTM -> Dense, predicting the verse's book from its text) on the same ``--examples`` examples
for one pass, with batches of at most ``--max_tokens`` cells (rows x padded length). It prints
one table (steps, padding efficiency, real (non-pad) tokens per wall second and per CPU second
of the process through ``model.fit``, speed-ups over plain padding) and writes it as JSON.
Each scheme first runs a few warm-up steps so that tracing is not timed.

Usage:
  python -m benchmarks.training --json_out=bench_out/training.json
  python -m benchmarks.training --model=lstm --examples=2000

Tokens are whitespace tokens hashed to ids in [1, 30000] and the label is the book name hashed
to 66 buckets: the numbers measure speed, not accuracy. XLA is off (``jit_compile=False``):
variable batch shapes would recompile at every new shape.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings

from absl import flags, logging

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_text as tf_text  # noqa: E402

import tfseq  # noqa: E402
from benchmarks import harness  # noqa: E402
from tfseq.bucketing import bucket_by_length  # noqa: E402

HASH_BUCKETS = 30000
NUM_CLASSES = 66

FLAGS = flags.FLAGS
flags.DEFINE_list("files", [tfseq.corpus_path("kjv_en")],
                  "Tab-separated files (gzip if they end in .gz).")
flags.DEFINE_integer("field", 3, "0-based field holding the text (the label is field 0).")
flags.DEFINE_integer("max_tokens", 8192, "Budget: rows x padded length per batch.")
flags.DEFINE_integer("max_length", 512, "Longer examples are dropped (same for every scheme).")
flags.DEFINE_integer("examples", 4096, "Examples trained on per scheme (one pass).")
flags.DEFINE_integer("warmup_steps", 3, "Untimed steps per scheme before the timed pass.")
flags.DEFINE_enum("model", "gru", ["gru", "lstm"], "Recurrent layer.")
flags.DEFINE_integer("embed_dim", 64, "Embedding size.")
flags.DEFINE_integer("units", 128, "Recurrent units.")
flags.DEFINE_integer("seed", 0, "Seed for the shuffle, tfseq and the weights.")


def read_examples(files, field, max_length) -> tf.data.Dataset:
    """TSV lines -> {"ids": int32 [(T)], "label": int32 []}, 1..max_length tokens."""
    compression = "GZIP" if all(f.endswith(".gz") for f in files) else None
    tokenizer = tf_text.WhitespaceTokenizer()

    def to_example(line):
        fields = tf.strings.split(line, "\t")
        tokens = tokenizer.tokenize(fields[field])
        ids = tf.cast(tf.strings.to_hash_bucket_fast(tokens, HASH_BUCKETS) + 1, tf.int32)
        label = tf.cast(tf.strings.to_hash_bucket_fast(fields[0], NUM_CLASSES), tf.int32)
        return {"ids": ids, "label": label}

    def keep(example):
        n = tf.size(example["ids"])
        return tf.logical_and(n >= 1, n <= max_length)

    lines = tf.data.TextLineDataset(files, compression_type=compression)
    return lines.map(to_example).filter(keep)


def build_model(kind, embed_dim, units, seed) -> keras.Model:
    keras.utils.set_random_seed(seed)
    rnn = keras.layers.GRU if kind == "gru" else keras.layers.LSTM
    model = keras.Sequential([
        keras.Input(shape=(None,), dtype="int32"),
        keras.layers.Embedding(HASH_BUCKETS + 1, embed_dim, mask_zero=True),
        rnn(units),
        keras.layers.Dense(NUM_CLASSES),
    ])
    model.compile(optimizer="adam", jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@dataclasses.dataclass(frozen=True)
class Setting:
    """What every scheme is given."""
    max_tokens: int
    max_length: int
    longest: int  # the longest example actually in the data
    seed: int


def plain(s: Setting):
    """padded_batch at the largest batch size that can never exceed the budget."""
    return lambda ds: ds.padded_batch(s.max_tokens // s.max_length)


def plain_known_longest(s: Setting):
    """padded_batch sized by the longest example in this data (needs a pass to know it)."""
    return lambda ds: ds.padded_batch(s.max_tokens // s.longest)


def tfseq_buckets(s: Setting):
    return lambda ds: ds.apply(bucket_by_length(max_tokens=s.max_tokens,
                                                max_length=s.max_length, seed=s.seed))


# (name, builder(Setting) -> (dataset -> batched dataset)); the first is the baseline of the
# speed-up column. Packing is one more line here.
SCHEMES = [
    ("plain padded_batch", plain),
    ("plain, rows by data's longest", plain_known_longest),
    ("tfseq bucket_by_length", tfseq_buckets),
]


def to_inputs(batch):
    return batch["ids"], batch["label"]


def main(argv):
    del argv
    warnings.filterwarnings("ignore", category=UserWarning, module="keras")
    data = read_examples(FLAGS.files, FLAGS.field, FLAGS.max_length)
    data = data.shuffle(8192, seed=FLAGS.seed, reshuffle_each_iteration=False)
    data = data.take(FLAGS.examples).cache()
    lengths = np.array([int(tf.size(x["ids"])) for x in data])
    real_tokens = int(lengths.sum())
    setting = Setting(FLAGS.max_tokens, FLAGS.max_length, int(lengths.max()), FLAGS.seed)

    rows = []
    for name, build in SCHEMES:
        batched = data.apply(build(setting))
        inputs = batched.map(to_inputs).cache()
        shapes = [x.shape for x, _ in inputs]  # fills the cache: the timed pass is training only
        cells = sum(rows_ * width for rows_, width in shapes)
        assert max(rows_ * width for rows_, width in shapes) <= FLAGS.max_tokens, name
        model = build_model(FLAGS.model, FLAGS.embed_dim, FLAGS.units, FLAGS.seed)
        model.fit(inputs.take(FLAGS.warmup_steps), epochs=1, verbose=0)
        start, cpu_start = time.perf_counter(), time.process_time()
        model.fit(inputs, epochs=1, verbose=0)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        rows.append({"scheme": name, "steps": len(shapes), "seconds": seconds,
                     "cpu_seconds": cpu,
                     "real_tokens_per_s": real_tokens / seconds,
                     "real_tokens_per_cpu_s": real_tokens / cpu,
                     "padding_efficiency": real_tokens / cells})
        logging.info("%s: %d steps in %.1f s", name, len(shapes), seconds)
    harness.add_ratios(rows, rows[0], speedup_vs_plain="real_tokens_per_s",
                       cpu_speedup_vs_plain="real_tokens_per_cpu_s")

    print(f"{FLAGS.examples} examples ({real_tokens} real tokens) from "
          f"{','.join(os.path.relpath(f) for f in FLAGS.files)}; "
          f"model Embedding({FLAGS.embed_dim}) -> {FLAGS.model.upper()}({FLAGS.units}) -> "
          f"Dense({NUM_CLASSES}); max_tokens={FLAGS.max_tokens} max_length={FLAGS.max_length}")
    harness.print_table(rows, [
        ("scheme", "scheme", ""), ("steps", "steps", "d"),
        ("pad eff", "padding_efficiency", ".3f"), ("wall s", "seconds", ".1f"),
        ("real tok/s", "real_tokens_per_s", ",.0f"), ("speed-up", "speedup_vs_plain", ".2f"),
        ("cpu s", "cpu_seconds", ".1f"), ("tok/cpu-s", "real_tokens_per_cpu_s", ",.0f"),
        ("speed-up", "cpu_speedup_vs_plain", ".2f")])
    harness.write_json({"examples": FLAGS.examples, "real_tokens": real_tokens,
                        "model": FLAGS.model, "embed_dim": FLAGS.embed_dim,
                        "units": FLAGS.units, "max_tokens": FLAGS.max_tokens,
                        "max_length": FLAGS.max_length, "schemes": rows})

if __name__ == "__main__":
    harness.run(main)
