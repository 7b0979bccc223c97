"""Row layout for ``pack``: placed examples -> dense packed rows and per-segment scalar tables.

Shapes: B = rows in a batch, T = row length (``block``), S = ``segments``, n = pieces (an
example, or the part of a split example that lies in one row), N = tokens they come from.

Whatever decided where each example goes (``tfseq._pack_plan`` for a whole part,
``tfseq._pack_greedy`` batch by batch), the rows are laid out here. Pieces listed in
row-major order (by row, then segment) become, per sequence feature::

    pieces (row, segment, tokens)   (0, 1, [7 8 5 1])  (0, 2, [8 4 9 3 1])
    <name>                          7  8  5  1  8  4  9  3  1  0
    <name>_segment_ids              1  1  1  1  2  2  2  2  2  0
    <name>_positions                0  1  2  3  0  1  2  3  4  0
    <name>_resets                   T  F  F  F  T  F  F  F  F  F

and each scalar feature becomes a ``[B, S]`` table whose column k - 1 holds segment k's value
(0, False or "" where a row has no segment k).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

SEGMENT_IDS_SUFFIX = "_segment_ids"
POSITIONS_SUFFIX = "_positions"
RESETS_SUFFIX = "_resets"
PACKED_SUFFIXES = (SEGMENT_IDS_SUFFIX, POSITIONS_SUFFIX, RESETS_SUFFIX)


def exclusive_cumsum(x: tf.Tensor) -> tf.Tensor:
    return tf.cumsum(x, axis=0, exclusive=True)


@dataclasses.dataclass(frozen=True)
class PackLayout:
    """What a packed batch holds.

    Attributes:
      seq_keys, seq_dtypes: the sequence features (F of them) and their dtypes.
      blocks: each sequence feature's row length T.
      scalar_keys, scalar_dtypes: the scalar features and their dtypes.
      rows: B, rows per batch.
      segments: S, most segments per row (the width of the scalar tables).
    """

    seq_keys: tuple
    seq_dtypes: tuple
    blocks: tuple
    scalar_keys: tuple
    scalar_dtypes: tuple
    rows: int
    segments: int

    def names(self, key: str) -> list[str]:
        """A sequence feature's outputs: tokens, segment ids, positions, resets."""
        return [key + suffix for suffix in ("",) + PACKED_SUFFIXES]

    def signature(self) -> dict:
        """``{name: (dtype, shape)}`` of a full batch of B rows."""
        sig = {}
        for key, dtype, block in zip(self.seq_keys, self.seq_dtypes, self.blocks):
            for name, kind in zip(self.names(key), (dtype, tf.int32, tf.int32, tf.bool)):
                sig[name] = (kind, [self.rows, block])
        for key, dtype in zip(self.scalar_keys, self.scalar_dtypes):
            sig[key] = (dtype, [self.rows, self.segments])
        return sig

    def part_spec(self) -> tuple:
        """The spec of examples on their way to the packer, ``(values, lengths, scalars)``:
        per sequence feature its tokens ``[N]``; lengths int32 ``[P, F]``; per scalar ``[P]``."""
        return (tuple(tf.TensorSpec([None], d) for d in self.seq_dtypes),
                tf.TensorSpec([None, len(self.seq_keys)], tf.int32),
                tuple(tf.TensorSpec([None], d) for d in self.scalar_dtypes))

    def segment_tables(self, row, seg, scalars, rows) -> dict:
        """Per scalar key, ``[rows, S]``: the value of the piece in ``row`` (int32 ``[n]``)
        and 1-based segment ``seg`` (int32 ``[n]``) at ``[row, seg - 1]``, 0 elsewhere.

        Args:
          scalars: per scalar key, the pieces' values ``[n]``.
          rows: int or int32 scalar, the number of rows.
        """
        index = tf.stack([row, seg - 1], 1)
        return {key: tf.tensor_scatter_nd_update(tf.zeros([rows, self.segments], dtype),
                                                 index, values)
                for key, dtype, values in zip(self.scalar_keys, self.scalar_dtypes, scalars)}

    def planned_rows(self, values, starts, lengths, scalars, plan, block: int) -> dict:
        """Examples of the one sequence feature laid out in their planned rows.

        Args:
          values: the part's tokens ``[N]``; starts, lengths: int32 ``[P]``, where each
            example begins in ``values`` and its length; scalars: per scalar key ``[P]``.
          plan: ``(row_of, seg_of, rows, order)`` of these examples
            (``tfseq._pack_plan.plan_part``).
          block: the rows' length.

        Returns:
          ``{name: [rows, block]}`` for the sequence key and its companions, ``{name: [rows,
          S]}`` per scalar key (segment k's value in column k - 1).
        """
        row_of, seg_of, rows, order = plan
        in_order = lambda x: tf.gather(x, order)  # noqa: E731
        laid_out = lay_out_rows(values, in_order(starts), in_order(lengths), in_order(row_of),
                                rows, block)
        dense = dict(zip(self.names(self.seq_keys[0]), laid_out))
        dense.update(self.segment_tables(row_of, seg_of, scalars, rows))
        return dense


