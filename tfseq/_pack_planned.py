"""Packing strategies that plan a whole part at once (one sequence feature, nothing split).

Shapes: B = rows per batch, T = row length, S = segments per row, P = examples in a part,
N = batches of a part.

A *part* is a run of consecutive examples, ``(values, lengths, scalars)``: per sequence
feature its tokens ``[sum(lengths)]``; lengths int32 ``[P, 1]``; per scalar key ``[P]``.
``tfseq._pack_plan`` decides each example's row and segment in a few hundred tf ops, whatever
``P``; ``tfseq._pack_layout`` lays the rows out; the strategies here cut them into batches.

* ``PlannedPacker``: rows of one length, B rows per batch, batches in the order of their
  rows (rows in the order of their oldest example). Example, B = 2, 5 planned rows::

      rows      r0 r1 | r2 r3 | r4
      num_rows   2      2       2 (1 once the input has ended: the pad row is trimmed)

* ``WidthsPacker``: rows of several lengths (``plan_widths``); each length's rows are cut
  into batches of its own row count and the batches of all lengths are put in the order of
  their oldest example.

Both give ``pack_part(is_last, part) -> (batches, num_rows)`` and ``finish(batch, rows)``,
the interface ``tfseq.packing`` drives every strategy through.
"""

from __future__ import annotations

import tensorflow as tf

from tfseq._pack_layout import PackLayout, dense_rows, exclusive_cumsum
from tfseq._pack_plan import plan_part, plan_widths


class PlannedPacker:
    """One sequence feature, no example longer than the block: each part planned whole.

    Args:
      layout: the batches' keys, row length (one), B and S.
    """

    def __init__(self, layout: PackLayout):
        self.layout = layout

    def pack_part(self, is_last, part):
        """A part -> its batches ``{name: [N, B, T]}`` / ``{scalar: [N, B, S]}`` and int32
        ``[N]`` rows to keep of each: B, except in the last batch once the input has ended
        (``is_last``, bool scalar)."""
        values, lengths, scalars = part
        lengths = lengths[:, 0]
        block, b = self.layout.blocks[0], self.layout.rows
        row_of, seg_of, rows, order = plan_part(lengths, block, self.layout.segments)
        dense = self.layout.planned_rows(values[0], exclusive_cumsum(lengths), lengths,
                                         scalars, (row_of, seg_of, rows, order), block)
        num_batches = (rows + b - 1) // b
        pad = num_batches * b - rows

        def batched(x):
            x = tf.pad(x, [[0, pad], [0, 0]])
            return tf.reshape(x, tf.concat([[num_batches, b], tf.shape(x)[1:]], 0))

        # Every batch keeps all B rows, except the last one once the input has ended.
        last_rows = rows - (num_batches - 1) * b
        num_rows = tf.where(is_last & tf.equal(tf.range(num_batches), num_batches - 1),
                            last_rows, b)
        return {k: batched(x) for k, x in dense.items()}, num_rows

    def finish(self, batch, num_rows):
        """One batch of ``pack_part`` -> its first ``num_rows`` rows."""
        return {k: v[:num_rows] for k, v in batch.items()}


class WidthsPacker:
    """One sequence feature, rows of several lengths (``long_examples`` "drop" or "truncate"):
    each example joins the rows of the shortest length that holds it, or the gap of a longer
    row (``plan_widths``).

    Args:
      layout: the batches' keys and S (``rows`` and ``blocks`` unused: see below).
      widths: ascending Python ints, the row lengths.
      width_rows: rows per batch for each row length.
    """

    def __init__(self, layout: PackLayout, widths, width_rows):
        self.layout, self.widths, self.width_rows = layout, list(widths), list(width_rows)

    def pack_part(self, is_last, part):
        """A part -> ``({name: RaggedTensor [N, (B), (T)]} per sequence output and
        ``[N, (B), S]`` per scalar key, int32 [N] rows per batch)``: N batches, each with its
        rows (no empty ones; a part's last batch of each length may have fewer) of one
        length. ``is_last`` is not needed: no batch waits for more input."""
        del is_last
        values, lengths, scalars = part
        lengths = lengths[:, 0]
        starts = exclusive_cumsum(lengths)
        names = self.layout.names(self.layout.seq_keys[0])
        cells = {name: [] for name in names}
        tables = {name: [] for name in self.layout.scalar_keys}
        batch_rows, row_widths, batch_oldest = [], [], []
        plans = plan_widths(lengths, self.widths, self.layout.segments)
        for width, b, plan in zip(self.widths, self.width_rows, plans):
            members, row_of, seg_of, rows, order = plan
            members_of = lambda x: tf.gather(x, members)  # noqa: E731
            dense = self.layout.planned_rows(
                values[0], members_of(starts), members_of(lengths),
                [members_of(v) for v in scalars], (row_of, seg_of, rows, order), width)
            for name in names:
                cells[name].append(tf.reshape(dense[name], [-1]))
            for name in self.layout.scalar_keys:
                tables[name].append(dense[name])
            num_batches = (rows + b - 1) // b
            batch_rows.append(tf.minimum(b, rows - tf.range(num_batches) * b))
            row_widths.append(tf.fill([rows], width))
            # Rows come in the order of their oldest example: a batch's first row has its own.
            oldest = tf.math.unsorted_segment_min(members, row_of, rows)
            batch_oldest.append(oldest[::b])
        batch_rows, row_widths = tf.concat(batch_rows, 0), tf.concat(row_widths, 0)
        batch_order = tf.argsort(tf.concat(batch_oldest, 0), stable=True)
        out = {}
        for name in names:
            out[name] = tf.gather(tf.RaggedTensor.from_nested_row_lengths(
                tf.concat(cells[name], 0), [batch_rows, row_widths], validate=False),
                batch_order)
        for name in self.layout.scalar_keys:
            out[name] = tf.gather(tf.RaggedTensor.from_row_lengths(
                tf.concat(tables[name], 0), batch_rows, validate=False), batch_order)
        return out, tf.gather(batch_rows, batch_order)

    def finish(self, batch, num_rows):
        """One batch of ``pack_part`` -> dense ``[B, T]`` / ``[B, S]`` tensors."""
        del num_rows
        return dense_rows(batch)
