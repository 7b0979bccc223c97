"""The task spine: what every text task has, once; a task supplies only what is its own.

Shapes: n = records in a batch, m = rows kept, B = rows in a batch, T = time.

A task (classify, lm, translate, tag) is a ``TextTask`` subclass. It supplies:

===================  ===============================================================
its rows             ``columns`` (required columns of the user's files), and
                     ``corpus_source`` (the embedded corpus' rows, if it has one)
its encoding         ``encode_rows(config, state, rows, counter)``: rows -> examples
                     (a ragged batch: sequence features int32 ``[m, (T)]``, scalars
                     ``[m]``), and ``features`` (``tfseq.model_inputs.ModelFeatures``):
                     which of them the model reads and learns
its model            ``build_model(config, state, model_config)``
its serving          ``serving_module(...)`` (the export's signature) and
                     ``prediction_line(row)`` (``tfseq-predict``'s output line)
===================  ===============================================================

and the spine does the rest for every task: the user's files and formats (``sources``), the
hold-out split, the checks on text columns, the vocabularies and label sets learned in one pass
(``state``), label lookup, the batching seam (``tfseq.batching.Batching``: pad | bucket |
pack from the config), the resumable shuffled training stream (``tfseq.resumable``), the
evaluation batches, and the split of global batches over replicas.

Element spec of every dataset a task gives (``TaskData.train`` / ``.eval``), for
``model.fit``: ``(inputs, targets, weights)`` as ``ModelFeatures`` makes them from padded
(pad, bucket) or packed (pack) batches.
"""

from __future__ import annotations

import weakref
from typing import Callable, ClassVar

import tensorflow as tf
import tensorflow_text as tf_text

from tfseq.pipelines import runs, sources
from tfseq.pipelines.config import TextConfig, batching_of
from tfseq.pipelines.records import TrainingRecords, training_records
from tfseq.pipelines.sources import Source
from tfseq.pipelines.state import PassReport, TaskState, prepare
from tfseq.pipelines.task_data import TaskData
from tfseq.pipelines.tasks import Task
from tfseq._common import pipeline_options
from tfseq.batching import Batching
from tfseq.filtering import line_checks
from tfseq.errors import InputError
from tfseq.model_inputs import ModelFeatures
from tfseq.distribute import replica_dataset_fn
from tfseq.resumable import ResumableStream
from tfseq.shuffling import RecordShards
from tfseq.splitting import split
from tfseq.stats import BatchStats, DropCounter
from tfseq.text import BOS_ID, EOS_ID, get_tokenizer


def _resolved_once(source_fn):
    """``source(config, split)`` resolved once per config and split (globs matched, format
    inferred, columns checked) and the same ``Source`` returned after: every use in a run sees
    the same files. Errors are not kept (a corrected file is seen on the next call)."""
    def source(self, config, split):
        cache = self.__dict__.setdefault("_resolved_sources", {})
        key = (source_fn.__qualname__, config, split)
        try:
            hash(key)
        except TypeError:  # an unhashable config (a list in it): resolved each time
            return source_fn(self, config, split)
        if key not in cache:
            cache[key] = source_fn(self, config, split)
        return cache[key]

    source.__doc__, source.__name__ = source_fn.__doc__, source_fn.__name__
    return source


