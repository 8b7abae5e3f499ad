#!/bin/bash
# session 28 second device call: set-up time, shared calls off at 10 steps (the pair of call 1's
# rows), and at 5 steps on and off (one copy buffer and one first-graph pool a session); first the
# paired cost benchmark again, now with one more session's memory per model
set -u
mkdir -p .site .cfx /tmp/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; date -u; echo "tree: $(git rev-parse --short HEAD 2>/dev/null)"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py; } > /tmp/r/gpu.txt
( time timeout 140 python3 benchmarks/shared_capture_cost.py --n-timesteps 10 --prompt-tokens 250 --chunks 12 ) > /tmp/r/cost.txt 2>&1; echo "cost rc=$?"; head -c 1800 /tmp/r/cost.txt
(cd /tmp && tar czf $OUT/r.tgz r)
for row in "10 0 setup-10-off" "5 1 setup-5-on" "5 0 setup-5-off"; do
  set -- $row
  mkdir -p /tmp/r/$3
  ( time CADENCE_FX_SHARED_CAPTURE=$2 timeout 170 python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps $1 --prompt-tokens 75,150,250 --chunks 4 --timeout 110 --out /tmp/r/$3 ) > /tmp/r/$3/log.txt 2>&1; echo "$3 rc=$?"; grep -E '^\{"prompt' /tmp/r/$3/log.txt | cut -c1-330
  (cd /tmp && tar czf $OUT/r.tgz r)
done
