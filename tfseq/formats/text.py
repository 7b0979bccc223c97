"""``--format=text``: the whole line is the one column, ``text`` (what a file of any other
name is).

    any line                 --format=text                       ->  {"text": "any line"}
"""

from __future__ import annotations

import tensorflow as tf

from tfseq.errors import InputError
from tfseq.formats.base import Format


class Text(Format):
    """The whole line is the one column, ``text``."""

    name, only_column = "text", "text"

    def matches(self, basename):
        return False  # the default when nothing else matches

    def columns_for(self, columns, required):
        columns = tuple(columns or ("text",))
        if columns != ("text",) or tuple(required) != ("text",):
            raise InputError(f"--format=text gives one column, 'text'; this task needs "
                             f"{list(required)}: use --format=tsv or csv with --columns="
                             + ",".join(required))
        return columns

    def parse(self, records, fmt):
        return {"text": records}, tf.ones_like(records, tf.bool)
