"""``--format=jsonl``: one JSON object per line, columns by key, decoded in the graph with
vectorized ops (``decode_fields``).

    {"text": "a \\u00e9", "label": "x"}   --format=jsonl --columns=label,text  (keys by name)

Keys in any order, other keys ignored; ``--columns=label=category,text=meta.body`` reads the
key ``category`` as the column ``label`` and the key ``body`` of the object under ``meta`` as
``text`` (``decode_paths``). A number, ``true`` or ``false`` is read as its text (``"label":
2`` -> ``"2"``), an array of strings or numbers is joined by spaces. A line that is not an
object, lacks a named key or holds null, an object or a list of those for it is ``malformed``,
and ``drop_examples`` says which (``json_problem``: ``missing key 'text'``, ``'label' is an
object, expected a string, a number or a list``). The held-out hash of a JSON line is
that of its named columns joined by tabs, so the same rows split alike in every format.

Shapes: n = lines in a batch, K = number of keys, F = JSON tokens in the whole batch.

``decode_fields(lines, keys)`` turns ``tf.string [n]`` (one JSON text per line) into
``({key: tf.string [n]}, ok bool [n])``::

    {"label": "sports", "text": "caf\\u00e9 \\"ok\\""}   ->  label "sports", text 'café "ok"'
    {"meta": {"text": "no"}, "text": "yes"}            ->  text "yes" (top level only)
    {"tokens": "EU rejects", "tags": ["B-ORG", "O"]}   ->  tags "B-ORG O" (``array_keys``)
    [1, 2]   /   {"text": 3}   /   {"text": "ab        ->  ok False, every field ""

How, for the whole batch at once (no Python and no ``tf.py_function`` per line). Both paths
give the same values and ok (the tests compare them on every line they have):

0. *Fast path for flat objects* (``{"key": value, ...}`` whose values are strings, numbers or
   literals): two ``regex_full_match`` of that grammar (without, then with, backslashes) find
   them; cut at every ``"`` (``tf.strings.split``, memchr fast) their pieces alternate
   structure and string contents, which gives keys and string values directly
   (``_decode_flat``). The other lines take steps 1-5, skipped by a ``tf.cond`` when none.
1. *Lex* (``_lex``): one ``regex_replace`` puts a NUL before every JSON token and ``split``
   cuts there. The string pattern admits only valid escapes and valid UTF-8 without raw
   control characters; anything else leaves an invalid token that fails the line.
   (``regex_replace`` uses RE2's DFA; ``tensorflow_text.regex_split`` would need a capture
   group, and is slower.)
2. *Nest* (``_container_kinds``): depths are a cumulative sum of +1 / -1 over the tokens; a
   stable sort by (line, level) lines up each container as opener, direct content, closer.
3. *Validate* (``_analyse``): each token's grammar role (from its kind and container) allows
   some kinds of next token, a table of JSON's grammar; the line must be one object. So a line
   is accepted iff ``json.loads`` accepts it (exceptions below).
4. *Extract* (``_extract``): a key at depth 1 equal to a requested key names the value two
   tokens on; the last occurrence wins, as in ``json.loads``. For ``array_keys`` an array's
   direct string elements are its pieces (any other element fails the line).
5. *Unescape* (``_unescape``): pieces with a backslash are cut at each escape, escapes become
   code points (surrogate pairs joined, a lone surrogate fails the line) and
   ``unicode_encode`` writes UTF-8; ``unsorted_segment_join`` joins each field's pieces.

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

import functools
import json
from typing import NamedTuple, Sequence

import tensorflow as tf

from tfseq.errors import InputError
from tfseq.filtering import valid_utf8
from tfseq.formats.base import Format, RowFormat, mapped_keys, named_columns_key

__all__ = ["decode_fields", "decode_paths", "JsonLines"]

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
_SCALAR_RE = (r"(?:-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
              r"|true|false|null|NaN|-?Infinity)")
_LITERAL_RE = f"{_SCALAR_RE}{_SPACE_RE}*"
_BARE_VALUE_RE = _SCALAR_RE.replace("|null", "")  # what ``scalars`` reads as text: not null

# A flat object: '{', "key": value pairs whose values are strings or bare values (no object or
# array), '}', whitespace where JSON allows it. json.loads and the full path accept every line
# of this shape (and so the fast path takes only lines they accept).
_FLAT_VALUE_RE = f"(?:{_STRING_RE}|{_SCALAR_RE})"
_FLAT_PAIR_RE = f"{_STRING_RE}{_SPACE_RE}*:{_SPACE_RE}*{_FLAT_VALUE_RE}{_SPACE_RE}*"
_FLAT_RE = (f"{_SPACE_RE}*\\{{{_SPACE_RE}*(?:{_FLAT_PAIR_RE}(?:,{_SPACE_RE}*{_FLAT_PAIR_RE})*)?"
            f"\\}}{_SPACE_RE}*")
_PLAIN_STRING_RE = r'"[\x{20}-\x{21}\x{23}-\x{5B}\x{5D}-\x{D7FF}\x{E000}-\x{10FFFF}]*"'
_FLAT_PLAIN_RE = _FLAT_RE.replace(_STRING_RE, _PLAIN_STRING_RE)  # no backslash at all
_ODD_BACKSLASHES_RE = r"(?s)(?:.*[^\\])?(?:\\\\)*\\"  # ends with an odd run of \\

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


class _Request(NamedTuple):
    """What ``decode_fields`` is asked: the keys, and which of them take arrays, objects or
    bare values."""

    keys: tuple[str, ...]
    array_keys: frozenset
    object_keys: frozenset
    scalars: bool


def decode_fields(lines: tf.Tensor, keys: Sequence[str], *, array_keys: Sequence[str] = (),
                  object_keys: Sequence[str] = (), scalars: bool = False
                  ) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """lines tf.string [n] (one JSON text per line, no trailing newline) -> ({key: tf.string
    [n]}, ok bool [n]).

    ``out[key][i]`` is the string value of ``key`` at the top level of line ``i``, decoded as
    ``json.loads`` decodes it and encoded as UTF-8; for a key in ``array_keys`` the value may
    also be an array of strings, whose decoded elements are joined by single spaces. With
    ``scalars``, a number, ``true`` or ``false`` (also as an array element) is read as its
    JSON text (``2`` -> ``"2"``, ``-1.5e3`` -> ``"-1.5e3"``); ``null`` never is. For a key in
    ``object_keys`` the value must be an object, read as its JSON text (to decode again:
    ``decode_paths``). ``ok[i]`` is False, and every ``out[key][i]`` is ``""``, when line
    ``i`` is not one valid JSON object, lacks one of ``keys`` at its top level, or holds a
    value of another type there (see the module docstring for the exact rules). Works
    eagerly, in ``tf.function`` and in ``tf.data`` maps, for any ``n`` including 0.
    """
    lines, request = _arguments(lines, keys, array_keys, object_keys, scalars)
    keys = request.keys
    # Flat lines without a backslash (most) are found by one regex, the others by a second.
    is_plain = tf.strings.regex_full_match(lines, _FLAT_PLAIN_RE)
    not_plain = tf.where(~is_plain)
    is_flat = tf.tensor_scatter_nd_update(is_plain, not_plain, tf.strings.regex_full_match(
        tf.gather_nd(lines, not_plain), _FLAT_RE))
    values, update_index, updates, ok = _decode_flat(lines, is_flat, is_plain, request)
    # The full path only on the lines that are not flat, and not at all when there are none.
    other = tf.where(~is_flat)

    def full_path():
        fields, other_ok = _decode_full(tf.gather_nd(lines, other), request)
        return [fields[key] for key in keys], other_ok

    def nothing():
        return [tf.zeros([0], tf.string) for _ in keys], tf.zeros([0], tf.bool)

    other_values, other_ok = tf.cond(tf.size(other) > 0, full_path, nothing)
    fields = {key: tf.tensor_scatter_nd_update(
        values[k], tf.concat([update_index[k], other], axis=0),
        tf.concat([updates[k], other_values[k]], axis=0)) for k, key in enumerate(keys)}
    return fields, tf.tensor_scatter_nd_update(ok, other, other_ok)


def decode_paths(lines: tf.Tensor, paths: Sequence[str], *, array_paths: Sequence[str] = (),
                 scalars: bool = False) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """``decode_fields`` for keys given as dotted paths: ``"meta.body"`` is the ``body`` key of
    the object that is the value of the top-level key ``meta`` (a key holding a dot cannot be
    named). Each level of nesting decodes the objects' JSON text again, so a nested key costs
    about one more decode of its objects; paths without a dot cost nothing more.

    Raises:
      ValueError: a path that is also the head of another (``meta`` and ``meta.body``).
    """
    paths = tuple(dict.fromkeys(paths))
    leaves = [p for p in paths if "." not in p]
    nested: dict[str, list[str]] = {}
    for path in paths:
        if "." in path:
            head, rest = path.split(".", 1)
            nested.setdefault(head, []).append(rest)
    both = sorted(set(leaves) & set(nested))
    if both:
        raise ValueError(f"{both[0]!r} is named both as a key and as an object holding "
                         f"{nested[both[0]][0]!r}")
    fields, ok = decode_fields(lines, leaves + list(nested),
                               array_keys=[p for p in leaves if p in array_paths],
                               object_keys=list(nested), scalars=scalars)
    out = {p: fields[p] for p in leaves}
    for head, rests in nested.items():
        inner, inner_ok = decode_paths(
            fields[head], rests, scalars=scalars,
            array_paths=[p.split(".", 1)[1] for p in array_paths if p.startswith(head + ".")])
        ok &= inner_ok
        out.update({f"{head}.{rest}": value for rest, value in inner.items()})
    if nested:  # a line that fails at any level has every field ""
        out = {p: tf.where(ok, v, "") for p, v in out.items()}
    return {p: out[p] for p in paths}, ok


def _decode_full_path(lines: tf.Tensor, keys: Sequence[str], *, array_keys: Sequence[str] = (),
                      object_keys: Sequence[str] = (), scalars: bool = False
                      ) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """``decode_fields`` with every line on the full path (for tests: both paths agree)."""
    return _decode_full(*_arguments(lines, keys, array_keys, object_keys, scalars))


def _arguments(lines, keys, array_keys, object_keys, scalars) -> tuple[tf.Tensor, _Request]:
    keys = tuple(dict.fromkeys(keys))
    for name, subset in (("array_keys", array_keys), ("object_keys", object_keys)):
        extra = set(subset) - set(keys)
        if extra:
            raise ValueError(f"{name} {sorted(extra)} are not in keys {list(keys)}")
    return (tf.ensure_shape(tf.convert_to_tensor(lines, tf.string), [None]),
            _Request(keys, frozenset(array_keys), frozenset(object_keys), bool(scalars)))


def _decode_full(lines: tf.Tensor, request: _Request) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """The full path (steps 1-5 of the module docstring): any line."""
    return _extract(_analyse(_lex(lines)), request)


# --- the fast path for flat objects -----------------------------------------------------------

def _key_spellings(key: str) -> list[str]:
    """The raw spellings of ``key`` that match (``json.dumps``, either ``ensure_ascii``)."""
    return list(dict.fromkeys([json.dumps(key, ensure_ascii=False), json.dumps(key)]))


def _decode_flat(lines: tf.Tensor, is_flat: tf.Tensor, is_plain: tf.Tensor,
                 request: _Request) -> tuple[list[tf.Tensor], list[tf.Tensor],
                                             list[tf.Tensor], tf.Tensor]:
    """The fast path: ``decode_fields`` for the lines that match ``_FLAT_RE`` (``is_flat``;
    ``is_plain``: they match ``_FLAT_PLAIN_RE``). Returns ([value tf.string [n] per key],
    [update indices int64 [u, 1] per key], [update tf.string [u] per key], ok bool [n]): a
    key's field is its value with the updates scattered in, for flat lines; ok is False for
    the others.

    Cut at every '"', a flat line's pieces are alternately structure (whitespace, ``{ } : ,``
    and non-string values) and string contents, except where a quote is escaped: the piece
    before it ends with an odd number of backslashes (a backslash is always in a string in a
    flat line, and each escape there is two characters). Pieces joined again across escaped
    quotes are the line's *tokens*: token 2j+1 is the content of its j-th string, which is a
    key iff token 2j+2 starts with ':', with a string value (token 2j+3) iff it is just ':',
    else with the bare value between the ':' and the ',' or '}' that token holds. A key of
    ``object_keys`` fails a flat line (its value cannot be an object there)."""
    keys = request.keys
    num_keys = len(keys)
    if not num_keys:
        return [], [], [], is_flat
    n = tf.size(lines, tf.int64)
    cut = tf.raw_ops.StringSplitV2(input=lines, sep='"')  # >= 1 piece per line, "" included
    pieces, piece_row, piece_index = cut.values, cut.indices[:, 0], cut.indices[:, 1]
    escapable = is_flat & ~is_plain  # lines whose quotes may be escaped
    check = tf.where(tf.gather(escapable, piece_row))[:, 0]
    checked = tf.gather(pieces, check)
    checked_length = tf.strings.length(checked)
    ends_in_backslash = tf.where(tf.equal(tf.strings.substr(
        checked, tf.maximum(checked_length - 1, 0), tf.minimum(checked_length, 1)), "\\"))[:, 0]
    before_escaped_quote = tf.gather(check, ends_in_backslash)[tf.strings.regex_full_match(
        tf.gather(checked, ends_in_backslash), _ODD_BACKSLASHES_RE)]
    escaped = tf.scatter_nd(before_escaped_quote[:, None], tf.ones_like(
        before_escaped_quote, tf.bool), tf.shape(pieces, tf.int64))
    tokens, token_row, token_index = tf.cond(
        tf.reduce_any(escaped), lambda: _join_escaped_quotes(pieces, piece_index, escaped, n),
        lambda: (pieces, piece_row, piece_index))
    # Key candidates: string contents of flat lines with a key's length, then its text.
    texts, ids = [], []
    for k, key in enumerate(keys):
        for text in _key_spellings(key):
            texts.append(text[1:-1].encode("utf-8"))
            ids.append(k)
    length = tf.strings.length(tokens)
    by_length = tf.equal(length, len(texts[0]))
    for size in sorted({len(text) for text in texts[1:]} - {len(texts[0])}):
        by_length |= tf.equal(length, size)
    candidate = tf.where(by_length)[:, 0]
    candidate = tf.gather(candidate, tf.where(
        tf.gather(is_flat, tf.gather(token_row, candidate))
        & tf.equal(tf.bitwise.bitwise_and(tf.gather(token_index, candidate), 1), 1))[:, 0])
    text = tf.gather(tokens, candidate)
    key_id = tf.fill(tf.shape(candidate), tf.constant(-1, tf.int64))
    for spelling, k in zip(texts, ids):
        key_id = tf.where(tf.equal(text, spelling), tf.constant(k, tf.int64), key_id)
    # A content token is never a line's last token: the next one is the structure after it.
    after = tf.strings.strip(tf.gather(tokens, candidate + 1))
    after_length = tf.strings.length(after)
    is_key = (key_id >= 0) & tf.equal(tf.strings.substr(
        after, tf.zeros_like(after_length), tf.minimum(after_length, 1)), ":")
    is_key = tf.where(is_key)[:, 0]
    key_pos, key_id = tf.gather(candidate, is_key), tf.gather(key_id, is_key)
    # The last occurrence of each key in each line (slot key * n + line); its value is a
    # string iff only ':' stands between the key and the next quote.
    last_key = tf.maximum(tf.math.unsorted_segment_max(
        tf.range(tf.size(key_pos, tf.int64)), key_id * n + tf.gather(token_row, key_pos),
        num_keys * n), -1) + 1  # 0: none
    slot_after = tf.gather(tf.concat([[""], tf.gather(after, is_key)], axis=0), last_key)
    value_slot = last_key > 0
    if request.object_keys:
        value_slot &= tf.repeat(tf.constant([key not in request.object_keys for key in keys]),
                                n)
    is_string = value_slot & tf.equal(slot_after, ":")
    value_pos = tf.where(is_string,
                         tf.gather(tf.concat([[0], key_pos + 2], axis=0), last_key), 0)
    # Strings of lines with a backslash are unescaped; unpaired surrogates fail their line.
    escapes = tf.where(tf.tile(escapable, [num_keys]) & is_string)[:, 0]
    decoded, decoded_ok = _unescape_contents(tf.gather(tokens, tf.gather(value_pos, escapes)))
    slot_ok = tf.tensor_scatter_nd_update(is_string, escapes[:, None], decoded_ok)
    if request.scalars:
        bare_slots, bare = _bare_values(slot_after, value_slot & ~is_string)
        slot_ok = tf.tensor_scatter_nd_update(slot_ok, bare_slots[:, None],
                                              tf.ones_like(bare_slots, tf.bool))
        escapes = tf.concat([escapes, bare_slots], axis=0)
        decoded = tf.concat([decoded, bare], axis=0)
    ok = tf.reduce_all(tf.reshape(slot_ok, tf.stack([num_keys, n])), axis=0)
    escape_line = escapes % tf.maximum(n, 1)
    keep = tf.where(tf.gather(ok, escape_line))[:, 0]
    escape_line, decoded = tf.gather(escape_line, keep), tf.gather(decoded, keep)
    escape_key = tf.cast(tf.gather(escapes, keep) // tf.maximum(n, 1), tf.int32)
    # Flat lines that are not ok get "".
    bad = tf.where(is_flat & ~ok)
    no_values = tf.zeros(tf.shape(bad)[:1], tf.string)
    values = tf.unstack(tf.reshape(value_pos, tf.stack([num_keys, n])), num=num_keys)
    lines_k = tf.dynamic_partition(escape_line, escape_key, num_keys)
    decoded_k = tf.dynamic_partition(decoded, escape_key, num_keys)
    return ([tf.gather(tokens, pos) for pos in values],
            [tf.concat([line[:, None], bad], axis=0) for line in lines_k],
            [tf.concat([text, no_values], axis=0) for text in decoded_k], ok)


def _bare_values(slot_after: tf.Tensor, candidate: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The slots (int64 [b]) whose value is a number, ``true`` or ``false``, and its text
    (tf.string [b]), from the structure after each slot's key (``: 2,`` or ``: true}``; a flat
    line holds nothing else there) for the ``candidate`` slots (bool [K*n])."""
    slots = tf.where(candidate)[:, 0]
    text = tf.strings.regex_replace(tf.gather(slot_after, slots),
                                    f"^:{_SPACE_RE}*|{_SPACE_RE}*[,}}]$", "")
    good = tf.strings.regex_full_match(text, _BARE_VALUE_RE)
    return slots[good], text[good]


