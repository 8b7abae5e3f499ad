#!/bin/bash
# One device call for capacity graphs under rules SRc: the GPU suite (every `cuda` test, among them
# test_capacity_graphs_replay_exactly_under_src, per-voice and shared captures; 10 workers: 16 ran an
# H100's 80 GB out, session 44, and 10 peaked at 75.7 GB), then new voices through the drop-in per prompt
# length against capacity=500 under SRc (capacity_voices.py: set-up, time to first audio, chunk ms,
# every chunk against stock).  With --shared-captures (captures shared by voices, runtime.working) the
# voices add a third variant paired against per-voice captures.  Issue 15's traffic on capacity graphs is
# issue15_call.sh's call: preparing its 48 window and flush shapes alone took 425 s on an H100 (session 44),
# more than one call holds beside the suite.
# Run through the device tool with carry [".whl"]:
#     bash benchmarks/capacity_r_call.sh <commit> [--shared-captures]
# Outputs under /tmp/r (tarred to $OUT/r.tgz after each part); the parts' timeouts add up to 570 s.
set -u
C=${1:?usage: capacity_r_call.sh <commit> [--shared-captures]}
SHARED=${2:-}
[ -z "$SHARED" ] || [ "$SHARED" = --shared-captures ] || { echo "capacity_r_call.sh: unknown option $SHARED" >&2; exit 2; }
. benchmarks/device_env.sh $C cadence_fx/capacity_executable.py benchmarks/capacity_voices.py \
  tests/integrations/test_capacity_executable.py cadence_fx/tools/traffic.py cadence_fx/capacity_hazards.py
mkdir -p /tmp/r/suite /tmp/r/voices
start=$SECONDS
(OUT=/tmp/r/suite COMMIT=$C WORKERS=10 SUITE_TIMEOUT=300 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1
 echo "suite rc=$? at $((SECONDS-start)) s")
grep -E "passed|failed|FAILED" /tmp/r/suite/pytest-cuda.log | tail -6 | cut -c1-300
(cd /tmp && tar czf $OUT/r.tgz r)
timeout 270 python3 benchmarks/capacity_voices.py --device cuda --rules SRc --n-timesteps 5 --capacity 500 \
  --prompt-tokens 90,150,237 $SHARED --json /tmp/r/voices/voices.json > /tmp/r/voices/stdout.txt \
  2> /tmp/r/voices/log.txt
echo "capacity_voices rc=$? at $((SECONDS-start)) s"; tail -1 /tmp/r/voices/stdout.txt | cut -c1-1200
(cd /tmp && tar czf $OUT/r.tgz r)
