"""Greedy packing batch by batch: several sequence features, or examples split across batches.

Shapes: B = rows per batch, F = sequence features, P = examples waiting in the pool,
T = row length of a feature (its ``block``), S = segments per row.

Used by ``tfseq.pack`` when a part cannot be planned whole (``tfseq._pack_planned``): several
sequence features packed together, or a part with an example longer than the block under
``long_examples="split"``. Within a part, examples wait in a pool of about ``window``
batches' worth of tokens beyond what one build takes. When the pool is full, a build places
the rows of one batch (``_assign``):

1. Rows take consecutive runs of the oldest examples, one row after the other (a long example
   ends its row with its first piece; a row gives its last example back when it would leave a
   gap shorter than any example).
2. The gaps are filled by best fit, the largest example that leaves no gap or a fillable one,
   a few rounds of one example per row (lowest row wins a contested example); a row that no
   example fits whole starts the oldest long example that can start there.

Each row first takes its carried continuation piece (the rest of an example split in the
previous batch, in the same row index: a lane), so the oldest examples leave first and the
input order (its shuffle) is kept up to the window. Example, B = 2, block 6, lengths
5 3 9 1 2 (the 9 is split; tokens shown as their example's length)::

    batch 1   row 0   5 5 5 5 5 1     the run [5] leaves a gap of 1: best fit takes the 1
              row 1   3 3 3 9 9 9     the run [3], then the 9 starts in the gap
    batch 2   row 0   2 2 0 0 0 0
              row 1   9 9 9 9 9 9     the rest of the 9, same lane, no reset

A part's chunks (``_CHUNK_SIZE`` examples) join the pool one at a time; after the part's last
chunk the pool and the carries are flushed, so a part's last batches may be part-filled.
"""

from __future__ import annotations

import tensorflow as tf

from tfseq._pack_layout import PackLayout, exclusive_cumsum, lay_out

# Inside a part, the pool takes this many examples per step.
_CHUNK_SIZE = 1024

# Rounds of gap filling per build (each places at most one example per row); later rounds
# place very few examples, so a cap costs almost no padding and saves their fixed cost.
_FILL_ROUNDS = 6
# Up to this many rows, the rows' lookups are unrolled (a few scalar ops each) instead of a loop.
_UNROLL_ROWS = 64


def _chain(reach: tf.Tensor, offsets: tf.Tensor, rows: int) -> tf.Tensor:
    """int32 ``[rows]``: ``x[r] = reach[offsets[r] + x[r - 1]]`` with ``x[-1] = 0``."""
    if rows > _UNROLL_ROWS:
        return tf.scan(lambda start, offset: tf.gather(reach, offset + start), offsets,
                       initializer=tf.constant(0))
    start, out = tf.constant(0), []
    for r in range(rows):
        start = tf.gather(reach, offsets[r] + start)
        out.append(start)
    return tf.stack(out)


