#!/bin/bash
# session 32 first device call (24e2675): the whole GPU suite; then setup_time at 10 and at 5 flow
# steps (SRc fp32, prompts 75,150,250, an empty program cache, a restarted process on the cache it filled)
set -u
C=24e2675
mkdir -p .site .cfx /tmp/r/suite /tmp/r/setup-10 /tmp/r/setup-5
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"; date -u; echo "tree: $C (check: sha256 below against git show $C:<file>)"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py benchmarks/setup_time.py; } > /tmp/r/gpu.txt
OUT=/tmp/r/suite COMMIT=$C WORKERS=16 SUITE_TIMEOUT=280 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
for S in 10 5; do
  rm -rf .cfx/*
  timeout 170 python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps $S --prompt-tokens 75,150,250 --chunks 4 --timeout 140 --out /tmp/r/setup-$S > /tmp/r/setup-$S/log.txt 2>&1; echo "setup-$S rc=$?"; grep -E '"ready_s"' /tmp/r/setup-$S/log.txt | cut -c1-200
  (cd /tmp && tar czf $OUT/r.tgz r)
done
