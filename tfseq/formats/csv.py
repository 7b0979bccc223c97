"""``--format=csv``: RFC 4180 on one line, parsed in the graph.

    "a, b",pos               --format=csv --columns=text,label   ->  text "a, b", label "pos"
    id,body,category         --format=csv --header --columns=label=category,text=body

Quoted fields may hold commas and doubled quotes (``""``); a line with a stray quote or the
wrong field count is ``malformed`` (``a quoted field that does not close``, ``3 fields,
expected 2``; records spanning lines are not supported: each half is counted as malformed).
With ``--header`` and ``--columns`` naming header columns (``FIELD=KEY``, or plain names all in
the header) the fields are found by the header's names.
"""

from __future__ import annotations

import csv
import re

import tensorflow as tf

from tfseq.formats.base import Delimited

# One CSV field: quoted (doubled quotes inside) or unquoted (no quote, no comma).
_CSV_FIELD = r'(?:"(?:[^"]|"")*"|[^",]*)'
CSV_LINE = rf"{_CSV_FIELD}(?:,{_CSV_FIELD})*"


class Csv(Delimited):
    """RFC 4180 on one line: quoted fields may hold commas and doubled quotes."""

    name, extensions = "csv", (".csv",)

    def parse(self, records, fmt):
        k = len(fmt.columns)
        well_formed = tf.strings.regex_full_match(records, CSV_LINE)
        # Field count = commas outside quoted fields + 1.
        bare = tf.strings.regex_replace(records, r'"(?:[^"]|"")*"', "")
        commas = (tf.strings.length(bare)
                  - tf.strings.length(tf.strings.regex_replace(bare, ",", "")))
        ok = tf.logical_and(well_formed, tf.equal(commas, k - 1))
        safe = tf.where(ok, records, "," * (k - 1))
        values = tf.io.decode_csv(safe, record_defaults=[""] * k, use_quote_delim=True,
                                  na_value="__tfseq_never__")
        return {name: values[i] for i, name in enumerate(fmt.columns) if name != "_"}, ok

    def header_fields(self, line):
        return next(csv.reader([line]), [])

    def count_fields(self, line):
        return len(next(csv.reader([line]), [])) or 1 if re.fullmatch(CSV_LINE, line) else None

    def malformed_detail(self, record, fmt):
        line = record.decode("utf-8", errors="replace")
        if re.fullmatch(CSV_LINE, line):
            return super().malformed_detail(record, fmt)
        if line.count('"') % 2:
            return "a quoted field that does not close"
        return "a quote inside an unquoted field, or text after a closing quote"
