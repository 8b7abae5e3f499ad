#!/bin/bash
# session 37, this CPU machine (2 cores, torch 2.13.0+cpu), library at the commit that added the script
# an empty program cache, so the symbolic entries are traced here
. .venv/bin/activate
export CADENCE_FX_CACHE_DIR=$(mktemp -d)
OMP_NUM_THREADS=1 python benchmarks/length_inventory.py --n-timesteps 5 \
  --json docs/results/cpu-2026-12-04-session37-inventory/inventory-5steps.json > /dev/null
