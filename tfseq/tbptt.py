"""Truncated backpropagation through time: in-order chunks with reset flags.

Shapes: B = batch (rows), T = time of a padded batch, C = ``chunk_length``, N = tokens in a
corpus.

A recurrent model trained with truncated BPTT sees each long sequence as consecutive chunks of
``C`` steps, takes a gradient step after each chunk and (optionally) carries its state from one
chunk to the next, resetting it on rows where a new sequence starts. Two transformations make
those chunks:

- ``tbptt_chunks(C)`` cuts each padded batch into ``ceil(max_len / C)`` chunks, in order;
- ``tbptt_stream(B, C)`` treats a corpus as one long text, deals it into ``B`` contiguous
  streams and cuts them into chunks of inputs and next-token targets.

Both emit, per chunk (sequence features keep their names and dtypes)::

  {"ids":         int32 [B, C]   0-padded,
   "ids_length":  int32 [B]      tokens of this row in this chunk (0: the row has ended),
   "resets":      bool  [B]      true where the row's sequence starts in this chunk,
   "chunk_index": int64 [B]      0, 1, 2, ... in the order emitted (same value on every row),
   ...}

**Order is part of the contract.** Chunk ``k + 1`` of a row continues chunk ``k``; a carried
state is only right if chunks arrive exactly in the order emitted. Do not ``shuffle``,
``interleave`` or ``map(..., deterministic=False)`` after these transformations (shuffle the
sequences *before* batching instead). This is asserted, not just documented: every chunk carries
``chunk_index``, and a consumer checks that each index is the previous one plus 1, or 0 (a new
pass over the data, where every row resets). ``assert_chunks_in_order()`` does that check as the
last step of a pipeline, and ``models.stateful_lm.StatefulLM`` does it in every
``train_step`` / ``test_step``, so a shuffled chunk stream fails with an error naming the
indices instead of training on scrambled state.
"""

from __future__ import annotations

import tensorflow as tf

from tfseq._common import LENGTH_SUFFIX, Transform, check_keys, check_positive_int, require_dict_spec

RESETS = "resets"
CHUNK_INDEX = "chunk_index"
TARGETS = "targets"

# Examples per group when the token stream is gathered (see _token_stream).
_GROUP = 1024


def _is_padded_sequence(spec) -> bool:
    return isinstance(spec, tf.TensorSpec) and spec.shape.rank == 2 and spec.dtype.is_integer


def _check_reserved(spec, names, where: str) -> None:
    for name in names:
        if name in spec:
            raise ValueError(
                f"{where} adds the feature {name!r}, but the input already has it. "
                f"Rename it first. Features: {sorted(spec)}")


def _padded_sequence_keys(spec, key: str) -> list[str]:
    """``key`` first, then every other dense [B, T] integer feature that has a length key."""
    where = "tbptt_chunks"
    check_keys(spec, [key], where)
    if isinstance(spec[key], tf.RaggedTensorSpec):
        raise TypeError(
            f"{where} needs padded batches (pad_batch(..., ragged=False)); feature {key!r} is "
            f"ragged: {spec[key]!r}")
    check_keys(spec, [key + LENGTH_SUFFIX], where)
    if not _is_padded_sequence(spec[key]):
        raise ValueError(
            f"{where} needs {key!r} as an integer [batch, time] tensor (a padded batch); "
            f"received {spec[key]!r}")
    length_spec = spec[key + LENGTH_SUFFIX]
    if not (isinstance(length_spec, tf.TensorSpec) and length_spec.shape.rank == 1
            and length_spec.dtype.is_integer):
        raise ValueError(
            f"{where} needs {key + LENGTH_SUFFIX!r} as an integer [batch] tensor; "
            f"received {length_spec!r}")
    others = [k for k, s in spec.items()
              if k != key and _is_padded_sequence(s) and k + LENGTH_SUFFIX in spec]
    return [key] + others


def _ceil_div(x, y):
    return (x + y - 1) // y


def _chunk_time(values, lengths, num_chunks, chunk_length):
    """[B, T] -> [num_chunks, B, C]: zero past each row's length, pad/trim T to num_chunks * C."""
    width = num_chunks * chunk_length
    values = values[:, :width]
    values = tf.pad(values, [[0, 0], [0, width - tf.shape(values)[1]]])
    values = tf.where(tf.sequence_mask(lengths, width), values, tf.zeros_like(values))
    values = tf.reshape(values, [tf.shape(values)[0], num_chunks, chunk_length])
    values = tf.transpose(values, [1, 0, 2])
    values.set_shape([None, None, chunk_length])
    return values


