#!/bin/bash
# session 35 call A (c5ae58d): the GPU suite (capture_entry gives back a stream it took for a
# caller without one); then an exactness sweep of `cadence-fx verify` on configurations no test
# or earlier result uses (steps 1-4, fp16/bf16, prompts of 1-2 and 250 tokens, flushes of 1 and
# 28 tokens, rules SR/SRc/Rc, Mimi and VibeVoice), each with its own time limit, empty cache
set -u
C=c5ae58d
. benchmarks/device_env.sh $C
mkdir -p /tmp/r/suite /tmp/r/sweep
OUT=/tmp/r/suite COMMIT=$C WORKERS=16 SUITE_TIMEOUT=280 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
rm -rf .cfx/*
start=$SECONDS
sweep() { name=$1; shift
  if [ $((SECONDS - start)) -gt 250 ]; then echo "$name: not run (time)"; return; fi
  timeout 110 python3 -m cadence_fx verify --device cuda --json "$@" > /tmp/r/sweep/$name.out 2> /tmp/r/sweep/$name.err
  echo "$name rc=$? $(tail -1 /tmp/r/sweep/$name.out | python3 -c 'import json,sys
try:
  d=json.loads(sys.stdin.read()); print({k: d.get(k) for k in ("exact","chunks","mismatches","fallbacks","setups") if k in d})
except Exception as e: print("no json:", e)')"
  (cd /tmp && tar czf $OUT/r.tgz r); }
sweep t2w-srcfp16-n3 --model token2wav --rules SRc --dtype float16 --n-timesteps 3 --prompt-tokens 7,91 --chunks 5 --final-tokens 1 --seed 11
sweep t2w-sr-n2-p250 --model token2wav --rules SR --n-timesteps 2 --prompt-tokens 250 --chunks 4 --final-tokens 28 --seed 5
sweep t2w-src-n1-p1 --model token2wav --rules SRc --n-timesteps 1 --prompt-tokens 1,2 --chunks 3 --final-tokens 13 --seed 3
sweep mimi-src --model mimi --rules SRc --chunks 6 --seed 3
sweep vv-src-bf16 --model vibevoice --rules SRc --dtype bfloat16 --chunks 4 --seed 4
sweep t2w-rc-n4 --model token2wav --rules Rc --n-timesteps 4 --prompt-tokens 33 --chunks 4 --final-tokens 5 --seed 8
