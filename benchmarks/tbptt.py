r"""Full BPTT vs truncated BPTT (independent chunks, carried state), side by side.

Usage:
  python -m benchmarks.tbptt --json_out=bench_out/tbptt.json
  python -m benchmarks.tbptt --datasets=chapters --train_tokens=300000 --chunk_length=64
  python -m benchmarks.tbptt --files='docs/*.txt' --field=-1   # your own text

Two datasets from the embedded corpus (text = 4th TSV field, lowercased whitespace tokens via
tensorflow_text, a vocabulary of the ``--max_vocab`` most frequent training tokens):
  verses    one verse per sequence (median ~26 tokens);
  chapters  verses joined into one sequence per book+chapter (``lm_tbptt.join_chapters``;
            median ~700 tokens, up to ~2,400).
  files     your own text (``--files``, gzip if they end in .gz): one line per sequence, the
            text in tab-separated ``--field`` (-1: the whole line); replaces the two above
            unless ``--datasets`` is given too. Held-out lines: 5% by a hash of the line.

Variants, all on the same shuffled batches of ``--batch_size`` sequences (same seed), trained
on the same first ``--train_tokens`` predicted tokens, one pass:
  full         whole sequences, one update per batch (full BPTT);
  independent  each batch cut into chunks of ``--chunk_length``, zero state at every chunk;
  carried      the same chunks, state carried across chunks, reset at sequence starts;
  stream       (optional) the split as one text in ``--batch_size`` streams, carried state.

Each variant runs in its own process. Measured there:
  tokens/s      predicted (non-pad) tokens / training wall time after the first step (tracing
                excluded), from the model's own token count;
  peak RSS      ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` at the end (whole process, MB),
                and its growth during training (peak after - peak before ``fit``): the
                activation memory BPTT needs shows up there;
  held-out ppl  perplexity on the first ``--eval_tokens`` held-out tokens (the same chunks for
                every variant: evaluation carries the state, so it is the whole-sequence
                perplexity; the stream variant evaluates on a held-out *stream*, not comparable).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from benchmarks import harness  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("datasets", ["verses", "chapters"], "Which datasets: verses, chapters "
                  "(with --files, files only unless this flag is given).")
flags.DEFINE_list("files", [], "Your own text files or globs, one sequence per line: adds the "
                  "'files' dataset.")
flags.DEFINE_integer("field", -1, "0-based tab-separated field of --files holding the text; -1 "
                     "for the whole line.")
flags.DEFINE_list("variants", ["full", "independent", "carried"],
                  "Which variants: full, independent, carried, stream.")
flags.DEFINE_integer("train_tokens", 30000, "Predicted tokens trained on per variant.")
flags.DEFINE_integer("eval_tokens", 8000, "Held-out tokens evaluated.")
flags.DEFINE_integer("chunk_length", 32, "TBPTT chunk length.")
flags.DEFINE_integer("batch_size", 16, "Sequences (or streams) per batch.")
flags.DEFINE_integer("max_vocab", 2000, "Vocabulary size (incl. 4 reserved ids).")
flags.DEFINE_integer("embedding_dim", 32, "Embedding width.")
flags.DEFINE_integer("units", 64, "GRU units.")
flags.DEFINE_float("learning_rate", 1e-2, "Adam learning rate.")
flags.DEFINE_integer("seed", 0, "Seed for shuffling and initialisation.")
flags.DEFINE_string("work_dir", None, "Where the chapters file and vocabularies go (temp dir).")
flags.DEFINE_string("worker", None, "Internal: run one variant (a JSON spec) and exit.")

VARIANTS = {"full": ("sequences", False, False), "independent": ("sequences", True, False),
            "carried": ("sequences", True, True), "stream": ("stream", True, True)}


def config_for(variant: str, files: list[str], vocab_path: str | None, text_field: int | None):
    from tfseq.pipelines import lm_tbptt

    mode, chunked, carry = VARIANTS[variant]
    return lm_tbptt.Config(
        files=tuple(files), text_field=text_field, vocab_path=vocab_path,
        max_vocab=FLAGS.max_vocab, mode=mode,
        tbptt=FLAGS.chunk_length if chunked else None, carry_state=carry,
        batch_size=FLAGS.batch_size, eval_chunk_length=FLAGS.chunk_length,
        max_train_tokens=FLAGS.train_tokens, seed=FLAGS.seed)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_worker(spec: str) -> dict:
    """Trains one variant in this process and returns its measurements."""
    import keras

    from tfseq.models import stateful_lm
    from tfseq.pipelines import lm_tbptt

    spec = json.loads(spec)
    dataset, variant = spec["dataset"], spec["variant"]
    keras.utils.set_random_seed(FLAGS.seed)
    config = config_for(variant, spec["files"], spec["vocab"], spec["text_field"])
    data = lm_tbptt.TASK.datasets(config)
    train_ds, eval_ds, info = data.train, data.eval, data.state
    eval_ds = eval_ds.apply(lm_tbptt.take_tokens(FLAGS.eval_tokens))
    model = stateful_lm.build_model(config, info, stateful_lm.ModelConfig(
        embedding_dim=FLAGS.embedding_dim, units=FLAGS.units, learning_rate=FLAGS.learning_rate))

    marks = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                marks.append((time.perf_counter(), float(logs["tokens"])))

    rss_before = rss_mb()
    start = time.perf_counter()
    history = model.fit(train_ds, epochs=1, verbose=0, callbacks=[Clock()]).history
    end = time.perf_counter()
    rss_after = rss_mb()
    tokens = history["tokens"][-1]
    first_time, first_tokens = marks[0]
    steps = int(model.optimizer.iterations.numpy())
    results = model.evaluate(eval_ds, verbose=0, return_dict=True)
    return {
        "dataset": dataset, "variant": variant, "train_tokens": int(tokens), "steps": steps,
        "train_seconds": end - start,
        "tokens_per_second": ((tokens - first_tokens) / (end - first_time) if steps > 1
                              else tokens / (end - start)),
        "train_loss": history["loss"][-1],
        "peak_rss_mb": rss_after, "rss_growth_in_fit_mb": rss_after - rss_before,
        "eval_tokens": int(results["tokens"]), "eval_perplexity": results["perplexity"],
        "padding_efficiency": data.stats["train"].padding_efficiency(),
    }


def prepare(work_dir: str) -> dict:
    """``name -> (files, text field, vocabulary path)``; each vocabulary is built once, from
    its dataset's training split."""
    import tfseq
    from tfseq.pipelines import lm_tbptt

    names = list(FLAGS.datasets) if FLAGS["datasets"].present or not FLAGS.files else []
    verses = tfseq.corpus_path("kjv_en")
    chapters = os.path.join(work_dir, "kjv_chapters.tsv")
    if "chapters" in names and not os.path.exists(chapters):
        lm_tbptt.join_chapters(verses, chapters)
    sources = {name: ({"verses": [verses], "chapters": [chapters]}[name], 3) for name in names}
    if FLAGS.files:
        sources["files"] = (tfseq.reading.resolve_files(FLAGS.files),
                            None if FLAGS.field < 0 else FLAGS.field)
    out = {}
    for name, (files, text_field) in sources.items():
        vocab_path = os.path.join(work_dir, f"vocab_{name}_{FLAGS.max_vocab}.txt")
        if name == "files" or not os.path.exists(vocab_path):
            lm_tbptt.build_vocab(config_for("full", files, None, text_field)).save(vocab_path)
        out[name] = (files, text_field, vocab_path)
    return out


