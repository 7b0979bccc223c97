"""Vocab build/save/load/lookup and tokenize."""

import pytest
import tensorflow as tf

import tfseq
from conftest import to_list


def lines(*texts):
    return tf.data.Dataset.from_tensor_slices(list(texts))


def test_build_orders_by_count_then_token_with_reserved_first():
    vocab = tfseq.Vocab.build(lines("b a b", "c b a", "d"))
    assert vocab.tokens == ["<pad>", "<unk>", "<s>", "</s>", "b", "a", "c", "d"]


def test_min_count_and_max_size():
    data = lines("b a b", "c b a", "d")
    assert tfseq.Vocab.build(data, min_count=2).tokens[4:] == ["b", "a"]
    assert tfseq.Vocab.build(data, max_size=5).tokens[4:] == ["b"]


def test_save_load_round_trip(tmp_path):
    vocab = tfseq.Vocab.build(lines("ñ ü ñ", "x"))
    path = tmp_path / "vocab.txt"
    vocab.save(path)
    assert path.read_text(encoding="utf-8") == "<pad>\n<unk>\n<s>\n</s>\nñ\nx\nü\n"
    assert tfseq.Vocab.load(path).tokens == vocab.tokens


def test_load_rejects_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        tfseq.Vocab.load(tmp_path / "nope.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("<pad>\n<unk>\n<s>\n</s>\na\nb\na\n")
    with pytest.raises(ValueError, match=r"bad.txt: Duplicate token 'a' at ids 4 and 6"):
        tfseq.Vocab.load(bad)
    no_reserved = tmp_path / "nr.txt"
    no_reserved.write_text("a\nb\n")
    with pytest.raises(ValueError, match="reserved tokens"):
        tfseq.Vocab.load(no_reserved)


def test_lookup_dense_and_ragged_unknown_is_1():
    vocab = tfseq.Vocab(["<pad>", "<unk>", "<s>", "</s>", "a", "b"])
    assert vocab.lookup(tf.constant(["b", "zz", "a"])).numpy().tolist() == [5, 1, 4]
    ragged = tf.ragged.constant([["a"], [], ["b", "q"]])
    assert vocab.lookup(ragged).to_list() == [[4], [], [5, 1]]
    assert vocab.lookup(tf.constant(["a"])).dtype == tf.int32
    assert to_list(vocab.to_tokens(tf.constant([5, 4, 99]))) == ["b", "a", "<unk>"]


VOCAB = tfseq.Vocab(["<pad>", "<unk>", "<s>", "</s>", "in", "the", "beginning", ",", "god"])


def test_tokenize_whitespace_with_bos_eos():
    ds = lines("in the  beginning", "the end").apply(tfseq.tokenize(VOCAB, add_bos=True, add_eos=True))
    assert to_list(ds) == [{"ids": [2, 4, 5, 6, 3]}, {"ids": [2, 5, 1, 3]}]
    assert ds.element_spec == {"ids": tf.TensorSpec([None], tf.int32)}


def test_tokenize_fixed_parallel_calls_keep_the_batches_in_order():
    # num_parallel_calls changes the threads only: the same ragged batches, in input order.
    text = [" ".join(["in", "the", "beginning", "god", "x"][: 1 + i % 5]) for i in range(40)]
    batches = tf.data.Dataset.from_tensor_slices(text).batch(3)
    for calls in (1, 4):
        out = [b["ids"].to_list() for b in batches.apply(
            tfseq.tokenize(VOCAB, num_parallel_calls=calls))]
        assert len(out) == 14 and out[0] == [[4], [4, 5], [4, 5, 6]]
        assert out[13] == [[4, 5, 6, 8, 1]]  # the 40th line; x is unknown
        assert sum(len(r) for b in out for r in b) == 120


def test_tokenize_unicode_script_splits_punctuation_and_lowercase():
    ds = lines("In the beginning, God").apply(
        tfseq.tokenize(VOCAB, tokenizer="unicode_script", lowercase=True))
    assert to_list(ds) == [{"ids": [4, 5, 6, 7, 8]}]


def test_tokenize_wordpiece():
    vocab = tfseq.Vocab(["<pad>", "<unk>", "<s>", "</s>", "begin", "##ning", "the"])
    ds = lines("the beginning xyz").apply(tfseq.tokenize(vocab, tokenizer="wordpiece"))
    assert to_list(ds) == [{"ids": [6, 4, 5, 1]}]


def test_tokenize_dict_key_for_pairs():
    pairs = tf.data.Dataset.from_tensor_slices({"source": ["the god"], "target": ["in"]})
    ds = pairs.apply(tfseq.tokenize(VOCAB, key="source")).apply(tfseq.tokenize(VOCAB, key="target"))
    assert to_list(ds) == [{"source": [5, 8], "target": [4]}]


def test_tokenize_three_ways_eager_map_batched():
    tok = tfseq.text.get_tokenizer()
    eager = VOCAB.lookup(tok.tokenize(tf.constant("the god")))
    assert eager.numpy().tolist() == [5, 8]
    mapped = to_list(lines("the god").apply(tfseq.tokenize(VOCAB)))
    assert mapped == [{"ids": [5, 8]}]
    batched = VOCAB.lookup(tok.tokenize(tf.constant(["the god", "in"])))
    assert batched.to_list() == [[5, 8], [4]]


def test_tokenize_errors():
    with pytest.raises(ValueError, match="Unknown tokenizer 'bpe'"):
        tfseq.tokenize(VOCAB, tokenizer="bpe")
    with pytest.raises(ValueError, match="Unknown key 'text'"):
        tf.data.Dataset.from_tensor_slices({"line": ["a"]}).apply(tfseq.tokenize(VOCAB, key="text"))
    with pytest.raises(ValueError, match="wordpiece"):
        tfseq.text.get_tokenizer("wordpiece")


# Unicode's White_Space characters: what the whitespace tokenizer splits on.
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + (
    "\u2028\u2029\u202f\u205f\u3000")


def test_whitespace_tokenizer_splits_on_every_unicode_space_without_broken_tokens():
    import tensorflow_text as tf_text

    # tensorflow-text's own tokenizer leaves part of a multi-byte space in the token before it.
    assert tf_text.WhitespaceTokenizer().tokenize(tf.constant(["a\u00a0b"])).to_list() == [
        [b"a\xc2", b"b"]]
    tok = tfseq.text.get_tokenizer()
    texts = [f"a{c}b{c}{c}c{c}" for c in WHITE_SPACE] + [
        "in the  beginning", "", "   ", "caf\u00e9 na\u00efve\u00a0\u3000x",
        "\u200bzero\u200bwidth"]
    expected = [[b"a", b"b", b"c"]] * len(WHITE_SPACE) + [
        [b"in", b"the", b"beginning"], [], [], ["caf\u00e9".encode(), "na\u00efve".encode(), b"x"],
        ["\u200bzero\u200bwidth".encode()]]  # U+200B is not White_Space
    assert tok.tokenize(tf.constant(texts)).to_list() == expected
    # Invalid UTF-8 passes through as the kernel splits it.
    assert tok.tokenize(tf.constant([b"bad\xff bytes\xc2"])).to_list() == [
        [b"bad\xff", b"bytes\xc2"]]
    # Scalars, [B, N] and ragged input give the same tokens.
    assert tok.tokenize(tf.constant("a\u3000b")).numpy().tolist() == [b"a", b"b"]
    assert tok.tokenize(tf.constant([["a\u00a0b"], ["c"]])).to_list() == [[[b"a", b"b"]], [[b"c"]]]
    assert tok.tokenize(tf.ragged.constant([["a\u2003b", "c"], []])).to_list() == [
        [[b"a", b"b"], [b"c"]], []]
    # Through tokenize(vocab): ids of the clean tokens.
    vocab = tfseq.Vocab(["<pad>", "<unk>", "<s>", "</s>", "a", "b"])
    ids = lines("a\u00a0b", "b\u3000a").apply(tfseq.tokenize(vocab))
    assert to_list(ids) == [{"ids": [4, 5]}, {"ids": [5, 4]}]


def test_whitespace_tokenizer_graph_has_no_assertions():
    # On [B] lines the kernel is called directly: no ragged-validation If / Assert ops, which
    # would run on every batch.
    graph = tf.function(tfseq.text.get_tokenizer().tokenize).get_concrete_function(
        tf.TensorSpec([None], tf.string)).graph
    types = {op.type for op in graph.get_operations()}
    assert "TFText>WhitespaceTokenizeWithOffsetsV2" in types
    assert not types & {"If", "StatelessIf", "Assert"}


def test_learn_splits_words_where_the_tokenizer_does():
    text = "a\u00a0b\x1cc\u3000d\te  f\u200bg"
    # U+001C stays inside a word (str.split() would split there); U+200B is not a space.
    assert tfseq.text.split_words(text) == ["a", "b\x1cc", "d", "e", "f\u200bg"]
    tokens = tfseq.text.get_tokenizer().tokenize(tf.constant([text])).to_list()[0]
    assert [t.decode() for t in tokens] == tfseq.text.split_words(text)
    assert tfseq.text.split_words(" ".join(WHITE_SPACE)) == []
