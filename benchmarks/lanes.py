"""Lanes: K independent copies of a pipeline over a split of the files, merged in a fixed
order, so sequential stages (a file interleave, a block reader's carried line, a map that
AUTOTUNE gives few threads) run K at a time. An experiment of ``python -m benchmarks.scaling
--lanes``, kept with its benchmark rather than in the library.

Lane ``l`` of K reads files ``l, l + K, l + 2K, ...`` and runs ``build`` on them, on its own
background thread (a ``prefetch`` at its end). The lanes' outputs are taken one element from
each lane in turn, a lane that has ended dropping out (``choose_from_datasets`` with a fixed
round-robin choice): the order depends only on K and the files, never on thread timing or the
number of cores, so the same elements come out in the same order on any machine. Every file is
in exactly one lane, so a pass has every element exactly once whenever each lane does.

K is configuration, not the core count: with a batching stage inside the lanes it changes the
batches (each lane pools only its own files). With K = 1 the result is ``build(files, 0)``.

Where lanes pay: reading and tokenizing, which on many cores run faster in a few lanes than in
one chain at the same CPU per token (docs/benchmarks.md#lanes). Bucketing or packing *inside*
each lane is slower than one batching stage: each lane's pools fill and drain in turn, and the
fixed merge order waits for the slowest lane. So: read and tokenize in lanes, batch once after
the merge::

    def read(files, index):
        del index
        return tfseq.text_lines(files, batch_size=512).apply(tfseq.tokenize(vocab))

    tokens = in_lanes("corpus/*.txt", read, num_lanes=4)
    batches = tokens.apply(tfseq.bucket_by_length(max_tokens=8192, seed=1))
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf

from tfseq.reading import resolve_files

DEFAULT_LANE_BUFFER = 2   # elements each lane prepares ahead on its own thread


def check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int; received {name}={value!r}")


def lane_files(files: Sequence[str], num_lanes: int) -> list[list[str]]:
    """The files of each lane: round-robin, file ``i`` in lane ``i % num_lanes``; lanes that
    would get no file are left out (fewer files than lanes gives one lane per file).

    >>> lane_files(["a", "b", "c", "d", "e"], 2)
    [['a', 'c', 'e'], ['b', 'd']]
    """
    check_positive_int("num_lanes", num_lanes)
    groups = [list(files[i::num_lanes]) for i in range(num_lanes)]
    return [g for g in groups if g]


def merge_lanes(lanes: Sequence[tf.data.Dataset], *,
                buffer: int = DEFAULT_LANE_BUFFER) -> tf.data.Dataset:
    """One element of each lane in turn (lane 0, 1, ..., K - 1, 0, ...), a lane that has ended
    dropping out; the stream ends when every lane has. Each lane runs ahead on its own thread
    by ``buffer`` elements. The order is fixed whatever the threads' timing.

    Args:
      lanes: datasets with the same element spec.
      buffer: elements each lane prepares ahead (its ``prefetch``).

    Returns:
      The merged dataset (unknown cardinality unless there is one lane).
    """
    check_positive_int("buffer", buffer)
    lanes = list(lanes)
    if not lanes:
        raise ValueError("merge_lanes needs at least one lane")
    if len(lanes) == 1:
        return lanes[0]
    spec = lanes[0].element_spec
    for i, lane in enumerate(lanes[1:], 1):
        if lane.element_spec != spec:
            raise ValueError(f"lane {i} has element spec {lane.element_spec}, lane 0 has "
                             f"{spec}: every lane must build the same kind of elements")
    # choose_from_datasets, not a parallel interleave of the lanes: a bucketing stage after an
    # interleave merge runs markedly slower.
    turns = tf.data.Dataset.range(len(lanes)).repeat()
    return tf.data.Dataset.choose_from_datasets(
        [lane.prefetch(buffer) for lane in lanes], turns, stop_on_empty_dataset=False)


def in_lanes(patterns, build: Callable[[list[str], int], tf.data.Dataset], *,
             num_lanes: int, buffer: int = DEFAULT_LANE_BUFFER) -> tf.data.Dataset:
    """``build`` run as ``num_lanes`` independent pipelines over a round-robin split of the
    files (``lane_files``), merged one element per lane in turn (``merge_lanes``).

    Args:
      patterns: files or globs (as ``text_lines`` takes them), resolved once here.
      build: ``(files, lane_index) -> tf.data.Dataset``: one lane's pipeline on its files (a
        list of paths); ``lane_index`` (0 .. K - 1) lets it seed each lane apart.
      num_lanes: K, the lanes; configuration, not the core count (a batching stage inside the
        lanes batches each lane's files apart). 4 was the fastest of 4, 8 and 16 for
        read + tokenize on 16 cores.
      buffer: elements each lane prepares ahead.

    Returns:
      The merged dataset: the same elements in the same order on any machine and at any
      ``tf.data`` parallelism, given the same files and K.

    Raises:
      FileNotFoundError: a pattern matches nothing.
      ValueError: ``num_lanes`` not a positive int, or lanes that build different element
        specs.
    """
    files = resolve_files(patterns)
    groups = lane_files(files, num_lanes)
    return merge_lanes([build(group, i) for i, group in enumerate(groups)], buffer=buffer)
