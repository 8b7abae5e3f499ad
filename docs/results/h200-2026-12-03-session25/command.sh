#!/bin/bash
# scratch (not committed): session 25 first device call
set -u
mkdir -p .site .cfx
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py > $OUT/code-check.txt
COMMIT=3a1bbdb WORKERS=16 SUITE_TIMEOUT=270 bash benchmarks/h200_suite.sh > $OUT/suite-stdout.txt 2>&1; echo "suite rc=$?"; grep -E "passed|failed" $OUT/pytest-cuda.log | tail -2
for n in 10 5; do
  mkdir -p $OUT/setup-$n
  ( time timeout 200 python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps $n --prompt-tokens 75,150,250 --chunks 4 --timeout 120 --profile $OUT/setup-$n/second-length.prof --out $OUT/setup-$n ) > $OUT/setup-$n/log.txt 2>&1; echo "setup $n rc=$?"; tail -c 600 $OUT/setup-$n/log.txt
done
