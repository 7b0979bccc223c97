"""Where each example of a whole part goes: the packing plan for one sequence feature.

Used by ``tfseq.pack`` when nothing is split (one sequence feature, with ``long_examples``
"drop" or "truncate", or "split" in a part with no example longer than the block): a part
(about 128 batches' worth of examples) is planned in one go, with a few hundred tf ops
whatever its size, instead of one build per few batches (``tfseq._pack_greedy``). The
strategies in ``tfseq._pack_planned`` cut the planned rows into batches.

The plan, for examples of lengths ``[P]`` (each in ``[1, block]``):

1. Big: an example longer than half a block never shares a row with another big one. Each gets
   a row of its own, and its gap takes the largest other examples that fit (matching rounds
   as in 4).
2. Fillers: of the rest, the shortest examples are set aside: enough to hold twice the tokens
   next-fit rows are expected to leave free (about half a length-biased example per row), at
   least ``_FILLERS_PER_ROW`` per row the part needs, at most half of the examples.
3. Runs: the others fill rows next-fit in their order (a row takes consecutive examples while
   they fit), so rows hold examples that arrived together.
4. Gaps: a few rounds give every open row at most one filler each, the largest that fits its
   gap, rows with larger gaps choosing first (a greedy matching: no two rows want the same
   filler); then the fillers, shortest first, are laid end to end over the gaps laid end to
   end, each landing inside one gap going there (twice); then a few more matching rounds.
5. Leftover fillers fill rows of their own, next-fit in their order.
6. Rows are put in the order of their oldest example, so big examples' rows and the fillers'
   rows fall among the others where their examples arrived (the short examples do not gather
   in the part's last batches); within a row, segments are in arrival order.

Every example gets exactly one row and segment; a row never holds more than ``block`` tokens
or more than ``segments`` examples.
"""

from __future__ import annotations

import tensorflow as tf

# Fillers set aside: at least this many per row the part needs, and at least this many times
# the tokens next-fit rows are expected to leave free.
_FILLERS_PER_ROW = 4
_FILL_VOLUME = 2.0
# Rounds of one-filler-per-row gap filling, before and after the bulk fill.
_MATCH_ROUNDS = 3


def _search(sorted_values: tf.Tensor, values: tf.Tensor, side: str) -> tf.Tensor:
    """``tf.searchsorted`` for 1-D int32 tensors, in fewer graph nodes (the graph is optimized
    again for every iterator, at a cost that grows with its node count)."""
    op = tf.raw_ops.UpperBound if side == "right" else tf.raw_ops.LowerBound
    return tf.reshape(op(sorted_inputs=tf.expand_dims(sorted_values, 0),
                         values=tf.expand_dims(values, 0), out_type=tf.int32), [-1])


def _indices(mask: tf.Tensor) -> tf.Tensor:
    """int32 ``[n]``: the positions where the 1-D ``mask`` is true."""
    return tf.cast(tf.reshape(tf.where(mask), [-1]), tf.int32)


