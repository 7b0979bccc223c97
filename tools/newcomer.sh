#!/usr/bin/env bash
# A new user's first hour, replayed: the built wheel installed in an empty directory, the
# README's commands on small hand-made files, and every command's output watched.
# Fails on a traceback, a usage dump, one of TensorFlow's own log lines (E0000 ..., I0000 ...),
# an unexpected exit status, or a phase that prints nothing for more than MAX_SILENT seconds
# (default 5).
#
#   bash tools/newcomer.sh              # from a checkout; needs python3 and the package index
#
# Not part of `make test` (it builds a wheel and a fresh environment: minutes); run it before
# a release or after changing what the commands print.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MAX_SILENT="${MAX_SILENT:-5}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export TF_CPP_MIN_LOG_LEVEL=2

python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q --upgrade pip
"$WORK/venv/bin/pip" wheel -q --no-deps -w "$WORK/dist" "$ROOT"
"$WORK/venv/bin/pip" install -q "$WORK"/dist/tfseq-*.whl
mkdir "$WORK/user" && cd "$WORK/user"
BIN="$WORK/venv/bin"

# Small files in each format the README shows.
"$BIN/python" - <<'EOF'
import gzip, os, random
rng = random.Random(0)
os.makedirs("data", exist_ok=True)
topics = {"sport": "ball goal team win match", "tech": "chip code data cloud model",
          "food": "bread soup rice salt cook"}
def line(label):
    return label + "\t" + " ".join(rng.choice(topics[label].split()) for _ in range(6))
for name, n in (("train1.tsv", 300), ("train2.tsv", 300), ("eval.tsv", 60)):
    with open(f"data/{name}", "w") as f:
        f.write("label\ttext\n" + "\n".join(line(rng.choice(sorted(topics))) for _ in range(n)) + "\n")
import json
with open("texts.jsonl", "w") as f:
    for _ in range(300):
        label = rng.choice(sorted(topics))
        words = " ".join(rng.choice(topics[label].split()) for _ in range(6))
        f.write(json.dumps({"label": label, "text": words, "meta": {"source": "web"}}) + "\n")
with gzip.open("corpus.txt.gz", "wt") as f:
    for _ in range(600):
        f.write(" ".join(rng.choice(" ".join(topics.values()).split()) for _ in range(8)) + "\n")
words = {"ball": "balle", "goal": "but", "team": "equipe", "win": "gagner", "code": "code"}
with open("train.en", "w") as en, open("train.de", "w") as de:
    for _ in range(300):
        s = [rng.choice(sorted(words)) for _ in range(5)]
        en.write(" ".join(s) + "\n"); de.write(" ".join(words[w] for w in s) + "\n")
with open("train.conll", "w") as f:
    for _ in range(200):
        for i in range(5):
            w = rng.choice(sorted(words))
            f.write(f"{w}\t_\t_\t{'B' if i == 0 else 'I'}\n")
        f.write("\n")
EOF

# Runs a command, stamps its output, and checks the status, tracebacks and silent phases.
run() {
  local expected="$1"; shift
  echo "== $* (expect exit $expected)"
  local help=no
  case " $* " in *" --help "*) help=yes ;; esac
  set +e
  "$@" 2>&1 | "$BIN/python" -c '
import re, sys, time
start = last = time.monotonic(); worst = (0.0, "the start")
for line in sys.stdin:
    now = time.monotonic()
    if now - last > worst[0]:
        worst = (now - last, line.strip()[:80])
    last = now
    sys.stdout.write(f"  {now - start:6.1f}s | {line}")
    usage = (line.startswith("Usage:") or line.startswith("USAGE:")) and sys.argv[2] == "no"
    if "Traceback" in line or usage:
        print("NEWCOMER: a traceback or a usage dump", flush=True); sys.exit(3)
    if re.match(r"[IWEF][0-9]{4} [0-9:. ]+ ", line) or line.startswith("WARNING: All log messages"):
        print("NEWCOMER: a TensorFlow log line reached the user", flush=True); sys.exit(5)
print(f"  longest silence {worst[0]:.1f} s, before: {worst[1]}")
if worst[0] > float(sys.argv[1]):
    print(f"NEWCOMER: silent for {worst[0]:.1f} s"); sys.exit(4)
