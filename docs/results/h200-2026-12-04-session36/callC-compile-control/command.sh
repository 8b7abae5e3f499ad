#!/bin/bash
# session 36 call C (9c6c146): issue 14's control, torch.compile reduce-overhead (setup_time.py's
# compile-ro: torch.compile(estimator.forward_chunk, mode="reduce-overhead", dynamic=False)) at two
# new prompt lengths, 10 steps, fp32: its set-up + first 3 chunks less 3 steady chunks per length,
# first with an empty inductor cache, then a new process on the cache the first filled (setup_time.py's
# own control child, run directly: its parent would first run the cadence rows call A has)
set -u
C=9c6c146
. benchmarks/device_env.sh $C benchmarks/setup_time.py cadence_fx/tools/bench/controls.py
mkdir -p /tmp/r/control
export TORCHINDUCTOR_CACHE_DIR=/tmp/r-inductor
rm -rf $TORCHINDUCTOR_CACHE_DIR
start=$SECONDS
for run in empty_cache warm_cache; do
  timeout 285 python3 benchmarks/setup_time.py --child --run-control compile-ro --device cuda --rules SRc --n-timesteps 10 --prompt-tokens 75,150 --chunks 4 --seed 0 > /tmp/r/control/$run.json 2> /tmp/r/control/$run.log
  echo "$run rc=$? at $((SECONDS-start)) s: $(tail -1 /tmp/r/control/$run.json)"
  (cd /tmp && tar czf $OUT/r.tgz r)
done
du -sh $TORCHINDUCTOR_CACHE_DIR
