#!/bin/bash
# session 33 call B (5543401): the GPU suite; reuse_cost.py (paired: istft recording and warm stream reuse)
# at 10 steps; setup_time at 10 and 5 flow steps (SRc fp32, prompts 75,150,250, empty cache, restart)
set -u
C=5543401
. benchmarks/device_env.sh $C benchmarks/setup_time.py benchmarks/reuse_cost.py cadence_fx/foreground.py
mkdir -p /tmp/r/suite /tmp/r/reuse-10 /tmp/r/setup-10 /tmp/r/setup-5
OUT=/tmp/r/suite COMMIT=$C WORKERS=16 SUITE_TIMEOUT=280 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
timeout 110 python3 benchmarks/reuse_cost.py --device cuda --n-timesteps 10 --prompt-tokens 80,90,100,110,120,130,140,150 > /tmp/r/reuse-10/out.json 2> /tmp/r/reuse-10/log.txt; echo "reuse rc=$?"; python3 -c "import json; d=json.load(open('/tmp/r/reuse-10/out.json')); print(d['median'], d['paired_after_over_before'], 'exact', d['exact'])"
(cd /tmp && tar czf $OUT/r.tgz r)
for S in 10 5; do
  rm -rf .cfx/*
  timeout 150 python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps $S --prompt-tokens 75,150,250 --chunks 4 --timeout 120 --out /tmp/r/setup-$S > /tmp/r/setup-$S/log.txt 2>&1; echo "setup-$S rc=$?"; grep -E '"ready_s"' /tmp/r/setup-$S/log.txt | cut -c1-200
  (cd /tmp && tar czf $OUT/r.tgz r)
done