def lay_out(values, src, take, row, seg, cont, rows: int, block: int):
    """Dense rows from pieces listed in row-major order (by row, then segment).

    Args:
      values: the tokens ``[N]``; src, take: int32 ``[n]``, where each piece starts in
        ``values`` and how many tokens it has; row, seg: int32 ``[n]``, its row and 1-based
        segment; cont: bool ``[n]``, true for a continuation piece (no reset; always segment 1
        of its row).

    Returns:
      tokens (``values.dtype``), segment ids, positions (int32) and resets (bool), each
      ``[rows, block]``.
    """
    spans = tf.ragged.range(src, src + take, row_splits_dtype=tf.int32)   # [n, (take)]
    tokens = tf.gather(values, spans.flat_values)                 # row-major: rows are runs
    index = tf.range(tf.size(spans.flat_values))
    piece = tf.searchsorted(spans.row_splits[1:], index, side="right")   # each token's piece
    positions = index - tf.gather(spans.row_splits, piece)
    segment_ids = tf.gather(seg, piece)
    filled = tf.math.unsorted_segment_sum(take, row, rows)        # [rows] tokens per row

    def dense(per_token):
        return tf.RaggedTensor.from_row_lengths(per_token, filled, validate=False).to_tensor(
            0, shape=[rows, block])

    segment_ids, positions = dense(segment_ids), dense(positions)
    continued = tf.math.unsorted_segment_max(tf.cast(cont, tf.int32), row, rows) > 0
    resets = ((positions == 0) & (segment_ids > 0)
              & tf.logical_not(continued[:, None] & (segment_ids == 1)))
    return dense(tokens), segment_ids, positions, resets


def lay_out_rows(values, src, take, row, rows, block: int):
    """``lay_out`` for pieces that are whole examples (no continuation), in row-major order.

    Per-token work is gathers, two scatters of one value per piece and running sums along
    the rows (no search per token, no ragged-to-dense conversion).

    Args:
      values: the tokens ``[N]``; src, take: int32 ``[n]``, where each piece starts in
        ``values`` and its length; row: int32 ``[n]``, its row, non-decreasing; within a row
        the pieces are its segments 1, 2, ... in order.
      rows: int32 scalar, the number of rows.

    Returns:
      tokens, segment ids, positions, resets, each ``[rows, block]``.
    """
    filled = tf.math.unsorted_segment_sum(take, row, rows)                 # [rows]
    row_start = exclusive_cumsum(filled)              # where each row's tokens begin in `flat`
    offset = exclusive_cumsum(take) - tf.gather(row_start, row)
    # The tokens in row-major order, then each cell reads its row's run of them.
    flat = tf.gather(values, tf.raw_ops.RaggedRange(starts=src, limits=src + take,
                                                    deltas=tf.ones_like(src))[1])
    column = tf.range(block)[None, :]
    real = column < filled[:, None]
    index = tf.minimum(row_start[:, None] + column,
                       tf.maximum(tf.size(flat) - 1, 0))
    tokens = tf.where(real, tf.gather(flat, index), tf.zeros([], values.dtype))
    cell = (row * block + offset)[:, None]
    cells = tf.stack([rows * block])
    # A mark on each piece's first cell: running sums along the row give every cell its
    # segment number and the offset where its segment starts.
    first_of_row = tf.concat([[True], row[1:] > row[:-1]], 0)
    step = offset - tf.where(first_of_row, offset, tf.concat([[0], offset[:-1]], 0))
    segment_ids = tf.cumsum(tf.reshape(tf.scatter_nd(cell, tf.ones_like(row), cells),
                                       [rows, block]), axis=1)
    starts = tf.cumsum(tf.reshape(tf.scatter_nd(cell, step, cells), [rows, block]), axis=1)
    positions = tf.where(real, column - starts, 0)
    return (tokens, tf.where(real, segment_ids, 0), positions, real & tf.equal(positions, 0))


def dense_rows(batch: dict) -> dict:
    """A batch whose rows are ragged but all of one length (``RaggedTensor [B, (T)]``) ->
    dense ``[B, T]`` (a reshape; the batch has at least one row). Dense values pass."""
    return {k: tf.reshape(v.flat_values, tf.stack([v.nrows(), -1]))
            if isinstance(v, tf.RaggedTensor) else v for k, v in batch.items()}
