#!/bin/bash
# session 26 second device call: the GPU suite with one graph for a shared step's calls (SHARE_CALLS on),
# then setup_time at 10 steps with it on and off (CADENCE_FX_SHARED_CAPTURE=0), paired, one process each
set -u
mkdir -p .site .cfx /tmp/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; date -u; echo "tree: 44ad074 + the shared-capture change (uncommitted)"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py; } > /tmp/r/gpu.txt
mkdir -p /tmp/r/suite
OUT=/tmp/r/suite COMMIT=44ad074+shared-capture WORKERS=16 SUITE_TIMEOUT=270 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E "passed|failed" /tmp/r/suite/pytest-cuda.log | tail -3; grep -E "^FAILED|Error" /tmp/r/suite/pytest-cuda.log | head -8
(cd /tmp && tar czf $OUT/r.tgz r)
for share in 1 0; do
  d=/tmp/r/setup-10-share$share; mkdir -p $d
  ( time CADENCE_FX_SHARED_CAPTURE=$share timeout 150 python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps 10 --prompt-tokens 75,150,250 --chunks 4 --timeout 120 --out $d ) > $d/log.txt 2>&1
  echo "setup 10 share=$share rc=$?"; grep -o '"prompt_tokens": [0-9]*, "ready_s": [0-9.]*' $d/log.txt | tr '\n' ' '; grep -o '"capture_s": [0-9.]*' $d/log.txt | tr '\n' ' '; grep -o '"exact": [a-z]*' $d/log.txt | sort | uniq -c | tr '\n' ' '; echo
  (cd /tmp && tar czf $OUT/r.tgz r)
done
