"""Named top-level string fields from JSON Lines, decoded in graph with vectorized ops.

Shapes: n = lines in a batch, K = number of keys, F = JSON tokens in the whole batch.

``decode_fields(lines, keys)`` turns ``tf.string [n]`` (one JSON text per line) into
``({key: tf.string [n]}, ok bool [n])``::

    {"label": "sports", "text": "caf\\u00e9 \\"ok\\""}   ->  label "sports", text 'café "ok"'
    {"meta": {"text": "no"}, "text": "yes"}            ->  text "yes" (top level only)
    {"tokens": "EU rejects", "tags": ["B-ORG", "O"]}   ->  tags "B-ORG O" (``array_keys``)
    [1, 2]   /   {"text": 3}   /   {"text": "ab        ->  ok False, every field ""

How, for the whole batch at once (no Python and no ``tf.py_function`` per line):

1. *Lex.* One ``tf.strings.regex_replace`` puts a NUL before every JSON token (a string
   literal, one of ``{ } [ ] : ,``, a run of literal characters, each with the whitespace after
   it) and ``tf.strings.split`` cuts there. The string pattern admits only valid escapes and
   valid UTF-8 without raw control characters; last-resort alternatives match any other single
   character or byte, so an unterminated string, a stray quote or backslash, a raw control
   character (NUL included) or invalid UTF-8 leaves a token that is no valid token (a lone
   ``"``, a lone byte, an empty token) and fails the line. (``regex_replace`` finds whole
   matches with RE2's DFA; ``tensorflow_text.regex_split`` needs a capture group, ~2.5x slower.)
2. *Nest.* Each token's depth is a cumulative sum of +1 (opener) / -1 (closer) over the flat
   tokens, rebased per line. A stable sort of the tokens by (line, level) lines up every
   container as ``opener, its direct content, closer``, which gives each closer its opener
   and each token its container type (object, array, none).
3. *Validate.* From its kind and container each token gets a grammar role (``{``, ``[``,
   key, ``:``, an object's ``,``, an array's ``,``, end of a value, error: a closer of the
   wrong type, ``:`` outside an object, a bad literal...), and a table says which kinds of
   token may follow each role: ``{`` a key or ``}``, a key ``:``, ``:`` and ``[`` a value
   (``[`` also ``]``), a value ``,`` or a closer, ``,`` a key (object) or a value (array).
   Literals must be JSON numbers or ``true false null`` (or Python's ``NaN Infinity
   -Infinity``). The line must be one object: it opens with ``{`` and depth first returns to
   0 at its last token. Together this is JSON's grammar, so a line is accepted iff
   ``json.loads`` accepts it (exceptions below).
4. *Extract.* A key at depth 1 (directly in the top object) whose raw text equals a requested
   key names the value two tokens on; the last occurrence wins, as in ``json.loads``. A string
   value is one *piece*; for an ``array_keys`` key an array's direct elements are its pieces
   (a non-string element fails the line).
5. *Unescape.* Pieces without a backslash pass through. The others are cut before each
   escape (``regex_replace`` + ``split`` again) into an escape and the plain run after it;
   each escape becomes a code point (a table for ``\\n``-style escapes, hex arithmetic on the
   bytes of ``\\uXXXX``), a high surrogate followed by a low one becomes one code point, a
   lone surrogate fails the line, and ``tf.strings.unicode_encode`` writes the code points as
   UTF-8. ``unsorted_segment_join`` joins each field's pieces (with a space for arrays).

Cost: 7-10x ``tf.strings.split`` of the same rows as TSV; ~100k lines/s of ~220 bytes
(a label and ~30 words) in a ``tf.data`` map on 2 CPU cores, batches of 1024. The lexing regex is
~40% of it.

Differences from ``json.loads`` (the tests cross-check everything else against it):

- Keys are matched on their raw text as ``json.dumps`` writes the key (with either value of
  ``ensure_ascii``); another spelling, e.g. ``"\\u0074ext"`` for ``"text"``, is a different
  key here (and so does not take part in "last occurrence wins").
- A lone surrogate escape in a requested value fails the line (it has no UTF-8 form; Python
  would return a str holding it). Elsewhere in the line a lone surrogate escape passes.
- Lines are UTF-8 text: a byte-order mark or any invalid UTF-8 fails the line
  (``json.loads`` on bytes would sniff UTF-16/32 and skip a UTF-8 BOM).
"""

