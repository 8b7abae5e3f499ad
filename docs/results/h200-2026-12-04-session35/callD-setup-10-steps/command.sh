#!/bin/bash
# session 35 call D (cff00be; library as 985136c): where issue 14's 3 s at 10 steps stands at today's
# code on this host: setup_time.py, SRc fp32, 10 steps, prompts 75/150/250 (a cold process, then a
# restarted one on its cache), each length streamed against stock
set -u
C=cff00be
. benchmarks/device_env.sh $C benchmarks/setup_time.py
mkdir -p /tmp/r/setup10
rm -rf .cfx/*
timeout 400 python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps 10 --prompt-tokens 75,150,250 --chunks 4 --timeout 180 --out /tmp/r/setup10 > /tmp/r/setup10/stdout.txt 2> /tmp/r/setup10/log.txt; echo "setup rc=$?"
python3 - <<'PY'
import json, glob
for f in glob.glob("/tmp/r/setup10/setup-*.json"):
    d = json.load(open(f))
    print({k: d.get(k) for k in ("first_setup_s", "new_prompt_length_ready_s", "cold_start_cached_s", "exact")})
    for run in ("cold", "warm"):
        for r in d.get(run, {}).get("rows", []):
            s = r.get("split") or {}
            print(run, r["prompt_tokens"], r["ready_s"], {k: s.get(k) for k in ("trace_s", "specialize_s", "passes_s")}, "capture", r.get("capture_s"), "exact", r.get("exact"))
PY
(cd /tmp && tar czf $OUT/r.tgz r)
