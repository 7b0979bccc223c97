#!/usr/bin/env bash
# A new user's first hour, replayed: the built wheel installed in an empty directory, the
# README's commands on small hand-made files, and every command's output watched.
# Fails on a traceback, a usage dump, an unexpected exit status, or a phase that prints
# nothing for more than MAX_SILENT seconds (default 5).
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
import sys, time
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
run 2 "$BIN/tfseq-train" --task=classify --train_files='data/train*.tsv' --format=tsv \
  --columns=text,label --header --model_dir=runs/swapped
run 2 "$BIN/tfseq-train" --task=classify --train_files='data/train*.tsv' --format=tsv \
  --columns=label,text --model_dir=runs/noheader
run 0 "$BIN/tfseq-train" --task=lm --train_files=corpus.txt.gz --format=text \
  --tokenizer=sentencepiece --vocab_size=200 --model_dir=runs/lm --epochs=1
run 0 "$BIN/tfseq-train" --task=translate --source_files=train.en --target_files=train.de \
  --model_dir=runs/mt --epochs=1
run 0 "$BIN/tfseq-train" --task=tag --train_files=train.conll --format=conll \
  --columns=token,_,_,tag --model_dir=runs/tag --epochs=1
run 2 "$BIN/tfseq-train" --task=tag --model_dir=runs/tsv
run 0 "$BIN/tfseq-predict" --model_dir=runs/tsv --files=data/eval.tsv --output=preds.tsv
run 0 "$BIN/tfseq-export" --model_dir=runs/tsv
run 2 "$BIN/tfseq-export" --model_dir=runs/nowhere
if [ "$FAILED" != 0 ]; then echo "NEWCOMER: $FAILED problem(s) above"; exit 1; fi
echo "NEWCOMER: all commands behaved"