def format_table(rows: list[dict]) -> str:
    """The rows side by side, with ratios against the same dataset's ``full`` variant."""
    def vs_full(key):
        def ratio(row):
            base = next((r for r in rows if r["dataset"] == row["dataset"]
                         and r["variant"] == "full"), row)
            return row[key] / base[key] if base[key] else float("nan")
        return ratio

    return harness.table(rows, [
        ("dataset", "dataset", ""), ("variant", "variant", ""), ("tokens", "train_tokens", "d"),
        ("steps", "steps", "d"), ("tok/s", "tokens_per_second", ".0f"),
        ("x full", vs_full("tokens_per_second"), ".2f"), ("peakMB", "peak_rss_mb", ".0f"),
        ("+fitMB", "rss_growth_in_fit_mb", ".0f"),
        ("x full", vs_full("rss_growth_in_fit_mb"), ".2f"),
        ("eval ppl", "eval_perplexity", ".1f"), ("x full", vs_full("eval_perplexity"), ".2f")])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    for name in FLAGS.datasets:
        if name not in ("verses", "chapters"):
            raise app.UsageError(f"Unknown dataset {name!r}; expected verses, chapters (and "
                                 "--files for your own text)")
    for name in FLAGS.variants:
        if name not in VARIANTS:
            raise app.UsageError(f"Unknown variant {name!r}; expected some of {sorted(VARIANTS)}")
    if FLAGS.worker:
        print("RESULT " + json.dumps(run_worker(FLAGS.worker)), flush=True)
        return
    work_dir = FLAGS.work_dir or tempfile.mkdtemp(prefix="bench_tbptt_")
    os.makedirs(work_dir, exist_ok=True)
    started = time.perf_counter()
    data = prepare(work_dir)
    own = [FLAGS[name].serialize() for name in (
        "train_tokens", "eval_tokens", "chunk_length", "batch_size", "max_vocab",
        "embedding_dim", "units", "learning_rate", "seed")]
    rows = []
    for dataset, (files, text_field, vocab_path) in data.items():
        for variant in FLAGS.variants:
            spec = json.dumps({"dataset": dataset, "variant": variant, "files": files,
                               "text_field": text_field, "vocab": vocab_path})
            command = [sys.executable, "-m", __spec__.name, f"--worker={spec}", *own]
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode or not result:
                sys.stderr.write(done.stderr[-4000:])
                raise RuntimeError(f"worker {dataset}:{variant} failed (rc={done.returncode})")
            rows.append(json.loads(result[-1][len("RESULT "):]))
            print(f"  done {dataset}:{variant} ({time.perf_counter() - started:.0f} s)",
                  flush=True)
    print(format_table(rows))
    harness.write_json({"command": sys.argv, "flags": harness.flag_values(
        "datasets", "files", "field", "variants", "train_tokens", "eval_tokens", "chunk_length",
        "batch_size", "max_vocab", "embedding_dim", "units", "learning_rate", "seed"),
        "results": rows, "total_seconds": time.perf_counter() - started})

if __name__ == "__main__":
    harness.run(main)
