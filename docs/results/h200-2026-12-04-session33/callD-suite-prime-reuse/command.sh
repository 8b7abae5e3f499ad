#!/bin/bash
# session 33 call D (10920e2): the GPU suite (streams.prime); reuse_cost.py at 10 steps (paired)
set -u
C=10920e2
. benchmarks/device_env.sh $C benchmarks/reuse_cost.py
mkdir -p /tmp/r/suite /tmp/r/reuse-10
OUT=/tmp/r/suite COMMIT=$C WORKERS=16 SUITE_TIMEOUT=280 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
timeout 100 python3 benchmarks/reuse_cost.py --device cuda --n-timesteps 10 --prompt-tokens 80,90,100,110,120,130,140,150,160,170,180,190 > /tmp/r/reuse-10/out.json 2> /tmp/r/reuse-10/log.txt; echo "reuse rc=$?"; grep '"variant"' /tmp/r/reuse-10/log.txt | cut -c1-160; python3 -c "import json; d=json.load(open('/tmp/r/reuse-10/out.json')); print(d['median'], d['paired_after_over_before'], 'exact', d['exact'])"
(cd /tmp && tar czf $OUT/r.tgz r)
