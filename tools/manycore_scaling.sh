#!/usr/bin/env bash
# The scaling measurement on the many-core test machine, as one command (../shared/manycore/README.md).
#
# Before: `bash ../shared/manycore/prepare.sh` here, each .dev/p<i> copied to /tmp/x there (one
# transfer each), and optionally a baseline tree as .dev/base.tgz (`git archive --format=tar.gz
# -o .dev/base.tgz <commit>`) carried with the last part. Then, from the repository root there:
#
#   bash tools/manycore_scaling.sh [table|lanes|stream|tokenize]   # results under $OUT (default /tmp/scaling_out)
#
# It installs the wheels into /tmp/site once, then runs python -m benchmarks.scaling of this tree
# (also against the baseline's tfseq) at several core counts, most wanted first,
# one JSON per run written as soon as it is done, so a run cut short still returns what it had.
# DEADLINE (seconds, default 480) stops starting new runs once that much time has gone.
set -u
OUT=${OUT:-/tmp/scaling_out}
DEADLINE=${DEADLINE:-480}
mkdir -p "$OUT"
start=$SECONDS
if [ -d /tmp/x ] && [ ! -d /tmp/site/tensorflow ]; then
  cat /tmp/x/part* > /tmp/wheels.tar && mkdir -p /tmp/wh && tar xf /tmp/wheels.tar -C /tmp/wh
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    /tmp/wh/*.whl
  rm -rf /tmp/wheels.tar /tmp/wh
fi
if [ -f .dev/base.tgz ] && [ ! -d /tmp/base ]; then
  mkdir -p /tmp/base && tar xzf .dev/base.tgz -C /tmp/base
fi
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
here=$PWD
{ echo "setup $((SECONDS - start)) s; cores $(nproc); $(python3 --version)"
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|MHz" ; } | tee "$OUT/machine.txt"

# run NAME TREE TIMEOUT CORES ARGS...: one benchmarks.scaling run, its JSON and log in $OUT
# (one pass length: the machine's minutes are few; ARGS may add --steady)
run() {
  local name=$1 tree=$2 limit=$3 cores=$4; shift 4
  local left=$((DEADLINE - (SECONDS - start)))
  if [ "$left" -lt 20 ]; then echo "skip $name: deadline" | tee -a "$OUT/log.txt"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  [ -d "$tree" ] || { echo "skip $name: no $tree" | tee -a "$OUT/log.txt"; return; }
  echo "== $name ($((SECONDS - start)) s in; limit $limit s)" | tee -a "$OUT/log.txt"
  # tfseq.scripts / .pipelines / .models are mapped by the editable install (setup.py's
  # package_dir); with PYTHONPATH only, a copy of the package gets them as links. This tree
  # comes last on the path: its benchmarks/ package, measuring TREE's tfseq.
  local pkg="/tmp/pkg_$(echo "$tree" | tr / _)"
  if [ ! -d "$pkg/tfseq" ]; then
    mkdir -p "$pkg" && cp -r "$tree/tfseq" "$pkg/"
    for d in scripts pipelines models; do
      [ -d "$tree/$d" ] && [ ! -e "$pkg/tfseq/$d" ] && ln -s "$tree/$d" "$pkg/tfseq/$d"
    done
  fi
  (cd /tmp && PYTHONPATH=/tmp/site:$pkg:$here timeout "$limit" python3 \
      -m benchmarks.scaling --cores="$cores" --copies=16 \
      --json_out="$OUT/$name.json" --nosteady "$@") >> "$OUT/log.txt" 2>&1
  echo "   rc $? after $((SECONDS - start)) s" | tee -a "$OUT/log.txt"
}
FIVE=--feeds=raw,read,bucket,pack,bucket_alone,pack_alone
case "${1:-table}" in
table)  # the scaling table, this tree and the baseline
  run now_16 "$here" 120 16 --repeats=3
  run now_2 "$here" 150 2 --repeats=3
  run base_16 /tmp/base 60 16 --repeats=3 "$FIVE" --python_loop=false
  run base_2 /tmp/base 80 2 --repeats=3 "$FIVE" --python_loop=false
  run now_8 "$here" 60 8 --repeats=3 "$FIVE" --python_loop=false
  run now_4 "$here" 60 4 --repeats=3 "$FIVE" --python_loop=false
  run now_16_parallel "$here" 90 16 --repeats=2 --feeds=raw,bucket,pack,bucket_alone,pack_alone \
    --parallel=1,4,16 --python_loop=false
  run base_8 /tmp/base 60 8 --repeats=3 "$FIVE" --python_loop=false ;;
lanes)  # K pipelines over a file split (benchmarks/lanes.py) against one chain; 16 cores first. On
  # 2026-11-27 lanes_16 took ~110 s (one pass of 47.9M tokens per feed); 64 copies with two
  # passes each did not finish in 200 s.
  L="--feeds=raw,bucket,pack --python_loop=false --repeats=1"
  S="--feeds=raw,stream_bucket,stream_pack --python_loop=false --repeats=2"
  run lanes_16 "$here" 180 16 $L --copies=32 --lanes=4,8
  run stream_16 "$here" 90 16 $S --copies=16
  run lanes_2 "$here" 150 2 $L --copies=16 --lanes=2
  run tok_16 "$here" 60 16 --feeds=raw --python_loop=false --repeats=2 --copies=32 \
    --tokenize_parallel=cores
  run stream_2 "$here" 90 2 $S --copies=8 ;;
stream)  # the binaries' stream: encode at AUTOTUNE against fixed calls; raw in lanes; 16 first
  S="--feeds=raw,bucket,pack,stream_bucket,stream_pack --python_loop=false --repeats=2"
  run stream_auto_16 "$here" 120 16 $S --lanes=4
  run stream_cores_16 "$here" 120 16 $S --tokenize_parallel=cores --lanes=4
  run stream_auto_2 "$here" 120 2 $S --lanes=2
  run stream_cores_2 "$here" 120 2 $S --tokenize_parallel=cores --lanes=2 ;;
tokenize)  # where the raw feed stops scaling (benchmarks/raw_scaling.py), tokenize's parallelism
  echo "== diag 2,16 ($((SECONDS - start)) s in)" | tee -a "$OUT/log.txt"
  (cd /tmp && PYTHONPATH=/tmp/site:$here timeout 150 python3 -m benchmarks.raw_scaling \
     --cores=2,16 --json_out="$OUT/diag.json") >> "$OUT/log.txt" 2>&1
  THREE=--feeds=raw,bucket,pack
  run tok_cores_16 "$here" 45 16 --repeats=3 "$THREE" --python_loop=false --tokenize_parallel=cores
  run tok_auto_16 "$here" 45 16 --repeats=3 "$THREE" --python_loop=false
  run tok_cores_2 "$here" 60 2 --repeats=3 "$THREE" --python_loop=false --tokenize_parallel=cores
  run tok_auto_2 "$here" 60 2 --repeats=3 "$THREE" --python_loop=false
  [ $((DEADLINE - (SECONDS - start))) -lt 60 ] && { echo "skip diag 8: deadline"; exit 0; }
  echo "== diag 8 ($((SECONDS - start)) s in)" | tee -a "$OUT/log.txt"
  (cd /tmp && PYTHONPATH=/tmp/site:$here timeout 60 python3 -m benchmarks.raw_scaling \
     --cores=8 --json_out="$OUT/diag8.json") >> "$OUT/log.txt" 2>&1 ;;
esac
grep -v "^I0000\|^W0000\|^E0000\|WARNING" "$OUT/log.txt" | tail -120
echo "total $((SECONDS - start)) s"
