#!/bin/bash
# Issue 15's H200 line in one device call: `cadence-fx traffic` (8 MiniCPM-o-shaped conversations,
# SRc, fp32, 5 steps) on capacity graphs (--capacity 500: the issue's longest voice, 250 tokens; 500 + 99
# is prime, so no window or flush graph is built in a rare branch class of Token2Wav's code, as the
# 13-token shapes are at 512, docs/serving.md "Choosing a capacity") with every window and flush shape built and
# captured before the first voice (--prepare --shared-captures), every chunk against its own stock
# tail.  Progress lines go to traffic/log.txt (what was reached if the call runs out of time), each
# with its seconds since the start.  Since session 45 --prepare also builds the capacity of the
# steady chunk's other branch class (476 frames; one prompt length in 25) and its shapes: about
# twice the preparing (290-425 s for capacity 500 alone on an H100), more than one 600-s call
# holds beside the traffic.  Since session 46 each capacity graph is kept in the program cache
# ($PWD/.cfx, which a warm machine keeps between calls) as soon as it is built: a call cut short
# keeps what it built, and the same command again on the warm machine loads those
# (docs/architecture.md, capacity graphs on disk), builds the rest, then runs the traffic.
# With --idle: every live session gets idle time after each event (session.idle(): each voice's
# checks of the shared window and flush graphs at its length made there, ahead of their chunks;
# timed apart from the chunks, reported as idle_s), as a server has between a voice's chunks.
# PREPARE_WORKERS=N (session 46): first N processes (`traffic --prepare-only --prepare-shard I/N`, rules SRc,
# no captures) build the shapes in parallel into .cfx, the catalogs' and classes' graphs once (the cache's
# claims); the traffic then loads every graph (and captures it) instead of building one after another.
# WAIT_FOR=FILE (session 47): the traffic starts once FILE exists, so a job started beside the
# preparing (the GPU suite, writing FILE when it ends) never runs beside the timed traffic.
# Session 48 ran that on an H100 (docs/results/h100-2026-12-06-session48/): the GPU suite's 6
# workers beside 8 shard processes ran the 80 GB card out of memory (18 suite tests and one shard
# failed with CUDA out of memory), and the script then hung at a bare `wait` (it waited for the
# ticker too; fixed: it waits for the workers).  Do not start the suite beside the shards on an
# 80 GB card: run the suite in a call of its own, or before this script in the same call.
# Session 49: a second call found no .cfx (the device keeps only what the tracked .gitignore
# ignores; .cfx was in .git/info/exclude alone, fixed: .gitignore names it).  Run the shards and
# the traffic in one call (PREPARE_WORKERS=8 ... 570 --idle: shards ~160 s on an H100, then the
# traffic loads their graphs); if it is cut, the same command without PREPARE_WORKERS on the
# warm machine loads what is on disk and runs the traffic.
# PREPARE_ONLY=1 (session 50): with PREPARE_WORKERS, stop after the shards; the same command without
# either, on the warm machine, then runs the traffic.  Session 50 did that after the GPU suite and
# the next call got a fresh machine (status had said warm): no .cfx, a 493-s serial prepare, cut.
# Prefer the shards and the traffic in one call, the suite in a call of its own.
# Run through the device tool with carry [".whl"]:
#     [SEED=5] [PREPARE_WORKERS=8] bash benchmarks/issue15_call.sh <commit> [seconds, default 570] [--idle]
# SEED (default 0): the traffic's seed; seed 5 sends three windows and flushes of a voice's other
# branch class than the capacity's (built and captured in idle time with --idle), seed 0 none.
# Session 51: shards and traffic in one call (SEED=5) were cut at the device's 600 s in conversation 4:
# the shards took ~150 s and the traffic's loading ~290 s on that host (~190 s the call before), and
# the limit counted from after the set-up.  Prefer two calls back to back, nothing between them:
# PREPARE_ONLY=1 PREPARE_WORKERS=8 ..., then the same without both (the traffic loads .cfx).
# Session 52 (what worked, docs/results/h100-2026-12-06-session52/command.sh): one call ran the GPU
# suite, then PREPARE_ONLY=1 PREPARE_WORKERS=8 ... 250 --idle (367 s in all); the next, at once, the
# traffic (364 s at seed 0; seed 5 410 s in a third).
# Outputs under /tmp/r, tarred to $OUT/r.tgz at the end (and every 30 s meanwhile).
set -u
C=${1:?usage: issue15_call.sh <commit> [seconds]}
LIMIT=${2:-570}
IDLE=${3:-}
[ -z "$IDLE" ] || [ "$IDLE" = --idle ] || { echo "issue15_call.sh: unknown option $IDLE" >&2; exit 2; }
. benchmarks/device_env.sh $C cadence_fx/capacity_executable.py cadence_fx/capacity_prepare.py \
  cadence_fx/tools/traffic.py cadence_fx/integrations/stepaudio2/dropin.py cadence_fx/capacity_hazards.py \
  cadence_fx/capacity_build.py cadence_fx/programs/serialize.py cadence_fx/tools/traffic_prepare.py
mkdir -p /tmp/r/traffic
( while sleep 30; do (cd /tmp && tar czf $OUT/r.tgz r); done ) & ticker=$!
start=0  # seconds from the script's start (SECONDS): the device's 600-s limit counts the set-up above too (session 51)
# the traffic's own model and ranges: the shard processes must build under the very keys it loads
ARGS="--device cuda --rules SRc --n-timesteps 5 --conversations 8 --seed ${SEED:-0} --capacity 500 --prepare"
W=${PREPARE_WORKERS:-0}
if [ "$W" -gt 0 ]; then  # processes sharing .cfx each build a shard of the shapes; the traffic loads them all
  pids=()
  for i in $(seq 0 $((W - 1))); do
    timeout $LIMIT python3 -m cadence_fx traffic $ARGS --prepare-only --prepare-shard $i/$W --quiet \
      > /tmp/r/traffic/prepare-$i.json 2> /tmp/r/traffic/prepare-$i.log &
    pids+=($!)
  done
  wait "${pids[@]}"  # the workers only (a bare `wait` would wait for the ticker, which never ends)
  echo "prepare workers ($W) done at $((SECONDS-start)) s"
  if [ -n "${PREPARE_ONLY:-}" ]; then  # the traffic in a later call on the warm machine (it loads .cfx)
    kill $ticker 2>/dev/null; (cd /tmp && tar czf $OUT/r.tgz r); exit 0
  fi
fi
if [ -n "${WAIT_FOR:-}" ]; then  # a job beside the preparing (the GPU suite) ends before the timed traffic
  while [ ! -e "$WAIT_FOR" ] && [ $((SECONDS - start)) -lt $LIMIT ]; do sleep 2; done
  echo "waited for $WAIT_FOR until $((SECONDS-start)) s"
fi
LIMIT=$((LIMIT - (SECONDS - start)))
timeout $LIMIT python3 -m cadence_fx traffic $ARGS --shared-captures $IDLE --json --out /tmp/r/traffic \
  > /tmp/r/traffic/stdout.txt 2> /tmp/r/traffic/log.txt
echo "traffic rc=$? at $((SECONDS-start)) s"; tail -1 /tmp/r/traffic/stdout.txt | cut -c1-1500
tail -5 /tmp/r/traffic/log.txt | cut -c1-300
kill $ticker 2>/dev/null; (cd /tmp && tar czf $OUT/r.tgz r)
