#!/bin/bash
# session 31 fifth device call (branch let-go-dropped-graphs: drop_graph unlinks the graphs it
# lets go): the whole GPU suite, as far as the session's device time allows
set -u
mkdir -p /tmp/r/suite
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; echo "tree: see the results README (the device's git metadata is stale)"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py; } > /tmp/r/gpu.txt
OUT=/tmp/r/suite COMMIT=let-go-dropped-graphs WORKERS=16 SUITE_TIMEOUT=${SUITE_T:-175} bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12; tail -c 300 /tmp/r/suite/pytest-cuda.log
(cd /tmp && tar czf $OUT/r.tgz r)
