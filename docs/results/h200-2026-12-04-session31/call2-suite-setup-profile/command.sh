#!/bin/bash
# session 31 second device call (main with the capture streams merged): the whole GPU suite;
# then setup_time at 10 steps with a cProfile of the second prompt length (where a new
# length's ~3 s go on this host: specialize, passes, capture, the rest)
set -u
mkdir -p .site .cfx /tmp/r/suite /tmp/r/setup-10p
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
C=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; date -u; echo "tree: $C"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py; } > /tmp/r/gpu.txt
OUT=/tmp/r/suite COMMIT=$C WORKERS=16 SUITE_TIMEOUT=280 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
rm -rf .cfx/*
timeout 200 python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps 10 --prompt-tokens 75,150,250 --chunks 4 --timeout 150 --profile /tmp/r/setup-10p/prof.txt --out /tmp/r/setup-10p > /tmp/r/setup-10p/log.txt 2>&1; echo "setup rc=$?"; grep -E '"ready_s"' /tmp/r/setup-10p/log.txt | cut -c1-230
(cd /tmp && tar czf $OUT/r.tgz r)
