"""Vocab.learn (WordPiece from the `tokenizers` trainer, uniform line sample) and Reservoir."""

import numpy as np
import pytest
import tensorflow as tf

import tfseq
from tfseq.sampling import Reservoir
from tfseq.text import Vocab

RESERVED = ["<pad>", "<unk>", "<s>", "</s>"]
CORPUS = ["low lower lowest", "new newer newest", "wide wider widest",
          "the newest widest low"] * 5
# Learned from CORPUS with vocab_size=36: the reserved tokens, the "##" form of every
# character, the characters, then the pieces in the order the trainer merged them.
CORPUS_TOKENS = RESERVED + [
    "##d", "##e", "##h", "##i", "##l", "##n", "##o", "##r", "##s", "##t", "##w",
    "d", "e", "h", "i", "l", "n", "o", "r", "s", "t", "w",
    "##es", "##est", "##ew", "##id", "##ow", "low", "new", "wid", "##er", "newest"]


def wordpiece_ids(vocab, lines):
    """Lines -> their ids through tfseq.tokenize(tokenizer="wordpiece"), as lists."""
    ds = tf.data.Dataset.from_tensor_slices(lines).apply(
        tfseq.tokenize(vocab, tokenizer="wordpiece"))
    return [e["ids"].numpy().tolist() for e in ds]


def pieces(vocab, lines):
    tokens = tfseq.text.get_tokenizer("wordpiece", vocab).tokenize(tf.constant(lines))
    return [[p.decode() for p in row] for row in tokens.to_list()]


# --- Vocab.learn(tokenizer="wordpiece") ------------------------------------------------

def test_wordpiece_vocab_tokens_ids_and_save_load_round_trip(tmp_path):
    vocab = Vocab.learn(CORPUS, tokenizer="wordpiece", vocab_size=36)
    assert vocab.tokens == CORPUS_TOKENS
    sentences = ["the lowest newer wide", "newlow"]
    expected_ids = [[24, 6, 5, 31, 27, 32, 34, 33, 5], [32, 8, 30]]
    assert pieces(vocab, sentences) == [
        ["t", "##h", "##e", "low", "##est", "new", "##er", "wid", "##e"],
        ["new", "##l", "##ow"]]
    assert wordpiece_ids(vocab, sentences) == expected_ids
    vocab.save(tmp_path / "vocab.txt")
    loaded = Vocab.load(tmp_path / "vocab.txt")
    assert loaded.tokens == CORPUS_TOKENS
    assert wordpiece_ids(loaded, sentences) == expected_ids


def test_wordpiece_input_forms_give_the_same_vocab(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(CORPUS) + "\n")
    from_dataset = Vocab.learn(tf.data.Dataset.from_tensor_slices(CORPUS), vocab_size=36)
    from_batches = Vocab.learn(tf.data.Dataset.from_tensor_slices(CORPUS).batch(3),
                               vocab_size=36)
    from_bytes = Vocab.learn((line.encode() for line in CORPUS), vocab_size=36)
    assert from_dataset.tokens == from_batches.tokens == from_bytes.tokens == CORPUS_TOKENS
    # A list/tuple whose first item names a file is a list of files; a path or glob too.
    assert Vocab.learn([str(path)], vocab_size=36).tokens == CORPUS_TOKENS
    assert Vocab.learn(str(tmp_path / "*.txt"), vocab_size=36).tokens == CORPUS_TOKENS
    assert Vocab.learn(path, vocab_size=36).tokens == CORPUS_TOKENS
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        Vocab.learn([str(path), str(tmp_path / "missing.txt")], vocab_size=36)