from __future__ import annotations

import json
from typing import Sequence

import tensorflow as tf

__all__ = ["decode_fields"]

# Token kinds. ``_END`` stands for "no next token" (after a line's last token), ``_SPACE`` for
# whitespace that follows no valid token (at the start of a line, or after an error): dropped.
_OBJ_OPEN, _OBJ_CLOSE, _ARR_OPEN, _ARR_CLOSE, _COLON, _COMMA, _STRING, _LITERAL, _ERROR = range(9)
_END, _SPACE = 9, 10
_NUM_KINDS = 10  # token kinds and _END

# A JSON string literal: valid escapes, and characters from explicit code point ranges (RE2
# compiles those to exact UTF-8 byte sequences, so invalid UTF-8, surrogates and raw control
# characters do not match).
_STRING_RE = (r'"(?:[\x{20}-\x{21}\x{23}-\x{5B}\x{5D}-\x{D7FF}\x{E000}-\x{10FFFF}]'
              r'|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
_PUNCT_RE = r"[{}\[\]:,]"
_LITERAL_CHARS_RE = r"[-+.0-9a-zA-Z]+"
_SPACE_RE = r"[ \t\n\r]"  # JSON's whitespace
# A token is a valid token with the whitespace after it, or else a single character (not
# whitespace: that is always taken by the token before it) or byte (\C: invalid UTF-8). Only
# whitespace at the start of a line is a token of its own.
_TOKEN_RE = (f"^{_SPACE_RE}+|(?:{_STRING_RE}|{_PUNCT_RE}|{_LITERAL_CHARS_RE}){_SPACE_RE}*"
             r"|[^ \t\n\r]|\C")
# What json.loads accepts as a bare value (its number grammar, constants, Python's extras).
_LITERAL_RE = (r"(?:-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
               rf"|true|false|null|NaN|-?Infinity){_SPACE_RE}*")
_ESCAPE_RE = r"\\(?:u[0-9a-fA-F]{4}|.)"  # one escape inside an already validated string

# A flat object: '{', "key": value pairs whose values are strings, numbers or the literals
# (no object or array), '}', whitespace where JSON allows it. json.loads accepts exactly these
# lines among those of this shape, and so does the full path, with the same literals.
_NUMBER_RE = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
_FLAT_VALUE_RE = f"(?:{_STRING_RE}|{_NUMBER_RE}|true|false|null|NaN|-?Infinity)"
_FLAT_PAIR_RE = f"{_STRING_RE}{_SPACE_RE}*:{_SPACE_RE}*{_FLAT_VALUE_RE}{_SPACE_RE}*"
_FLAT_RE = (f"{_SPACE_RE}*\\{{{_SPACE_RE}*(?:{_FLAT_PAIR_RE}(?:,{_SPACE_RE}*{_FLAT_PAIR_RE})*)?"
            f"\\}}{_SPACE_RE}*")

# First byte of a token -> its kind (strings and literals are refined afterwards). An empty
# token (byte 0, as decode_raw pads it) comes from a raw NUL.
_FIRST_BYTE_KIND = [_LITERAL] * 256
for _char, _kind in {"{": _OBJ_OPEN, "}": _OBJ_CLOSE, "[": _ARR_OPEN, "]": _ARR_CLOSE,
                     ":": _COLON, ",": _COMMA, '"': _STRING, " ": _SPACE, "\t": _SPACE,
                     "\n": _SPACE, "\r": _SPACE, "\0": _ERROR}.items():
    _FIRST_BYTE_KIND[ord(_char)] = _kind

# Grammar roles: what a token allows next. A string is a key after ``{`` or an object's ``,``.
(_R_OPEN_OBJECT, _R_OPEN_ARRAY, _R_KEY, _R_COLON, _R_OBJECT_COMMA, _R_ARRAY_COMMA,
 _R_VALUE_END, _R_ERROR) = range(8)
_VALUE_START = (_OBJ_OPEN, _ARR_OPEN, _STRING, _LITERAL)
_ALLOWED_NEXT = {
    _R_OPEN_OBJECT: (_STRING, _OBJ_CLOSE),
    _R_OPEN_ARRAY: _VALUE_START + (_ARR_CLOSE,),
    _R_KEY: (_COLON,),
    _R_COLON: _VALUE_START,
    _R_OBJECT_COMMA: (_STRING,),
    _R_ARRAY_COMMA: _VALUE_START,
    _R_VALUE_END: (_COMMA, _OBJ_CLOSE, _ARR_CLOSE, _END),
    _R_ERROR: (),
}
# [role * _NUM_KINDS + next kind] -> allowed.
_ALLOWED_TABLE = [next_kind in _ALLOWED_NEXT[role]
                  for role in range(8) for next_kind in range(_NUM_KINDS)]
_CONTAINERS = (None, _OBJ_OPEN, _ARR_OPEN)  # a token's container: none (top level), {, [


def _role(kind: int, container: int | None) -> int:
    """The grammar role of a token of ``kind`` in ``container`` (strings: as values)."""
    if kind == _OBJ_OPEN:
        return _R_OPEN_OBJECT
    if kind == _ARR_OPEN:
        return _R_OPEN_ARRAY
    if kind == _COLON:
        return _R_COLON if container == _OBJ_OPEN else _R_ERROR
    if kind == _COMMA:
        return {_OBJ_OPEN: _R_OBJECT_COMMA, _ARR_OPEN: _R_ARRAY_COMMA}.get(container, _R_ERROR)
    if kind in (_OBJ_CLOSE, _ARR_CLOSE):  # a closer must close its own kind of container
        return _R_VALUE_END if container == kind - 1 else _R_ERROR
    return _R_VALUE_END if kind in (_STRING, _LITERAL) else _R_ERROR


# [kind * 3 + container index] -> role.
_ROLE_TABLE = [_role(kind, container) for kind in range(_NUM_KINDS) for container in _CONTAINERS]
_DEPTH_DELTA = [{_OBJ_OPEN: 1, _ARR_OPEN: 1, _OBJ_CLOSE: -1, _ARR_CLOSE: -1}.get(kind, 0)
                for kind in range(_NUM_KINDS)]
_IS_OPENER = [kind in (_OBJ_OPEN, _ARR_OPEN) for kind in range(_NUM_KINDS)]

# Simple escape letter -> code point (indexed by the letter's byte value).
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r",
                   "t": "\t"}
