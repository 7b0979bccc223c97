"""``--format=conll``: one token per line, a blank line ends a sentence; a record per sentence.

    EU    B-ORG              --format=conll --columns=token,tag  ->  {"token": "EU rejects",
    rejects  O                 (one token per line, a blank          "tag": "B-ORG O"}
    <blank line>               line ends a sentence)

Each non-blank line is one token, its columns separated by tabs (or, in a line with no tab, by
runs of spaces); a blank line ends a sentence, and so does the end of the file (a last
sentence without a blank line after it still counts). A sentence's record holds each named
column as the space-joined values of its lines. Lines starting with ``#`` (CoNLL-U comments)
and ``-DOCSTART-`` lines (CoNLL-2003 document marks) are markup, not tokens, and are skipped. A
sentence with a line of the wrong field count is ``malformed`` (``drop_examples`` names the
line: ``5 fields, expected 3``).
"""

from __future__ import annotations

import gzip
from typing import Sequence

import tensorflow as tf

from tfseq._common import mark_last
from tfseq.formats.base import (FIELD_SEPARATOR, READ_BATCH, Format, RowFormat,
                                fields_detail, split_parse)
from tfseq.reading import verify_gzip

_CONLL_BATCH = 4096      # lines grouped into sentences per step


class Conll(Format):
    """One token per line, a blank line ends a sentence: a record per sentence."""

    name, extensions, per_line, per_example = "conll", (".conll", ".conllu"), False, False
    token_lines = True

    def read(self, files, fmt, *, batch_size, num_shards, shard_index, in_order):
        ds = conll_sentences(files, fmt, batch_size=batch_size)
        if num_shards > 1:
            ds = ds.unbatch().shard(num_shards, shard_index).batch(batch_size)
        return ds

    def parse(self, records, fmt):
        return split_parse(records, FIELD_SEPARATOR, fmt.names)

    def drop_examples(self, files, fmt, limit):
        """Token lines with the wrong number of fields, named by line."""
        found: list[str] = []
        for path in files:
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rt", encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    line = line.strip()
                    if (fmt.header and number == 1) or not line or line.startswith("#") \
                            or line.split()[0] == "-DOCSTART-":
                        continue
                    fields = line.split("\t") if "\t" in line else line.split()
                    if len(fields) != len(fmt.columns):
                        found.append(f"{path}:{number}: malformed "
                                     f"({fields_detail(len(fields), len(fmt.columns))})")
                        if len(found) >= limit:
                            return found
        return found


def conll_sentences(files: Sequence[str], fmt: RowFormat, *,
                    batch_size: int = READ_BATCH) -> tf.data.Dataset:
    """CoNLL files -> one record per sentence, ``tf.string [n]`` batches, in file order.

    A record holds the named columns of ``fmt`` joined by ``"\\n"``, each the space-joined
    values of the sentence's token lines (``"EU rejects\\nB-ORG O"``); a sentence with a line
    of the wrong field count becomes a record with one field too many, which ``parse`` calls
    ``malformed``. See the module docstring for blank lines, comments and ``-DOCSTART-``.
    """
    per_file = []
    for path in files:
        kind = "GZIP" if path.endswith(".gz") else ""
        if kind:
            verify_gzip(path)
        lines = tf.data.TextLineDataset(path, compression_type=kind)
        if fmt.header:
            lines = lines.skip(1)
        groups = mark_last(lines.batch(_CONLL_BATCH)).scan(
            tf.zeros([0], tf.string), lambda carry, step: _group_sentences(carry, step, fmt))
        per_file.append(groups.unbatch())
    ds = per_file[0]
    for more in per_file[1:]:
        ds = ds.concatenate(more)
    return ds.batch(batch_size)


def _split_fields(lines: tf.Tensor) -> tf.RaggedTensor:
    """``tf.string [m]`` CoNLL token lines -> their fields ``[m, (k)]``: split on tabs, or on
    runs of whitespace in a line without a tab."""
    tabbed = tf.strings.split(lines, "\t")
    spaced = tf.strings.split(lines)
    return _rowwise(tf.strings.regex_full_match(lines, ".*\t.*"), tabbed, spaced)


def _rowwise(choose_first: tf.Tensor, first: tf.RaggedTensor,
             second: tf.RaggedTensor) -> tf.RaggedTensor:
    """Row i of ``first`` where ``choose_first[i]``, else row i of ``second`` (``[m, (k)]``)."""
    rows = tf.range(tf.size(choose_first))
    both = tf.concat([first, second], axis=0)
    pick = tf.where(choose_first, rows, rows + tf.size(choose_first))
    return tf.gather(both, pick)


def _group_sentences(carry: tf.Tensor, step, fmt: RowFormat):
    """One ``scan`` step: lines (after the ``carry`` of an unfinished sentence) -> the records
    of the sentences they finish, and the new carry (the lines of the last, open sentence;
    nothing at the end of the file)."""
    is_last, batch = step
    lines = tf.strings.strip(tf.concat([carry, batch], 0))
    markup = tf.strings.regex_full_match(lines, r"#.*|-DOCSTART-(\s.*)?")
    lines = tf.boolean_mask(lines, tf.logical_not(markup))
    blank = tf.equal(lines, "")
    sentence = tf.cumsum(tf.cast(blank, tf.int32), exclusive=True)
    open_id = tf.reduce_sum(tf.cast(blank, tf.int32))
    finished = tf.logical_not(blank) & (is_last | (sentence < open_id))
    new_carry = tf.boolean_mask(lines, tf.logical_not(blank) & tf.logical_not(finished))
    token_lines = tf.boolean_mask(lines, finished)
    ids, index = tf.unique(tf.boolean_mask(sentence, finished))
    num = tf.size(ids)
    fields = _split_fields(token_lines)
    width = len(fmt.columns)
    ok_line = tf.equal(fields.row_lengths(), width)
    dense = fields.to_tensor("", shape=[None, width])
    ok = tf.math.unsorted_segment_min(tf.cast(ok_line, tf.int32), index, num) > 0
    columns = [tf.strings.unsorted_segment_join(dense[:, i], index, num, separator=" ")
               for i, name in enumerate(fmt.columns) if name != "_"]
    joined = tf.strings.reduce_join(tf.stack(columns, axis=1), axis=1,
                                    separator=FIELD_SEPARATOR)
    # A malformed sentence gets one field too many: ``parse`` counts it.
    records = tf.where(ok, joined, joined + FIELD_SEPARATOR)
    return new_carry, records
