#!/bin/bash
# a new prompt length at 10 steps with the shared flow step
set -u
mkdir -p .site .cfx
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
sha256sum cadence_fx/passes/specialize.py cadence_fx/passes/step_share.py cadence_fx/passes/partition.py cadence_fx/compiler.py > $OUT/code-check.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
( time timeout 150 python3 -m cadence_fx verify --model token2wav --device cuda --rules SRc --n-timesteps 10 --prompt-tokens 173,150,250 --chunks 2 --json ) > $OUT/verify-ten.log 2>&1; echo "rc=$?"; tail -c 300 $OUT/verify-ten.log
