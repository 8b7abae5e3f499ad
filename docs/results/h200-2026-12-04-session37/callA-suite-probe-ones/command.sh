#!/bin/bash
# session 37 call A (c067602; library as 429b01f): the GPU suite after the probe's NeedsForeground
# pass-through (eced27c) and the one whole-slice predicate (429b01f: specialize's drop and
# state_rewrite's _same_view); then architecture item 4's kernel question,
# benchmarks/length_free_attention.py (zeros in the padding, then --garbage), fp32 and fp16, with --rows
set -u
C=c067602
. benchmarks/device_env.sh $C cadence_fx/passes/base.py benchmarks/length_free_attention.py
mkdir -p /tmp/r/suite /tmp/r/probe
start=$SECONDS
OUT=/tmp/r/suite COMMIT=$C WORKERS=16 SUITE_TIMEOUT=300 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$? at $((SECONDS-start)) s"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
for g in "" "--garbage"; do
  name=zeros; [ -n "$g" ] && name=garbage
  timeout 120 python3 benchmarks/length_free_attention.py --device cuda --rows $g --json /tmp/r/probe/$name.json > /tmp/r/probe/$name.out 2> /tmp/r/probe/$name.err
  echo "probe $name rc=$? at $((SECONDS-start)) s"; cat /tmp/r/probe/$name.out; tail -3 /tmp/r/probe/$name.err
done
(cd /tmp && tar czf $OUT/r.tgz r)
