#!/bin/bash
# session 31 fourth device call (main, capture streams of each session's own): issue 15's
# traffic at 8 conversations as a service would run it (background builds, idle time),
# an empty program cache; every chunk checked against its conversation's own stock tail
set -u
mkdir -p .site .cfx /tmp/r/traffic-8
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
C=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; date -u; echo "tree: $C"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py cadence_fx/tools/traffic.py; } > /tmp/r/gpu.txt
(time timeout 420 python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --seed 0 --background --idle --conversations 8 --json --out /tmp/r/traffic-8) > /tmp/r/traffic-8/log.txt 2>&1; echo "traffic rc=$?"; grep -v '^{' /tmp/r/traffic-8/log.txt | tail -30
(cd /tmp && tar czf $OUT/r.tgz r)
