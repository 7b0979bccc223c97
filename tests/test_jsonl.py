"""tfseq.formats.jsonl.decode_fields: top-level string fields of JSON Lines, decoded in graph."""

from __future__ import annotations

import json
import random

import pytest
import tensorflow as tf

from tfseq.formats import jsonl
from tfseq.formats.jsonl import decode_fields

KEYS = ("label", "text")


def decode(lines, keys=KEYS, array_keys=(), **kwargs):
    """decode_fields on Python strings -> ([{key: str} or None per line])."""
    fields, ok = decode_fields(tf.constant(lines, tf.string), keys, array_keys=array_keys,
                               **kwargs)
    values = {key: fields[key].numpy().tolist() for key in keys}
    out = []
    for i, line_ok in enumerate(ok.numpy().tolist()):
        row = {key: values[key][i].decode("utf-8") for key in keys}
        if not line_ok:
            assert row == {key: "" for key in keys}, "a bad line's fields are all empty"
        out.append(row if line_ok else None)
    return out


def reference(line: str, keys=KEYS, array_keys=()):
    """What decode_fields should give for one line, from Python's json module."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    row = {}
    for key in keys:
        value = obj.get(key)
        if isinstance(value, list) and key in array_keys and all(isinstance(v, str)
                                                                 for v in value):
            value = " ".join(value)
        if not isinstance(value, str):
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no UTF-8 form
            return None
        row[key] = value
    return row


# --- tricky but valid lines, expectations written out

TRICKY = [
    (r'{"label": "a", "text": "quote \" backslash \\ slash \/ b\b f\f n\n r\r t\t"}',
     "a", 'quote " backslash \\ slash / b\b f\f n\n r\r t\t'),
    (r'{"label": "caf\u00e9 CAF\u00C9", "text": "\u0041\u00e9\u65e5\uFFFF\u0000end"}',
     "café CAFÉ", "Aé日\uffff\x00end"),
    (r'{"label": "\ud83d\ude00", "text": "x\uD834\uDD1Ey"}', "\U0001F600", "x\U0001D11Ey"),
    ('{"label": "naïve 日本", "text": "😀 raw"}', "naïve 日本", "😀 raw"),
    ('{"meta": {"text": "no", "label": "no"}, "text": "yes", "label": "l"}', "l", "yes"),
    ('{"x": [{"text": "no"}, ["text", "no"]], "label": "l", "text": "yes"}', "l", "yes"),
    ('{"text": "first", "label": "second"}', "second", "first"),
    ('{"n": 1, "f": -2.5e-3, "z": null, "t": true, "u": false, "a": [1, [2, {}]], "o": {}, '
     '"label": "l", "e": [], "text": "t"}', "l", "t"),
    ('{"label": "{", "text": "}"}', "{", "}"),
    ('{"skip": "[{,:\\"}]", "label": "[", "text": ",:"}', "[", ",:"),
    ('{"skip": {"a": "}}]]", "b": ["{\\"", ":"]}, "label": "\\"", "text": "\\"}"}',
     '"', '"}'),
    ('  {  "label"  :  "a"  ,  "text"  :  "b"  }  ', "a", "b"),
    ('\t{\t"label"\t:\t"a"\t,\t"text":"b"}\t', "a", "b"),
    ('{"label":"a","text":"b","x":[ ],"y":{ }}', "a", "b"),
    ('{"label": "old", "text": "t", "label": "new"}', "new", "t"),
    ('{"label": "", "text": ""}', "", ""),
    ('{"label": "  spaced  ", "text": "tab\\there"}', "  spaced  ", "tab\there"),
    ('{"label": "a", "text": "b", "x": NaN, "y": -Infinity}', "a", "b"),
    ('{"x": [[[[[[{"text": [[{}]], "label": {"label": []}}]]]]]], "label": "l", "text": "t"}',
     "l", "t"),
    ('{"label":"\\\\","text":"\\\\\\""}', "\\", '\\"'),
]


@pytest.mark.parametrize("line,label,text", TRICKY)
def test_tricky_lines(line, label, text):
    assert decode([line]) == [{"label": label, "text": text}]
    assert reference(line) == {"label": label, "text": text}  # the expectation is json's


def test_tricky_lines_in_one_batch():
    assert decode([t[0] for t in TRICKY]) == [{"label": t[1], "text": t[2]} for t in TRICKY]


# --- bad lines

BAD = [
    "[1]", '"s"', "3", "", "   ", "null", "{}",
    '{"label": "a"}',                                  # missing key
    '{"label": "a", "meta": {"text": "nested only"}}',  # only nested
    '{"label": 1, "text": "t"}', '{"label": null, "text": "t"}',
    '{"label": true, "text": "t"}', '{"label": {"a": "b"}, "text": "t"}',
    '{"label": ["a"], "text": "t"}',                    # array for a non-array key
    '{"label": "a", "text": "ab', '{"label": "a", "text": "b"',
    '{"label": "a", "text": "b"}}', '{"label": "a", "text": "b", "x": [}',
    '{"label": "a", "text": "b", "x": [1}]', '{"label": "a", "text": "b", "x": {]}',
    '{"label": "a", "text": "b"} {"c": "d"}', '{"label": "a", "text": "b"} 1',
    '{"label": "a", "text": "b",}', '{"label": "a",, "text": "b"}',
    '{"label" "a", "text": "b"}', '{"label": "a" "text": "b"}', '{"label": "a", "text":}',
    '{"label": "a", "text": "b", "x": [1 2]}', '{"label": "a", "text": "b", "x": 01}',
    '{"label": "a", "text": "b", "x": tru}', "{'label': 'a', 'text': 'b'}",
    '{"label": "a", "text": "b", 1: "c"}', '{"label": "a", "text": "b", "x": ["y": 1]}',
    r'{"label": "a\x", "text": "b"}', r'{"label": "a", "text": "\u12"}',
    r'{"label": "\ud800", "text": "b"}', r'{"label": "\ud800x", "text": "b"}',
    r'{"label": "\udc00\ud800", "text": "b"}', r'{"label": "\ud800\u0041", "text": "b"}',
    r'{"label": "\ud800\ud800\udc00", "text": "b"}',
    '{"label": "raw\ttab", "text": "b"}', '{"label": "raw\x01ctl", "text": "b"}',
    '{"label": "nul\x00", "text": "b"}', '{"label": "a",\x00 "text": "b"}',
    '{"label": "a", "text": "b"}\x00', '{"label": "a", "text": "b", "x": "\\"}',
    '\ufeff{"label": "a", "text": "b"}', '{"label": "a", "text": "b"}\x0c',
]


@pytest.mark.parametrize("line", BAD)
def test_bad_lines(line):
    assert decode([line]) == [None]
    assert reference(line) is None  # json rejects it too (or gives a lone surrogate)


def test_bad_lines_do_not_disturb_good_neighbours():
    good = '{"label": "l", "text": "t"}'
    lines = [x for bad in BAD for x in (bad, good)]
    assert decode(lines) == [None, {"label": "l", "text": "t"}] * len(BAD)


def test_invalid_utf8_is_not_ok():
    lines = tf.constant([b'{"label": "\xff", "text": "b"}', b'{"label": "\xc3", "text": "b"}',
                         b'{"label": "\xed\xa0\x80", "text": "b"}', b'{"\xff": 1, "label": "a",'
                         b' "text": "b"}'])
    assert decode_fields(lines, KEYS)[1].numpy().tolist() == [False] * 4


# --- array keys

def test_array_keys():
    lines = ['{"tokens": "EU rejects", "tags": ["B-ORG", "O"]}',
             '{"tokens": "EU", "tags": "B-ORG"}',
             '{"tags": [], "tokens": ""}',
             '{"tokens": "a b", "tags": [ "x\\u00e9" ,"\\"" ], "tags2": [1, "no"]}',
             '{"tokens": "a", "tags": ["", "x", ""]}',
             '{"tokens": "a", "tags": [""]}',
             '{"tokens": "a", "tags": ["B", 1]}',
             '{"tokens": "a", "tags": ["B", null]}',
             '{"tokens": "a", "tags": ["B", ["C"]]}',
             '{"tokens": "a", "tags": [{"x": "C"}]}',
             '{"tokens": ["a"], "tags": ["B"]}',
             '{"tokens": "a", "tags": {"x": "B"}}']
    assert decode(lines, ("tokens", "tags"), array_keys=("tags",)) == [
        {"tokens": "EU rejects", "tags": "B-ORG O"},
        {"tokens": "EU", "tags": "B-ORG"},
        {"tokens": "", "tags": ""},
        {"tokens": "a b", "tags": 'xé "'},
        {"tokens": "a", "tags": " x "},
        {"tokens": "a", "tags": ""},
        None, None, None, None, None, None]


def test_array_keys_must_be_keys():
    with pytest.raises(ValueError, match="array_keys"):
        decode_fields(tf.constant(["{}"]), ["a"], array_keys=["b"])


def test_keys_match_their_raw_spelling():
    """An escaped spelling of a key is another key (documented); both json.dumps forms match."""
    assert decode([r'{"label": "a", "\u0074ext": "b"}']) == [None]
    assert decode(['{"é": "x"}', r'{"\u00e9": "y"}'], keys=("é",)) == [{"é": "x"}, {"é": "y"}]
    assert decode([r'{"a\"b": "x", "a\\b": "y"}'], keys=('a"b', "a\\b")) == [
        {'a"b': "x", "a\\b": "y"}]


# --- cross-check against json.loads on random objects

_CHARS = (list("abcxyz XYZ019") + ['"', "\\", "/", "{", "}", "[", "]", ",", ":", "'"]
          + [chr(c) for c in range(0x20)] + ["\x7f", "é", "ß", "日本", "\u2028", "\uffff",
                                             "😀", "\U0001D11E", "\U0010FFFF"])


def random_string(rng: random.Random) -> str:
    return "".join(rng.choice(_CHARS) for _ in range(rng.randrange(12)))


def random_junk(rng: random.Random, depth: int = 0):
    """Any JSON value, with keys that shadow the requested ones inside containers."""
    choice = rng.randrange(9 if depth < 3 else 6)
    if choice == 0:
        return rng.randint(-10**6, 10**6)
    if choice == 1:
        return rng.uniform(-1e9, 1e9) * 10 ** rng.randint(-30, 30)
    if choice == 2:
        return rng.choice([None, True, False])
    if choice in (3, 4, 5):
        return random_string(rng)
    if choice in (6, 7):
        return [random_junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = [rng.choice(["label", "text", "tags", random_string(rng)]) for _ in range(3)]
    return {key: random_junk(rng, depth + 1) for key in keys}


def random_object(rng: random.Random) -> dict:
    obj = {random_string(rng) or "k": random_junk(rng) for _ in range(rng.randrange(4))}
    obj["label"] = random_string(rng)
    obj["text"] = random_string(rng)
    obj["tags"] = ([random_string(rng) for _ in range(rng.randrange(4))] if rng.random() < 0.5
                   else random_string(rng))
    items = list(obj.items())
    rng.shuffle(items)
    return dict(items)


SEPARATORS = [None, (",", ":"), (" , ", " : "), ("\t,  ", "\t:\t")]


def random_lines(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        obj = random_object(rng)
        for ensure_ascii in (True, False):
            for separators in SEPARATORS:
                line = json.dumps(obj, ensure_ascii=ensure_ascii, separators=separators)
                lines.append(rng.choice(["", " ", "\t "]) + line + rng.choice(["", "  "]))
    return lines


def test_matches_json_loads_on_random_objects():
    lines = random_lines(seed=1234, count=300)
    keys = ("label", "text", "tags")
    expected = [reference(line, keys, ("tags",)) for line in lines]
    assert all(row is not None for row in expected)
    assert decode(lines, keys, array_keys=("tags",)) == expected


def mutate(rng: random.Random, line: str) -> str:
    """The line with one or two characters deleted, duplicated, replaced or inserted."""
    for _ in range(rng.randrange(1, 3)):
        i = rng.randrange(len(line) + 1)
        op = rng.randrange(4)
        new = rng.choice('{}[]:,"\\ 0-.eutnl' + "x\t")
        if op == 0:
            line = line[:i] + line[i + 1:]
        elif op == 1:
            line = line[:i] + line[i:i + 1] * 2 + line[i + 1:]
        elif op == 2:
            line = line[:i] + new + line[i + 1:]
        else:
            line = line[:i] + new + line[i:]
    return line


def test_ok_matches_json_loads_on_mutated_lines():
    """Broken variants of random lines: accepted exactly when json.loads accepts them."""
    rng = random.Random(99)
    lines = [mutate(rng, line) for line in random_lines(seed=5, count=150)]
    keys = ("label", "text", "tags")
    expected = [reference(line, keys, ("tags",)) for line in lines]
    assert 0.2 < sum(row is None for row in expected) / len(lines) < 0.9
    assert decode(lines, keys, array_keys=("tags",)) == expected


# --- graph mode, tf.data, empty batches

def test_in_tf_data_pipeline():
    lines = [t[0] for t in TRICKY] + BAD[:5]
    dataset = tf.data.Dataset.from_tensor_slices(lines).batch(4).map(
        lambda batch: decode_fields(batch, KEYS))
    assert dataset.element_spec[1].shape.as_list() == [None]
    got = []
    for fields, ok in dataset:
        for i, line_ok in enumerate(ok.numpy().tolist()):
            got.append({k: fields[k][i].numpy().decode() for k in KEYS} if line_ok else None)
    assert got == [{"label": t[1], "text": t[2]} for t in TRICKY] + [None] * 5


def test_empty_batch():
    for lines in (tf.constant([], tf.string), tf.zeros([0], tf.string)):
        fields, ok = decode_fields(lines, KEYS)
        assert ok.shape == [0] and fields["label"].shape == [0] and fields["text"].shape == [0]
    fn = tf.function(lambda x: decode_fields(x, ("tokens", "tags"), array_keys=("tags",)),
                     input_signature=[tf.TensorSpec([None], tf.string)])
    fields, ok = fn(tf.constant([], tf.string))
    assert ok.numpy().tolist() == [] and fields["tags"].numpy().tolist() == []
    fields, ok = fn(tf.constant(['{"tokens": "a", "tags": ["b", "c"]}']))
    assert fields["tags"].numpy().tolist() == [b"b c"] and ok.numpy().tolist() == [True]
    dataset = tf.data.Dataset.from_tensor_slices(tf.constant([], tf.string)).batch(4)
    assert list(dataset.map(lambda b: decode_fields(b, KEYS))) == []


def test_no_keys_checks_only_the_object():
    fields, ok = decode_fields(tf.constant(["{}", "[]", '{"a": 1}']), [])
    assert fields == {} and ok.numpy().tolist() == [True, False, True]


# --- the fast path for flat objects, against the full path

def decode_full(lines, keys=KEYS, array_keys=(), **kwargs):
    """decode() with every line on the full path."""
    fields, ok = jsonl._decode_full_path(tf.constant(lines), keys, array_keys=array_keys,
                                         **kwargs)
    values = {key: fields[key].numpy().tolist() for key in keys}
    return [{key: values[key][i].decode("utf-8") for key in keys} if line_ok else None
            for i, line_ok in enumerate(ok.numpy().tolist())]


def is_flat(lines) -> list[bool]:
    return tf.strings.regex_full_match(tf.constant(lines), jsonl._FLAT_RE).numpy().tolist()


def assert_paths_agree(lines, keys=KEYS, array_keys=(), **kwargs):
    """Values and ok of decode_fields equal those of the full path, as raw bytes."""
    lines = tf.constant(lines)
    fast, fast_ok = decode_fields(lines, keys, array_keys=array_keys, **kwargs)
    full, full_ok = jsonl._decode_full_path(lines, keys, array_keys=array_keys, **kwargs)
    assert fast_ok.numpy().tolist() == full_ok.numpy().tolist()
    for key in keys:
        assert fast[key].numpy().tolist() == full[key].numpy().tolist(), key


FLAT = [  # (line, label, text), or (line, None, None) for a line that is not ok
    # a key's text inside another string is no key
    ('{"a": "\\"text\\": \\"x\\"", "text": "y", "label": "l"}', "l", "y"),
    ('{"label": "l", "a": "\\"text\\": \\"x\\""}', None, None),
    ('{"label": "l", "a": "\\", \\"text\\": \\"evil", "text": "good"}', "l", "good"),
    ('{"label": "l", "a": "text", "b": "\\"text\\"", "text": "t"}', "l", "t"),
    ('{"label": "text", "text": "label"}', "text", "label"),
    ('{"label": "l", "x": "\\"text\\":", "text": ":"}', "l", ":"),
    ('{"label": "l", "text": " : "}', "l", " : "),
    # duplicate keys: the last one wins, whatever its type
    ('{"text": "a", "label": "l", "text": "b"}', "l", "b"),
    ('{"text": 1, "label": "l", "text": "b"}', "l", "b"),
    ('{"text": "a", "label": "l", "text": 1}', None, None),
    ('{"text": "a", "text": null, "label": "l"}', None, None),
    ('{"label": "1", "label": "2", "label": "3", "text": "t", "text": "u"}', "3", "u"),
    # escaped quotes and backslashes before, in and around the keys
    ('{"q": "say \\"hi\\"", "label": "l", "text": "t"}', "l", "t"),
    ('{"q\\"": "x", "label\\"": "no", "label": "l", "text": "t"}', "l", "t"),
    ('{"label": "\\"", "text": "\\"\\""}', '"', '""'),
    ('{"label": "a\\\\", "text": "\\\\\\"b\\\\"}', "a\\", '\\"b\\'),
    ('{"b": "\\\\", "label": "l", "text": "t\\\\"}', "l", "t\\"),
    ('{"label": "l", "text\\\\": "no", "text": "t"}', "l", "t"),
    ('{"x": "\\\\\\"", "label": "\\\\\\\\", "text": "\\u0022\\\\u0022"}', "\\\\", '"\\u0022'),
    # other values for a requested key
    ('{"label": "l", "text": 12}', None, None), ('{"label": "l", "text": -0.5e+3}', None, None),
    ('{"label": "l", "text": true}', None, None), ('{"label": "l", "text": false}', None, None),
    ('{"label": "l", "text": null}', None, None), ('{"label": "l", "text": NaN}', None, None),
    ('{"label": "l", "text": -Infinity}', None, None),
    ('{"label": "l", "text": "t", "n": -0, "m": 1.5E-7, "i": Infinity}', "l", "t"),
    # missing keys
    ('{"label": "l"}', None, None), ('{"label": "l", "Text": "t"}', None, None),
    ('{"label": "l", "text ": "t"}', None, None),
    ("{}", None, None), ("  {  }  ", None, None), ('{"": ""}', None, None),
    # whitespace
    ('\t{\n"label"\r\n:\t"l" ,"text" :"t"\n}\r', "l", "t"),
    ('{"label":"l","text":"t"}', "l", "t"), ('  {"label" : "" , "text" : ""}  ', "", ""),
    # escapes in the values
    ('{"label": "caf\\u00e9", "text": "\\ud83d\\ude00 \\n\\t\\/"}', "café", "😀 \n\t/"),
    ('{"label": "l", "text": "\\ud83d"}', None, None),
    ('{"label": "l", "text": "t", "x": "\\ud83d"}', "l", "t"),
    ('{"label": "\x7f", "text": "t"}', "\x7f", "t"),
]


@pytest.mark.parametrize("line,label,text", FLAT)
def test_flat_lines(line, label, text):
    expected = None if label is None else {"label": label, "text": text}
    assert is_flat([line]) == [True]
    assert reference(line) == expected  # the expectation is json's
    assert decode([line]) == [expected]
    assert decode_full([line]) == [expected]


def test_flat_lines_in_one_batch():
    lines = [line for line, _, _ in FLAT]
    assert decode(lines) == [None if label is None else {"label": label, "text": text}
                             for _, label, text in FLAT]
    assert_paths_agree(lines)


def test_flat_lines_match_keys_on_their_raw_spelling():
    lines = ['{"label": "l", "\\u0074ext": "t"}', '{"label": "l", "text": "t", "\\u0074ext": 1}',
             '{"\\u00e9": "a", "é": "b"}', '{"é": "a", "\\u00e9": "b"}']
    assert all(is_flat(lines))
    assert decode(lines[:2]) == [None, {"label": "l", "text": "t"}]
    assert decode(lines[2:], keys=("é",)) == [{"é": "b"}, {"é": "b"}]
    assert_paths_agree(lines)
    assert_paths_agree(lines, ("é", "text"))


def test_flat_shaped_lines_with_bad_strings_are_not_ok():
    """Invalid UTF-8, raw control characters, bad escapes: the fast path declines them, and
    the full path rejects them."""
    lines = [b'{"label": "\xff", "text": "t"}', b'{"label": "l", "text": "\xc3"}',
             b'{"label": "l", "text": "\xed\xa0\x80"}', b'{"label": "l", "text": "t", "\xff": 1}',
             b'{"label": "l", "text": "a\tb"}', b'{"label": "l", "text": "a\x00b"}',
             b'{"label": "l", "text": "a\x1fb"}', b'{"label": "l", "text": "a\nb"}',
             b'{"label": "l", "text": "\\x"}', b'{"label": "l", "text": "\\u12"}',
             b'{"label": "l", "text": "t\\"}', b'{"label": "l", "text": "t"', b'{"label": "l"',
             b'{"label": "l", "text": "t",}', b'{"label": "l", "text": "t"} x',
             b'{"label": "l", "text": 01}', b'{"label": "l", "text": "t", "n": 1.}',
             b'{"label": "l", "text": "t", "n": +1}', b'{"label": "l", "text": "t", "n": -NaN}',
             b'{"label": "l" "text": "t"}', b'{"label": "l", "text": "t"}\x0b']
    assert not any(is_flat(lines))
    assert decode_fields(tf.constant(lines), KEYS)[1].numpy().tolist() == [False] * len(lines)
    assert_paths_agree(lines)


def test_paths_agree_on_all_test_lines():
    lines = ([t[0] for t in TRICKY] + BAD + [line for line, _, _ in FLAT]
             + random_lines(seed=7, count=40))
    rng = random.Random(3)
    lines += [mutate(rng, line) for line in lines]
    assert 0.2 < sum(is_flat(lines)) / len(lines) < 0.8
    assert_paths_agree(lines)
    assert_paths_agree(lines, ("label", "text", "tags"), array_keys=("tags",))
    assert_paths_agree(lines, ("text",))
    assert_paths_agree(lines, ())
    assert_paths_agree(lines, ("label", "text", "tags"), array_keys=("tags",), scalars=True)
    assert_paths_agree(lines + random_scalar_lines(seed=8, count=60), ("label", "x", "tags"),
                       array_keys=("tags",), scalars=True)


def test_mixed_batch_keeps_order():
    flat = '{"label": "f%d", "text": "t\\"%d"}'
    nested = '{"label": "n%d", "text": "u%d", "x": [1, {"text": "no"}]}'
    lines = []
    for i in range(12):
        lines.append([flat, nested, '{"label": %d}', "[%d]"][i % 4].replace("%d", str(i)))
    assert is_flat(lines) == [True, False, True, False] * 3
    expected = [reference(line) for line in lines]
    assert decode(lines) == expected
    assert [row["label"] for row in expected if row] == ["f0", "n1", "f4", "n5", "f8", "n9"]
    # all flat, none flat, and both unknown-size in a tf.function
    fn = tf.function(lambda x: decode_fields(x, KEYS),
                     input_signature=[tf.TensorSpec([None], tf.string)])
    for subset in (lines[0::4], lines[1::2], lines[:0], lines):
        fields, ok = fn(tf.constant(subset, tf.string))
        rows = [reference(line) for line in subset]
        assert ok.numpy().tolist() == [row is not None for row in rows]
        assert fields["text"].numpy().tolist() == [
            row["text"].encode() if row else b"" for row in rows]


def test_array_keys_with_flat_lines():
    lines = ['{"tokens": "a b", "tags": "B-ORG"}', '{"tokens": "a", "tags": ["B", "O"]}',
             '{"tokens": "a", "tags": 1}', '{"tags": "x"}']
    assert is_flat(lines) == [True, False, True, True]
    assert decode(lines, ("tokens", "tags"), array_keys=("tags",)) == [
        {"tokens": "a b", "tags": "B-ORG"}, {"tokens": "a", "tags": "B O"}, None, None]
    assert_paths_agree(lines, ("tokens", "tags"), array_keys=("tags",))


_FLAT_CHARS = _CHARS + ['\\"', '"text": "', '", "label": "', "\\", '\\\\"']


def random_flat_line(rng: random.Random) -> str:
    """A flat object (strings with quotes, backslashes, key-like text; every kind of
    scalar; duplicate keys) as json.dumps writes it, with random whitespace."""
    pairs = []
    for _ in range(rng.randrange(5)):
        key = rng.choice(["label", "text", "x", 'te"xt', "te\\xt", "é", ""])
        choice = rng.randrange(8)
        if choice < 4:
            value = "".join(rng.choice(_FLAT_CHARS) for _ in range(rng.randrange(8)))
        elif choice == 4:
            value = rng.choice([0, -1, 12345, 1.5, -2.5e-30, 1e300])
        elif choice == 5:
            value = rng.choice([None, True, False])
        else:
            value = rng.choice([float("nan"), float("inf"), float("-inf")])
        pairs.append((key, value))
    for key in ("label", "text", 'te"xt', "te\\xt", "é", ""):
        if rng.random() < 0.9:
            value = "".join(rng.choice(_FLAT_CHARS) for _ in range(rng.randrange(10)))
            pairs.insert(rng.randrange(len(pairs) + 1), (key, value))
    ensure_ascii = rng.random() < 0.5
    space = lambda: rng.choice(["", "", " ", "\t", "\n ", "\r\n"])  # noqa: E731
    body = ("," + space()).join(
        f"{json.dumps(k, ensure_ascii=ensure_ascii)}{space()}:{space()}"
        f"{json.dumps(v, ensure_ascii=ensure_ascii)}{space()}" for k, v in pairs)
    return space() + "{" + space() + body + "}" + space()


def test_fast_path_matches_json_loads_on_random_flat_lines():
    rng = random.Random(2024)
    lines = [random_flat_line(rng) for _ in range(300)]
    lines += [mutate(rng, line) for line in lines]
    assert sum(is_flat(lines)) > 330
    for keys in (KEYS, ('te"xt', "te\\xt", "é", "")):
        expected = [reference(line, keys) for line in lines]
        assert 0.1 < sum(row is not None for row in expected) / len(lines) < 0.7
        assert decode(lines, keys) == expected
        assert_paths_agree(lines, keys)


def test_unescape_runs_of_backslashes_and_surrogates():
    """Escapes next to each other: runs of escaped backslashes before quotes, letters,
    ``u`` and surrogate pairs, on both paths."""
    parts = ["\\", '"', "n", "u", "\\u", "x", "😀", "é", "\ud83d", "\ude00"]
    rng = random.Random(11)
    values = ["".join(rng.choice(parts) for _ in range(rng.randrange(1, 9))) for _ in range(300)]
    lines = []
    for value in values:
        for ensure_ascii in (True, False):
            text = json.dumps(value, ensure_ascii=ensure_ascii)
            lines.append('{"label": "l", "text": ' + text + "}")
    lines = [line.encode("utf-8", "surrogatepass") for line in lines]
    expected = [reference(line.decode("utf-8", "surrogatepass")) for line in lines]
    assert 0.2 < sum(row is None for row in expected) / len(lines) < 0.8  # lone surrogates
    fields, ok = decode_fields(tf.constant(lines), KEYS)
    assert ok.numpy().tolist() == [row is not None for row in expected]
    assert fields["text"].numpy().tolist() == [
        row["text"].encode() if row else b"" for row in expected]
    assert_paths_agree(lines)


# --- numbers and booleans as text (scalars=True), keys inside objects (decode_paths)

def reference_scalars(line: str, keys=KEYS, array_keys=()):
    """What decode_fields(..., scalars=True) should give: json.loads keeping every number as
    the text it was written as; true/false as "true"/"false"; null, objects never."""
    try:
        obj = json.loads(line, parse_int=str, parse_float=str, parse_constant=str)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    row = {}
    for key in keys:
        value = obj.get(key)
        values = value if isinstance(value, list) and key in array_keys else [value]
        texts = []
        for v in values:
            if isinstance(v, bool):
                v = "true" if v else "false"
            if not isinstance(v, str):
                return None
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return None
            texts.append(v)
        row[key] = " ".join(texts)
    return row


def test_scalars_read_numbers_and_booleans_as_their_text():
    lines = ['{"label": 2, "text": "a"}', '{"label": -1.5e3 , "text": "b"}',
             '{"label": true, "text": false}', '{"label": null, "text": "c"}',
             '{"label": 0, "text": ["x", 7, true]}', '{"label": 1, "text": ["x", null]}',
             '{"label": 01, "text": "d"}', '{"label": {"n": 1}, "text": "e"}',
             '{"label": NaN, "text": "f", "x": [1]}']
    want = [{"label": "2", "text": "a"}, {"label": "-1.5e3", "text": "b"},
            {"label": "true", "text": "false"}, None, {"label": "0", "text": "x 7 true"},
            None, None, None, {"label": "NaN", "text": "f"}]
    assert decode(lines, array_keys=("text",), scalars=True) == want
    assert [reference_scalars(line, KEYS, ("text",)) for line in lines] == want
    assert decode(lines[:3]) == [None, None, None]  # without scalars: strings only


def random_scalar_lines(seed: int, count: int) -> list[str]:
    """Random objects whose label, text and tags are strings, numbers, booleans, null,
    objects or lists of those."""
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        obj = random_object(rng)
        for key in ("label", "text", "tags"):
            if rng.random() < 0.6:
                obj[key] = (random_junk(rng, 2) if rng.random() < 0.7 else
                            [random_junk(rng, 3) for _ in range(rng.randrange(3))])
        line = json.dumps(obj, ensure_ascii=rng.random() < 0.5,
                          separators=rng.choice(SEPARATORS))
        lines.append(line)
    return lines


def test_scalars_match_json_loads_on_random_objects():
    lines = random_scalar_lines(seed=11, count=400)
    rng = random.Random(12)
    lines += [mutate(rng, line) for line in lines[:200]]
    keys = ("label", "text", "tags")
    expected = [reference_scalars(line, keys, ("tags",)) for line in lines]
    assert 0.2 < sum(row is None for row in expected) / len(lines) < 0.8
    assert decode(lines, keys, array_keys=("tags",), scalars=True) == expected
    assert decode_full(lines, keys, array_keys=("tags",), scalars=True) == expected


def test_object_keys_give_the_objects_json_text():
    lines = ['{"meta": {"body": "x", "n": [1, {"k": "v"}]}, "label": "a"}',
             '{"label": "b", "meta": { "body" : "y" } }', '{"label": "c", "meta": "flat"}',
             '{"label": "d"}', '{"meta": {}, "label": "e", "x": {"meta": "no"}}']
    want = [{"meta": '{"body": "x", "n": [1, {"k": "v"}]}', "label": "a"},
            {"meta": '{ "body" : "y" } ', "label": "b"}, None, None,
            {"meta": "{}", "label": "e"}]
    assert decode(lines, ("meta", "label"), object_keys=("meta",)) == want
    assert decode_full(lines, ("meta", "label"), object_keys=("meta",)) == want
    with pytest.raises(ValueError, match="object_keys"):
        decode_fields(tf.constant(["{}"]), ["a"], object_keys=["b"])


def test_decode_paths_reads_keys_inside_objects():
    lines = ['{"meta": {"body": "deep", "lang": {"code": 7}}, "label": 2}',
             '{"label": 1, "meta": {"lang": {"code": "en"}, "body": ["a", "b"]}}',
             '{"label": 1, "meta": {"body": "no code"}}',
             '{"label": 1, "meta": "a string"}', '{"label": 1, "body": "top level"}',
             '{"label": 3, "meta": {"body": "x", "lang": {"code": null}}}']
    fields, ok = jsonl.decode_paths(tf.constant(lines), ["label", "meta.body",
                                                          "meta.lang.code"],
                                    array_paths=["meta.body"], scalars=True)
    assert ok.numpy().tolist() == [True, True, False, False, False, False]
    assert {k: v.numpy().tolist() for k, v in fields.items()} == {
        "label": [b"2", b"1", b"", b"", b"", b""],
        "meta.body": [b"deep", b"a b", b"", b"", b"", b""],
        "meta.lang.code": [b"7", b"en", b"", b"", b"", b""]}
    with pytest.raises(ValueError, match="'meta' is named both as a key and as an object"):
        jsonl.decode_paths(tf.constant(lines), ["meta", "meta.body"])
