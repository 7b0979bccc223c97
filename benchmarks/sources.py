r"""Many sources: the rate of reading JSON Lines, TFRecord and Parquet against TSV, and of
bucketing a mixture of corpora against bucketing one.

Usage:
  python -m benchmarks.sources --json_out=bench_out/sources.json
  python -m benchmarks.sources --copies=2 --repeats=2

The rows (label = the book, text = the verse) of the embedded corpus, both languages (62,204
rows), written ``--copies`` times into files of the same rows: ``rows.tsv``, ``rows.jsonl``
(``json.dumps``, raw UTF-8), ``renamed.jsonl`` (the same with the keys ``category`` and
``body``, read with ``--columns=label=category,text=body``), ``rows.tfrecord``
(``tf.train.Example``, two bytes features), ``rows.parquet`` (two string columns, pyarrow's
default row groups and compression: snappy) and ``plain.parquet`` (the same, uncompressed).
Every feed is consumed in the graph (``Dataset.reduce``), best of ``--repeats`` round-robin
passes:

  read tsv / jsonl / tfrecord / parquet, parquet uncompressed, jsonl renamed keys
                                ``formats.read_rows`` (read + parse + drop checks): rows/s
  read tsv / tfrecord, 8 shards the same rows dealt round-robin into 8 files of each format,
                                read as a sharded corpus is (``in_order=False``: the files
                                in parallel, a batch of each in turn)
  bucket, one source            the TSV rows' text -> ``tokenize`` -> ``bucket_by_length``
  bucket, mix of 3              the same rows cut into three files (thirds), each read and
                                tokenized as above, ``tfseq.mix`` in proportion to their
                                sizes (``temperature=1``), then the same ``bucket_by_length``
                                over as many rows (M real tokens/s)

Targets (issue: many sources): jsonl >= 0.5x tsv, tfrecord >= tsv, mix of 3 >= 0.9x one;
(data as it comes) parquet >= tsv, jsonl with renamed keys >= jsonl.
The sharded rows are held against the sharded TSV.

``--steady`` (the default; needs ``--copies`` of 2 or more) also times the bucket feeds over a
quarter of the copies, in the same round robin, and splits each into a steady rate and a start
(as ``benchmarks.scaling --steady`` does: each pass builds its iterator again, and the mixture
builds three read pipelines, three chunking ``scan``s and the merge): the bucket rows get
``steady_rate``, ``steady_ratio`` (against one source's steady rate) and ``start_seconds``.
"""

from __future__ import annotations

import json
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from benchmarks import harness  # noqa: E402

FLAGS = flags.FLAGS
harness.define_copies(4, "Times the corpus' rows are written into each file.")
harness.define_repeats(3)
flags.DEFINE_integer("max_tokens", 8192, "Token budget per batch (bucket feeds).")
flags.DEFINE_list("feeds", ["read", "bucket"], "Which groups of feeds to run: read, bucket.")
flags.DEFINE_boolean("steady", True, "Also time the bucket feeds over a quarter of the copies "
                     "and split their time into a steady rate and a start.")


SHARDS = 8


def write_tsv(out_dir: str, rows, copies: int) -> dict[str, str]:
    """The bucket feeds' files: ``rows.tsv`` and its thirds, ``copies`` times each."""
    path = os.path.join(out_dir, "rows.tsv")
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(copies):
            f.writelines(f"{label}\t{text}\n" for label, text in rows)
    return {"tsv": path, **write_thirds(out_dir, rows, copies)}


