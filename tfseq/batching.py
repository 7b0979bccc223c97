"""Plain batching: ``pad_batch`` to dense ``[B, T]`` plus lengths, or to RaggedTensor.

Shapes: B = batch, T = the longest sequence in the batch.

Padded batch of ``{"ids": [5, 6, 7]}, {"ids": [8]}`` with ``batch_size=2``::

    ids         [[5, 6, 7],
                 [8, 0, 0]]
    ids_length   [3, 1]

With ``ragged=True``: ``ids`` is ``<tf.RaggedTensor [[5, 6, 7], [8]]>`` and no length key.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfseq._common import LENGTH_SUFFIX, Transform, check_positive_int, example_keys, unbatch
from tfseq.errors import InputError


def add_lengths(keys) -> callable:
    """Map function adding ``<name>_length`` (int32 scalar) for each sequence feature in ``keys``."""

    def add(example):
        example = dict(example)
        for k in keys:
            example[k + LENGTH_SUFFIX] = tf.shape(example[k], out_type=tf.int32)[0]
        return example

    return add


def pad_batch(batch_size: int, *, ragged: bool = False, drop_remainder: bool = False,
              prefetch: bool = True) -> Transform:
    """Transformation batching examples in arrival order.

    Args:
      batch_size: examples per batch (the last batch may be smaller).
      ragged: emit ``int32 RaggedTensor [B, (T)]`` sequence features and no length keys,
        instead of dense ``[B, T]`` padded with 0 plus ``"<name>_length"`` int32 ``[B]``.
      drop_remainder: drop a last, smaller batch (off by default: nothing is lost).
      prefetch: end with ``prefetch(AUTOTUNE)``.

    Returns:
      A ``Dataset.apply`` transformation. Scalar features become ``[B]``. Ragged batches of
      examples in the input are unbatched first (one tf.data call per example: use
      ``bucket_by_length``/``pack`` for the fast path).

    Raises:
      TypeError/ValueError: bad ``batch_size``; (when applied) no sequence feature.
    """
    check_positive_int("batch_size", batch_size)

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        keys, batched = example_keys(dataset.element_spec, "pad_batch")
        if batched:  # ragged batches of examples: re-batch their examples to batch_size
            dataset = unbatch(dataset)
        if ragged:
            out = dataset.ragged_batch(batch_size, drop_remainder=drop_remainder)
        else:
            out = dataset.map(add_lengths(keys), num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=None)
            out = out.padded_batch(batch_size, drop_remainder=drop_remainder)
        return out.prefetch(tf.data.AUTOTUNE) if prefetch else out

    return apply


# ----------------------------------------------------------------------------- the seam
#
# The one place that knows what each batching mode means: its budget, the flags that apply to
# it, how it checks a task's lengths, its pools, its shape budget and its transformation. Every
# other module asks ``mode_of(name)`` or a ``Batching``; adding a mode is a ``Mode`` subclass
# here, registered in ``MODES``.

DEFAULT_POOL_BUDGETS = 256   # bucket: budgets of tokens per pool
PAD_POOL_BATCHES = 64        # pad: batches per pool
PACK_POOL_BATCHES = 128      # pack: batches' worth of tokens per pool
_FUSE_SHIFT = 32
# The flags that size batches, and the modes each applies to (``Mode.flags``).
MODE_FLAGS = ("batch_size", "max_tokens", "block_length", "boundaries")


class Mode:
    """One batching mode. Attributes: ``name``; ``description`` (one line, for ``--help``);
    ``budget``: the ``Batching`` field that is a batch's budget (``batch_size`` rows or
    ``max_tokens`` cells), what a resume keeps per replica; ``flags``: the ``MODE_FLAGS``
    that apply to it; ``predicts``: inference can batch this way (one output per input);
    ``packs``: a row holds several examples, which a model keeps apart by their segment ids
    (a model that takes a padding mask only cannot train on it)."""

    name = ""
    description = ""
    budget = "max_tokens"
    flags: tuple[str, ...] = ()
    predicts = True
    packs = False

    def check(self, b: "Batching", longest: int, pack_split: bool) -> "Batching":
        """``b`` for a task whose examples have at most ``longest`` tokens; raises
        ``InputError`` (naming the values) when its budgets cannot hold one."""
        return b

    def cells(self, b: "Batching", longest: int) -> int:
        """The cells (rows x padded length) a batch may hold: evaluation's bucket budget."""
        return b.max_tokens

    def pool_size(self, b: "Batching") -> dict:
        raise NotImplementedError

    def num_shapes(self, b: "Batching") -> int:
        raise NotImplementedError

    def pool_batcher(self, b: "Batching", counter):
        raise NotImplementedError

    def transform(self, b: "Batching", *, training: bool, seed, counter) -> Transform:
        raise NotImplementedError