class TextTask(Task):
    """A text task on the spine; see the module docstring for what a subclass supplies.

    Class attributes:
      name: the ``--task`` name.
      Config: its ``TextConfig`` subclass.
      columns: the columns its rows need; ``allowed_columns`` the ones it accepts.
      text_columns: columns checked as text lines (``tfseq.filter_lines``' reasons).
      vocab_columns: ``{vocabulary name: columns it learns from}``.
      label_columns: columns whose values are discovered into label sets; ``encode_fn`` turns
        each into an int32 id (index in the set; -1: ``unknown_label``), except the
        ``token_label_columns`` (one label per token), which ``encode_rows`` looks up.
      features: the ``ModelFeatures`` of its model.
      aligned: ``Batching.aligned``: per-token targets packed with their input.
      pack_split: long examples are split across packed rows of one length (lm).
      model_module: the module with ``ModelConfig`` and ``build_model``.
      prediction_input: the export's input name (``text`` or ``source``).
    """

    name: ClassVar[str]
    Config: ClassVar[type] = TextConfig
    columns: ClassVar[tuple[str, ...]] = ("text",)
    allowed_columns: ClassVar[tuple[str, ...] | None] = None
    text_columns: ClassVar[tuple[str, ...]] = ("text",)
    vocab_columns: ClassVar[dict[str, tuple[str, ...]]] = {"vocab": ("text",)}
    label_columns: ClassVar[tuple[str, ...]] = ()
    token_label_columns: ClassVar[tuple[str, ...]] = ()
    features: ClassVar[ModelFeatures]
    aligned: ClassVar[tuple[tuple[str, str], ...]] = ()
    pack_split: ClassVar[bool] = False
    model_module: ClassVar[str]
    prediction_input: ClassVar[str] = "text"

    # ----- rows

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "source" in cls.__dict__:  # a task's own source is resolved once too
            cls.source = _resolved_once(cls.__dict__["source"])

    @_resolved_once
    def source(self, config, split: str) -> Source:
        """The records of ``split``: the user's files, else the embedded corpus (resolved once
        per config and split)."""
        if config.train_files:
            return sources.user_source(config, split, required=self.columns,
                                       allowed=self.allowed_columns or self.columns)
        if config.eval_files:
            raise InputError("--eval_files applies to --train_files, which is not given")
        return self.corpus_source(config, split)

    def corpus_source(self, config, split: str) -> Source:
        raise InputError(f"--task={self.name} needs --train_files (it has no embedded corpus)")

    def fixed_labels(self, config) -> dict[str, tuple[str, ...]]:
        """Label sets known without reading the data (the embedded corpus' classes)."""
        return {}

    def check_labels(self, labels: dict[str, tuple[str, ...]]) -> None:
        """Raises ``InputError`` on label sets the task cannot learn from."""

    def label_values(self, column: str, values: tf.Tensor) -> tf.Tensor:
        """``tf.string [m]`` values of a label column -> the labels they hold (``[k]``)."""
        return tf.strings.strip(values)

    def clean_rows(self, config, rows: dict, counter: DropCounter) -> dict:
        """Drops rows whose text columns are not usable lines (``filter_lines``' reasons:
        ``too_many_bytes``, ``invalid_utf8``, ``nul_byte``, ``empty``), counted."""
        checks = {}
        counter.register("too_many_bytes", "invalid_utf8", "nul_byte", "empty")
        for column in self.text_columns:
            if column in rows:
                for reason, fires in line_checks(rows[column], config.max_line_bytes).items():
                    checks[reason] = fires if reason not in checks else checks[reason] | fires
        if not checks:
            return rows
        keep = counter.keep_if(checks)
        return {k: tf.boolean_mask(v, keep) for k, v in rows.items()}

    # ----- learned state

    def records(self, config) -> TrainingRecords:
        """The training records of ``config``: one source, or a mixture of several
        (``pipelines.records``; the same object for the same config)."""
        cache = self.__dict__.setdefault("_records", {})
        try:
            hash(config)
        except TypeError:  # an unhashable config (a list in it): made each time
            return training_records(self, config)
        if config not in cache:
            cache[config] = training_records(self, config)
        return cache[config]

    def prepare(self, config, *, shards: RecordShards | None = None, fingerprint=None,
                write=None) -> tuple[TaskState, PassReport]:
        """The vocabularies and label sets of the training data, in at most one read
        (``pipelines.state.prepare``), and the training shards written (``shards``)."""
        config.check()
        records = self.records(config)
        state, report = prepare(self, config, records.sources("train"),
                                shards=None if shards is None else records.pass_shards(shards),
                                fingerprint=fingerprint, write=write)
        if shards is not None:  # what the pass did not write (a mixture's sources)
            report.passes += records.spill(shards, fingerprint, write=write).passes
        return state, report

    # ----- encoding

    def encode_rows(self, config, state: TaskState, rows: dict, counter: DropCounter) -> dict:
        raise NotImplementedError

    def longest(self, config) -> int:
        """The most tokens of an example ``encode_rows`` emits (a batch must hold one)."""
        return config.max_length

    def encode_fn(self, config, state: TaskState, split: str,
                  counter: DropCounter) -> Callable[[tf.Tensor], dict]:
        """``records tf.string [n] -> examples`` of ``split`` (a graph function), every drop
        counted in ``counter``: parse, clean, label ids, ``encode_rows``."""
        source = self.source(config, split)
        tables = {column: label_table(state.labels[column]) for column in state.labels
                  if column in self.label_columns and column not in self.token_label_columns}

        def encode(records):
            rows = self.clean_rows(config, source.parse(records, counter), counter)
            if tables:
                counter.register("unknown_label")
                ids = {c: t.lookup(tf.strings.strip(rows[c])) for c, t in tables.items()}
                keep = counter.keep_if({"unknown_label": tf.reduce_any(
                    tf.stack([i < 0 for i in ids.values()]), axis=0)})
                rows = {k: tf.boolean_mask(ids.get(k, v), keep) for k, v in rows.items()}
            return self.encode_rows(config, state, rows, counter)

        return encode

    def batching(self, config) -> Batching:
        return batching_of(config, longest=self.longest(config), aligned=self.aligned,
                           pack_split=self.pack_split)

    def eval_batching(self, config) -> Batching:
        """Evaluation batches: by length, in file order, a budget of the training batch's
        cells (the model computes the same per-example function in every mode)."""
        longest = self.longest(config)
        cells = self.batching(config).cells(longest)
        return Batching("bucket", max_tokens=max(cells, longest), max_length=longest)

    # ----- datasets

    def eval_dataset(self, config, state: TaskState, counter: DropCounter,
                     stats: BatchStats | None = None, *, batching: Batching | None = None,
                     num_shards: int = 1, shard_index: int = 0) -> tf.data.Dataset:
        """Evaluation batches ``(inputs, targets, weights)``, in file order, source after
        source (``batching``: ``eval_batching`` by default)."""
        ds = None
        for sub in self.records(config).configs("eval"):
            encode = self.encode_fn(sub, state, "eval", counter)
            part = self.source(sub, "eval").read(num_shards, shard_index).map(
                encode, num_parallel_calls=tf.data.AUTOTUNE)
            ds = part if ds is None else ds.concatenate(part)
        batching = batching or self.eval_batching(config)
        ds = ds.apply(batching.transform(training=False, counter=counter))
        if stats is not None:
            ds = ds.apply(stats.track())
        return ds.map(self.features).prefetch(tf.data.AUTOTUNE).with_options(pipeline_options())

    def record_shards(self, config, *, num_workers: int = 1, worker: int = 0,
                      directory: str | None = None):
        """The training records as shuffle shards (``records(config).shards``)."""
        return self.records(config).shards(num_workers=num_workers, worker=worker,
                                           directory=directory)

    def training_stream(self, config, state: TaskState, counter: DropCounter,
                        shards: RecordShards, *, replicas: int = 1, parts: bool = False,
                        epoch: tf.Variable | None = None) -> ResumableStream:
        """The resumable training stream: global batches of ``replicas`` times the budget,
        each ``(inputs, targets, weights)``, or with ``parts`` (a ``tf.distribute`` run) a
        tuple of ``replicas`` such parts (``tfseq.split``: dummy rows of weight 0, never an
        empty part)."""
        batching = self.batching(config).scaled(replicas)

        def to_model(batch):
            if not parts:
                return self.features(batch)
            return tuple(self.features(part) for part in
                         split(batch, replicas, balance="tokens", equal_rows=True))

        encode = self.records(config).encode_fn(state, counter, shards,
                                                token_keys=self.features.inputs)
        return ResumableStream(shards, encode, batching.pool_batcher(counter), counter=counter,
                               seed=config.seed, epoch=epoch, map_fn=to_model,
                               token_keys=self.features.inputs, **batching.pool_size)

    def datasets(self, config, state: TaskState | None = None, *, write=None,
                 counters: dict | None = None) -> TaskData:
        """Everything ``model.fit`` needs, on one device: ``TaskData`` (``state``: learned
        from the training files when not given; ``counters``: the ``DropCounter`` of a split
        to count in, by split name; new ones otherwise)."""
        records = self.records(config)
        shards = records.shards()
        fingerprint = sources.fingerprint(records.files)
        if state is None:
            state, setup = self.prepare(config, shards=shards, fingerprint=fingerprint,
                                        write=write)
        else:
            setup = records.spill(shards, fingerprint, write=write)
        counters = {split: (counters or {}).get(split) or DropCounter(split)
                    for split in ("train", "eval")}
        stats = {"train": BatchStats(), "eval": BatchStats()}
        stream = self.training_stream(config, state, counters["train"], shards)
        train = committed(stream, stats["train"]).prefetch(tf.data.AUTOTUNE)
        eval_ds = self.eval_dataset(config, state, counters["eval"], stats["eval"])
        return TaskData(train.with_options(pipeline_options()), eval_ds, state, counters, stats,
                        stream, setup, records.drop_examples)

    # ----- the run

    modes: ClassVar[tuple[str, ...]] = ("single", "replicated", "multi_worker", "data_service")
    predicts_in_order: ClassVar[bool] = False  # tfseq-predict buckets by length, then reorders

    def open(self, model_dir: str, config, *, model_config, replicas: int = 1,
             workers: int = 1, worker: int = 0, write=None):
        """Opens (or starts) the run in ``model_dir`` (``runs.open_run``): its ``TaskState``
        learned in one read, or loaded on a resume, and its training shards."""
        return runs.open_run(model_dir, self, config, model_config=model_config,
                             replicas=replicas, workers=workers, worker=worker, write=write)

    def drop_examples(self, config, limit: int = 5) -> list[str]:
        """The first ``file:line: reason`` of the training files' malformed records."""
        return self.records(config).drop_examples(limit)

    def saved_state(self, model_dir: str, config) -> TaskState:
        """The vocabularies and label sets a run saved in ``model_dir``."""
        return TaskState.load(model_dir, list(self.vocab_columns), list(self.label_columns))

    def built(self, model, config, state: TaskState):
        return model

    def export_module(self, config, state: TaskState, model, asset_dir: str):
        """``(tf.Module, serving.json fields)`` of the export: a single-device copy of
        ``model`` (outside any strategy scope) behind ``serving_module``, with the tokenization
        settings and, for user files, the columns ``tfseq-predict`` reads by default."""
        served_model = self.build_model(config, state)
        served_model.set_weights(model.get_weights())
        module, meta = self.serving_module(config, state, served_model, asset_dir)
        meta.update(tokenizer=config.tokenizer, lowercase=config.lowercase,
                    max_length=config.max_length, long_examples=config.long_examples,
                    batching=config.batching)
        meta["input_column"] = self.input_column(config)
        if config.columns:  # user files: predict's default --columns
            meta["columns"] = list(config.columns)
            meta["format"] = config.format
            meta["header"] = bool(config.header)
        module.keras_model = served_model
        return module, meta

    # ----- model, serving, prediction

    def serving_module(self, config, state: TaskState, model, asset_dir: str):
        """``(tf.Module with serving_default, serving.json info)`` of the export."""
        raise NotImplementedError

    def prediction_line(self, row: dict) -> str:
        """One output line of ``tfseq-predict`` for one input line's prediction."""
        raise NotImplementedError

    def input_column(self, config) -> str:
        """The column of the training files that feeds the export's input (what
        ``tfseq-predict`` reads from files in the training format)."""
        return self.prediction_input

    def replica_dataset_fn(self, config, state: TaskState, counter: DropCounter, replicas: int,
                           *, data_service: str | None = None, stats: BatchStats | None = None):
        """``dataset_fn`` for ``strategy.distribute_datasets_from_function`` (the tf.data
        service path): records in file order (the service splits them among its workers),
        pools shuffled, global batches of ``replicas`` budgets split in graph (dummy rows of
        weight 0, never an empty replica), parts of ``(inputs, targets, weights)``."""
        source = self.source(config, "train")
        encode = self.encode_fn(config, state, "train", counter)
        batching = self.batching(config)

        def make_dataset(num_shards, shard_index):
            return source.read(num_shards, shard_index).map(
                encode, num_parallel_calls=tf.data.AUTOTUNE)

        def batch_fn(n):
            return batching.scaled(n).transform(training=True, seed=config.seed,
                                                counter=counter)

        def to_model(part):
            return self.features(part)

        fn = replica_dataset_fn(make_dataset, batch_fn, balance="tokens",
                                data_service=data_service, map_fn=to_model)
        if stats is None:
            return fn
        return lambda context: fn(context).apply(_tracked(stats))


