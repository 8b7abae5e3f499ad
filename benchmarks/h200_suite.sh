#!/usr/bin/env bash
# The GPU suite on the lent H200 (device tool), as its results are committed under docs/results/.
# Run from the repository root there, with the upstream wheels carried in .whl/ (README of
# docs/results says which): installs them, runs every `cuda`-marked test under the deterministic
# protocol (tests/conftest.py fixes cuBLAS's workspace), and leaves in $OUT: gpu.txt (GPU, driver,
# torch, date, commit), pytest-cuda.log, gpu_memory.txt (each test's peak device memory, heaviest
# first: tests/conftest.py), and suite.tgz (every verify report the tests kept).
# Exits non-zero when pytest fails or when any process aborted, even after its tests passed.
# Usage: COMMIT=<sha> [CADENCE_CELLS=...] [WORKERS=8] bash benchmarks/h200_suite.sh [pytest args...]
# Session fifty (an H100, 78 tests): 10 workers ran the card out of memory (14 failures) and past a
# 300-s limit; 8 workers ran its two halves in 94 s and 255 s.  Run it in a call of its own with the
# default limit (560 s), never beside other GPU work, and start the next call at once: a machine
# left idle 30 s goes back (a fresh one has no .cfx).
set -uo pipefail
out=${OUT:?set OUT to the folder that comes back}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"
  echo "commit ${COMMIT:-unknown}"; date -u +%Y-%m-%dT%H:%M:%SZ; } > "$out/gpu.txt"
rm -rf /tmp/suite; mkdir -p /tmp/suite  # a warm machine keeps /tmp: no failure or report of an earlier call
CADENCE_RESULTS_DIR=/tmp/suite timeout "${SUITE_TIMEOUT:-560}" python3 -m pytest -m cuda tests -n "${WORKERS:-8}" --durations=40 -rs \
  -p no:cacheprovider "$@" 2>&1 | tee "$out/pytest-cuda.log"
rc=${PIPESTATUS[0]}
[ -f /tmp/suite/failures.txt ] && cp /tmp/suite/failures.txt "$out/failures.txt"  # each failure as reported
[ -f /tmp/suite/gpu_memory.txt ] && sort -t' ' -k6,6nr /tmp/suite/gpu_memory.txt > "$out/gpu_memory.txt"  # heaviest first
# A process that aborts after its tests passed (a C++ destructor that throws at the
# interpreter's exit, 2026-12-02) leaves pytest's exit status 0: that is a failure too.
if grep -qE "terminate called|Fatal Python error|crashed while running" "$out/pytest-cuda.log"; then
  echo "h200_suite: a process aborted (see 'terminate called' / 'Fatal Python error' above): failing the run" \
    | tee -a "$out/pytest-cuda.log"
  [ "$rc" -eq 0 ] && rc=1
fi
tar czf "$out/suite.tgz" -C /tmp suite
exit "$rc"