def _gather_spans(values: tf.Tensor, starts: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
    """Concatenation of ``values[starts[i]:starts[i] + lengths[i]]`` over i (1-D tensors)."""
    index = tf.ragged.range(starts, starts + lengths)
    return tf.gather(values, index.flat_values)


class GreedyPacker:
    """Packs a part batch by batch (see the module docstring).

    State, per sequence feature f: the pool's tokens ``pool_values[f]`` with per-example
    lengths ``pool_lengths`` ``[P, F]`` and scalar values ``[P]``; and one carried remainder
    of a split example per lane: ``carry_values[f]``, ``carry_lengths`` ``[B, F]``, carried
    scalars ``[B]``.

    Args:
      layout: the batches' keys, row lengths, B and S.
      window: the pool holds this many batches' worth of tokens beyond what one build takes
        before it builds.
    """

    def __init__(self, layout: PackLayout, window: int):
        self.layout = layout
        self.seq_keys, self.blocks = list(layout.seq_keys), list(layout.blocks)
        self.rows, self.segments = layout.rows, layout.segments
        self.threshold = window * layout.rows * max(layout.blocks)
        pool_spec = tuple(tf.nest.map_structure(
            lambda shape, dtype: tf.TensorSpec(shape, dtype), self._pool_shapes(),
            self._pool_dtypes()))
        carry_spec = tuple(tf.nest.map_structure(
            lambda shape, dtype: tf.TensorSpec(shape, dtype), self._carry_shapes(),
            self._pool_dtypes()))
        # Traced once, whatever the scan's own retracing.
        self._build = tf.function(self._build_batch,
                                  input_signature=(pool_spec, carry_spec),
                                  autograph=False)

    def finish(self, batch, num_rows):
        """One batch of ``pack_part`` -> its first ``num_rows`` rows."""
        return {k: v[:num_rows] for k, v in batch.items()}

    def pack_part(self, is_last, part):
        """One part ``(values, lengths, scalars)`` -> its packed batches ``{name: [N, B, T]}``
        / ``{scalar: [N, B, S]}`` and int32 ``[N]`` rows to keep of each (0: skip the batch),
        built batch by batch. Before the input ends (``is_last``, bool scalar) every batch
        keeps all B rows, so lanes keep their index."""
        num = len(self.seq_keys)
        values, lengths, scalars = part
        offsets = tf.concat([tf.zeros([1, num], tf.int32), tf.cumsum(lengths, axis=0)], 0)
        count = tf.shape(lengths)[0]
        num_chunks = tf.maximum((count + _CHUNK_SIZE - 1) // _CHUNK_SIZE, 1)

        def chunk(i):
            lo = i * _CHUNK_SIZE
            hi = tf.minimum(lo + _CHUNK_SIZE, count)
            seq = tuple(v[offsets[lo, f]:offsets[hi, f]] for f, v in enumerate(values))
            return seq, lengths[lo:hi], tuple(v[lo:hi] for v in scalars)

        out_arrays = {k: tf.TensorArray(dtype, size=0, dynamic_size=True, element_shape=shape)
                      for k, (dtype, shape) in self.layout.signature().items()}
        rows_array = tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[])

        def body(i, state, written, out_arrays, rows_array):
            final = tf.equal(i, num_chunks - 1)
            state, written, out_arrays, rows_array = self._step(
                state, chunk(i), final, is_last, written, out_arrays, rows_array)
            return i + 1, state, written, out_arrays, rows_array

        state = self._initial_state()
        _, _, _, out_arrays, rows_array = tf.while_loop(
            lambda i, *_: i < num_chunks, body,
            (tf.constant(0), state, tf.constant(0), out_arrays, rows_array),
            shape_invariants=(tf.TensorShape([]), (self._pool_shapes(), self._carry_shapes()),
                              tf.TensorShape([]), {k: tf.TensorShape(None) for k in out_arrays},
                              tf.TensorShape(None)))
        return {k: a.stack() for k, a in out_arrays.items()}, rows_array.stack()

    def _empty_group(self):
        seq = tuple(tf.zeros([0], d) for d in self.layout.seq_dtypes)
        lengths = tf.zeros([0, len(self.seq_keys)], tf.int32)
        scalars = tuple(tf.zeros([0], d) for d in self.layout.scalar_dtypes)
        return seq, lengths, scalars

    def _initial_state(self):
        pool = self._empty_group()
        carry = (tuple(tf.zeros([0], d) for d in self.layout.seq_dtypes),
                 tf.zeros([self.rows, len(self.seq_keys)], tf.int32),
                 tuple(tf.zeros([self.rows], d) for d in self.layout.scalar_dtypes))
        return pool, carry


    def _step(self, state, group, final, is_last, written, out_arrays, rows_array):
        """Adds a group to the pool and writes every batch that is ready to ``out_arrays``
        from index ``written`` on; ``final`` (the part's last group) flushes the pool and
        the carries. Returns the new state, count written and arrays."""
        g_seq, g_lengths, g_scalars = group
        (p_seq, p_lengths, p_scalars), carry = state
        pool = (tuple(tf.concat([a, b], 0) for a, b in zip(p_seq, g_seq)),
                tf.concat([p_lengths, g_lengths], 0),
                tuple(tf.concat([a, b], 0) for a, b in zip(p_scalars, g_scalars)))

        def ready(pool, carry):
            pool_tokens = tf.reduce_sum(tf.reduce_max(pool[1], axis=1))
            pending = tf.logical_or(tf.shape(pool[1])[0] > 0, tf.reduce_any(carry[1] > 0))
            return tf.logical_or(pool_tokens >= self.threshold,
                                 tf.logical_and(final, pending))

        def cond(written, pool, carry, out_arrays, rows_array):
            return ready(pool, carry)

        def body(written, pool, carry, out_arrays, rows_array):
            built, num_rows, pool, carry = self._build(pool, carry)
            out_arrays = {key: out_arrays[key].write(written, v) for key, v in built.items()}
            # Before the input ends every batch keeps all B rows, so lanes keep their index;
            # after, the trailing empty rows go. Empty batches are skipped.
            rows_array = rows_array.write(written, tf.where(
                is_last | tf.equal(num_rows, 0), num_rows, self.rows))
            return written + 1, pool, carry, out_arrays, rows_array

        written, pool, carry, out_arrays, rows_array = tf.while_loop(
            cond, body, (written, pool, carry, out_arrays, rows_array),
            shape_invariants=(tf.TensorShape([]), self._pool_shapes(), self._carry_shapes(),
                              {k: tf.TensorShape(None) for k in out_arrays},
                              tf.TensorShape(None)))
        return (pool, carry), written, out_arrays, rows_array


    def _pool_dtypes(self):
        return (tuple(self.layout.seq_dtypes), tf.int32, tuple(self.layout.scalar_dtypes))

    def _pool_shapes(self):
        num = len(self.seq_keys)
        return (tuple(tf.TensorShape([None]) for _ in range(num)), tf.TensorShape([None, num]),
                tuple(tf.TensorShape([None]) for _ in self.layout.scalar_keys))

    def _carry_shapes(self):
        num = len(self.seq_keys)
        return (tuple(tf.TensorShape([None]) for _ in range(num)),
                tf.TensorShape([self.rows, num]),
                tuple(tf.TensorShape([self.rows]) for _ in self.layout.scalar_keys))

    # ----- one batch

    def _assign(self, lengths, carry_lengths):
        """Places pool examples into the B rows of one batch.

        First, rows take the oldest examples in order, one row after the other (a long example
        in split mode ends its row with its first piece); a row gives its last example back
        when it would leave a gap shorter than any example. Then the gaps are filled by best
        fit (the largest example that leaves no gap or a fillable one) from the rest; a row
        that no example fits whole starts the oldest long example that can start there.

        Args:
          lengths: int32 ``[P, F]``, the pool examples' lengths, oldest first.
          carry_lengths: int32 ``[B, F]``, what each row still carries of a split example.

        Returns:
          Per pool example: row ``[P]`` (-1 if it stays in the pool), segment id ``[P]``,
          start offset ``[P, F]`` and tokens taken ``[P, F]`` (less than its length for the
          first piece of a split example); and per row the carried piece ``[B, F]``.
        """
        blocks = tf.constant(self.blocks, tf.int32)
        num_pool = tf.shape(lengths)[0]
        is_long = tf.reduce_any(lengths > blocks, axis=1)
        short = tf.logical_not(is_long)
        smallest = tf.reduce_min(tf.where(short[:, None], lengths, tf.int32.max), axis=0)
        carry_piece = tf.minimum(carry_lengths, blocks)
        nseg0 = tf.cast(tf.reduce_any(carry_lengths > 0, axis=1), tf.int32)
        closed0 = tf.reduce_any(carry_lengths > carry_piece, axis=1)
        ends = tf.cumsum(lengths, axis=0)
        starts = tf.concat([ends - lengths, tf.reduce_sum(lengths, 0, keepdims=True)], 0)
        longs_end = tf.cumsum(tf.cast(is_long, tf.int32))
        longs_start = tf.concat([longs_end - tf.cast(is_long, tf.int32),
                                 tf.reduce_sum(tf.cast(is_long, tf.int32), keepdims=True)], 0)

        # 1. Rows take consecutive runs of the oldest examples.
        run_start, run_end, long_at, fill, long_take = self._row_runs(
            lengths, is_long, smallest, carry_piece, nseg0, closed0, starts, ends, longs_start)

        runs = tf.ragged.range(run_start, run_end)
        items = runs.flat_values
        item_rows = tf.cast(runs.value_rowids(), tf.int32)
        item_starts = (tf.gather(carry_piece, item_rows) + tf.gather(starts, items)
                       - tf.gather(starts, tf.gather(run_start, item_rows)))
        num_run = run_end - run_start
        has_long = long_at >= 0
        long_rows = tf.cast(tf.where(has_long)[:, 0], tf.int32)
        long_items = tf.gather(long_at, long_rows)
        all_items = tf.concat([items, long_items], 0)[:, None]
        row_of = tf.scatter_nd(all_items, tf.concat([item_rows, long_rows], 0) + 1,
                               [num_pool]) - 1
        seg_of = tf.scatter_nd(all_items, tf.concat(
            [tf.gather(nseg0, item_rows) + items - tf.gather(run_start, item_rows) + 1,
             tf.gather(nseg0 + num_run + 1, long_rows)], 0), [num_pool])
        shape = tf.shape(lengths)
        start_of = tf.scatter_nd(all_items, tf.concat(
            [item_starts, tf.gather(fill, long_rows)], 0), shape)
        take_of = tf.scatter_nd(all_items, tf.concat(
            [tf.gather(lengths, items), tf.gather(long_take, long_rows)], 0), shape)
        fill = fill + long_take
        nseg = nseg0 + num_run + tf.cast(has_long, tf.int32)
        row_open = tf.logical_not(closed0 | has_long)

        # 2. Best fit into the gaps.
        row_of, seg_of, start_of, take_of = self._fill_gaps(
            lengths, is_long, smallest, (row_of, seg_of, start_of, take_of), fill, nseg,
            row_open)
        return row_of, seg_of, start_of, take_of, carry_piece

    def _best_fit(self, lengths, is_long, smallest, row_of):
        """Phase 2's chooser: ``(choose, sorted_keys, sorted_items)``, where
        ``choose(gap [B, F], unplaced [P], can_take [B], sorted_keys, sorted_items)`` gives
        each row's best fit ``choice`` and whether it ``wants`` it (``[B]`` each), and the
        sorted waiting examples it searches (one feature; empty otherwise)."""
        num_pool = tf.shape(lengths)[0]
        index = tf.range(num_pool)
        short = tf.logical_not(is_long)
        size = tf.reduce_sum(lengths, axis=1)
        single = len(self.blocks) == 1
        if single:
            # One feature: the unplaced short examples sorted by (length, age), so a row's
            # best fit is a binary search, not a [B, P] comparison.
            wide = tf.cast(num_pool + 1, tf.int64)
            waiting = tf.cast(tf.where((row_of < 0) & short)[:, 0], tf.int32)
            keys = (tf.cast(tf.gather(size, waiting), tf.int64) * wide
                    + tf.cast(num_pool - waiting, tf.int64))
            order = tf.argsort(keys)
            sorted_keys, sorted_items = tf.gather(keys, order), tf.gather(waiting, order)
        else:
            sorted_keys, sorted_items = tf.zeros([0], tf.int64), tf.zeros([0], tf.int32)

        def choose_sorted(gap, unplaced, can_take, sorted_keys, sorted_items):
            """Best fit per row by search: returns choice and wants, ``[B]``."""
            gap = gap[:, 0]
            alive = tf.gather(unplaced, sorted_items)
            sorted_keys = tf.boolean_mask(sorted_keys, alive)
            sorted_items = tf.boolean_mask(sorted_items, alive)

            def largest_up_to(limit):
                # The longest waiting example of at most `limit` tokens, the oldest among equals.
                bound = limit * wide + tf.cast(num_pool, tf.int64)
                pos = tf.searchsorted(sorted_keys[None], bound[None], side="right")[0] - 1
                return tf.gather(tf.concat([[-1], sorted_items], 0), pos + 1), pos >= 0

            fit, fits = largest_up_to(tf.cast(gap, tf.int64))
            exact = fits & (tf.gather(size, tf.maximum(fit, 0)) == gap)
            clean, cleans = largest_up_to(tf.cast(gap, tf.int64)
                                          - tf.cast(smallest[0], tf.int64))
            short_choice = tf.where(exact | tf.logical_not(cleans), fit, clean)
            # A row that no short example fits starts the oldest long one (if it has room).
            oldest_long = tf.reduce_min(tf.where(unplaced & is_long, index, num_pool))
            starts_long = (oldest_long < num_pool) & (gap > 0)
            choice = tf.where(fits, short_choice, oldest_long)
            wants = can_take & (fits | starts_long)
            return choice, wants, sorted_keys, sorted_items

        def choose_scan(gap, unplaced, can_take, sorted_keys, sorted_items):
            """Best fit per row over a ``[B, P, F]`` comparison: returns choice and wants."""
            can_take = can_take[:, None]
            fits = (can_take & (unplaced & short)[None, :]
                    & tf.reduce_all(lengths[None] <= gap[:, None], axis=2))
            left = gap[:, None] - lengths[None]
            clean = fits & tf.reduce_all((left == 0) | (left >= smallest), axis=2)
            candidates = tf.where(tf.reduce_any(clean, axis=1, keepdims=True), clean, fits)
            # A row that no short example fits starts the oldest long one that can start.
            starts_long = (can_take & (unplaced & is_long)[None, :]
                           & tf.reduce_all((lengths[None] == 0) | (gap[:, None] > 0), axis=2))
            no_short = tf.logical_not(tf.reduce_any(fits, axis=1, keepdims=True))
            oldest = tf.cast(num_pool - index, tf.int32)[None, :]
            score = tf.where(candidates, size[None], tf.where(starts_long & no_short, oldest, -1))
            score = tf.concat([score, tf.fill([self.rows, 1], -1)], 1)
            choice = tf.argmax(score, axis=1, output_type=tf.int32)
            wants = tf.reduce_max(score, axis=1) >= 0
            return choice, wants, sorted_keys, sorted_items

        return (choose_sorted if single else choose_scan), sorted_keys, sorted_items

    def _fill_gaps(self, lengths, is_long, smallest, placed, fill, nseg, row_open):
        """Phase 2 of ``_assign``: each row proposes one example per round (``_best_fit``),
        the lowest row wins; at most ``_FILL_ROUNDS`` rounds.

        Args:
          lengths: int32 ``[P, F]``; is_long: bool ``[P]``; smallest: int32 ``[F]``.
          placed: ``(row_of, seg_of, start_of, take_of)`` after phase 1 (see ``_assign``).
          fill: int32 ``[B, F]``, tokens per row; nseg: int32 ``[B]``, segments per row;
            row_open: bool ``[B]``, rows that may take more.

        Returns:
          ``placed`` updated.
        """
        blocks = tf.constant(self.blocks, tf.int32)
        num_pool = tf.shape(lengths)[0]
        rows = tf.range(self.rows)
        row_of, seg_of, start_of, take_of = placed
        choose, sorted_keys, sorted_items = self._best_fit(lengths, is_long, smallest, row_of)

        def fill_gaps(placed_any, row_of, seg_of, start_of, take_of, fill, nseg, row_open,
                      sorted_keys, sorted_items):
            gap = blocks - fill
            choice, wants, sorted_keys, sorted_items = choose(
                gap, row_of < 0, row_open & (nseg < self.segments), sorted_keys, sorted_items)
            claim = tf.where(wants, choice, num_pool)
            winner = tf.math.unsorted_segment_min(rows, claim, num_pool + 1)
            won = wants & (tf.gather(winner, claim) == rows)
            won_rows = tf.cast(tf.where(won)[:, 0], tf.int32)
            won_items = tf.gather(choice, won_rows)[:, None]
            take = tf.minimum(tf.gather(lengths, won_items[:, 0]), tf.gather(gap, won_rows))
            row_of = tf.tensor_scatter_nd_update(row_of, won_items, won_rows)
            seg_of = tf.tensor_scatter_nd_update(seg_of, won_items,
                                                 tf.gather(nseg, won_rows) + 1)
            start_of = tf.tensor_scatter_nd_update(start_of, won_items,
                                                   tf.gather(fill, won_rows))
            take_of = tf.tensor_scatter_nd_update(take_of, won_items, take)
            fill = tf.tensor_scatter_nd_add(fill, won_rows[:, None], take)
            nseg = tf.tensor_scatter_nd_add(nseg, won_rows[:, None], tf.ones_like(won_rows))
            closes = tf.gather(is_long, won_items[:, 0])
            row_open = tf.tensor_scatter_nd_update(row_open, won_rows[:, None],
                                                   tf.logical_not(closes))
            return (tf.reduce_any(won), row_of, seg_of, start_of, take_of, fill, nseg,
                    row_open, sorted_keys, sorted_items)

        _, row_of, seg_of, start_of, take_of, _, _, _, _, _ = tf.while_loop(
            lambda placed_any, *_: placed_any, fill_gaps,
            (num_pool > 0, row_of, seg_of, start_of, take_of, fill, nseg, row_open,
             sorted_keys, sorted_items),
            shape_invariants=(tf.TensorShape([]), row_of.shape, seg_of.shape, start_of.shape,
                              take_of.shape, fill.shape, nseg.shape, row_open.shape,
                              tf.TensorShape([None]), tf.TensorShape([None])),
            maximum_iterations=_FILL_ROUNDS)
        return row_of, seg_of, start_of, take_of

    def _row_runs(self, lengths, is_long, smallest, carry_piece, nseg0, closed0, starts, ends,
                  longs_start):
        """Phase 1 of ``_assign``: the run of consecutive pool examples each row takes.

        Rows differ only by what they carry, so the run a row would take from every possible
        start p is tabulated once for an empty row and once per carrying row (K of them,
        usually none): ``[1 + K, P + 1]`` tables, by search over the cumulative lengths. Row r
        starts where row r - 1 ended: one table lookup per row.

        Args:
          lengths: int32 ``[P, F]``; is_long: bool ``[P]``; smallest: int32 ``[F]``, the
            shortest short example per feature; carry_piece: int32 ``[B, F]``; nseg0: int32
            ``[B]``, segments already in each row; closed0: bool ``[B]``, rows a carried piece
            fills; starts: int32 ``[P + 1, F]`` and ends ``[P, F]``, cumulative offsets;
            longs_start: int32 ``[P + 1]``, long examples before each index.

        Returns:
          Per row, int32 ``[B]``: the run's first and end index, the long example it starts
          (-1 if none), and int32 ``[B, F]``: tokens filled by the run, tokens of the long one.
        """
        blocks = tf.constant(self.blocks, tf.int32)
        num_pool = tf.shape(lengths)[0]
        lengths_pad = tf.concat([lengths, tf.zeros([1, len(self.blocks)], tf.int32)], 0)
        long_pad = tf.concat([is_long, [False]], 0)
        # Kind 0: a row that carries nothing; kind k > 0: the k-th carrying row.
        carrying = tf.cast(tf.where(nseg0 > 0)[:, 0], tf.int32)
        num_kinds = tf.size(carrying) + 1
        kind = tf.tensor_scatter_nd_update(tf.zeros([self.rows], tf.int32), carrying[:, None],
                                           tf.range(1, num_kinds))
        gap = tf.concat([blocks[None], tf.gather(blocks[None] - carry_piece, carrying)], 0)
        used = tf.concat([[0], tf.gather(nseg0, carrying)], 0)[:, None]          # [1 + K, 1]
        is_open = tf.concat([[True], tf.gather(tf.logical_not(closed0), carrying)], 0)[:, None]
        p = tf.range(num_pool + 1)[None]                                       # [1, P + 1]
        # The run from p ends before the first example that overflows a feature's gap, before
        # the next long example, and at the row's segment limit.
        target = starts[None] + gap[:, None]                                   # [1 + K, P + 1, F]
        fit_end = tf.reduce_min(tf.stack([
            tf.reshape(tf.searchsorted(ends[None, :, f], tf.reshape(target[:, :, f], [1, -1]),
                                       side="right"), [num_kinds, -1])
            for f in range(len(self.blocks))]), axis=0)
        long_index = tf.cast(tf.where(is_long)[:, 0], tf.int32)
        next_long = tf.gather(tf.concat([long_index, [num_pool]], 0), longs_start)[None]
        room = tf.maximum(self.segments - used, 0)
        end = tf.where(is_open, tf.minimum(tf.minimum(fit_end, next_long), p + room), p)
        end = tf.maximum(end, p)

        def left_at(q):
            return gap[:, None] - (tf.gather(starts, q) - starts[None])

        left = left_at(end)
        # (A row keeps its only example: giving it back would leave the row empty and stop
        # the chain of runs there.)
        give_back = ((end > p + 1) & tf.reduce_any((left > 0) & (left < smallest), axis=2)
                     & tf.logical_not(tf.gather(long_pad, end)))
        q = end - tf.cast(give_back, tf.int32)
        left = left_at(q)
        long_here = (is_open & tf.gather(long_pad, q)
                     & tf.reduce_all((tf.gather(lengths_pad, q) == 0) | (left > 0), axis=2)
                     & (used + q - p < self.segments))
        reach = tf.reshape(q + tf.cast(long_here, tf.int32), [-1])
        width = num_pool + 1
        ends_of_rows = _chain(reach, kind * width, self.rows)
        run_start = tf.concat([[0], ends_of_rows[:-1]], 0)
        at = kind * width + run_start
        run_end = tf.gather(tf.reshape(q, [-1]), at)
        here = tf.gather(tf.reshape(long_here, [-1]), at)
        left = tf.gather(tf.reshape(left, [-1, len(self.blocks)]), at)
        long_take = tf.where(here[:, None],
                             tf.minimum(tf.gather(lengths_pad, run_end), left), 0)
        return run_start, run_end, tf.where(here, run_end, -1), blocks - left, long_take


    def _build_batch(self, pool, carry):
        """One build: the B rows of a batch from the carries and the pool.

        Returns:
          ``(batch, num_rows, pool, carry)``: the batch ``{name: [B, T]}`` / ``[B, S]``; int32
          scalar, its rows up to the last non-empty one; what stays in the pool; the new
          carries (the rest of a carried piece, or of a split example started here).
        """
        (p_seq, p_lengths, p_scalars), (c_seq, c_lengths, c_scalars) = pool, carry
        row_of, seg_of, start_of, take_of, carry_piece = self._assign(p_lengths, c_lengths)
        placed = row_of >= 0
        p_starts = exclusive_cumsum(p_lengths)
        c_starts = exclusive_cumsum(c_lengths)
        batch, num_rows = self._lay_out_batch(pool, carry, (row_of, seg_of, take_of),
                                              carry_piece, p_starts, c_starts)

        # New carries: the rest of a carried piece, or of a split example started here.
        started = placed & tf.reduce_any(take_of < p_lengths, axis=1)
        start_idx = tf.where(started)[:, 0]
        start_rows = tf.gather(row_of, start_idx)[:, None]
        new_len = tf.tensor_scatter_nd_update(
            c_lengths - carry_piece, start_rows,
            tf.gather(p_lengths - take_of, start_idx))
        new_carry_seq = []
        for f in range(len(self.seq_keys)):
            values = tf.concat([p_seq[f], c_seq[f]], 0)
            offset = tf.shape(p_seq[f])[0]
            src = tf.tensor_scatter_nd_update(
                offset + c_starts[:, f] + carry_piece[:, f], start_rows,
                tf.gather(p_starts[:, f] + take_of[:, f], start_idx))
            new_carry_seq.append(_gather_spans(values, src, new_len[:, f]))
        new_carry_scalars = [
            tf.tensor_scatter_nd_update(c, start_rows, tf.gather(p, start_idx))
            for p, c in zip(p_scalars, c_scalars)]

        # The pool keeps what was not placed.
        keep = tf.logical_not(placed)
        keep_idx = tf.where(keep)[:, 0]
        kept_lengths = tf.gather(p_lengths, keep_idx)
        new_pool_seq = tuple(
            _gather_spans(p_seq[f], tf.gather(p_starts[:, f], keep_idx), kept_lengths[:, f])
            for f in range(len(self.seq_keys)))
        new_pool_scalars = tuple(tf.gather(v, keep_idx) for v in p_scalars)
        return (batch, num_rows, (new_pool_seq, kept_lengths, new_pool_scalars),
                (tuple(new_carry_seq), new_len, tuple(new_carry_scalars)))

    def _lay_out_batch(self, pool, carry, placement, carry_piece, p_starts, c_starts):
        """The batch's pieces laid out as rows: the placed pool examples, then the carried
        pieces (segment 1 of their row, no reset).

        Args:
          pool, carry: as in ``_build_batch``.
          placement: ``(row_of, seg_of, take_of)`` of the pool examples (``_assign``).
          carry_piece: int32 ``[B, F]``, the carried tokens each row takes.
          p_starts, c_starts: int32 ``[P, F]`` / ``[B, F]``, where each pool example and
            each carry begins in its tokens.

        Returns:
          ``(batch, num_rows)``, as ``_build_batch``.
        """
        (p_seq, _, p_scalars), (c_seq, c_lengths, c_scalars) = pool, carry
        row_of, seg_of, take_of = placement
        lanes = tf.range(self.rows)
        has_carry = tf.reduce_any(c_lengths > 0, axis=1)
        pool_idx = tf.where(row_of >= 0)[:, 0]
        lane_idx = tf.where(has_carry)[:, 0]
        piece_row = tf.concat([tf.gather(row_of, pool_idx), tf.gather(lanes, lane_idx)], 0)
        piece_seg = tf.concat([tf.gather(seg_of, pool_idx), tf.ones_like(lane_idx, tf.int32)], 0)
        piece_take = tf.concat([tf.gather(take_of, pool_idx), tf.gather(carry_piece, lane_idx)],
                               0)
        piece_cont = tf.concat([tf.zeros_like(pool_idx, tf.bool),
                                tf.ones_like(lane_idx, tf.bool)], 0)
        # Each row is the concatenation of its pieces in segment order, then padding.
        order = tf.argsort(tf.cast(piece_row, tf.int64) * (self.segments + 1)
                           + tf.cast(piece_seg, tf.int64))
        in_order = lambda x: tf.gather(x, order)  # noqa: E731
        batch = {}
        for f, key in enumerate(self.seq_keys):
            values = tf.concat([p_seq[f], c_seq[f]], 0)
            offset = tf.shape(p_seq[f])[0]
            src = tf.concat([tf.gather(p_starts[:, f], pool_idx),
                             offset + tf.gather(c_starts[:, f], lane_idx)], 0)
            laid_out = lay_out(values, in_order(src), in_order(piece_take[:, f]),
                               in_order(piece_row), in_order(piece_seg), in_order(piece_cont),
                               self.rows, self.blocks[f])
            batch.update(zip(self.layout.names(key), laid_out))
        batch.update(self.layout.segment_tables(
            piece_row, piece_seg,
            [tf.concat([tf.gather(p, pool_idx), tf.gather(c, lane_idx)], 0)
             for p, c in zip(p_scalars, c_scalars)], self.rows))
        num_rows = tf.reduce_max(tf.concat([piece_row, [-1]], 0)) + 1
        return batch, num_rows