class Pad(Mode):
    name, budget, flags = "pad", "batch_size", ("batch_size",)
    description = "batch_size rows in arrival order, padded to the longest"

    def cells(self, b, longest):
        return b.batch_size * longest

    def pool_size(self, b):
        return {"pool_examples": PAD_POOL_BATCHES * b.batch_size}

    def num_shapes(self, b):
        return 1

    def pool_batcher(self, b, counter):
        return _PadPools(b.batch_size, b.max_length if b.static_shapes else None)

    def transform(self, b, *, training, seed, counter):
        if b.static_shapes and training:
            pools = _PadPools(b.batch_size, b.max_length)
            return lambda ds: pad_batch(b.batch_size, ragged=True, prefetch=False)(
                ds).map(pools.finish, num_parallel_calls=tf.data.AUTOTUNE)
        return pad_batch(b.batch_size)


class Bucket(Mode):
    name, flags = "bucket", ("max_tokens", "boundaries")
    description = "examples of similar length under a max_tokens budget"

    def check(self, b, longest, pack_split):
        if b.max_tokens < longest:
            raise InputError(f"max_tokens={b.max_tokens} cannot hold one example of {longest} "
                             "tokens (max_length); raise max_tokens or lower max_length")
        return b

    def pool_size(self, b):
        return {"pool_tokens": DEFAULT_POOL_BUDGETS * b.max_tokens}

    def num_shapes(self, b):
        return len(b._static_bounds())

    def pool_batcher(self, b, counter):
        from tfseq.bucketing import Bucketer
        return Bucketer(**b._bucket_args(shuffle=True, seed=0, static=b.static_shapes),
                        counter=counter)

    def transform(self, b, *, training, seed, counter):
        from tfseq.bucketing import bucket_by_length
        args = b._bucket_args(shuffle=training, seed=seed, static=b.static_shapes and training)
        if b.pool_examples:
            args["pool_size"] = b.pool_examples
        return bucket_by_length(**args, counter=counter)


class Pack(Mode):
    name, flags, predicts, packs = "pack", ("max_tokens", "block_length"), False, True
    description = "rows of block_length tokens holding several examples, max_tokens a batch"

    def check(self, b, longest, pack_split):
        block = b.block_length
        widest = block if isinstance(block, int) else max(block)
        if b.max_tokens < widest:
            raise InputError(f"max_tokens={b.max_tokens} is smaller than one packed row "
                             f"of {widest} tokens (block_length)")
        if widest < longest:
            if not (pack_split and isinstance(block, int)):
                raise InputError(f"block_length={block}: the longest row is shorter than an "
                                 f"example may be ({longest} tokens); add a longer row, or "
                                 "lower max_length")
            return dataclasses.replace(b, long_examples="split")
        return b

    def pool_size(self, b):
        return {"pool_tokens": PACK_POOL_BATCHES * b.max_tokens}

    def num_shapes(self, b):
        return len(b.block_length) if isinstance(b.block_length, tuple) else 1

    def pool_batcher(self, b, counter):
        fused = _Fused(b._packer(counter), b.aligned)
        return _FullRows(fused, b.max_tokens) if b.static_shapes else fused

    def transform(self, b, *, training, seed, counter):
        fused = _Fused(b._packer(counter), b.aligned)
        if b.static_shapes and training:
            full = _FullRows(fused, b.max_tokens)
            return lambda ds: fused.transform(ds).map(full.fill,
                                                      num_parallel_calls=tf.data.AUTOTUNE)
        return fused.transform


MODES: dict[str, Mode] = {m.name: m for m in (Pad(), Bucket(), Pack())}