def _join_escaped_quotes(pieces: tf.Tensor, piece_index: tf.Tensor, escaped: tf.Tensor,
                         n: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Pieces [P] (``piece_index``: their index in their line; ``escaped``: the quote after
    them is escaped) -> (tokens [T], their line, their index in their line)."""
    starts = tf.concat([[True], ~escaped], axis=0)[:-1]
    token_id = tf.cumsum(tf.cast(starts, tf.int64)) - 1
    num_tokens = tf.reduce_sum(tf.cast(starts, tf.int64))
    tokens = tf.strings.unsorted_segment_join(pieces, token_id, num_tokens, separator='"')
    # Every flat line has pieces: its first piece starts its first token.
    line_start = token_id[tf.equal(piece_index, 0)]
    token_row = tf.cumsum(tf.scatter_nd(line_start[1:, None], tf.ones_like(line_start[1:]),
                                        num_tokens[None]))
    return tokens, token_row, tf.range(num_tokens) - tf.gather(line_start, token_row)


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
        for text in _key_spellings(key):
            spellings.append(text)
            ids.append(k)
    if not spellings:
        return -tf.ones_like(raw, tf.int64)
    equal = tf.equal(tf.strings.strip(raw)[:, None], tf.constant(spellings))
    return tf.reduce_max(tf.where(equal, tf.constant(ids, tf.int64), -1), axis=1)


def _token_text(tok: dict[str, tf.Tensor], pos: tf.Tensor) -> tf.Tensor:
    """tf.string: the tokens at positions ``pos`` (with the whitespace after them)."""
    return tf.gather(tok["pieces"], tf.gather(tok["token_piece"], pos))


def _extract(tok: dict[str, tf.Tensor], request: _Request
             ) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """``decode_fields``'s result from the analysed tokens.

    Works on *slots*, one per (key, line): slot ``k * n + i`` for ``keys[k]`` in line ``i``.
    A slot's *pieces* are its decoded string value or array elements (bare values: their
    text; an object of ``object_keys``: its JSON text)."""
    keys, array_keys = request.keys, request.array_keys
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
    wants_object = tf.gather(tf.constant([key in request.object_keys for key in keys],
                                         tf.bool), found_slot // n)
    is_value = tf.equal(value_kind, _STRING)
    if request.scalars:
        is_value |= tf.equal(value_kind, _LITERAL) & tf.not_equal(
            tf.strings.strip(_token_text(tok, value_pos)), "null")
    is_value &= ~wants_object
    piece_pos, piece_slot = value_pos[is_value], found_slot[is_value]
    is_object = wants_object & tf.equal(value_kind, _OBJ_OPEN)
    handled = is_value | is_object
    bad_slots = []
    if array_keys:
        is_array = tf.equal(value_kind, _ARR_OPEN) & tf.gather(
            tf.constant([key in array_keys for key in keys]), found_slot // n)
        handled |= is_array
        element_pos, element_slot, bad_element_slot = _array_elements(
            tok, value_pos[is_array], found_slot[is_array], n, request.scalars)
        piece_pos = tf.concat([piece_pos, element_pos], axis=0)
        piece_slot = tf.concat([piece_slot, element_slot], axis=0)
        bad_slots.append(bad_element_slot)
    bad_slots.append(found_slot[~handled])
    pieces, piece_ok = _piece_values(tok, piece_pos)
    bad_slots.append(piece_slot[~piece_ok])
    if request.object_keys:
        pieces = tf.concat([pieces, _object_texts(tok, value_pos[is_object])], axis=0)
        piece_slot = tf.concat([piece_slot, found_slot[is_object]], axis=0)
    bad_slot = tf.concat(bad_slots, axis=0)
    slot_bad = tf.math.unsorted_segment_max(tf.ones_like(bad_slot, tf.int32), bad_slot,
                                            slots) > 0
    slot_ok = tf.reshape((last_key >= 0) & ~slot_bad, tf.stack([num_keys, n]))
    ok = tok["line_ok"] & tf.reduce_all(slot_ok, axis=0)
    return _join_pieces(pieces, piece_slot, ok, keys, array_keys), ok


def _piece_values(tok: dict[str, tf.Tensor], pos: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The values of the string and bare-value tokens at ``pos`` (int64 [m]): strings decoded
    (``_unescape``), bare values as their text; and ok bool [m] (False: a lone surrogate)."""
    raw = _token_text(tok, pos)
    strings = tf.where(tf.equal(tf.gather(tok["kind"], pos), _STRING))
    decoded, ok = _unescape(tf.gather_nd(raw, strings))
    return (tf.tensor_scatter_nd_update(tf.strings.strip(raw), strings, decoded),
            tf.tensor_scatter_nd_update(tf.ones_like(pos, tf.bool), strings, ok))


