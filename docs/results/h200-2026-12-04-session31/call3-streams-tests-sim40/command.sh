#!/bin/bash
# session 31 third device call (main + capture_streams stats): the two CUDA test files that
# check capture streams; then serve-sim with 40 overlapped sessions (past PyTorch's pool of 32
# streams), every session's PCM checked against its own stock stream alone
set -u
mkdir -p .site .cfx /tmp/r/unit /tmp/r/sim40
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
C=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; date -u; echo "tree: $C"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py tests/serving/test_multi_session.py tests/runtime/test_capture_streams.py; } > /tmp/r/gpu.txt
timeout 150 python3 -m pytest -m cuda -n 4 -p no:cacheprovider -rs --durations=10 tests/runtime/test_capture_streams.py tests/serving/test_multi_session.py > /tmp/r/unit/pytest.log 2>&1; echo "unit rc=$?"; grep -E " passed| failed|^FAILED|^E  " /tmp/r/unit/pytest.log | head -8
(cd /tmp && tar czf $OUT/r.tgz r)
(time timeout 330 python3 -m cadence_fx serve-sim --device cuda --rules SRc --n-timesteps 5 --overlap --sweep --sweep-points 40 --seconds 2 --check-workers 12 --json --out /tmp/r/sim40) > /tmp/r/sim40/log.txt 2>&1; echo "sim rc=$?"; tail -c 1500 /tmp/r/sim40/log.txt
(cd /tmp && tar czf $OUT/r.tgz r)
