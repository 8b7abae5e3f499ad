#!/bin/bash
# session 36 call E (3d11956; library as 51b4479): the GPU suite after step.value (the drift check,
# traced_extents and specialize's whole-slice drop read a node's value through one reader); then, if
# time is left, `cadence-fx verify --device cuda` on a configuration no result uses: SRc fp16, 10 steps,
# prompts 100 then 180, a flush of 17, seed 21, empty cache
set -u
C=3d11956
. benchmarks/device_env.sh $C cadence_fx/step.py
mkdir -p /tmp/r/suite /tmp/r/sweep
start=$SECONDS
OUT=/tmp/r/suite COMMIT=$C WORKERS=16 SUITE_TIMEOUT=300 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$? at $((SECONDS-start)) s"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
rm -rf .cfx/*
if [ $((SECONDS - start)) -lt 280 ]; then
  timeout $((400 - (SECONDS - start))) python3 -m cadence_fx verify --device cuda --json --model token2wav --rules SRc --dtype float16 --n-timesteps 10 --prompt-tokens 100,180 --chunks 5 --final-tokens 17 --seed 21 > /tmp/r/sweep/t2w-srcfp16-n10.out 2> /tmp/r/sweep/t2w-srcfp16-n10.err
  echo "verify rc=$? at $((SECONDS-start)) s $(tail -1 /tmp/r/sweep/t2w-srcfp16-n10.out | python3 -c 'import json,sys
try:
  d=json.loads(sys.stdin.read()); print({k: d.get(k) for k in ("exact","chunks","mismatches","setups") if k in d})
except Exception as e: print("no json:", e)')"
else echo "verify: not run (time)"; fi
(cd /tmp && tar czf $OUT/r.tgz r)