def _object_texts(tok: dict[str, tf.Tensor], opener_pos: tf.Tensor) -> tf.Tensor:
    """tf.string [m]: the JSON text of the top-level members' objects opened at
    ``opener_pos`` (int64 [m]), from their opener to their closer.

    Containers that are values of top-level keys ("members") come one after another in a
    line: a token nested deeper (or a member's closer) belongs to the last member opened."""
    kind, depth_before = tok["kind"], tok["depth_before"]
    is_member = tf.gather(tf.constant(_IS_OPENER), kind) & tf.equal(depth_before, 1)
    member_id = tf.cumsum(tf.cast(is_member, tf.int64)) - 1
    inside = tf.where((is_member | (depth_before >= 2)) & (member_id >= 0))[:, 0]
    texts = tf.strings.unsorted_segment_join(
        _token_text(tok, inside), tf.gather(member_id, inside),
        tf.reduce_sum(tf.cast(is_member, tf.int64)))
    return tf.gather(texts, tf.gather(member_id, opener_pos))


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
                    n: tf.Tensor, scalars: bool) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The direct elements of the top-level arrays at token positions ``array_pos``: (string
    element positions (with ``scalars``, bare values too), their slots, slots with another
    element), all int64 [?].

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
    element_kind = tf.gather(kind, element_pos)
    is_value = tf.equal(element_kind, _STRING)
    if scalars:
        is_value |= tf.equal(element_kind, _LITERAL) & tf.not_equal(
            tf.strings.strip(_token_text(tok, element_pos)), "null")
    return element_pos[is_value], slot[is_value], slot[~is_value]


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
    cut = tf.raw_ops.StringSplitV2(input=inner, sep="\\", maxsplit=1)
    escaped = tf.gather(cut.indices[:, :1], tf.where(tf.equal(cut.indices[:, 1], 1))[:, 0])
    decoded, ok = _unescape_escaped(tf.gather_nd(inner, escaped))
    return (tf.tensor_scatter_nd_update(inner, escaped, decoded),
            tf.tensor_scatter_nd_update(tf.ones_like(inner, tf.bool), escaped, ok))


