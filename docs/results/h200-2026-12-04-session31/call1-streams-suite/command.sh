#!/bin/bash
# session 31 first device call (branch capture-streams rebased on main): the stream/workspace probe
# with graphs captured on one pooled stream, two pooled streams, and the sessions' own streams;
# the capture-stream CUDA test alone; then the whole GPU suite
set -u
mkdir -p .site .cfx /tmp/r/probe /tmp/r/unit /tmp/r/suite
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
C=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; date -u; echo "tree: $C"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py benchmarks/stream_workspace_probe.py tests/runtime/test_capture_streams.py; } > /tmp/r/gpu.txt
for mode in one two own; do
  for shape in "256 32768 400" "64 65536 200"; do set -- $shape
    echo "== --capture-on $mode --m $1 --k $2 --rounds $3" | tee -a /tmp/r/probe/log.txt
    timeout 60 python3 benchmarks/stream_workspace_probe.py --capture-on $mode --m $1 --k $2 --rounds $3 2>&1 | tail -3 | tee -a /tmp/r/probe/log.txt
  done
done
(cd /tmp && tar czf $OUT/r.tgz r)
timeout 60 python3 -m pytest -m cuda -p no:cacheprovider -rs tests/runtime/test_capture_streams.py > /tmp/r/unit/pytest.log 2>&1; echo "unit rc=$?"; tail -3 /tmp/r/unit/pytest.log
(cd /tmp && tar czf $OUT/r.tgz r)
OUT=/tmp/r/suite COMMIT=$C WORKERS=16 SUITE_TIMEOUT=300 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
