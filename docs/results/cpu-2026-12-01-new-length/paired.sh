#!/bin/bash
# paired: old (c4a3ed8) and new (HEAD) alternately, torch 2.11 CPU, 1 thread
. /work/venv211/bin/activate
export OMP_NUM_THREADS=1
for steps in 5 10; do
  for round in 1 2; do
    for tree in /tmp/old /work/main; do
      echo "== $tree steps=$steps round=$round"
      (cd $tree && PYTHONPATH=$tree CADENCE_FX_CACHE_DIR=/tmp/cfx-cache-$steps python benchmarks/new_length.py --n-timesteps $steps --rules SRc --reps 5 --capture-code 2>&1 | tail -1)
    done
  done
done