def write_thirds(out_dir: str, rows, copies: int) -> dict[str, str]:
    """Three TSV files of a third of the rows each, ``copies`` times (the mixture's sources)."""
    paths = {}
    for i in range(3):
        paths[f"third{i}"] = os.path.join(out_dir, f"third{i}.tsv")
        with open(paths[f"third{i}"], "w", encoding="utf-8") as f:
            for _ in range(copies):
                for label, text in rows[i * len(rows) // 3:(i + 1) * len(rows) // 3]:
                    f.write(f"{label}\t{text}\n")
    return paths


def write_files(out_dir: str, rows) -> dict[str, str]:
    """The same rows as TSV, JSON Lines (and with renamed keys), TFRecord and Parquet; and
    three TSV thirds."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf

    paths = {k: os.path.join(out_dir, f"rows.{k}") for k in ("tsv", "jsonl", "tfrecord")}
    paths["jsonl renamed keys"] = os.path.join(out_dir, "renamed.jsonl")
    with open(paths["tsv"], "w", encoding="utf-8") as tsv, \
            open(paths["jsonl"], "w", encoding="utf-8") as jsonl, \
            open(paths["jsonl renamed keys"], "w", encoding="utf-8") as renamed, \
            tf.io.TFRecordWriter(paths["tfrecord"]) as records:
        for _ in range(FLAGS.copies):
            for label, text in rows:
                tsv.write(f"{label}\t{text}\n")
                jsonl.write(json.dumps({"label": label, "text": text}, ensure_ascii=False) + "\n")
                renamed.write(json.dumps({"category": label, "body": text},
                                         ensure_ascii=False) + "\n")
                records.write(tf.train.Example(features=tf.train.Features(feature={
                    "label": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[label.encode()])),
                    "text": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[text.encode()]))})).SerializeToString())
    table = pa.table({"label": [label for label, _ in rows] * FLAGS.copies,
                      "text": [text for _, text in rows] * FLAGS.copies})
    paths["parquet"] = os.path.join(out_dir, "rows.parquet")
    pq.write_table(table, paths["parquet"])
    paths["parquet uncompressed"] = os.path.join(out_dir, "plain.parquet")
    pq.write_table(table, paths["parquet uncompressed"], compression="none")
    for kind in ("tsv", "tfrecord"):
        shards = [os.path.join(out_dir, f"part-{i}.{kind}") for i in range(SHARDS)]
        paths[f"{kind} shards"] = shards
        if kind == "tsv":
            with open(paths["tsv"], encoding="utf-8") as f:
                lines = f.readlines()
            for i, shard in enumerate(shards):
                with open(shard, "w", encoding="utf-8") as f:
                    f.writelines(lines[i::SHARDS])
        else:
            records = list(tf.data.TFRecordDataset(paths["tfrecord"]).as_numpy_iterator())
            for i, shard in enumerate(shards):
                with tf.io.TFRecordWriter(shard) as w:
                    for record in records[i::SHARDS]:
                        w.write(record)
    return {**paths, **write_thirds(out_dir, rows, FLAGS.copies)}


def read(path, kind, in_order=True, columns=("label", "text")):
    """``formats.read_rows`` of ``path`` (a file or a list): ``{label, text}`` rows."""
    import tfseq
    from tfseq import formats

    files = path if isinstance(path, list) else [path]
    fmt = formats.row_format(files, kind, list(columns), False,
                             required=("label", "text"), allowed=("label", "text"))
    return formats.read_rows(files, fmt, tfseq.DropCounter(kind), in_order=in_order)


def build_feeds(paths, total_rows):
    """name -> (dataset, count): count maps an element to what the rate counts (int64);
    and the vocabulary the bucket feeds tokenize with."""
    import tensorflow as tf

    import tfseq

    rows = lambda b: tf.size(b["text"], out_type=tf.int64)  # noqa: E731
    feeds = {f"read {kind}": (read(paths[kind], kind), rows)
             for kind in ("tsv", "jsonl", "tfrecord", "parquet")}
    feeds["read parquet uncompressed"] = (read(paths["parquet uncompressed"], "parquet"), rows)
    feeds["read jsonl renamed keys"] = (read(paths["jsonl renamed keys"], "jsonl", columns=(
        "label=category", "text=body")), rows)
    for kind in ("tsv", "tfrecord"):
        feeds[f"read {kind}, {SHARDS} shards"] = (
            read(paths[f"{kind} shards"], kind, in_order=False), rows)
    texts = [t.decode() for t in read(paths["tsv"], "tsv").map(lambda b: b["text"]).unbatch()
             .take(20000).as_numpy_iterator()]
    vocab = tfseq.Vocab.build(tf.data.Dataset.from_tensor_slices(texts), min_count=1)
    feeds.update(bucket_feeds(paths, total_rows, vocab))
    return feeds, vocab


def bucket_feeds(paths, total_rows, vocab):
    """The two bucket feeds over ``paths``' TSV and its thirds: name -> (dataset, count)."""
    import tensorflow as tf

    import tfseq

    def tokenized(path):
        return read(path, "tsv").map(lambda b: b["text"]).apply(tfseq.tokenize(vocab))

    def bucket(ds):
        return ds.apply(tfseq.bucket_by_length(max_tokens=FLAGS.max_tokens, max_length=512,
                                               seed=0, counter=tfseq.DropCounter()))

    real = lambda b: tf.reduce_sum(tf.cast(b["ids_length"], tf.int64))  # noqa: E731
    feeds = {"bucket, one source": (bucket(tokenized(paths["tsv"])), real)}
    thirds = [tokenized(paths[f"third{i}"]) for i in range(3)]
    sizes = [sum(1 for _ in open(paths[f"third{i}"], encoding="utf-8")) for i in range(3)]
    mixed = tfseq.mix(thirds, sizes=sizes, seed=0)
    block = int(next(iter(mixed.take(1)))["source"].shape[0])
    feeds["bucket, mix of 3"] = (bucket(mixed.take(-(-total_rows // block))), real)
    return feeds


def main(argv):
    del argv
    import tfseq

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_sources_") as tmp:
        rows = harness.embedded_rows()
        paths = write_files(tmp, rows)
        sizes = {k: os.path.getsize(p) for k, p in paths.items() if isinstance(p, str)}
        feeds, vocab = build_feeds(paths, len(rows) * FLAGS.copies)
        short_copies = harness.short_copies(FLAGS.copies)
        if FLAGS.steady and "bucket" in FLAGS.feeds and short_copies < FLAGS.copies:
            os.makedirs(os.path.join(tmp, "short"))
            short_paths = write_tsv(os.path.join(tmp, "short"), rows, short_copies)
            feeds.update({f"{name} (short)": feed for name, feed in bucket_feeds(
                short_paths, len(rows) * short_copies, vocab).items()})
        options = tfseq.pipeline_options()
        best = harness.best_passes(
            {name: (ds.with_options(options), count) for name, (ds, count) in feeds.items()
             if name.split(" ")[0].rstrip(",") in FLAGS.feeds}, FLAGS.repeats)
    best_short = {name[:-len(" (short)")]: best.pop(name)[:2] for name in list(best)
                  if name.endswith(" (short)")}
    rate_of = lambda name: best[name][0] / best[name][1] if name in best else None  # noqa
    tsv_rate, one_rate = rate_of("read tsv"), rate_of("bucket, one source")
    sharded_rate = rate_of(f"read tsv, {SHARDS} shards")
    for name, (n, seconds, _) in best.items():
        rate = n / seconds
        base = (one_rate if name.startswith("bucket") else
                sharded_rate if name.endswith("shards") else tsv_rate)
        unit = "rows" if name.startswith("read") else "real tokens"
        results[name] = {"count": n, "unit": unit, "seconds": round(seconds, 4),
                         "rate": rate, "ratio": rate / base}
    table = [{"feed": name, **row} for name, row in results.items()]
    harness.print_table(table, [
        ("feed", "feed", ""), ("count", "count", "d"), ("seconds", "seconds", ".3f"),
        ("rate (M/s)", lambda row: row["rate"] / 1e6, ".3f"), ("ratio", "ratio", ".2f")],
        title=f"\n{len(rows) * FLAGS.copies} rows per file; best of {FLAGS.repeats}, in-graph")
    if best_short:
        for name in best_short:
            split = harness.steady(best_short[name], best[name][:2])
            results[name].update(
                short_count=split["short_real_tokens"], short_seconds=split["short_seconds"],
                steady_rate=split["steady_tokens_per_second"],
                start_seconds=split["start_seconds"])
        one_steady = results["bucket, one source"]["steady_rate"]
        for name in best_short:
            results[name]["steady_ratio"] = results[name]["steady_rate"] / one_steady
        harness.print_table([{"feed": name, **results[name]} for name in best_short], [
            ("feed", "feed", ""), ("steady (M/s)", lambda row: row["steady_rate"] / 1e6, ".3f"),
            ("ratio", "steady_ratio", ".2f"), ("start (s)", "start_seconds", ".2f")],
            title=f"\nsteady rate (from passes of {FLAGS.copies} and {short_copies} copies) "
                  "and start")
    results["file_bytes"] = {k: v for k, v in sizes.items() if not k.startswith("third")}
    harness.write_json(results)


if __name__ == "__main__":
    harness.run(main)
