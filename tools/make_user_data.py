r"""Writes small generated files in the user formats that ``tfseq-train`` reads.

Usage:
  python tools/make_user_data.py --out_dir=/tmp/mydata --lines=3000

Writes ``train.tsv`` (``label<TAB>text`` with a header, plus one malformed line and one empty
text), ``eval.tsv`` (with one label never seen in training), ``train.csv`` (``text,label``,
quoted fields with commas and doubled quotes, plus one broken quote), ``corpus.txt`` (plain
text) and ``train.en``/``train.es`` (line-aligned pairs of a toy number-word translation).
The classification is learnable: each label has its own topic words among shared filler words.
"""

import csv
import os
import random

from absl import app, flags

flags.DEFINE_string("out_dir", "/tmp/tfseq_user_data", "Where to write the files.")
flags.DEFINE_integer("lines", 3000, "Training lines per file.")
flags.DEFINE_integer("seed", 1, "Random seed.")
FLAGS = flags.FLAGS

TOPICS = {"sports": "goal match team score coach league player ball".split(),
          "food": "bread soup spicy recipe oven sweet salad cheese".split(),
          "tech": "laptop code server network chip software robot cloud".split()}
COMMON = "the a and of with very today really new old good bad".split()
SOURCE = "one two three four five six seven eight".split()
TARGET = "uno dos tres cuatro cinco seis siete ocho".split()


def main(argv):
    del argv
    rng = random.Random(FLAGS.seed)
    labels = sorted(TOPICS)

    def sentence(label):
        words = [rng.choice(TOPICS[label]) for _ in range(3)] + [
            rng.choice(COMMON) for _ in range(rng.randint(3, 9))]
        rng.shuffle(words)
        return " ".join(words)

    out = FLAGS.out_dir
    os.makedirs(out, exist_ok=True)
    n = FLAGS.lines
    with open(os.path.join(out, "train.tsv"), "w") as f:
        f.write("label\ttext\n")
        for i in range(n):
            label = labels[i % 3] if i % 5 else "sports"  # sports is the majority class
            f.write(f"{label}\t{sentence(label)}\n")
        f.write("only-one-field\nfood\t\n")
    with open(os.path.join(out, "eval.tsv"), "w") as f:
        f.write("label\ttext\n")
        for i in range(n // 10):
            f.write(f"{labels[i % 3]}\t{sentence(labels[i % 3])}\n")
        f.write("weather\tsunny rain cloud\n")
    with open(os.path.join(out, "train.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for i in range(n):
            text = sentence(labels[i % 3]).replace(" ", ", ", 1)
            writer.writerow([text + (' "quoted" said' if i % 7 == 0 else ""), labels[i % 3]])
        f.write('broken "quote, food\n')
    with open(os.path.join(out, "corpus.txt"), "w") as f:
        f.writelines(sentence(labels[i % 3]) + "\n" for i in range(n))
    with open(os.path.join(out, "train.en"), "w") as en, open(
            os.path.join(out, "train.es"), "w") as es:
        for _ in range(n):
            words = [rng.randrange(len(SOURCE)) for _ in range(rng.randint(2, 6))]
            en.write(" ".join(SOURCE[w] for w in words) + "\n")
            es.write(" ".join(TARGET[w] for w in words) + "\n")
    print(f"wrote {out}/{{train.tsv,eval.tsv,train.csv,corpus.txt,train.en,train.es}}")


if __name__ == "__main__":
    app.run(main)
