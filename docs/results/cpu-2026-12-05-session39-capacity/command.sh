#!/bin/bash
# CPU (this session's machine: 2 cores, torch 2.13.0+cpu), 2026-12-05, session thirty-nine.
# New voices through the drop-in: each prompt length compiled for itself, against
# optimize(..., capacity=500); every chunk against stock (waveform, PCM, state).
# At 0dc514f (the hazard check runs each entry once per new length):
OMP_NUM_THREADS=2 python benchmarks/capacity_voices.py --n-timesteps 2 --capacity 500 \
  --prompt-tokens 90,150,188,237 --json voices-2steps-0dc514f.json > stdout-0dc514f.txt
# At e76cf6a (the hazard check walks the region views at the stream's host sizes):
OMP_NUM_THREADS=2 python benchmarks/capacity_voices.py --n-timesteps 2 --capacity 500 \
  --prompt-tokens 90,150,188,237 --json voices-2steps-e76cf6a.json > stdout-e76cf6a.txt
# At 2b67a7d: issue 15's traffic on the CPU (released Token2Wav, 2 steps), per length and on capacity
# graphs, one process each, one program cache directory shared (the second run loads the first's traces):
export CADENCE_FX_CACHE_DIR=$(mktemp -d)
OMP_NUM_THREADS=2 cadence-fx traffic --device cpu --conversations 2 --turns 2 --n-timesteps 2 --seed 0 \
  --json --quiet --out traffic-plain
OMP_NUM_THREADS=2 cadence-fx traffic --device cpu --conversations 2 --turns 2 --n-timesteps 2 --seed 0 \
  --capacity 512 --json --quiet --out traffic-capacity
