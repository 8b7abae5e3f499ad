#!/bin/bash
# session 24's device check of the shared flow step on rules SRc
set -u
mkdir -p .site .cfx
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
sha256sum cadence_fx/passes/specialize.py cadence_fx/passes/step_share.py cadence_fx/passes/partition.py cadence_fx/compiler.py > $OUT/code-check.txt
V="verify --model token2wav --device cuda --rules SRc --n-timesteps 5 --prompt-tokens 163,173,150,250 --chunks 2 --json"
( time timeout 140 python3 -m cadence_fx $V ) > $OUT/verify-shared.log 2>&1; echo "shared rc=$?"; tail -c 400 $OUT/verify-shared.log
( time timeout 110 python3 -c "import sys, cadence_fx.compiler as c; c.shared_calls = lambda a, r: None; from cadence_fx.tools import cli; sys.exit(cli.main(sys.argv[1:]))" $V ) > $OUT/verify-unrolled.log 2>&1; echo "unrolled rc=$?"; tail -c 300 $OUT/verify-unrolled.log
COMMIT=${COMMIT:-wip} WORKERS=16 SUITE_TIMEOUT=270 bash benchmarks/h200_suite.sh 2>&1 | tail -4