def _tracked(stats: BatchStats):
    """Adds the real tokens and cells of ``(inputs, targets, weights)`` parts to ``stats``:
    real tokens are the weighted target positions of per-token targets, or the inputs'
    lengths."""

    def apply(ds):
        def count(x, y, w):
            first = next(iter(x))
            rows = tf.cast(tf.reduce_sum(tf.cast(w > 0, tf.int64)), tf.int64) \
                if w.shape.rank == 1 else tf.math.count_nonzero(tf.reduce_max(w, axis=1))
            real = tf.math.count_nonzero(x[first], dtype=tf.int64) if w.shape.rank == 1 \
                else tf.math.count_nonzero(w, dtype=tf.int64)
            ops = [stats.real_tokens.assign_add(real),
                   stats.cells.assign_add(tf.cast(tf.size(x[first]), tf.int64)),
                   stats.examples.assign_add(rows), stats.batches.assign_add(1)]
            with tf.control_dependencies(ops):
                return tf.nest.map_structure(tf.identity, (x, y, w))
        return ds.map(count)

    return apply


def committed(stream: ResumableStream, stats: BatchStats | None = None) -> tf.data.Dataset:
    """A stream's batches for ``model.fit``: its counts and batch numbers are added to the
    counter and ``stats`` in graph as the batches pass (read ahead of the model by the
    prefetch; a ``tfseq.training.Trainer`` adds them exactly when it takes a batch)."""
    ds = stream.dataset()
    keys = stream.count_keys
    variables = [stream.counter.variable(key) for key in keys]

    def commit(batch, meta):
        ops = [v.assign_add(meta["counts"][i]) for i, v in enumerate(variables)]
        if stats is not None:
            ops += [stats.real_tokens.assign_add(meta["tokens"]),
                    stats.cells.assign_add(meta["cells"]),
                    stats.examples.assign_add(meta["examples"]),
                    stats.batches.assign_add(tf.cast(meta["examples"] > 0, tf.int64))]
        with tf.control_dependencies(ops):
            return tf.nest.map_structure(tf.identity, batch), tf.identity(meta["examples"])

    # A pool left with no example gives an empty batch only to carry its counts: skip it.
    return (ds.map(commit).filter(lambda batch, examples: examples > 0)
            .map(lambda batch, examples: batch))


_TOKENIZERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # vocab -> {name: tok}


def token_ids(config, vocab, texts: tf.Tensor, *, add_bos: bool = False,
              add_eos: bool = False) -> tf.RaggedTensor:
    """``tf.string [m]`` -> int32 ``[m, (T)]`` ids: ``config.lowercase``, ``config.tokenizer``
    and ``vocab``, with ``<s>``/``</s>`` if asked (as ``tfseq.tokenize``)."""
    cache = _TOKENIZERS.setdefault(vocab, {})
    if config.tokenizer not in cache:
        cache[config.tokenizer] = get_tokenizer(config.tokenizer, vocab)
    if config.lowercase:
        texts = tf_text.case_fold_utf8(texts)
    ids = vocab.lookup(cache[config.tokenizer].tokenize(texts))
    rows = tf.shape(texts)[0]
    parts = [ids]
    if add_bos:
        parts.insert(0, tf.RaggedTensor.from_tensor(tf.fill([rows, 1], BOS_ID)))
    if add_eos:
        parts.append(tf.RaggedTensor.from_tensor(tf.fill([rows, 1], EOS_ID)))
    return tf.concat(parts, axis=1) if len(parts) > 1 else ids


def label_table(names) -> tf.lookup.StaticHashTable:
    """label string -> int32 id (its index in ``names``; -1 if unknown)."""
    with tf.init_scope():
        return tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(list(names)), tf.range(len(names), dtype=tf.int32)),
            default_value=-1)


