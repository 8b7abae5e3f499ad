#!/bin/bash
# session 34 call A (faac8b3): the GPU suite (Session._must_warm_up: one warm-up rule for both capture
# paths; session 33's unverified 0d6d06b test fix and 571b218 prime-per-device); then paced traffic,
# 8 conversations, 5 steps, background builds and idle, empty cache (pending sessions capture mid-stream)
set -u
C=faac8b3
. benchmarks/device_env.sh $C cadence_fx/foreground.py cadence_fx/tools/traffic.py
mkdir -p /tmp/r/suite /tmp/r/paced
OUT=/tmp/r/suite COMMIT=$C WORKERS=16 SUITE_TIMEOUT=280 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
rm -rf .cfx/*
timeout 250 python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --seed 0 --background --idle --pace --conversations 8 --json --out /tmp/r/paced > /tmp/r/paced/stdout.txt 2> /tmp/r/paced/log.txt; echo "paced rc=$?"; tail -1 /tmp/r/paced/stdout.txt | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d.get(k) for k in ('exact','replayed_share','program_share','ttfa_s','latency_s','chunks')})"
(cd /tmp && tar czf $OUT/r.tgz r)