_ESCAPE_TABLE = [ord(_SIMPLE_ESCAPES.get(chr(i), "\0")) for i in range(128)]


def decode_fields(lines: tf.Tensor, keys: Sequence[str], *,
                  array_keys: Sequence[str] = ()) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """lines tf.string [n] (one JSON text per line, no trailing newline) -> ({key: tf.string
    [n]}, ok bool [n]).

    ``out[key][i]`` is the string value of ``key`` at the top level of line ``i``, decoded as
    ``json.loads`` decodes it and encoded as UTF-8; for a key in ``array_keys`` the value may
    also be an array of strings, whose decoded elements are joined by single spaces. ``ok[i]``
    is False, and every ``out[key][i]`` is ``""``, when line ``i`` is not one valid JSON
    object, lacks one of ``keys`` at its top level, or holds a value of another type there
    (see the module docstring for the exact rules). Works eagerly, in ``tf.function`` and in
    ``tf.data`` maps, for any ``n`` including 0.
    """
    lines, keys, array_keys = _arguments(lines, keys, array_keys)
    is_flat = tf.strings.regex_full_match(lines, _FLAT_RE)
    index = tf.range(tf.size(lines))
    flat_index, other_index = index[is_flat], index[~is_flat]
    flat_values, flat_ok = _decode_flat(lines[is_flat], keys)
    other = lines[~is_flat]

    def full_path():
        fields, ok = _decode_full(other, keys, array_keys)
        return [fields[key] for key in keys], ok

    def nothing():
        return [tf.zeros([0], tf.string) for _ in keys], tf.zeros([0], tf.bool)

    # The full path only on the lines that are not flat, and not at all when there are none.
    other_values, other_ok = tf.cond(tf.size(other) > 0, full_path, nothing)

    def stitch(flat: tf.Tensor, rest: tf.Tensor) -> tf.Tensor:
        return tf.dynamic_stitch([flat_index, other_index], [flat, rest])

    fields = {key: stitch(flat_values[k], other_values[k]) for k, key in enumerate(keys)}
    return fields, stitch(flat_ok, other_ok)