def next_fit_runs(lengths: tf.Tensor, block: int, segments: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Rows filled next-fit: each takes consecutive examples while they fit.

    Args:
      lengths: int32 ``[M]``, each in ``[1, block]``.
      block: tokens per row.
      segments: most examples per row.

    Returns:
      int32 ``starts, ends`` ``[R]``: row r holds examples ``starts[r]:ends[r]``.

    Example:
      lengths ``[3, 4, 2, 5]``, block 6 -> starts ``[0, 1, 3]``, ends ``[1, 3, 4]``.
    """
    m = tf.size(lengths)
    ends_cum = tf.cumsum(lengths)
    starts_cum = tf.concat([[0], ends_cum], 0)                                 # [M + 1]
    p = tf.range(m + 1)
    reach = _search(ends_cum, starts_cum + block, "right")      # first misfit
    reach = tf.maximum(tf.minimum(reach, p + segments), tf.minimum(p + 1, m))
    # Row boundaries b[0] = 0, b[k + 1] = reach[b[k]], by doubling: xs = b[:n] and
    # power = reach applied n times, so power[xs] = b[n:2n].
    xs, _ = tf.while_loop(
        lambda xs, power: xs[-1] < m,
        lambda xs, power: (tf.concat([xs, tf.gather(power, xs)], 0), tf.gather(power, power)),
        (tf.zeros([1], tf.int32), reach),
        shape_invariants=(tf.TensorShape([None]), reach.shape))
    rows = tf.reduce_sum(tf.cast(xs < m, tf.int32))
    return xs[:rows], xs[1:rows + 1]


def _running_min(x: tf.Tensor) -> tf.Tensor:
    """``out[k] = min(x[:k + 1])`` for int32 ``[n]``, in log2(n) rounds."""
    n = tf.size(x)

    def body(x, shift):
        shifted = tf.concat([tf.fill([shift], x.dtype.max), x[:n - shift]], 0)
        return tf.minimum(x, shifted), shift * 2

    x, _ = tf.while_loop(lambda x, shift: shift < n, body, (x, tf.constant(1)),
                         shape_invariants=(x.shape, tf.TensorShape([])))
    return x


def _match(gap: tf.Tensor, cand_lengths: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """One round of gap filling: rows by decreasing gap each take the largest candidate that
    fits and is not taken by a row before them.

    Args:
      gap: int32 ``[R]``, free tokens per row (-1 for a row that takes nothing).
      cand_lengths: int32 ``[C]``, the candidates' lengths, ascending.

    Returns:
      ``rows, picks``: int32 ``[W]``, the rows that got a candidate and its index in
      ``cand_lengths`` (all distinct).
    """
    order = tf.argsort(gap, direction="DESCENDING", stable=True)
    best = _search(cand_lengths, tf.gather(gap, order), "right") - 1
    # The k-th row (in that order) takes min(best[k], its predecessor's pick - 1), i.e.
    # min over j <= k of best[j] + j, minus k.
    k = tf.range(tf.size(order))
    picks = _running_min(best + k) - k
    won = picks >= 0
    won = _indices(won)
    return tf.gather(order, won), tf.gather(picks, won)


def _match_rounds(lengths, block, segments, row_of, seg_of, fill, nseg, cand):
    """Up to ``_MATCH_ROUNDS`` rounds of ``_match``: rows' gaps take candidates.

    Args:
      lengths: int32 ``[P]``, every example's length.
      row_of, seg_of: int32 ``[P]``, each example's row (-1: not placed yet) and segment.
      fill, nseg: int32 ``[R]``, tokens and segments per row.
      cand: int32 ``[C]``, the candidates (example indices), by ascending length.

    Returns:
      ``row_of, seg_of, fill, nseg, cand`` updated (``cand``: those left).
    """
    def match_round(any_placed, row_of, seg_of, fill, nseg, cand):
        cand_lengths = tf.gather(lengths, cand)
        gap = tf.where(nseg < segments, block - fill, -1)
        won_rows, picks = _match(gap, cand_lengths)
        items = tf.expand_dims(tf.gather(cand, picks), 1)
        row_of = tf.tensor_scatter_nd_update(row_of, items, won_rows)
        seg_of = tf.tensor_scatter_nd_update(seg_of, items, tf.gather(nseg, won_rows) + 1)
        rows = tf.expand_dims(won_rows, 1)
        fill = tf.tensor_scatter_nd_add(fill, rows, tf.gather(cand_lengths, picks))
        nseg = tf.tensor_scatter_nd_add(nseg, rows, tf.ones_like(won_rows))
        left = tf.tensor_scatter_nd_update(tf.fill(tf.shape(cand), True),
                                           tf.expand_dims(picks, 1),
                                           tf.zeros_like(picks, tf.bool))
        return (tf.size(picks) > 0, row_of, seg_of, fill, nseg,
                tf.gather(cand, _indices(left)))

    return tf.while_loop(
        lambda any_placed, row_of, seg_of, fill, nseg, cand: any_placed & (tf.size(cand) > 0),
        match_round, (tf.size(fill) > 0, row_of, seg_of, fill, nseg, cand),
        shape_invariants=(tf.TensorShape([]), row_of.shape, seg_of.shape,
                          tf.TensorShape([None]), tf.TensorShape([None]),
                          tf.TensorShape([None])),
        maximum_iterations=_MATCH_ROUNDS)[1:]


def _place(lengths, block, segments, items, row_of, seg_of, fill, nseg):
    """New next-fit rows for ``items`` (in order), numbered after the existing ones."""
    item_lengths = tf.gather(lengths, items)
    starts, ends = next_fit_runs(item_lengths, block, segments)
    # The runs cover the items in order: an item's row counts the runs started up to it.
    count = tf.size(items)
    run_rows = tf.cumsum(tf.scatter_nd(tf.expand_dims(starts[1:], 1),
                                       tf.ones_like(starts[1:]), [count]))
    placed = tf.expand_dims(items, 1)
    row_of = tf.tensor_scatter_nd_update(row_of, placed, run_rows + tf.size(fill))
    seg_of = tf.tensor_scatter_nd_update(
        seg_of, placed, tf.range(count) - tf.gather(starts, run_rows) + 1)
    new_fill = tf.math.unsorted_segment_sum(item_lengths, run_rows, tf.size(starts))
    return (row_of, seg_of, tf.concat([fill, new_fill], 0),
            tf.concat([nseg, ends - starts], 0))


def _bulk_fill(lengths, block, segments, row_of, seg_of, fill, nseg, cand):
    """Candidates laid end to end over the rows' gaps laid end to end: each that lies
    inside one row's gap goes there (for gaps many candidates wide)."""
    cand_lengths = tf.gather(lengths, cand)
    gap_ends = tf.cumsum(tf.where(nseg < segments, block - fill, 0))
    cand_ends = tf.cumsum(cand_lengths)
    row = _search(gap_ends, cand_ends - cand_lengths, "right")
    row_end = tf.gather(tf.concat([gap_ends, [-1]], 0), row)   # -1: past the last row
    rank = tf.range(tf.size(cand)) - _search(row, row, "left")
    fits = (cand_ends <= row_end) & (
        rank + tf.gather(tf.concat([nseg, [segments]], 0), row) < segments)
    won = _indices(fits)
    won_rows = tf.gather(row, won)
    items = tf.expand_dims(tf.gather(cand, won), 1)
    row_of = tf.tensor_scatter_nd_update(row_of, items, won_rows)
    seg_of = tf.tensor_scatter_nd_update(
        seg_of, items, tf.gather(nseg, won_rows) + tf.gather(rank, won) + 1)
    num_rows = tf.size(fill)
    fill += tf.math.unsorted_segment_sum(tf.gather(cand_lengths, won), won_rows, num_rows)
    nseg += tf.math.unsorted_segment_sum(tf.ones_like(won_rows), won_rows, num_rows)
    return row_of, seg_of, fill, nseg, tf.gather(cand, _indices(tf.logical_not(fits)))


def plan_part(lengths: tf.Tensor, block: int, segments: int
              ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """Rows and segments for every example of a part (see the module docstring).

    Args:
      lengths: int32 ``[P]``, each in ``[1, block]``, in arrival order.
      block: tokens per row.
      segments: most examples per row.

    Returns:
      ``row_of, seg_of, rows, order``: int32 ``[P]`` row of each example (``[0, rows)``) and
      its 1-based segment number in that row (segments in arrival order); int32 scalar, the
      number of rows; int32 ``[P]``, the examples in row-major order (by row, then segment).
    """
    num = tf.size(lengths)

    def place(items, row_of, seg_of, fill, nseg):
        return _place(lengths, block, segments, items, row_of, seg_of, fill, nseg)

    def match_rounds(row_of, seg_of, fill, nseg, cand):
        return _match_rounds(lengths, block, segments, row_of, seg_of, fill, nseg, cand)

    def bulk_fill(row_of, seg_of, fill, nseg, cand):
        return _bulk_fill(lengths, block, segments, row_of, seg_of, fill, nseg, cand)

    def ascending(items):
        return tf.gather(items, tf.argsort(tf.gather(lengths, items), stable=True))

    # 1. Examples longer than half a block never share a row with each other: one row each,
    # its gap taken by the largest others that fit.
    row_of = tf.fill([num], -1)
    seg_of = tf.zeros([num], tf.int32)
    empty = tf.zeros([0], tf.int32)
    is_big = lengths * 2 > block
    row_of, seg_of, fill, nseg = place(_indices(is_big), row_of, seg_of, empty, empty)
    big_rows = tf.size(fill)
    row_of, seg_of, fill, nseg = tf.cond(
        big_rows > 0,
        lambda: match_rounds(row_of, seg_of, fill, nseg,
                             ascending(_indices(tf.logical_not(is_big))))[:4],
        lambda: (row_of, seg_of, fill, nseg))

    # 2-3. The rest: the shortest are fillers, the others fill rows next-fit in arrival order.
    rest = row_of < 0
    rest_num = tf.reduce_sum(tf.cast(rest, tf.int32))
    rest_lengths = tf.where(rest, lengths, 0)
    rows_needed = (tf.reduce_sum(rest_lengths) + block - 1) // block
    hist = tf.math.bincount(rest_lengths, minlength=block + 1, maxlength=block + 1)
    hist = tf.concat([[0], hist[1:]], 0)   # placed examples counted as length 0: not fillers
    # Next-fit leaves about half a length-biased example free per row, sum(L^2) / (2 sum(L)):
    # the fillers are the shortest examples holding _FILL_VOLUME times that many tokens, and
    # at least _FILLERS_PER_ROW per row (at most half of the examples).
    sizes = tf.range(block + 1, dtype=tf.float32)
    counts = tf.cast(hist, tf.float32)
    volume = tf.cumsum(counts * sizes)
    gaps = tf.cast(rows_needed, tf.float32) * tf.reduce_sum(counts * sizes * sizes) / (
        tf.maximum(2.0 * volume[-1], 1.0))
    by_volume = tf.reduce_sum(tf.where(volume < _FILL_VOLUME * gaps, hist, 0))
    target = tf.minimum(rest_num // 2, tf.maximum(_FILLERS_PER_ROW * rows_needed, by_volume))
    # The `target` shortest (the earliest among equal lengths) are the fillers.
    cut = _search(tf.cumsum(hist), target[None], "left")[0]
    at_cut = rest & tf.equal(lengths, cut)
    room_at_cut = target - tf.reduce_sum(hist[:cut])
    is_filler = rest & ((lengths < cut) | (at_cut & (
        tf.cumsum(tf.cast(at_cut, tf.int32), exclusive=True) < room_at_cut)))
    row_of, seg_of, fill, nseg = place(_indices(rest & tf.logical_not(is_filler)),
                                       row_of, seg_of, fill, nseg)

    # 4. Gaps: large ones take the largest fillers that fit, then runs of small ones, then the
    # rest is topped off.
    state = match_rounds(row_of, seg_of, fill, nseg, ascending(_indices(is_filler)))
    state = bulk_fill(*bulk_fill(*state))
    row_of, seg_of, fill, nseg, cand = match_rounds(*state)

    # 5. The fillers left over, in arrival order, fill rows of their own.
    row_of, seg_of, fill, nseg = place(tf.sort(cand), row_of, seg_of, fill, nseg)
    rows = tf.size(fill)
    # 6. Rows in the order of their oldest example: rows of big examples and of leftover fillers
    # fall among the others where those examples arrived.
    row_of, seg_of, order = _rows_in_order(row_of, rows)
    return row_of, seg_of, rows, order


def _rows_in_order(row_of: tf.Tensor, rows: tf.Tensor
                   ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Step 6: examples ``[n]`` (in arrival order) placed in ``rows`` rows (``row_of``) ->
    ``row_of, seg_of, order``: rows renumbered in the order of their oldest example, 1-based
    segments in arrival order within each row, and the examples in row-major order."""
    n = tf.size(row_of)
    key = tf.math.unsorted_segment_min(tf.range(n), row_of, rows)
    row_of = tf.gather(tf.math.invert_permutation(tf.argsort(key, stable=True)), row_of)
    order = tf.argsort(tf.cast(row_of, tf.int64) * tf.cast(n, tf.int64)
                       + tf.range(n, dtype=tf.int64))
    sorted_rows = tf.gather(row_of, order)
    segment = tf.range(n) - _search(sorted_rows, sorted_rows, "left") + 1
    seg_of = tf.scatter_nd(tf.expand_dims(order, 1), segment, tf.shape(row_of))
    return row_of, seg_of, order


def plan_widths(lengths: tf.Tensor, widths, segments: int) -> list:
    """Rows of several lengths for a part: each example in rows of the shortest length that
    holds it, or in the gap of a longer row.

    From the longest row length down: the examples that need it (longer than the next
    length) fill rows next-fit, and their gaps take the largest shorter examples that fit
    (step 4 of ``plan_part``); whatever is left goes on to the shorter lengths, and the
    shortest is planned by ``plan_part``.

    Args:
      lengths: int32 ``[P]``, each in ``[1, widths[-1]]``, in arrival order.
      widths: ascending Python ints, the row lengths.
      segments: most examples per row.

    Returns:
      One ``(items, row_of, seg_of, rows, order)`` per row length: int32 ``[n]`` the
      examples (ascending), their row and 1-based segment, the number of rows, and the
      examples' positions in ``items`` in row-major order (as ``plan_part``).
    """
    num = tf.size(lengths)
    left = tf.fill([num], True)
    ascending = tf.argsort(lengths, stable=True)
    plans = []
    for k in range(len(widths) - 1, 0, -1):
        block = widths[k]
        owners = _indices(left & (lengths > widths[k - 1]))
        row_of = tf.fill([num], -1)
        seg_of = tf.zeros([num], tf.int32)
        empty = tf.zeros([0], tf.int32)
        row_of, seg_of, fill, nseg = _place(lengths, block, segments, owners, row_of, seg_of,
                                            empty, empty)
        # The shorter examples left, by ascending length (one sort for every row length).
        cand = tf.gather(ascending, _indices(tf.gather(left & (lengths <= widths[k - 1]),
                                                       ascending)))
        state = _match_rounds(lengths, block, segments, row_of, seg_of, fill, nseg, cand)
        state = _bulk_fill(lengths, block, segments, *_bulk_fill(lengths, block, segments, *state))
        row_of = _match_rounds(lengths, block, segments, *state)[0]
        placed = row_of >= 0
        left &= tf.logical_not(placed)
        items = _indices(placed)
        rows = tf.size(fill)
        item_rows, item_segs, order = _rows_in_order(tf.gather(row_of, items), rows)
        plans.append((items, item_rows, item_segs, rows, order))
    items = _indices(left)
    row_of, seg_of, rows, order = plan_part(tf.gather(lengths, items), widths[0], segments)
    plans.append((items, row_of, seg_of, rows, order))
    return plans[::-1]
