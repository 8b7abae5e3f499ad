#!/bin/bash
# session 27 third device call: the GPU suite at the default (SHARE_CALLS off) on the tree with the
# shared call's first graph in a pool of its own, then the shared-call tests with CADENCE_FX_SHARED_CAPTURE=1
set -u
mkdir -p .site .cfx /tmp/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; date -u; echo "tree: $(git rev-parse --short HEAD 2>/dev/null) + leader pool (uncommitted)"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py; } > /tmp/r/gpu.txt
mkdir -p /tmp/r/suite
OUT=/tmp/r/suite COMMIT=07bb5cc+leader-pool WORKERS=16 SUITE_TIMEOUT=330 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
mkdir -p /tmp/r/shared
( time CADENCE_FX_SHARED_CAPTURE=1 timeout 200 python3 -m pytest -m cuda tests/integrations/test_token2wav.py tests/integrations/test_upstream_token2wav.py tests/integrations/test_off_catalog.py -n 12 -p no:cacheprovider -q ) > /tmp/r/shared/pytest.log 2>&1; echo "shared rc=$?"; grep -E " passed| failed" /tmp/r/shared/pytest.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/shared/pytest.log | head -8
(cd /tmp && tar czf $OUT/r.tgz r)