def mode_of(name: str) -> Mode:
    """The ``Mode`` called ``name``.

    Raises:
      InputError: an unknown mode (naming the known ones).
    """
    if name not in MODES:
        raise InputError(f"Unknown batching {name!r}; expected one of {tuple(MODES)}")
    return MODES[name]


def flag_refused(flag: str, mode: str) -> str:
    """The message for a ``MODE_FLAGS`` flag given with a mode it does not apply to."""
    modes = [m.name for m in MODES.values() if flag in m.flags]
    hints = {"batch_size": " (use --max_tokens for a token budget)",
             "max_tokens": " (use --batch_size)"}
    return (f"--{flag} applies to --batching={' or '.join(modes)}, not --batching={mode}"
            + (hints.get(flag, "") if mode_of(mode).budget != MODES[modes[0]].budget else ""))


@dataclasses.dataclass(frozen=True)
class Batching:
    """How examples become batches: the one seam between tasks and ``pad_batch`` |
    ``bucket_by_length`` | ``pack``.

    A task says which mode and budgets; the seam gives the streaming transformation (evaluation,
    ``training_pipeline``), the pool batcher of a resumable stream (``tfseq.resumable``) and the
    pools' size, so a task never branches on the mode (each mode is a ``Mode`` in ``MODES``).

    Attributes:
      mode: ``"pad"`` (``batch_size`` rows in arrival order), ``"bucket"`` (``max_tokens``
        cells, examples of similar length) or ``"pack"`` (rows of ``block_length`` tokens
        holding several examples, ``max_tokens`` cells).
      batch_size: rows per batch for ``"pad"``.
      max_tokens: cells (rows x padded length) per batch for ``"bucket"`` and ``"pack"``.
      max_length: the longest example, in tokens over every sequence feature (``"bucket"``
        drops and counts longer ones as ``too_long``); ``None``: the budget's.
      block_length: ``"pack"``: the row length, or several (each example goes into the
        shortest that holds it; one sequence feature, after ``aligned`` fusion).
      max_segments: ``"pack"``: examples per row and the width of the scalar tables.
      boundaries: ``"bucket"``: inclusive upper lengths of the buckets; ``()``: every length
        its own bucket (the most efficient).
      long_examples: ``"pack"``: ``"split"``, ``"truncate"`` or ``"drop"`` examples longer
        than a row (``tfseq.pack``).
      aligned: ``"pack"``: pairs ``(feature, primary)`` of sequence features with the lengths
        of ``primary`` (tags of tokens, next-token targets): packed in the same cells as
        ``primary`` (two ids in one int64 while packing), so the packer sees one feature.
      static_shapes: training batches of at most ``num_shapes`` shapes, for a jit-compiled
        step: ``"pad"`` pads to ``max_length`` and ``batch_size`` rows; ``"bucket"`` pads to
        the bucket bounds (``boundaries``, or 8, 16, 32, ... up to ``max_length`` when there
        are none) and fills each batch to that bound's rows (``bucket_by_length(
        pad_to_boundary=True, fill_rows=True)``); ``"pack"`` fills each batch to
        ``max_tokens // row length`` rows. Added rows have no token and weigh 0 (a
        ``"weight"`` of 0, or no segment). Evaluation batches are not changed.
      pool_examples: ``"bucket"``'s streaming transformation: a pool closes at this many
        examples (bounds its memory; ``None``: by tokens).

    Raises:
      InputError: an unknown mode; ValueError: a budget that is not positive (naming it).
    """

    mode: str = "bucket"
    batch_size: int = 64
    max_tokens: int = 2048
    max_length: int | None = None
    block_length: int | tuple[int, ...] = 128
    max_segments: int | None = None
    boundaries: tuple[int, ...] = ()
    long_examples: str = "truncate"
    aligned: tuple[tuple[str, str], ...] = ()
    static_shapes: bool = False
    pool_examples: int | None = None

    def __post_init__(self):
        mode_of(self.mode)
        check_positive_int("batch_size", self.batch_size)
        check_positive_int("max_tokens", self.max_tokens)
        check_positive_int("max_length", self.max_length, allow_none=True)

    @classmethod
    def for_examples(cls, mode: str, *, longest: int, pack_split: bool = False,
                     block_length=128, boundaries=(), **kwargs) -> "Batching":
        """The batching of examples of at most ``longest`` tokens: ``block_length`` a sorted
        tuple (or one int), ``boundaries`` cut at ``longest``; ``pack_split``: with one row
        length, split longer examples across rows instead of refusing them (lm).

        Raises:
          InputError: a budget that cannot hold one example of ``longest`` tokens, or row
            lengths whose longest is shorter than that (naming the values).
        """
        if isinstance(block_length, (list, tuple)):
            block = tuple(sorted(set(int(b) for b in block_length)))
            block_length = block[0] if len(block) == 1 else block
        b = cls(mode, max_length=longest, block_length=block_length,
                boundaries=tuple(x for x in boundaries if x <= longest), **kwargs)
        return mode_of(mode).check(b, longest, pack_split)

    @property
    def budget(self) -> str:
        """The field that is this mode's budget (``batch_size`` or ``max_tokens``)."""
        return mode_of(self.mode).budget

    def cells(self, longest: int) -> int:
        """The cells a batch may hold (pad: ``batch_size`` rows of ``longest``)."""
        return mode_of(self.mode).cells(self, longest)

    def scaled(self, n: int) -> "Batching":
        """The batching of one global batch shared by ``n`` replicas: ``n`` times the rows
        (``"pad"``) or the cells (``"bucket"``, ``"pack"``) of one replica's budget."""
        return dataclasses.replace(self, batch_size=self.batch_size * n,
                                   max_tokens=self.max_tokens * n)

    @property
    def pool_size(self) -> dict:
        """When a resumable stream's pool closes: ``{"pool_tokens": n}`` or
        ``{"pool_examples": n}``."""
        return mode_of(self.mode).pool_size(self)

    @property
    def num_shapes(self) -> int | None:
        """With ``static_shapes``: the most distinct training batch shapes (what a
        jit-compiled step compiles); None without it."""
        return mode_of(self.mode).num_shapes(self) if self.static_shapes else None

    def pool_batcher(self, counter=None):
        """The pool batcher of this mode: ``pool_batches(pool, pool_seed)`` (every example of
        one pool in batches) and ``finish(element)`` (one of them -> a batch)."""
        return mode_of(self.mode).pool_batcher(self, counter)

    def transform(self, *, training: bool, seed: int | None = None, counter=None) -> Transform:
        """The streaming transformation: ragged batches (or examples) -> batches. With
        ``training`` the order inside pools is shuffled from ``seed`` (and ``static_shapes``
        applies); without, arrival order is kept where the mode allows (evaluation)."""
        return mode_of(self.mode).transform(self, training=training, seed=seed,
                                            counter=counter)

    def _static_bounds(self) -> tuple[int, ...]:
        """``"bucket"`` with ``static_shapes``: the padded lengths (the buckets' bounds)."""
        longest = self.max_length or self.max_tokens
        if self.boundaries:
            bounds = [b for b in self.boundaries if b < longest]
        else:
            bounds, b = [], 8
            while b < longest:
                bounds.append(b)
                b *= 2
        return tuple(bounds) + (longest,)

    def _bucket_args(self, *, shuffle: bool, seed, static: bool = False) -> dict:
        args = dict(max_tokens=self.max_tokens, max_length=self.max_length,
                    boundaries=list(self.boundaries) or None, shuffle=shuffle, seed=seed)
        if static:
            args.update(boundaries=list(self._static_bounds()),
                        max_length=self.max_length or self.max_tokens,
                        pad_to_boundary=True, fill_rows=True)
        return args

    def _packer(self, counter):
        from tfseq.packing import Packer
        block = self.block_length
        return Packer(list(block) if isinstance(block, tuple) else block,
                      max_tokens=self.max_tokens, long_examples=self.long_examples,
                      max_segments=self.max_segments, counter=counter)


