#!/bin/bash
# CPU (this session's machine: 2 cores, torch 2.13.0+cpu), 2026-12-05, session forty, at 33c0925
# (the library as c97aa19: a flush of another branch class gets the stream's own program).
# New voices through the drop-in, each prompt length compiled for itself against
# optimize(..., capacity=500), rule S; every chunk against stock (waveform, PCM, state).
# A review agent ran tests on this machine during the run: its times are NOT claimed here;
# what this run shows is exactness and the routes (program_share), compared with session
# thirty-nine's run of the same command (docs/results/cpu-2026-12-05-session39-capacity/).
OMP_NUM_THREADS=2 python benchmarks/capacity_voices.py --n-timesteps 2 --capacity 500 \
  --prompt-tokens 90,150,188,237 --json voices-2steps-33c0925.json > stdout-33c0925.txt