def _add_chunk_index(index, chunk):
    rows = tf.shape(chunk[RESETS])[0]
    return {**chunk, CHUNK_INDEX: tf.fill([rows], index)}


def tbptt_chunks(chunk_length: int, *, key: str = "ids") -> Transform:
    """Transformation that cuts each padded batch into in-order chunks of ``chunk_length`` steps.

    Each batch gives ``max(1, ceil(max(ids_length) / chunk_length))`` chunks, one after the
    other. Every dense ``[B, T]`` integer feature with a ``<name>_length`` key (``key`` and, for
    example, ``"targets"``) is cut on the same time grid, 0-padded to ``[B, C]``, and its length
    becomes the number of its tokens inside the chunk: a row whose sequence has ended gets
    length 0 (no loss). ``resets`` is true on the first chunk of every batch (each row's sequence
    starts there) and false after. Every other feature (``"label"``, ``"weight"``, ...) is
    repeated unchanged in each chunk of its batch. The last, smaller batch is cut the same way.

    Worked example: ``key="ids"``, ``chunk_length=3``, one batch of three rows, lengths 7, 3, 5::

      ids (B=3, T=7)              chunk 0     chunk 1     chunk 2
      a1 a2 a3 a4 a5 a6 a7        a1 a2 a3    a4 a5 a6    a7 0  0
      b1 b2 b3 0  0  0  0         b1 b2 b3    0  0  0     0  0  0
      c1 c2 c3 c4 c5 0  0         c1 c2 c3    c4 c5 0     0  0  0
      ids_length                  3  3  3     3  0  2     1  0  0
      resets                      T  T  T     F  F  F     F  F  F
      chunk_index                 0  0  0     1  1  1     2  2  2

    ``chunk_index`` counts chunks over the whole dataset (the next batch starts at 3).

    Order: nothing downstream may reorder the chunks (see the module docstring); consumers
    check ``chunk_index`` (``assert_chunks_in_order``, ``StatefulLM``).

    Args:
      chunk_length: C, the number of time steps per chunk (positive int).
      key: the sequence feature that defines the batch, ``int [B, T]`` with
        ``<key>_length`` ``int32 [B]``.

    Returns:
      A ``dataset -> dataset`` function. Output elements: every sequence feature ``[B, C]``
      with its ``_length`` ``[B]``, ``resets`` bool ``[B]``, ``chunk_index`` int64 ``[B]``,
      other features as they were.

    Raises:
      TypeError: ``chunk_length`` is not an int; the elements are not dicts; ``key`` is ragged.
      ValueError: ``chunk_length`` is not positive; ``key`` or its length is missing or has
        the wrong rank/dtype; the input already has ``resets`` or ``chunk_index``.

    Example:
      >>> ds = tf.data.Dataset.from_tensors(
      ...     {"ids": tf.constant([[1, 2, 3, 4], [5, 6, 0, 0]]), "ids_length": tf.constant([4, 2])})
      >>> [c["ids_length"].numpy().tolist() for c in ds.apply(tbptt_chunks(3))]
      [[3, 2], [1, 0]]
    """
    check_positive_int("chunk_length", chunk_length)
    if not isinstance(key, str):
        raise TypeError(f"key must be a str; received key={key!r}")

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        spec = require_dict_spec(dataset.element_spec, "tbptt_chunks")
        seq_keys = _padded_sequence_keys(spec, key)
        _check_reserved(spec, [RESETS, CHUNK_INDEX], "tbptt_chunks")
        length_keys = [k + LENGTH_SUFFIX for k in seq_keys]
        other_keys = [k for k in spec if k not in seq_keys and k not in length_keys]

        def split(batch):
            lengths = {k: tf.cast(batch[k + LENGTH_SUFFIX], tf.int32) for k in seq_keys}
            max_length = tf.reduce_max(tf.stack(
                [tf.reduce_max(tf.concat([v, [0]], 0)) for v in lengths.values()]))
            num_chunks = tf.maximum(1, _ceil_div(max_length, chunk_length))
            starts = tf.range(num_chunks) * chunk_length
            rows = tf.shape(batch[key])[0]
            out = {}
            for k in seq_keys:
                out[k] = _chunk_time(batch[k], lengths[k], num_chunks, chunk_length)
                chunk_lengths = tf.clip_by_value(
                    lengths[k][tf.newaxis, :] - starts[:, tf.newaxis], 0, chunk_length)
                out[k + LENGTH_SUFFIX] = tf.cast(chunk_lengths, batch[k + LENGTH_SUFFIX].dtype)
            out[RESETS] = tf.broadcast_to((starts == 0)[:, tf.newaxis], [num_chunks, rows])
            for k in other_keys:
                value = batch[k]
                out[k] = tf.broadcast_to(
                    value[tf.newaxis], tf.concat([[num_chunks], tf.shape(value)], 0))
            return tf.data.Dataset.from_tensor_slices(out)

        return dataset.flat_map(split).enumerate().map(_add_chunk_index)

    return apply