class _PadPools:
    """``"pad"`` pools: the pool's examples in arrival order, ``batch_size`` per batch; with
    ``pad_length`` every batch is ``[batch_size, pad_length]`` (added rows weigh 0)."""

    def __init__(self, batch_size: int, pad_length: int | None = None):
        self.batch_size = batch_size
        self.pad_length = pad_length

    def pool_batches(self, pool, pool_seed):
        del pool_seed  # arrival order: the records come shuffled
        first = next(v for v in pool.values())
        rows = first.nrows() if isinstance(first, tf.RaggedTensor) else tf.shape(first)[0]
        rows = tf.cast(rows, tf.int64)
        size = tf.constant(self.batch_size, tf.int64)
        sizes = tf.minimum(size, rows - tf.range(0, rows, size))
        return {k: tf.RaggedTensor.from_row_lengths(
            v, tf.cast(sizes, v.row_splits.dtype if isinstance(v, tf.RaggedTensor) else tf.int64),
            validate=False) for k, v in pool.items()}

    def finish(self, rows):
        batch = {}
        for k, v in rows.items():
            if isinstance(v, tf.RaggedTensor):
                shape = None if self.pad_length is None else [None, self.pad_length]
                batch[k] = v.to_tensor(0, shape=shape)
                batch[k + LENGTH_SUFFIX] = tf.cast(v.row_lengths(), tf.int32)
            else:
                batch[k] = v
        if self.pad_length is None:
            return batch
        from tfseq.bucketing import fill_rows
        rows_now = tf.shape(next(iter(batch.values())))[0]
        return fill_rows(batch, self.batch_size - rows_now)


