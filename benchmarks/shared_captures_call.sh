#!/bin/bash
# One device call for captures shared by voices (session forty-one's code, never run on a GPU yet):
# the GPU suite (every `cuda` test; among them test_capacity_graphs_replay_exactly_under_src[SRc-True],
# the working arena's), then new voices per prompt length under SRc against capacity=500, its
# captures per voice and shared (capacity_voices.py --shared-captures: set-up, time to first audio,
# chunk ms, paired shared / per-voice captures, every chunk against stock), then issue 15's traffic
# under SRc on one capacity with every window and flush shape built and captured before the
# first voice (--capacity 512 --prepare --shared-captures).
# Run through the device tool with carry [".whl"]:
#     bash benchmarks/shared_captures_call.sh <commit>
# Outputs under /tmp/r (tarred to $OUT/r.tgz after each part); the parts' timeouts add up to 580 s.
set -u
C=${1:?usage: shared_captures_call.sh <commit>}
. benchmarks/device_env.sh $C cadence_fx/runtime/working.py benchmarks/capacity_voices.py \
  tests/integrations/test_capacity_executable.py cadence_fx/tools/traffic.py
mkdir -p /tmp/r/suite /tmp/r/voices /tmp/r/traffic
start=$SECONDS
(OUT=/tmp/r/suite COMMIT=$C WORKERS=16 SUITE_TIMEOUT=280 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1
 echo "suite rc=$? at $((SECONDS-start)) s")
grep -E "passed|failed|FAILED" /tmp/r/suite/pytest-cuda.log | tail -6 | cut -c1-300
(cd /tmp && tar czf $OUT/r.tgz r)
timeout 170 python3 benchmarks/capacity_voices.py --device cuda --rules SRc --n-timesteps 5 --capacity 500 \
  --prompt-tokens 90,150,237 --shared-captures --json /tmp/r/voices/voices.json > /tmp/r/voices/stdout.txt \
  2> /tmp/r/voices/log.txt
echo "capacity_voices rc=$? at $((SECONDS-start)) s"; tail -1 /tmp/r/voices/stdout.txt | cut -c1-1200
(cd /tmp && tar czf $OUT/r.tgz r)
timeout 130 python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --conversations 3 --turns 2 \
  --seed 0 --capacity 512 --prepare --shared-captures --json --quiet --out /tmp/r/traffic \
  > /tmp/r/traffic/stdout.txt 2> /tmp/r/traffic/log.txt
echo "traffic rc=$? at $((SECONDS-start)) s"; tail -1 /tmp/r/traffic/stdout.txt | cut -c1-900
(cd /tmp && tar czf $OUT/r.tgz r)
