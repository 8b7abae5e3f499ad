#!/bin/bash
# session 37, this CPU machine (2 cores, torch 2.13.0+cpu), library at 50f290b: issue 15's CPU line
# with a seed no earlier run used (the lines' runs at 0-3: ../cpu-traffic/), an empty program cache
. .venv/bin/activate
CADENCE_FX_CACHE_DIR=$(mktemp -d) python -m cadence_fx traffic --device cpu --conversations 2 --turns 2 \
  --n-timesteps 2 --seed 37 --json --out docs/results/cpu-2026-12-04-session37-traffic > /dev/null
# took 2 min 11 s (real)