class _FullRows:
    """Packed batches filled to ``max_tokens // row length`` rows (empty rows: no segment,
    so they weigh 0): one shape per row length."""

    def __init__(self, batcher, max_tokens: int):
        self.batcher, self.max_tokens = batcher, max_tokens

    def pool_batches(self, pool, pool_seed):
        return self.batcher.pool_batches(pool, pool_seed)

    def finish(self, element):
        return self.fill(self.batcher.finish(element))

    def fill(self, batch):
        batch = dict(batch)
        key = next(k for k in batch if k.endswith("_segment_ids"))
        rows, width = tf.shape(batch[key])[0], tf.shape(batch[key])[1]
        extra = tf.maximum(self.max_tokens // width - rows, 0)
        return {k: tf.pad(v, [[0, extra]] + [[0, 0]] * (v.shape.rank - 1))
                for k, v in batch.items()}


class _Fused:
    """A packer whose ``aligned`` features ride in the cells of their primary feature: both
    ids in one int64 (primary << 32 | aligned) while packing, split again after."""

    def __init__(self, packer, aligned):
        self.packer = packer
        self.aligned = tuple(aligned)

    def _fuse(self, examples):
        examples = dict(examples)
        for name, primary in self.aligned:
            high = tf.cast(examples[primary], tf.int64)
            low = tf.cast(examples.pop(name), tf.int64)
            fused = tf.bitwise.bitwise_or(tf.bitwise.left_shift(high, _FUSE_SHIFT), low)
            examples[primary] = fused
        return examples

    def _split(self, batch, dtypes):
        batch = dict(batch)
        for name, primary in self.aligned:
            fused = batch[primary]
            batch[name] = tf.cast(tf.bitwise.bitwise_and(fused, (1 << _FUSE_SHIFT) - 1),
                                  dtypes[name])
            batch[primary] = tf.cast(tf.bitwise.right_shift(fused, _FUSE_SHIFT), dtypes[primary])
        return batch

    def _dtypes(self, spec):
        return {k: spec[k].dtype for pair in self.aligned for k in pair}

    def pool_batches(self, pool, pool_seed):
        self._pool_dtypes = {k: pool[k].dtype for pair in self.aligned for k in pair}
        return self.packer.pool_batches(self._fuse(pool), pool_seed)

    def finish(self, element):
        return self._split(self.packer.finish(element), getattr(self, "_pool_dtypes", {}))

    def transform(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        if not self.aligned:
            return dataset.apply(self.packer.transform)
        dtypes = self._dtypes(dataset.element_spec)
        fused = dataset.map(self._fuse, num_parallel_calls=tf.data.AUTOTUNE)
        return fused.apply(self.packer.transform).map(
            lambda b: self._split(b, dtypes), num_parallel_calls=tf.data.AUTOTUNE)
