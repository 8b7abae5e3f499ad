#!/bin/bash
# session 36 call B (9c6c146): the GPU suite (call A's suite line named the commit where the
# variable's name belonged and did not run)
set -u
C=9c6c146
. benchmarks/device_env.sh $C
mkdir -p /tmp/r/suite
OUT=/tmp/r/suite COMMIT=$C WORKERS=16 SUITE_TIMEOUT=300 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
