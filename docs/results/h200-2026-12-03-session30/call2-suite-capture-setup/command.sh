#!/bin/bash
# session 30 second device call (branch s30: main + pools.recording + the aliasing memo): the GPU suite,
# the paired capture cost (recording vs a synchronize around every capture), setup time at 10 and 5 steps
set -u
mkdir -p .site .cfx /tmp/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; date -u; echo "tree: 79af76e (branch s30)"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py benchmarks/capture_sync_cost.py; } > /tmp/r/gpu.txt
mkdir -p /tmp/r/suite
OUT=/tmp/r/suite COMMIT=79af76e WORKERS=16 SUITE_TIMEOUT=280 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
mkdir -p /tmp/r/capture-sync
( time timeout 130 python3 benchmarks/capture_sync_cost.py --n-timesteps 10 --prompt-tokens 150,250 --reps 3 ) > /tmp/r/capture-sync/log.txt 2>&1; echo "capture-sync rc=$?"; tail -n 5 /tmp/r/capture-sync/log.txt | cut -c1-600
(cd /tmp && tar czf $OUT/r.tgz r)
show() { grep -E '^\{"prompt' $1 | python3 -c "import sys,json; [print({k: r.get(k) for k in ('prompt_tokens','ready_s','capture_s','gc','tracked_objects','exact')}, r.get('split')) for r in map(json.loads, sys.stdin)]"; }
mkdir -p /tmp/r/setup-10
( time timeout 135 python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps 10 --prompt-tokens 75,150,250 --chunks 4 --timeout 120 --out /tmp/r/setup-10 ) > /tmp/r/setup-10/log.txt 2>&1; echo "setup-10 rc=$?"; show /tmp/r/setup-10/log.txt
(cd /tmp && tar czf $OUT/r.tgz r)
mkdir -p /tmp/r/setup-5
( time timeout 150 python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps 5 --prompt-tokens 75,150,250 --chunks 4 --timeout 140 --out /tmp/r/setup-5 ) > /tmp/r/setup-5/log.txt 2>&1; echo "setup-5 rc=$?"; show /tmp/r/setup-5/log.txt
(cd /tmp && tar czf $OUT/r.tgz r)