def test_wordpiece_splits_words_only_at_white_space():
    # A no-break space (U+00A0) splits words, as in split_words and the whitespace tokenizer;
    # punctuation stays attached to its word.
    vocab = Vocab.learn(["hello,\u00a0world! hello, world!"] * 5, vocab_size=60)
    assert vocab.tokens == RESERVED + [
        "##!", "##,", "##d", "##e", "##h", "##l", "##o", "##r", "##w",
        "!", ",", "d", "e", "h", "l", "o", "r", "w",
        "##d!", "##el", "##lo", "##ld!", "##or", "hel", "wor", "##lo,", "hello,", "world!"]
    assert pieces(vocab, ["hello,\u00a0world!", "world,hello!"]) == [
        ["hello,", "world!"], ["wor", "##l", "##d", "##,", "##h", "##el", "##lo", "##!"]]


def test_wordpiece_covers_every_character_of_the_sample():
    lines = ["über café x—y", "naïve ½ über", "日本語 テキスト"]
    vocab = Vocab.learn(lines, vocab_size=80)
    assert len(vocab) <= 80
    assert all(tfseq.text.UNK_ID not in ids for ids in wordpiece_ids(vocab, lines))
    # New words of seen characters in positions they never had in the sample: "x", "ü" and
    # "日" only started words there, "y" and "—" only continued them.
    assert pieces(vocab, ["yx", "—über", "テ日"]) == [
        ["y", "##x"], ["—", "##ü", "##be", "##r"], ["テ", "##日"]]


def test_wordpiece_lowercase_folds_the_sample():
    vocab = Vocab.learn(["The Walker WALKED"] * 3, vocab_size=60, lowercase=True)
    assert vocab.tokens == RESERVED + [
        "##a", "##d", "##e", "##h", "##k", "##l", "##r", "##t", "##w",
        "a", "d", "e", "h", "k", "l", "r", "t", "w",
        "##al", "##ke", "wal", "walke", "##he", "the", "walked", "walker"]


def test_wordpiece_initial_alphabet_covers_unseen_characters_and_drops_line_breaks():
    # "\n" (which the Vocab constructor rejects) is dropped; "z" gets both forms.
    vocab = Vocab.learn(["ab ba"] * 3, vocab_size=30, initial_alphabet=["z", "\n"])
    assert vocab.tokens == RESERVED + ["##a", "##b", "##z", "a", "b", "z", "ab", "ba"]
    assert pieces(vocab, ["zaz"]) == [["z", "##a", "##z"]]


def test_wordpiece_errors_name_the_problem():
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['lower_thresh'\]"):
        Vocab.learn(CORPUS, vocab_size=36, lower_thresh=1)
    with pytest.raises(ValueError, match=r"11 distinct characters, which need 26 tokens"):
        Vocab.learn(CORPUS, vocab_size=20)
    with pytest.raises(ValueError, match="no line to learn"):
        Vocab.learn([], vocab_size=36)
    with pytest.raises(ValueError, match="no words"):
        Vocab.learn([" ", "\u3000"], vocab_size=36)
    with pytest.raises(TypeError, match="lines must be str or bytes; received int 7"):
        Vocab.learn(["a", 7], vocab_size=36)
    with pytest.raises(ValueError, match="tf.string lines"):
        Vocab.learn(tf.data.Dataset.range(3), vocab_size=36)
    with pytest.raises(ValueError, match="max_lines=0"):
        Vocab.learn(CORPUS, vocab_size=36, max_lines=0)


def test_max_lines_samples_the_whole_file_not_its_first_lines(tmp_path):
    # Sorted by label: the last tenth (weather) has words that appear nowhere earlier.
    sports = ["goal match team", "team coach goal", "match ball league", "coach team ball"]
    rows = ([f"sports\t{sports[i % 4]}" for i in range(900)]
            + [f"weather\tsunny rainy {word}" for word in ["windy", "foggy"] * 50])
    path = tmp_path / "sorted.tsv"
    path.write_text("\n".join(rows) + "\n")
    vocab = Vocab.learn(str(path), vocab_size=200, max_lines=50)
    assert {"weather", "sunny", "rainy", "windy", "foggy"} <= set(vocab.tokens)
    assert {"sports", "goal", "match", "team", "coach", "ball", "league"} <= set(vocab.tokens)
    # The first 50 lines (what max_lines used to keep) never reach the weather rows.
    first_lines = Vocab.learn(rows[:50], vocab_size=200)
    assert not {"weather", "sunny", "rainy", "windy", "foggy"} & set(first_lines.tokens)
    assert not {"w", "y", "##y"} & set(first_lines.tokens)