def _token_stream(sequences: tf.data.Dataset, dtype) -> tf.data.Dataset:
    """One element: the concatenation of all 1-D ``sequences``, in order, as a [N] tensor.

    Sequences are padded into groups of ``_GROUP`` (a dense batch: fast) and unpadded, then
    the groups are gathered in a TensorArray. (``ragged_batch`` or ``padded_batch`` of the whole
    dataset at once reserve memory for the batch size, and unbatching costs a step per token.)
    """

    def unpad(values, lengths):
        return tf.boolean_mask(values, tf.sequence_mask(lengths, tf.shape(values)[1]))

    groups = (sequences.map(lambda values: (values, tf.size(values, out_type=tf.int32)))
              .padded_batch(_GROUP).map(unpad))

    def gather(_):
        parts = tf.TensorArray(dtype, size=0, dynamic_size=True, infer_shape=False,
                               element_shape=[None])
        parts = groups.reduce(parts, lambda parts, group: parts.write(parts.size(), group))
        return parts.concat()

    return tf.data.Dataset.from_tensors(0).map(gather)


def tbptt_stream(batch_size: int, chunk_length: int, *, key: str = "ids",
                 target_key: str = TARGETS) -> Transform:
    """Transformation that turns a corpus into ``batch_size`` contiguous streams, chunked.

    The input is a dataset of examples whose ``key`` is a 1-D integer tensor (e.g. one line of
    token ids); their concatenation, in dataset order, is the token stream ``x_0 .. x_{N-1}``.
    The ``N - 1`` prediction pairs ``(x_i -> x_{i+1})`` are dealt into ``batch_size`` contiguous
    streams: with ``q, r = divmod(N - 1, batch_size)``, stream ``b`` gets ``q + 1`` pairs if
    ``b < r`` else ``q``, starting right after stream ``b - 1``. Streams are then cut into
    chunks of ``chunk_length`` steps, in order: chunk ``k`` holds steps ``[k*C, (k+1)*C)`` of
    every stream, ``key`` = inputs, ``target_key`` = the next tokens.

    Exactly once: every token except ``x_0``, the first token of the corpus, is a target exactly
    once per pass (streams overlap by one token: the last target of stream ``b`` is the first
    input of stream ``b + 1``, so no token is lost at stream boundaries).

    Worked example: tokens 1..11 (N = 11, 10 pairs), ``batch_size=3``, ``chunk_length=2``
    (q=3, r=1: streams of 4, 3, 3 pairs)::

                      chunk 0     chunk 1
      ids             1  2        3  4
                      5  6        7  0
                      8  9        10 0
      targets         2  3        4  5
                      6  7        8  0
                      9  10       11 0
      ids_length      2  2  2     2  1  1
      resets          T  T  T     F  F  F
      chunk_index     0  0  0     1  1  1

    ``resets`` is true on the first chunk only (each stream starts there). The whole token
    stream is held in memory (one integer per token: 4 MB per million int32 tokens), since the
    stream boundaries depend on ``N``. A corpus with fewer than 2 tokens gives no chunk.

    Args:
      batch_size: the number of parallel streams B (positive int).
      chunk_length: C, the time steps per chunk (positive int).
      key: the 1-D integer sequence feature of the input examples; other features are dropped.
      target_key: the name of the next-token feature in the output.

    Returns:
      A ``dataset -> dataset`` function giving elements ``{key: [B, C], key_length: int32 [B],
      target_key: [B, C], target_key_length: int32 [B] (= key_length), "resets": bool [B],
      "chunk_index": int64 [B]}``, ids in the input dtype, 0-padded.

    Raises:
      TypeError: an argument has the wrong type; the elements are not dicts.
      ValueError: a size is not positive; ``key`` is missing or not a 1-D integer feature;
        ``target_key`` equals ``key``.
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("chunk_length", chunk_length)
    for name, value in (("key", key), ("target_key", target_key)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str; received {name}={value!r}")
    if key == target_key:
        raise ValueError(f"target_key must differ from key; received both {key!r}")

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        spec = require_dict_spec(dataset.element_spec, "tbptt_stream")
        check_keys(spec, [key], "tbptt_stream")
        s = spec[key]
        if not (isinstance(s, tf.TensorSpec) and s.shape.rank == 1 and s.dtype.is_integer):
            raise ValueError(
                f"tbptt_stream needs {key!r} as a 1-D integer tensor per example (unbatched); "
                f"received {s!r}")

        def streams(tokens):
            num_pairs = tf.maximum(tf.size(tokens, out_type=tf.int32) - 1, 0)
            base, rem = num_pairs // batch_size, num_pairs % batch_size
            row = tf.range(batch_size)
            lengths = base + tf.cast(row < rem, tf.int32)
            starts = row * base + tf.minimum(row, rem)
            num_chunks = _ceil_div(lengths[0], chunk_length)

            def chunk(index):
                index = tf.cast(index, tf.int32)
                steps = index * chunk_length + tf.range(chunk_length)
                valid = steps[tf.newaxis, :] < lengths[:, tf.newaxis]
                position = starts[:, tf.newaxis] + steps[tf.newaxis, :]
                position = tf.where(valid, position, 0)
                zeros = tf.zeros([batch_size, chunk_length], tokens.dtype)
                chunk_lengths = tf.clip_by_value(lengths - index * chunk_length, 0, chunk_length)
                return {
                    key: tf.where(valid, tf.gather(tokens, position), zeros),
                    key + LENGTH_SUFFIX: chunk_lengths,
                    target_key: tf.where(valid, tf.gather(tokens, position + 1), zeros),
                    target_key + LENGTH_SUFFIX: chunk_lengths,
                    RESETS: tf.fill([batch_size], tf.equal(index, 0)),
                }

            return tf.data.Dataset.range(tf.cast(num_chunks, tf.int64)).map(chunk)

        tokens = _token_stream(dataset.map(lambda example: example[key]), s.dtype)
        return tokens.flat_map(streams).enumerate().map(_add_chunk_index)

    return apply


def assert_chunks_in_order() -> Transform:
    """Transformation that fails if chunks from ``tbptt_chunks``/``tbptt_stream`` are reordered.

    Use it as the last step of a pipeline whose consumer carries state across chunks (the
    ``StatefulLM`` model makes the same check itself). Each chunk's ``chunk_index`` must be the
    previous one plus 1, or 0 (the start of a new pass, e.g. after ``repeat``); anything else
    raises ``tf.errors.InvalidArgumentError`` naming the expected and received index. Within one
    pass any reordering is caught, since index 0 occurs once.

    Returns:
      A ``dataset -> dataset`` function; elements pass through unchanged.

    Raises:
      TypeError: the elements are not dicts.
      ValueError: the elements have no ``chunk_index``.
    """

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        check_keys(require_dict_spec(dataset.element_spec, "assert_chunks_in_order"),
                   [CHUNK_INDEX], "assert_chunks_in_order")

        def check(expected, chunk):
            index = tf.reduce_max(chunk[CHUNK_INDEX])
            ok = tf.logical_or(tf.equal(index, expected), tf.equal(index, 0))
            message = ("tbptt chunks arrived out of order (was the chunked dataset shuffled or "
                       "interleaved?): expected chunk_index")
            with tf.control_dependencies([tf.debugging.Assert(
                    ok, [message, expected, "or 0, received", index])]):
                return index + 1, tf.nest.map_structure(tf.identity, chunk)

        return dataset.scan(tf.constant(0, tf.int64), check)

    return apply