def limit_lengths(config, counter: DropCounter, examples: dict, limits: dict[str, int], *,
                  min_length: dict[str, int] | None = None,
                  over: tf.Tensor | None = None) -> dict:
    """``config.long_examples`` on ragged examples: ``"truncate"`` cuts each feature of
    ``limits`` to its limit (counted under seen ``truncated``, once per example), ``"drop"``
    drops examples over a limit (``too_long``); examples under ``min_length`` are dropped
    (``too_short``). ``over`` (bool ``[m]``): the examples that were over a limit before an
    encoding cut them to it in its own way (a KerasHub tokenizer keeps its end token)."""
    if over is None:
        over = tf.zeros([examples[next(iter(limits))].nrows()], tf.bool)
        for key, limit in limits.items():
            over |= examples[key].row_lengths() > limit
    checks = {}
    notes = []
    if config.long_examples == "truncate":
        notes.append(counter.note("truncated", tf.reduce_sum(tf.cast(over, tf.int64))))
        examples = {k: (v[:, :limits[k]] if k in limits else v) for k, v in examples.items()}
    else:
        counter.register("too_long")
        checks["too_long"] = over
    short = tf.zeros_like(over)
    for key, least in (min_length or {}).items():
        short |= examples[key].row_lengths() < least
    if min_length:
        counter.register("too_short")
        checks = {"too_short": short, **checks}
    if not checks:
        return examples
    with tf.control_dependencies(notes):
        keep = counter.keep_if(checks)
    return {k: tf.gather(v, tf.where(keep)[:, 0]) for k, v in examples.items()}
