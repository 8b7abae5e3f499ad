#!/bin/bash
# session 36 call A (9c6c146): the GPU suite (copies of nodes through passes.base.copy_node; the two
# torch probes of passes/trace.py as one _Probe); node_copy_cost on this host's torch (2.11, whose
# create_node does not walk arguments: is copy_node as fast there?); then issue 14's rows at today's
# code: setup_time.py SRc fp32 at 10 and 5 steps, prompts 75/150/250 (a cold process, then a restarted
# one on its cache), every length streamed against stock
set -u
C=9c6c146
. benchmarks/device_env.sh $C benchmarks/setup_time.py benchmarks/node_copy_cost.py
mkdir -p /tmp/r/suite /tmp/r/setup10 /tmp/r/setup5
start=$SECONDS
python3 benchmarks/node_copy_cost.py --blocks 600 --reps 9 > /tmp/r/node_copy_cost.json 2>&1; echo "node_copy rc=$? $(cat /tmp/r/node_copy_cost.json)"
OUT=/tmp/r/suite 9c6c146=$C WORKERS=16 SUITE_TIMEOUT=280 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$? at $((SECONDS-start)) s"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
setup() { k=$1; limit=$2
  rm -rf .cfx/*
  timeout $limit python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps $k --prompt-tokens 75,150,250 --chunks 4 --timeout 140 --out /tmp/r/setup$k > /tmp/r/setup$k/stdout.txt 2> /tmp/r/setup$k/log.txt; echo "setup $k rc=$? at $((SECONDS-start)) s"
  python3 - $k <<'PY'
import json, glob, sys
for f in glob.glob(f"/tmp/r/setup{sys.argv[1]}/setup-*.json"):
    d = json.load(open(f))
    print({k: d.get(k) for k in ("first_setup_s", "new_prompt_length_ready_s", "cold_start_cached_s", "exact")})
    for run in ("cold", "warm"):
        for r in d.get(run, {}).get("rows", []):
            s = r.get("split") or {}
            print(run, r["prompt_tokens"], r["ready_s"], {k: s.get(k) for k in ("trace_s", "specialize_s", "passes_s")}, "capture", r.get("capture_s"), "exact", r.get("exact"))
PY
  (cd /tmp && tar czf $OUT/r.tgz r); }
setup 10 300
if [ $((SECONDS - start)) -lt 430 ]; then setup 5 $((560 - (SECONDS - start))); else echo "setup 5: not run (time)"; fi
