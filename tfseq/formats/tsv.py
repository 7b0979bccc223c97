"""``--format=tsv``: tab-separated fields, exactly ``len(columns)`` per line.

    label<TAB>text           --format=tsv --columns=label,text
    category<TAB>body        --format=tsv --header --columns=label=category,text=body

With ``--header`` and ``--columns`` naming header columns (``FIELD=KEY``, or plain names all in
the header) the fields are found by the header's names. A line of another field count is
``malformed`` (``3 fields, expected 2``).
"""

from __future__ import annotations

from tfseq.formats.base import Delimited, split_parse


class Tsv(Delimited):
    """Tab-separated fields, exactly ``len(columns)`` per line."""

    name, extensions = "tsv", (".tsv",)

    def parse(self, records, fmt):
        return split_parse(records, "\t", fmt.columns)

    def header_fields(self, line):
        return line.split("\t")

    def count_fields(self, line):
        return line.count("\t") + 1
