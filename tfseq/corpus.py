"""The embedded default corpus: two aligned public-domain Bible translations (see data/README.md).

Each file is gzip TSV, one verse per line: ``book<TAB>chapter<TAB>verse<TAB>text``; line N of
the English file is the translation of line N of the Spanish file (31,102 verses each).
"""

from __future__ import annotations

import os

CORPORA = {"kjv_en": "kjv_en.tsv.gz", "rv1909_es": "rv1909_es.tsv.gz"}

# Sections of the canon, in order, with the OSIS names of their books.
SECTIONS = {
    "Law": "Gen Exod Lev Num Deut",
    "History": "Josh Judg Ruth 1Sam 2Sam 1Kgs 2Kgs 1Chr 2Chr Ezra Neh Esth",
    "Wisdom": "Job Ps Prov Eccl Song",
    "Prophets": "Isa Jer Lam Ezek Dan Hos Joel Amos Obad Jonah Mic Nah Hab Zeph Hag Zech Mal",
    "Gospels and Acts": "Matt Mark Luke John Acts",
    "Epistles": ("Rom 1Cor 2Cor Gal Eph Phil Col 1Thess 2Thess 1Tim 2Tim Titus Phlm Heb Jas "
                 "1Pet 2Pet 1John 2John 3John Jude"),
    "Revelation": "Rev",
}
SECTION_NAMES = tuple(SECTIONS)
BOOK_TO_SECTION = {book: i for i, books in enumerate(SECTIONS.values()) for book in books.split()}


def corpus_path(name: str = "kjv_en") -> str:
    """Path of an embedded corpus file: ``"kjv_en"`` or ``"rv1909_es"``.

    Raises:
      ValueError: an unknown name (the message lists the names).
    """
    if name not in CORPORA:
        raise ValueError(f"Unknown corpus {name!r}; available: {sorted(CORPORA)}")
    return os.path.join(os.path.dirname(__file__), "data", CORPORA[name])