' "$MAX_SILENT" "$help"
  local statuses=("${PIPESTATUS[@]}")
  set -e
  if [ "${statuses[0]}" != "$expected" ]; then
    echo "NEWCOMER: exit ${statuses[0]}, expected $expected"; FAILED=$((FAILED + 1))
  fi
  if [ "${statuses[1]}" != "0" ]; then FAILED=$((FAILED + 1)); fi
}
FAILED=0

run 0 "$BIN/tfseq-train" --help
run 0 "$BIN/tfseq-train" --task=classify --train_files='data/train*.tsv' \
  --eval_files=data/eval.tsv --format=tsv --header --columns=label,text --model_dir=runs/tsv \
  --epochs=2
# With --header the columns are the header's names, in any order.
run 0 "$BIN/tfseq-train" --task=classify --train_files='data/train*.tsv' --format=tsv \
  --columns=text,label --header --model_dir=runs/swapped --epochs=1
run 2 "$BIN/tfseq-train" --task=classify --train_files='data/train*.tsv' --format=tsv \
  --columns=label,text --model_dir=runs/noheader
run 0 "$BIN/tfseq-train" --task=lm --train_files=corpus.txt.gz --format=text \
  --tokenizer=sentencepiece --vocab_size=200 --model_dir=runs/lm --epochs=1
run 0 "$BIN/tfseq-train" --task=translate --source_files=train.en --target_files=train.de \
  --model_dir=runs/mt --epochs=1
run 0 "$BIN/tfseq-train" --task=tag --train_files=train.conll --format=conll \
  --columns=token,_,_,tag --model_dir=runs/tag --epochs=1
run 2 "$BIN/tfseq-train" --task=tag --model_dir=runs/tsv
run 0 "$BIN/tfseq-predict" --model_dir=runs/tsv --files=data/eval.tsv --output=out/preds.tsv
run 2 "$BIN/tfseq-predict" --model_dir=runs/tsv --files=texts.jsonl --format=tsv --output=p.tsv
run 0 "$BIN/tfseq-predict" --model_dir=runs/tag --files=train.conll --output=tags.txt
run 0 "$BIN/tfseq-predict" --model_dir=runs/tsv --files=- --format=tsv --columns=label,text \
  <<< $'sport\tball goal\nno tab here'

run 0 "$BIN/tfseq-train" --task=classify --train_files='data/train*.tsv' \
  --eval_files=data/eval.tsv --format=tsv --header --columns=label,text --model_dir=runs/tsv \
  --epochs=2
run 0 "$BIN/tfseq-train" --task=classify --train_files='texts.jsonl@0.5,data/train1.tsv@0.5' \
  --columns=label,text --header --model_dir=runs/mix --epochs=1
run 0 "$BIN/tfseq-export" --model_dir=runs/tsv
run 2 "$BIN/tfseq-export" --model_dir=runs/nowhere
run 2 "$BIN/tfseq-profile" --files=data/eval.tsv
run 2 "$BIN/tfseq-profile" --files=texts.jsonl --format=jsonl --columns=label,text
run 0 "$BIN/tfseq-profile" --train_files=texts.jsonl --columns=label,text --repeats=1
run 0 "$BIN/tfseq-profile" --task=tag --train_files=train.conll --format=conll \
  --columns=token,_,_,tag --repeats=1
run 2 "$BIN/tfseq-data-service" --role=dispatcher
# The user's own script prints once, at its end: no limit on its silence.
MAX_SILENT=600 run 0 "$BIN/python" -W error::UserWarning - <<'PY'
import tfseq  # before keras: tfseq keeps TensorFlow's start-up lines off the terminal
import keras
vocab = tfseq.Vocab.build(tfseq.formats.text_column("data/train1.tsv", columns=["label", "text"], header=True))
ds = tfseq.training_pipeline("data/train1.tsv", vocab, columns=("label", "text"), header=True,
                             labels=["food", "sport", "tech"], batching="bucket", max_tokens=256)
ids = keras.Input((None,), dtype="int32", name="ids")
lengths = keras.Input((), dtype="int32", name="ids_length")
x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(len(vocab), 8)(ids))
model = keras.Model({"ids": ids, "ids_length": lengths}, keras.layers.Dense(3)(x))
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(ds, epochs=2, verbose=0)
print("model.fit on training_pipeline: 2 epochs, no warning")
PY
if [ "$FAILED" != 0 ]; then echo "NEWCOMER: $FAILED problem(s) above"; exit 1; fi
echo "NEWCOMER: all commands behaved"
