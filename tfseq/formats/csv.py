"""``--format=csv``: RFC 4180 on one line, parsed in the graph.

    "a, b",pos               --format=csv --columns=text,label   ->  text "a, b", label "pos"

Quoted fields may hold commas and doubled quotes (``""``); a line with a stray quote or the
wrong field count is ``malformed`` (records spanning lines are not supported: each half is
counted as malformed).
"""

from __future__ import annotations

import tensorflow as tf

from tfseq.formats.base import Format

# One CSV field: quoted (doubled quotes inside) or unquoted (no quote, no comma).
_CSV_FIELD = r'(?:"(?:[^"]|"")*"|[^",]*)'
CSV_LINE = rf"{_CSV_FIELD}(?:,{_CSV_FIELD})*"


class Csv(Format):
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
