"""``--format=tsv``: tab-separated fields, exactly ``len(columns)`` per line.

    label<TAB>text           --format=tsv --columns=label,text
"""

from __future__ import annotations

from tfseq.formats.base import Format, split_parse


class Tsv(Format):
    """Tab-separated fields, exactly ``len(columns)`` per line."""

    name, extensions = "tsv", (".tsv",)

    def parse(self, records, fmt):
        return split_parse(records, "\t", fmt.columns)
