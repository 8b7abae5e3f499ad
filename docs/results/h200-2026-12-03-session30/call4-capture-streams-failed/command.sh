#!/bin/bash
# session 30 fourth device call (branch capture-streams: a capture stream of its own for every live session):
# the CUDA tests that capture across sessions, streams and background builds first, then the whole GPU suite as time allows
set -u
mkdir -p .site .cfx /tmp/r/subset /tmp/r/suite
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; date -u; echo "tree: 639d18c"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py tests/runtime/test_capture_streams.py; } > /tmp/r/gpu.txt
timeout 110 python3 -m pytest -m cuda -n 16 -p no:cacheprovider -rs --durations=15 tests/runtime/test_capture_streams.py tests/serving/test_multi_session.py tests/integrations/test_background.py tests/runtime/test_capture_warmup.py tests/runtime/test_graph_rng.py tests/runtime/test_misuse.py "tests/integrations/test_token2wav.py::test_replay_rules_are_exact_on_cuda[SRc-float32-5]" > /tmp/r/subset/pytest.log 2>&1; echo "subset rc=$?"; grep -E " passed| failed|^FAILED|^E  |Fatal|terminate" /tmp/r/subset/pytest.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
OUT=/tmp/r/suite COMMIT=639d18c WORKERS=16 SUITE_TIMEOUT=${SUITE_T:-100} bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -8; grep -cE "PASSED|^\." /tmp/r/suite/pytest-cuda.log; tail -c 400 /tmp/r/suite/pytest-cuda.log
(cd /tmp && tar czf $OUT/r.tgz r)
