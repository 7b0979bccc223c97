"""Rows with named columns from user files: TSV, CSV (RFC 4180), plain text, CoNLL, JSON Lines,
TFRecord of ``tf.train.Example`` and Parquet, parsed in graph.

Shapes: n = records in a batch.

A *record* is what becomes one example: a line of a TSV/CSV/text/JSON Lines file, a sentence
of a CoNLL file, an Example, a Parquet row, or a line pair of two line-aligned files.
``read_records`` reads records in file order as ``tf.string [n]`` batches; ``parse_rows`` cuts
a batch into rows ``{column: tf.string [n]}`` and counts every record it drops
(``tfseq.DropCounter``)::

    label<TAB>text           --format=tsv --columns=label,text
    "a, b",pos               --format=csv --columns=text,label   ->  text "a, b", label "pos"
    any line                 --format=text                       ->  {"text": "any line"}
    EU    B-ORG              --format=conll --columns=token,tag  ->  {"token": "EU rejects",
    rejects  O                 (one token per line, a blank          "tag": "B-ORG O"}
    <blank line>               line ends a sentence)
    {"text": "a \u00e9", "label": "x"}   --format=jsonl --columns=label,text  (keys by name)
    {"category": 2, "meta": {"body": "a"}}  --columns=label=category,text=meta.body
    Example{text: bytes, label: int64}  --format=tfrecord --columns=label,text (features)
    body: string, category: int64       --format=parquet --columns=label=category,text=body

One module per format (``tsv``, ``csv``, ``text``, ``conll``, ``jsonl``, ``tfrecord``,
``parquet``, and ``pair`` for two aligned files), each a ``Format`` subclass that owns its
reading, parsing, the naming and explaining of its bad records, and what a run must do about
its files; ``base`` holds what they share and the functions that dispatch on a ``RowFormat``.

``--columns`` names a record's fields in order (``_`` skips one); formats with named fields
(JSON Lines, TFRecord, Parquet, and TSV/CSV with ``--header``) read them by name, and
``FIELD=KEY`` reads the file's ``KEY`` into the task's column ``FIELD`` (a dotted ``KEY``
reaches into nested JSON objects). Numbers and booleans are read as their text.

Drop reasons: ``malformed`` (the record does not have the fields ``--columns`` names;
``drop_examples`` says what is wrong: ``3 fields, expected 2``, ``a quoted field that does not
close``, ``missing key 'text'``, ``'label' is an object, expected a string, a number or a
list``, ``not a JSON object: a list``, ``no feature 'text'``, ``'text' is null``),
``invalid_utf8``, ``empty_text`` (a text column, ``TEXT_COLUMNS``, is blank), ``other_split``
(the record is held out for the other split by ``eval_percent``). Parsing is vectorized
``tf.strings`` / ``tf.io.decode_csv`` on batches, no Python per record.
"""

from tfseq.errors import InputError  # also tfseq.formats.InputError, as before
from tfseq.formats.base import (  # noqa: F401
    DROP_REASONS, FIELD_SEPARATOR, FORMAT_CLASSES, PAIR, READ_BATCH, TEXT_COLUMNS, Delimited,
    Format, RowFormat, drop_checks, drop_examples, format_of, in_eval_split, infer_format,
    parse, parse_rows, read_records, read_rows, resolve, row_format, split_columns,
    text_column)
from tfseq.formats import base as _base
from tfseq.formats.conll import Conll, conll_sentences  # noqa: F401
from tfseq.formats.csv import Csv
from tfseq.formats.jsonl import JsonLines, decode_fields, decode_paths  # noqa: F401
from tfseq.formats.pair import Pair, read_aligned  # noqa: F401
from tfseq.formats.parquet import Parquet
from tfseq.formats.text import Text
from tfseq.formats.tfrecord import (  # noqa: F401
    TfRecord, feature_kinds, parse_examples, record_problem)
from tfseq.formats.tsv import Tsv

# ``--format`` -> its class, in inference order (Text, the default, matches nothing).
FORMAT_CLASSES.update({f.name: f for f in (
    Tsv(), Csv(), Text(), JsonLines(), TfRecord(), Parquet(), Conll())})
_base._PAIR_FORMAT.append(Pair())
LINE_FORMATS = tuple(n for n, f in FORMAT_CLASSES.items() if f.per_line)  # a record per line
RECORD_FORMATS = tuple(n for n, f in FORMAT_CLASSES.items() if f.per_example)
FORMATS = tuple(FORMAT_CLASSES)
