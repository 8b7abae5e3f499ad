#!/bin/bash
# session 27 first device call: CADENCE_FX_SHARED_CAPTURE=1 (the shared calls' graph) for the GPU suite,
# its steady cost paired in one process, and setup_time at 10 steps with it on
set -u
mkdir -p .site .cfx /tmp/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
export CADENCE_FX_SHARED_CAPTURE=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; date -u; echo "tree: $(git rev-parse --short HEAD 2>/dev/null) with CADENCE_FX_SHARED_CAPTURE=1"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py; } > /tmp/r/gpu.txt
mkdir -p /tmp/r/suite
OUT=/tmp/r/suite COMMIT=07bb5cc+SHARED_CAPTURE=1 WORKERS=16 SUITE_TIMEOUT=250 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E "passed|failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
( time timeout 80 python3 benchmarks/shared_capture_cost.py --n-timesteps 10 --prompt-tokens 250 --chunks 20 ) > /tmp/r/cost.txt 2>&1; echo "cost rc=$?"; tail -c 1200 /tmp/r/cost.txt
(cd /tmp && tar czf $OUT/r.tgz r)
d=/tmp/r/setup-10-share1; mkdir -p $d
( time timeout 130 python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps 10 --prompt-tokens 75,150,250 --chunks 4 --timeout 120 --out $d ) > $d/log.txt 2>&1
echo "setup 10 rc=$?"; grep -o '"prompt_tokens": [0-9]*, "ready_s": [0-9.]*' $d/log.txt | tr '\n' ' '; grep -o '"capture_s": [0-9.]*' $d/log.txt | sort -u | tr '\n' ' '; grep -o '"exact": [a-z]*' $d/log.txt | sort | uniq -c | tr '\n' ' '; grep -o '"restart[a-z_]*": [0-9.]*' $d/log.txt | tr '\n' ' '; echo
(cd /tmp && tar czf $OUT/r.tgz r)