def test_sentencepiece_still_learns_from_the_uniform_sample(tmp_path):
    vocab = Vocab.learn(CORPUS, tokenizer="sentencepiece", vocab_size=30, max_lines=8)
    assert vocab.tokens[:4] == RESERVED and vocab.sentencepiece_model is not None
    tok = tfseq.text.get_tokenizer("sentencepiece", vocab)
    ids = vocab.lookup(tok.tokenize(tf.constant(["the newest low"])))
    assert tok.detokenize(ids).numpy().tolist() == [b"the newest low"]


# --- Reservoir ---------------------------------------------------------------------------

def test_reservoir_keeps_at_most_capacity_lines():
    reservoir = Reservoir(10, seed=0)
    for start in range(0, 1000, 64):
        reservoir.add([f"line {i}" for i in range(start, min(start + 64, 1000))])
    sample = reservoir.sample()
    assert reservoir.seen == 1000 and len(reservoir) == 10 and len(sample) == 10
    assert len(set(sample)) == 10 and set(sample) <= {f"line {i}" for i in range(1000)}


def test_reservoir_exact_sample_for_a_seed_however_the_lines_are_batched():
    lines = ["a", "b", "c", "d", "e", "f", "g", "h"]
    whole = Reservoir(3, seed=0)
    whole.add(lines)
    assert whole.sample() == ["d", "e", "g"]
    one_by_one = Reservoir(3, seed=0)
    for line in lines:
        one_by_one.add([line])
    as_arrays = Reservoir(3, seed=0)
    as_arrays.add(np.array([b"a", b"b", b"c"], dtype=object))
    as_arrays.add(np.array([b"d", b"e", b"f", b"g", b"h"]))  # fixed-width bytes: dtype S1
    assert one_by_one.sample() == ["d", "e", "g"]
    assert as_arrays.sample() == [b"d", b"e", b"g"]
    other_seed = Reservoir(3, seed=1)
    other_seed.add(lines)
    assert other_seed.sample() == ["b", "f", "h"]


def test_reservoir_keeps_every_line_with_equal_probability():
    # 20 lines, 5 kept, 2,000 seeds: each line is kept 500 times in expectation (standard
    # deviation 19.4). Batches of 3 make lines of one batch compete for the same slot.
    counts = np.zeros(20, dtype=np.int64)
    for seed in range(2000):
        reservoir = Reservoir(5, seed=seed)
        for start in range(0, 20, 3):
            reservoir.add(np.arange(start, min(start + 3, 20)).astype(object))
        kept = reservoir.sample()
        assert len(kept) == 5 and kept == sorted(set(kept))
        counts[kept] += 1
    assert counts.sum() == 10_000
    assert counts.min() >= 400 and counts.max() <= 600, counts.tolist()


def test_reservoir_with_fewer_lines_than_capacity_keeps_all_in_order():
    reservoir = Reservoir(5, seed=0)
    reservoir.add(["x", "y"])
    reservoir.add([])
    reservoir.add(("z",))
    assert reservoir.sample() == ["x", "y", "z"] and reservoir.seen == 3 and len(reservoir) == 3


def test_reservoir_errors():
    with pytest.raises(ValueError, match="capacity=0"):
        Reservoir(0)
    with pytest.raises(TypeError, match="capacity must be an int"):
        Reservoir(2.5)
    with pytest.raises(ValueError, match=r"shape \(2, 1\)"):
        Reservoir(2).add(np.array([[b"a"], [b"b"]]))
    with pytest.raises(ValueError, match="not one line"):
        Reservoir(2).add("one line")