def _decode_full_path(lines: tf.Tensor, keys: Sequence[str], *, array_keys: Sequence[str] = ()
                      ) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """``decode_fields`` with every line on the full path (for tests: both paths agree)."""
    return _decode_full(*_arguments(lines, keys, array_keys))


def _arguments(lines, keys, array_keys) -> tuple[tf.Tensor, tuple[str, ...], set[str]]:
    keys = tuple(dict.fromkeys(keys))
    extra = set(array_keys) - set(keys)
    if extra:
        raise ValueError(f"array_keys {sorted(extra)} are not in keys {list(keys)}")
    return tf.ensure_shape(tf.convert_to_tensor(lines, tf.string), [None]), keys, set(array_keys)


def _decode_full(lines: tf.Tensor, keys: Sequence[str], array_keys: set[str]
                 ) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """The full path (steps 1-5 of the module docstring): any line."""
    return _extract(_analyse(_lex(lines)), keys, array_keys)


# --- the fast path for flat objects -----------------------------------------------------------

def _key_spellings(key: str) -> list[str]:
    """The raw spellings of ``key`` that match (``json.dumps``, either ``ensure_ascii``)."""
    return list(dict.fromkeys([json.dumps(key, ensure_ascii=False), json.dumps(key)]))


def _re_literal(text: str) -> str:
    """An RE2 pattern matching exactly ``text`` (ASCII punctuation as ``\\x{..}``)."""
    return "".join(char if char.isalnum() or ord(char) > 127 else f"\\x{{{ord(char):02x}}}"
                   for char in text)


def _key_prefix_re(key: str) -> str:
    """From the start of a flat line through the last ``"key":`` at its top level (and the
    whitespace after it): the pairs before it are consumed whole, so a key's text inside a
    string literal is never taken for a key, and the greedy ``*`` makes the last one win."""
    spellings = "|".join(_re_literal(text) for text in _key_spellings(key))
    return (f"^{_SPACE_RE}*\\{{{_SPACE_RE}*(?:{_FLAT_PAIR_RE},{_SPACE_RE}*)*"
            f"(?:{spellings}){_SPACE_RE}*:{_SPACE_RE}*")


def _decode_flat(lines: tf.Tensor, keys: Sequence[str]) -> tuple[list[tf.Tensor], tf.Tensor]:
    """The fast path, for lines that match ``_FLAT_RE`` only: ([tf.string [n] per key], ok
    bool [n]), as ``_decode_full`` gives them."""
    ok = tf.fill(tf.shape(lines), True)
    if not keys:
        return [], ok
    contents = []
    for key in keys:
        # The line from the value of the key's last occurrence on (the line if there is none).
        rest = tf.strings.regex_replace(lines, _key_prefix_re(key), "", replace_global=False)
        after = tf.strings.regex_replace(rest, f"^{_STRING_RE}", "", replace_global=False)
        # > 0 iff the value is a string (a flat line starts with '{' or whitespace).
        literal_length = tf.strings.length(rest) - tf.strings.length(after)
        ok &= literal_length > 0
        contents.append(tf.strings.substr(rest, tf.ones_like(literal_length),
                                          tf.maximum(literal_length - 2, 0)))
    decoded, decoded_ok = _unescape_contents(tf.concat(contents, axis=0))
    ok &= tf.reduce_all(tf.reshape(decoded_ok, tf.stack([len(keys), tf.size(lines)])), axis=0)
    columns = tf.unstack(tf.reshape(decoded, tf.stack([len(keys), tf.size(lines)])),
                         num=len(keys))
    return [tf.where(ok, column, "") for column in columns], ok


# --- lexing and structure ---------------------------------------------------------------------

