#!/bin/bash
# session 26 first device call: traffic, paced 4 on an EMPTY cache (two-voice warm-up), then b2b 8
set -u
mkdir -p .site .cfx
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
rm -rf .cfx/*
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; date -u; echo "commit 620798d"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py cadence_fx/tools/traffic.py; } > /tmp/gpu.txt
mkdir -p /tmp/r; cp /tmp/gpu.txt /tmp/r/
for spec in "--conversations 4 --pace" "--conversations 8"; do
  name=$(echo "$spec" | tr ' ' '_' | tr -d '-')
  echo "== $spec"; date
  ( time timeout ${T:-270} python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --seed 0 --background --idle $spec --json --out /tmp/r/$name ) > /tmp/$name.log 2>&1
  echo "rc=$?"; tail -c 1500 /tmp/$name.log; mkdir -p /tmp/r/$name; mv /tmp/$name.log /tmp/r/$name/log.txt
  (cd /tmp && tar czf $OUT/r.tgz r)
done
