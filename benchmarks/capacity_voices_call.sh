#!/bin/bash
# One device call for the capacity executables as users reach them (rule S, fp32, 5 flow steps,
# deterministic protocol): new voices through the drop-in per prompt length against capacity=500
# (capacity_voices.py: set-up, time to first audio, chunk ms, every chunk against stock), then
# issue 15's traffic under rule S with and without --capacity 512 (cadence-fx traffic).  Run
# through the device tool with carry [".whl"]:
#     bash benchmarks/capacity_voices_call.sh <commit>
# Outputs under /tmp/r (tarred to $OUT/r.tgz after each part); the parts' timeouts add up to 580 s.
set -u
C=${1:?usage: capacity_voices_call.sh <commit>}
. benchmarks/device_env.sh $C benchmarks/capacity_voices.py cadence_fx/capacity_executable.py \
  cadence_fx/integrations/stepaudio2/dropin.py cadence_fx/tools/traffic.py
mkdir -p /tmp/r/voices /tmp/r/traffic-S /tmp/r/traffic-S-capacity
start=$SECONDS
timeout 280 python3 benchmarks/capacity_voices.py --device cuda --n-timesteps 5 --capacity 500 \
  --prompt-tokens 90,150,188,237 --json /tmp/r/voices/voices.json > /tmp/r/voices/stdout.txt 2> /tmp/r/voices/log.txt
echo "capacity_voices rc=$? at $((SECONDS-start)) s"; tail -1 /tmp/r/voices/stdout.txt | cut -c1-900; tail -2 /tmp/r/voices/log.txt
(cd /tmp && tar czf $OUT/r.tgz r)
for v in S S-capacity; do
  extra=""; [ $v = S-capacity ] && extra="--capacity 512"
  timeout 150 cadence-fx traffic --device cuda --rules S --n-timesteps 5 --conversations 4 --turns 2 --seed 0 \
    $extra --json --quiet --out /tmp/r/traffic-$v > /tmp/r/traffic-$v/stdout.txt 2> /tmp/r/traffic-$v/log.txt
  echo "traffic $v rc=$? at $((SECONDS-start)) s"; tail -1 /tmp/r/traffic-$v/stdout.txt | cut -c1-700
  (cd /tmp && tar czf $OUT/r.tgz r)
done