def _lex(lines: tf.Tensor) -> dict[str, tf.Tensor]:
    """Cuts lines tf.string [n] into JSON tokens.

    Returns ``pieces`` tf.string [P] (the tokens, with the whitespace after them, and pieces
    that are no tokens), and for the F tokens: ``token_piece`` int64 [F] (its piece),
    ``kind`` int32 [F], ``row_ids`` int64 [F] (its line), plus ``row_splits`` int64 [n+1]."""
    pieces = tf.strings.split(tf.strings.regex_replace(lines, _TOKEN_RE, "\0\\0"), "\0")
    flat, piece_row = pieces.flat_values, pieces.value_rowids()
    kind = _token_kinds(flat)
    # Every byte is in some token, so each line's first piece is the empty one before its
    # first NUL: not a token. A raw NUL in a line makes an empty piece, an error token.
    is_token = (tf.not_equal(tf.range(tf.size(flat, tf.int64)),
                             tf.gather(pieces.row_splits, piece_row))
                & tf.not_equal(kind, _SPACE))
    token_piece = tf.where(is_token)[:, 0]
    row_ids = tf.gather(piece_row, token_piece)
    row_lengths = tf.math.unsorted_segment_sum(tf.ones_like(row_ids), row_ids, pieces.nrows())
    return dict(pieces=flat, token_piece=token_piece, kind=tf.gather(kind, token_piece),
                row_ids=row_ids, row_splits=tf.concat([[0], tf.cumsum(row_lengths)], axis=0))


def _token_kinds(flat: tf.Tensor) -> tf.Tensor:
    """int32 [P]: the kind of each piece (``_OBJ_OPEN`` ... ``_ERROR``, ``_SPACE``)."""
    first = tf.io.decode_raw(flat, tf.uint8, fixed_length=1)[:, 0]
    kind = tf.gather(tf.constant(_FIRST_BYTE_KIND, tf.int32), tf.cast(first, tf.int32))
    # A lone '"' is an unterminated string (the lexer's last resort, never followed by
    # whitespace in its token), not a string.
    bad_string = tf.equal(kind, _STRING) & (tf.strings.length(flat) < 2)
    literal = tf.where(tf.equal(kind, _LITERAL))
    bad_literal = tf.scatter_nd(literal, ~tf.strings.regex_full_match(
        tf.gather_nd(flat, literal), _LITERAL_RE), tf.shape(kind, out_type=tf.int64))
    return tf.where(bad_string | bad_literal, _ERROR, kind)


def _shift(values: tf.Tensor, edge: tf.Tensor, fill: int, offset: int) -> tf.Tensor:
    """``values`` moved by ``offset`` (+1: each token sees the next one, -1: the previous one)
    within each line; ``fill`` at the line ``edge`` (its last or first token)."""
    filler = tf.constant([fill], values.dtype)
    if offset > 0:
        moved = tf.concat([values[1:], filler], axis=0)
    else:
        moved = tf.concat([filler, values[:-1]], axis=0)
    return tf.where(edge, fill, moved)


def _container_kinds(kind: tf.Tensor, level: tf.Tensor, row_ids: tf.Tensor) -> tf.Tensor:
    """int32 [F]: for a closer its opener's kind, for other tokens the kind of the innermost
    opener before them at their ``level`` (their container, in a well-nested line), -1 if none.

    Sorting stably by (line, level) lists each container as its opener, its direct content,
    its closer; the most recent opener in that order is the one asked for."""
    level = tf.cast(tf.maximum(level, 0), tf.int64)
    levels = tf.reduce_max(tf.concat([level, [0]], axis=0)) + 1
    order = tf.argsort(row_ids * levels + level, stable=True)
    sorted_kind = tf.gather(kind, order)
    is_open = tf.gather(tf.constant(_IS_OPENER), sorted_kind)
    opener_kinds = tf.concat([[-1], tf.boolean_mask(sorted_kind, is_open)], axis=0)
    container = tf.gather(opener_kinds, tf.cumsum(tf.cast(is_open, tf.int32)))
    return tf.gather(container, tf.math.invert_permutation(order))


