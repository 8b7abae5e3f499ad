#!/bin/bash
# One device call for architecture item 4 on the H200 (fp32, 5 flow steps, deterministic protocol):
# the capacity form of each entry with the device's attention probe, against specialize at six
# prompt lengths (capacity_form.py), then the steady entry's DiT pieces captured once and replayed
# at every length (capacity_replay.py), then every piece of the chunk so (--scope ""), then four
# voices interleaved on one capacity executable against stock (capacity_sessions.py, rule S).  Run through the device tool with carry [".whl"]:
#     bash benchmarks/capacity_call.sh <commit>
# Outputs under /tmp/r (tarred to $OUT/r.tgz after each part); the parts' timeouts add up to 590 s
# (one call's limit is 600 s), the program cache on disk shared by the four.
set -u
C=${1:?usage: capacity_call.sh <commit>}
. benchmarks/device_env.sh $C benchmarks/capacity_form.py benchmarks/capacity_replay.py
mkdir -p /tmp/r/form /tmp/r/replay /tmp/r/replay-all /tmp/r/sessions
start=$SECONDS
FRAMES=150,176,222,300,418,500
timeout 180 python3 benchmarks/capacity_form.py --device cuda --n-timesteps 5 --attention probe \
  --prompt-frames $FRAMES --json /tmp/r/form/form-probe.json > /tmp/r/form/stdout.txt 2> /tmp/r/form/log.txt
echo "capacity_form rc=$? at $((SECONDS-start)) s"; grep -E "^exact:" /tmp/r/form/stdout.txt; tail -2 /tmp/r/form/log.txt
(cd /tmp && tar czf $OUT/r.tgz r)
timeout 150 python3 benchmarks/capacity_replay.py --device cuda --n-timesteps 5 --attention probe \
  --prompt-frames $FRAMES --reps 5 --json /tmp/r/replay/replay-probe.json > /tmp/r/replay/stdout.txt 2> /tmp/r/replay/log.txt
echo "capacity_replay rc=$? at $((SECONDS-start)) s"; tail -8 /tmp/r/replay/stdout.txt | cut -c1-400; tail -2 /tmp/r/replay/log.txt
(cd /tmp && tar czf $OUT/r.tgz r)
timeout 120 python3 benchmarks/capacity_replay.py --device cuda --n-timesteps 5 --attention probe --scope "" \
  --prompt-frames $FRAMES --reps 5 --json /tmp/r/replay-all/replay-all.json > /tmp/r/replay-all/stdout.txt 2> /tmp/r/replay-all/log.txt
echo "capacity_replay (whole chunk) rc=$? at $((SECONDS-start)) s"; tail -3 /tmp/r/replay-all/stdout.txt | cut -c1-400
(cd /tmp && tar czf $OUT/r.tgz r)
timeout 140 python3 benchmarks/capacity_sessions.py --device cuda --n-timesteps 5 --attention probe \
  --prompt-tokens 75,111,188,250 --json /tmp/r/sessions/sessions.json > /tmp/r/sessions/stdout.txt 2> /tmp/r/sessions/log.txt
echo "capacity_sessions rc=$? at $((SECONDS-start)) s"; tail -6 /tmp/r/sessions/stdout.txt | cut -c1-300
(cd /tmp && tar czf $OUT/r.tgz r)
