#!/usr/bin/env bash
# Paired set-up times on the lent H200 (device tool): an old checkout and this one, run
# alternately (ROUNDS rounds, ORDER per round), each a `setup_time.py` run in its own process
# tree (a cold process with an empty program cache, then a restarted one), SRc fp32.
# Run from the repository root there with the upstream wheels in .whl/ and the old checkout
# in $OLD (carry both: `git archive <sha> | tar -x -C .old`, carry [".whl", ".old"]).
# Leaves in $OUT: <tree>-<round>/setup-SRc-<steps>.json, logs.txt, gpu.txt.
# Usage: [OLD=.old] [STEPS=5] [ROUNDS=2] [ORDER="old new"] [TMO=110] [TOKENS=75,150,250,200] bash benchmarks/paired_setup.sh
set -u
out=${OUT:?set OUT to the folder that comes back}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1
old=${OLD:-.old}; steps=${STEPS:-5}; tmo=${TMO:-110}; rounds=${ROUNDS:-2}; tokens=${TOKENS:-75,150,250,200}
for r in $(seq 1 "$rounds"); do
  for tree in ${ORDER:-old new}; do
    d=$PWD; [ "$tree" = old ] && d=$(cd "$old" && pwd)
    tag=$tree-$r; mkdir -p "$out/$tag"
    (cd "$d" && PYTHONPATH=/tmp/site:$d python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps "$steps" \
      --prompt-tokens "$tokens" --chunks 4 --timeout "$tmo" --out "$out/$tag" >> "$out/logs.txt" 2>&1)
    echo "$tag rc=$?" | tee -a "$out/logs.txt"
  done
done
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > "$out/gpu.txt"