def _analyse(tok: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Adds to ``_lex``'s tokens their ``depth_before`` / ``depth_after`` int32 [F] (open
    containers around them), ``is_key`` bool [F] and ``line_ok`` bool [n] (one valid object).

    The grammar check: each token's role (from its kind and container) allows some kinds of
    next token; the line opens with ``{`` and its depth first returns to 0 at its last token."""
    kind, row_ids, row_splits = tok["kind"], tok["row_ids"], tok["row_splits"]
    n = tf.size(row_splits, tf.int64) - 1
    index = tf.range(tf.size(kind, tf.int64))
    first = tf.equal(index, tf.gather(row_splits, row_ids))
    last = tf.equal(index + 1, tf.gather(row_splits, row_ids + 1))
    delta = tf.gather(tf.constant(_DEPTH_DELTA), kind)
    after = tf.cumsum(delta)
    before = after - delta
    base = tf.gather(before, tf.gather(row_splits, row_ids))
    depth_before, depth_after = before - base, after - base
    container = _container_kinds(kind, tf.maximum(depth_before, depth_after), row_ids)
    container_index = tf.where(tf.equal(container, _OBJ_OPEN), 1,
                               tf.where(tf.equal(container, _ARR_OPEN), 2, 0))
    role = tf.gather(tf.constant(_ROLE_TABLE), kind * len(_CONTAINERS) + container_index)
    prev_role = _shift(role, first, _R_ERROR, -1)
    is_key = tf.equal(kind, _STRING) & (tf.equal(prev_role, _R_OPEN_OBJECT)
                                        | tf.equal(prev_role, _R_OBJECT_COMMA))
    role = tf.where(is_key, _R_KEY, role)
    next_kind = _shift(kind, last, _END, +1)
    allowed = tf.gather(tf.constant(_ALLOWED_TABLE), role * _NUM_KINDS + next_kind)
    bad = (~allowed | (first & tf.not_equal(kind, _OBJ_OPEN))
           | tf.where(last, tf.not_equal(depth_after, 0), depth_after < 1))
    bad_lines = tf.math.unsorted_segment_max(tf.cast(bad, tf.int32), row_ids, n) > 0
    line_ok = (row_splits[1:] > row_splits[:-1]) & ~bad_lines
    return dict(tok, depth_before=depth_before, depth_after=depth_after, is_key=is_key,
                line_ok=line_ok)


# --- extraction -------------------------------------------------------------------------------

def _key_ids(raw: tf.Tensor, keys: Sequence[str]) -> tf.Tensor:
    """int64 [m]: the index in ``keys`` of each key token (a string literal, maybe with
    whitespace after it), -1 for other keys.

    A key matches in the spelling ``json.dumps`` gives it, with either ``ensure_ascii``."""
    spellings, ids = [], []
    for k, key in enumerate(keys):
        for text in dict.fromkeys([json.dumps(key, ensure_ascii=False), json.dumps(key)]):
            spellings.append(text)
            ids.append(k)
    if not spellings:
        return -tf.ones_like(raw, tf.int64)
    equal = tf.equal(tf.strings.strip(raw)[:, None], tf.constant(spellings))
    return tf.reduce_max(tf.where(equal, tf.constant(ids, tf.int64), -1), axis=1)


def _token_text(tok: dict[str, tf.Tensor], pos: tf.Tensor) -> tf.Tensor:
    """tf.string: the tokens at positions ``pos`` (with the whitespace after them)."""
    return tf.gather(tok["pieces"], tf.gather(tok["token_piece"], pos))


def _extract(tok: dict[str, tf.Tensor], keys: Sequence[str], array_keys: set[str]
             ) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """``decode_fields``'s result from the analysed tokens.

    Works on *slots*, one per (key, line): slot ``k * n + i`` for ``keys[k]`` in line ``i``.
    A slot's *pieces* are its decoded string value or array elements."""
    kind, row_ids = tok["kind"], tok["row_ids"]
    num_keys = len(keys)
    n = tf.size(tok["line_ok"], tf.int64)
    slots = n * num_keys
    # The last top-level key token of each slot.
    key_pos = tf.where(tok["is_key"] & tf.equal(tok["depth_after"], 1))[:, 0]
    key_id = _key_ids(_token_text(tok, key_pos), keys)
    key_pos, key_id = key_pos[key_id >= 0], key_id[key_id >= 0]
    last_key = tf.math.unsorted_segment_max(key_pos, key_id * n + tf.gather(row_ids, key_pos),
                                            slots)
    found_slot = tf.where(last_key >= 0)[:, 0]
    value_pos = tf.minimum(tf.gather(last_key, found_slot) + 2, tf.size(kind, tf.int64) - 1)
    value_kind = tf.gather(kind, value_pos)
    is_string = tf.equal(value_kind, _STRING)
    piece_pos, piece_slot = value_pos[is_string], found_slot[is_string]
    bad_slots = [found_slot[~is_string]]
    if array_keys:
        is_array = tf.equal(value_kind, _ARR_OPEN) & tf.gather(
            tf.constant([key in array_keys for key in keys]), found_slot // n)
        bad_slots = [found_slot[~is_string & ~is_array]]
        element_pos, element_slot, bad_element_slot = _array_elements(
            tok, value_pos[is_array], found_slot[is_array], n)
        piece_pos = tf.concat([piece_pos, element_pos], axis=0)
        piece_slot = tf.concat([piece_slot, element_slot], axis=0)
        bad_slots.append(bad_element_slot)
    pieces, piece_ok = _unescape(_token_text(tok, piece_pos))
    bad_slots.append(piece_slot[~piece_ok])
    bad_slot = tf.concat(bad_slots, axis=0)
    slot_bad = tf.math.unsorted_segment_max(tf.ones_like(bad_slot, tf.int32), bad_slot,
                                            slots) > 0
    slot_ok = tf.reshape((last_key >= 0) & ~slot_bad, tf.stack([num_keys, n]))
    ok = tok["line_ok"] & tf.reduce_all(slot_ok, axis=0)
    return _join_pieces(pieces, piece_slot, ok, keys, array_keys), ok


def _join_pieces(pieces: tf.Tensor, piece_slot: tf.Tensor, ok: tf.Tensor,
                 keys: Sequence[str], array_keys: set[str]) -> dict[str, tf.Tensor]:
    """{key: tf.string [n]}: the pieces of each slot of an ok line joined in order, by single
    spaces for ``array_keys``; "" for lines that are not ok.

    ``unsorted_segment_join``'s separator goes only after a non-empty prefix (["", "x"] gives
    "x"), so each array element brings its own leading space, cut off after the join (a
    string value is the only piece of its slot, and has none)."""
    n = tf.size(ok, tf.int64)
    slots = n * len(keys)
    if array_keys:
        is_element = tf.gather(tf.constant([key in array_keys for key in keys]),
                               piece_slot // n)
        pieces = tf.where(is_element, tf.strings.join([" ", pieces]), pieces)
    # Pieces of lines that are not ok go to an extra last slot, dropped.
    segment = tf.where(tf.gather(ok, piece_slot % n), piece_slot, slots)
    joined = tf.strings.unsorted_segment_join(pieces, segment, slots + 1)[:slots]
    columns = tf.unstack(tf.reshape(joined, tf.stack([len(keys), n])), num=len(keys))
    out = {}
    for key, column in zip(keys, columns):
        if key in array_keys:
            length = tf.strings.length(column)
            cut = tf.minimum(length, 1)
            column = tf.strings.substr(column, cut, length - cut)
        out[key] = column
    return out


def _array_elements(tok: dict[str, tf.Tensor], array_pos: tf.Tensor, array_slot: tf.Tensor,
                    n: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The direct elements of the top-level arrays at token positions ``array_pos``: (string
    element positions, their slots, slots with a non-string element), all int64 [?].

    Containers that are values of top-level keys ("members") come one after another in a
    line, so the last member opener before a deeper token is the member holding it."""
    kind, row_ids, depth_before = tok["kind"], tok["row_ids"], tok["depth_before"]
    is_member = tf.gather(tf.constant(_IS_OPENER), kind) & tf.equal(depth_before, 1)
    member_id = tf.cumsum(tf.cast(is_member, tf.int64)) - 1
    member_slot = tf.tensor_scatter_nd_update(
        -tf.ones(tf.reduce_sum(tf.cast(is_member, tf.int64), keepdims=True), tf.int64),
        tf.gather(member_id, array_pos)[:, None], array_slot)
    is_element = (tf.equal(depth_before, 2) & tf.not_equal(kind, _COMMA)
                  & tf.greater_equal(tf.gather(tf.constant(_DEPTH_DELTA), kind), 0))
    element_pos = tf.where(is_element & (member_id >= 0))[:, 0]
    slot = tf.gather(member_slot, tf.gather(member_id, element_pos))
    # In a broken line the member found may lie in an earlier line: keep slots within the line.
    mine = (slot >= 0) & tf.equal(slot % n, tf.gather(row_ids, element_pos))
    element_pos, slot = element_pos[mine], slot[mine]
    is_string = tf.equal(tf.gather(kind, element_pos), _STRING)
    return element_pos[is_string], slot[is_string], slot[~is_string]


# --- unescaping -------------------------------------------------------------------------------

def _unescape(raw: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Valid JSON string literal tokens tf.string [m] (quotes included, whitespace after them
    allowed) -> (their decoded UTF-8 tf.string [m], ok bool [m]: False where a surrogate
    escape is unpaired)."""
    raw = tf.strings.strip(raw)
    return _unescape_contents(tf.strings.substr(raw, tf.ones_like(tf.strings.length(raw)),
                                                tf.strings.length(raw) - 2))


def _unescape_contents(inner: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``_unescape`` of the contents of string literals (between the quotes)."""
    # Cutting at backslashes (memchr) finds the few strings with escapes faster than a regex.
    escaped = tf.where(tf.strings.split(inner, "\\").row_lengths() > 1)
    decoded, ok = _unescape_escaped(tf.gather_nd(inner, escaped))
    return (tf.tensor_scatter_nd_update(inner, escaped, decoded),
            tf.tensor_scatter_nd_update(tf.ones_like(inner, tf.bool), escaped, ok))


def _escape_code_points(pieces: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Pieces that start with an escape (``\\n``, ``\\u00e9``, ...) -> (its code point, its
    length in bytes), both int32 [p]."""
    byte = tf.cast(tf.io.decode_raw(pieces, tf.uint8, fixed_length=6), tf.int32)  # 0-padded
    letter = byte[:, 1]
    hex_chars = byte[:, 2:6]
    digits = tf.where(hex_chars <= ord("9"), hex_chars - ord("0"),
                      tf.bitwise.bitwise_or(hex_chars, 0x20) - (ord("a") - 10))
    from_hex = tf.reduce_sum(digits * tf.constant([4096, 256, 16, 1]), axis=1)
    simple = tf.gather(tf.constant(_ESCAPE_TABLE, tf.int32), tf.minimum(letter, 127))
    is_hex = tf.equal(letter, ord("u"))
    return tf.where(is_hex, from_hex, simple), tf.where(is_hex, 6, 2)


def _unescape_escaped(inner: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """String contents with at least one escape [e] -> (decoded [e], ok [e]).

    Each content is cut before every escape: its first piece is plain text, every other piece
    an escape and the plain text after it. A high surrogate escape with nothing after it and
    a low surrogate escape starting the next piece make one code point."""
    parts = tf.strings.split(tf.strings.regex_replace(inner, _ESCAPE_RE, "\0\\0"), "\0")
    pieces, piece_row = parts.flat_values, parts.value_rowids()
    is_escape = ~tf.equal(tf.range(tf.size(pieces, tf.int64)),
                          tf.gather(parts.row_splits, piece_row))
    code, escape_length = _escape_code_points(pieces)
    escape_length = tf.where(is_escape, escape_length, 0)
    tail_length = tf.strings.length(pieces) - escape_length
    tail = tf.strings.substr(pieces, escape_length, tail_length)
    is_high = is_escape & (code >= 0xD800) & (code <= 0xDBFF)
    is_low = is_escape & (code >= 0xDC00) & (code <= 0xDFFF)
    same_row_next = tf.concat([tf.equal(piece_row[1:], piece_row[:-1]), [False]], axis=0)
    next_low = tf.concat([is_low[1:], [False]], axis=0)
    paired_high = is_high & tf.equal(tail_length, 0) & next_low & same_row_next
    paired_low = is_low & tf.concat([[False], paired_high[:-1]], axis=0)
    next_code = tf.concat([code[1:], [0]], axis=0)
    code = tf.where(paired_high,
                    0x10000 + (code - 0xD800) * 0x400 + (next_code - 0xDC00), code)
    emit = is_escape & ~paired_low
    chars = tf.strings.unicode_encode(tf.RaggedTensor.from_row_lengths(
        tf.boolean_mask(code, emit), tf.cast(emit, tf.int64)), "UTF-8")
    decoded = tf.strings.reduce_join(parts.with_flat_values(
        tf.strings.join([chars, tail])), axis=1)
    lone = (is_high & ~paired_high) | (is_low & ~paired_low)
    bad = tf.math.unsorted_segment_max(tf.cast(lone, tf.int32), piece_row,
                                       tf.shape(inner, out_type=tf.int64)[0]) > 0
    return decoded, ~bad
