#!/bin/bash
# session 35 call B (36bfab3; library as c5ae58d): issue 15's traffic as the issue states it (back to
# back, not paced), 8 conversations, SRc fp32, 5 steps, background builds and idle time, empty cache:
# where its H200 line (replayed >= 0.99, TTFA <= 1.1x stock, chunk p99 <= 1.5x p50) stands today
set -u
C=36bfab3
. benchmarks/device_env.sh $C cadence_fx/tools/traffic.py cadence_fx/foreground.py cadence_fx/programs/entry.py
mkdir -p /tmp/r/b2b
rm -rf .cfx/*
timeout 540 python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --seed 0 --background --idle --conversations 8 --json --out /tmp/r/b2b > /tmp/r/b2b/stdout.txt 2> /tmp/r/b2b/log.txt; echo "b2b rc=$?"; tail -1 /tmp/r/b2b/stdout.txt | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d.get(k) for k in ('exact','chunks','program_share','replayed_share','ttfa_ms_p50','stock_ttfa_ms_p50','chunk_ms_p50','chunk_ms_p99','stock_chunk_ms_p50','peak_mib','idle_s','captured_idle')}); print(d['fallbacks'])"
(cd /tmp && tar czf $OUT/r.tgz r)