def _escape_code_points(pieces: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The text after an escape's backslash (``n...``, ``u00e9...``, or "" for the first
    backslash of ``\\\\``) -> (the escape's code point, the bytes of it in the text), both
    int32 [p]."""
    byte = tf.cast(tf.io.decode_raw(pieces, tf.uint8, fixed_length=5), tf.int32)  # 0-padded
    letter = byte[:, 0]
    hex_chars = byte[:, 1:]
    digits = tf.where(hex_chars <= ord("9"), hex_chars - ord("0"),
                      tf.bitwise.bitwise_or(hex_chars, 0x20) - (ord("a") - 10))
    from_hex = tf.reduce_sum(digits * tf.constant([4096, 256, 16, 1]), axis=1)
    simple = tf.gather(tf.constant(_ESCAPE_TABLE, tf.int32), tf.minimum(letter, 127))
    is_hex = tf.equal(letter, ord("u"))
    return (tf.where(is_hex, from_hex, simple),
            tf.where(is_hex, 5, tf.minimum(tf.strings.length(pieces), 1)))


def _next(values: tf.Tensor, fill) -> tf.Tensor:
    """values[i + 1] at i (``fill`` at the end)."""
    return tf.concat([values[1:], [fill]], axis=0)


def _previous(values: tf.Tensor, fill) -> tf.Tensor:
    """values[i - 1] at i (``fill`` at the start)."""
    return tf.concat([[fill], values[:-1]], axis=0)


def _unescape_escaped(inner: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """String contents with at least one escape [e] -> (decoded [e], ok [e]).

    Each content is cut at every backslash (memchr). A backslash starts an escape unless it is
    the second one of ``\\\\``, i.e. unless it follows an odd run of empty pieces (since the
    content's start or the last non-empty piece). A piece after an escape's backslash starts
    with the rest of the escape (nothing for ``\\\\``), then plain text; the first piece, and a
    piece after the second backslash of ``\\\\``, are plain text. A high surrogate escape with
    no text after it and a low surrogate escape in the next piece make one code point."""
    cut = tf.raw_ops.StringSplitV2(input=inner, sep="\\")
    pieces, piece_row, index = cut.values, cut.indices[:, 0], cut.indices[:, 1]
    position = tf.range(tf.size(pieces, tf.int64))
    boundary = tf.equal(index, 0) | (tf.strings.length(pieces) > 0)
    last_boundary = tf.gather(tf.where(boundary)[:, 0],  # at or before each piece
                              tf.cumsum(tf.cast(boundary, tf.int64)) - 1)
    empty_run = position - 1 - _previous(last_boundary, tf.constant(-1, tf.int64))
    is_escape = (index > 0) & tf.equal(tf.bitwise.bitwise_and(empty_run, 1), 0)
    code, escape_length = _escape_code_points(pieces)
    code = tf.where(tf.equal(escape_length, 0), ord("\\"), code)
    escape_length = tf.where(is_escape, escape_length, 0)
    tail_length = tf.strings.length(pieces) - escape_length
    tail = tf.strings.substr(pieces, escape_length, tail_length)
    is_high = is_escape & (code >= 0xD800) & (code <= 0xDBFF)
    is_low = is_escape & (code >= 0xDC00) & (code <= 0xDFFF)
    # An escape piece is never a content's first piece: a low one follows a piece of its row.
    paired_high = is_high & tf.equal(tail_length, 0) & _next(is_low, False)
    paired_low = is_low & _previous(paired_high, False)
    code = tf.where(paired_high,
                    0x10000 + (code - 0xD800) * 0x400 + (_next(code, 0) - 0xDC00), code)
    emit = is_escape & ~paired_low
    chars = tf.raw_ops.UnicodeEncode(
        input_values=tf.gather_nd(code, tf.where(emit)),
        input_splits=tf.concat([[0], tf.cumsum(tf.cast(emit, tf.int64))], axis=0),
        output_encoding="UTF-8", errors="replace", replacement_char=0xFFFD)
    rows = tf.size(inner, tf.int64)
    decoded = tf.strings.unsorted_segment_join(tf.strings.join([chars, tail]), piece_row, rows)
    lone = (is_high & ~paired_high) | (is_low & ~paired_low)
    bad = tf.math.unsorted_segment_max(tf.cast(lone, tf.int32), piece_row, rows) > 0
    return decoded, ~bad


# --- the format -------------------------------------------------------------------------------

class JsonLines(Format):
    """One JSON object per line, columns by key (``decode_paths``): a number, ``true`` or
    ``false`` is read as its text, an array of them or of strings is joined by spaces."""

    name, extensions, named_fields, maps_keys = "jsonl", (".jsonl", ".ndjson"), True, True

    def row_format(self, files, columns, keys, header):
        named = [(n, k) for n, k in zip(columns, keys) if n != "_"]
        heads = {k.split(".", 1)[0] for _, k in named if "." in k}
        both = [k for _, k in named if k in heads]
        if both:
            raise InputError(f"--columns names the key {both[0]!r} and keys inside it; read "
                             "either the key or keys inside it")
        return RowFormat(self.name, tuple(columns), bool(header),
                         keys=mapped_keys(columns, keys))

    def parse(self, records, fmt):
        fields, ok = _row_decoder(tuple(fmt.file_keys))(records)
        return {name: fields[key] for name, key in zip(fmt.names, fmt.file_keys)}, ok

    def bad_utf8(self, records, row, ok):
        # A line decode_fields accepts is valid UTF-8 (its string literals admit only valid
        # UTF-8, the rest of it only ASCII): only the lines it fails are checked, so the one
        # full pass over every line is the decoder's own.
        failed = tf.where(tf.logical_not(ok))
        return tf.scatter_nd(failed, tf.logical_not(valid_utf8(tf.gather_nd(records, failed))),
                             tf.shape(ok, out_type=tf.int64))

    def hold_out_keys(self, records, row, fmt):
        return named_columns_key(row, fmt)

    def malformed_detail(self, record, fmt):
        return json_problem(record, fmt.file_keys)


@functools.lru_cache(maxsize=None)
def _row_decoder(keys: tuple[str, ...]):
    """``decode_paths(lines, keys, array_paths=keys, scalars=True)`` as one traced function per
    ``keys``, shared by every pipeline of the process: the decoder's graph takes ~0.7 s of
    CPU to trace, and a classify run parses in four pipelines (its one read, train, eval)."""
    return tf.function(
        lambda lines: decode_paths(lines, keys, array_paths=keys, scalars=True),
        input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)


def json_problem(line: bytes, keys: Sequence[str]) -> str | None:
    """What keeps ``decode_paths(..., array_paths=keys, scalars=True)`` from reading ``keys``
    (dotted paths) out of ``line``, in words, from ``json.loads`` (the decoder's reference):
    ``not valid JSON: ...``, ``not a JSON object: a list``, ``missing key 'text'``, ``'label'
    is an object, expected a string, a number or a list``; ``None`` if it reads them."""
    try:
        value = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return "not UTF-8"
    except ValueError as e:
        message = str(getattr(e, "msg", e)).removesuffix(" at")
        return f"not valid JSON: {message} at column {getattr(e, 'colno', '?')}"
    if not isinstance(value, dict):
        return f"not a JSON object: {_json_type(value)}"
    for key in keys:
        node, path = value, []
        for part in key.split("."):
            if not isinstance(node, dict):
                return f"{'.'.join(path)!r} is {_json_type(node)}, expected an object"
            if part not in node:
                return f"missing key {key!r}"
            node = node[part]
            path.append(part)
        if node is None or isinstance(node, dict):
            return f"{key!r} is {_json_type(node)}, expected a string, a number or a list"
        for element in node if isinstance(node, list) else [node]:
            if element is None or isinstance(element, (dict, list)):
                return (f"{key!r} is a list holding {_json_type(element)}, expected strings "
                        "or numbers")
            if isinstance(element, str):
                try:
                    element.encode("utf-8")
                except UnicodeEncodeError:
                    return f"{key!r} holds a lone surrogate escape"
    return None


def _json_type(value) -> str:
    """``json.loads``' value -> its JSON type with an article (``"a list"``, ``"null"``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), "a number")
