#!/bin/bash
# session 28 last device call: paced traffic (issue 15), 2 conversations on an EMPTY program cache,
# with the shared calls' graph on (the new default); session twenty-six's command at --conversations 2
set -u
mkdir -p .site .cfx /tmp/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
rm -rf .cfx/*
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; date -u; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py cadence_fx/tools/traffic.py; } > /tmp/r/gpu.txt
name=paced-2-empty-cache; mkdir -p /tmp/r/$name
( time timeout 165 python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --seed 0 --background --idle --conversations 2 --pace --json --out /tmp/r/$name ) > /tmp/r/$name/log.txt 2>&1
echo "rc=$?"; tail -c 600 /tmp/r/$name/log.txt
(cd /tmp && tar czf $OUT/r.tgz r)
