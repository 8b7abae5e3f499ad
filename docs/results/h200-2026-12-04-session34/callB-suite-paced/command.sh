#!/bin/bash
# session 34 call B (850dc11): the GPU suite (device_work.host_only: a build's symbolic trace lets
# captures in; its CUDA test); then paced traffic, 8 conversations, 5 steps, background builds and
# idle, empty cache (the same command as call A, which ran the code before host_only)
set -u
C=850dc11
. benchmarks/device_env.sh $C cadence_fx/programs/entry.py cadence_fx/foreground.py cadence_fx/tools/traffic.py
mkdir -p /tmp/r/suite /tmp/r/paced
OUT=/tmp/r/suite COMMIT=$C WORKERS=16 SUITE_TIMEOUT=280 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
rm -rf .cfx/*
timeout 260 python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --seed 0 --background --idle --pace --conversations 8 --json --out /tmp/r/paced > /tmp/r/paced/stdout.txt 2> /tmp/r/paced/log.txt; echo "paced rc=$?"; tail -1 /tmp/r/paced/stdout.txt | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); f=d['fallbacks']; print({k: d.get(k) for k in ('exact','replayed_share','ttfa_ms_p50','latency_ms_p50','chunk_ms_p50','stalls')}, 'deferred', f.get('capture deferred: a background build is running'), 'capture failures', {k: v for k, v in f.items() if 'captur' in k and 'deferred' not in k})"
(cd /tmp && tar czf $OUT/r.tgz r)
