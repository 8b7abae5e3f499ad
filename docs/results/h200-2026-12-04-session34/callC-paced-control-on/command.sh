#!/bin/bash
# session 34 call C (850dc11, the machine of call B still warm): paced traffic as in calls A and B, first
# with the control CADENCE_FX_TRACE_HOLDS_DEVICE=1 (a build holds the device lock through its symbolic
# traces, as before 850dc11), then without it (host_only on) again; each on an empty cache
set -u
C=850dc11
. benchmarks/device_env.sh $C cadence_fx/programs/entry.py cadence_fx/foreground.py cadence_fx/tools/traffic.py
for V in control on; do
  mkdir -p /tmp/r/paced-$V; rm -rf .cfx/*
  if [ $V = control ]; then export CADENCE_FX_TRACE_HOLDS_DEVICE=1; else unset CADENCE_FX_TRACE_HOLDS_DEVICE; fi
  timeout 250 python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --seed 0 --background --idle --pace --conversations 8 --json --out /tmp/r/paced-$V > /tmp/r/paced-$V/stdout.txt 2> /tmp/r/paced-$V/log.txt; echo "paced-$V rc=$?"; tail -1 /tmp/r/paced-$V/stdout.txt | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); f=d['fallbacks']; print({k: d.get(k) for k in ('exact','replayed_share','ttfa_ms_p50','latency_ms_p50','chunk_ms_p50','stalls')}, 'deferred', f.get('capture deferred: a background build is running'), 'capture failures', {k: v for k, v in f.items() if 'captur' in k and 'deferred' not in k})"
  (cd /tmp && tar czf $OUT/r.tgz r)
done
