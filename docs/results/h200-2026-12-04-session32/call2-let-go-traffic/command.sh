#!/bin/bash
# session 32 second device call (24e2675): let_go_cost on the GPU (a new length's build with the
# let-go graphs unlinked against left to the collector, paired, one process); then issue 15's traffic,
# 8 conversations back to back with background builds and idle time, an empty program cache; then the
# same paced (--pace: chunks arrive as the audio before them would have played) on the cache it left
set -u
C=24e2675
mkdir -p .site .cfx /tmp/r/let-go /tmp/r/traffic-8 /tmp/r/traffic-8-paced
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"; date -u; echo "tree: $C (check: sha256 below against git show $C:<file>)"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py benchmarks/let_go_cost.py cadence_fx/tools/traffic.py; } > /tmp/r/gpu.txt
(time timeout 150 python3 benchmarks/let_go_cost.py --device cuda --n-timesteps 10 --prompt-tokens 47,53,59 --reps 2 > /tmp/r/let-go/let-go.json 2> /tmp/r/let-go/log.txt) 2>> /tmp/r/let-go/log.txt; echo "let-go rc=$?"; cut -c1-600 /tmp/r/let-go/let-go.json; tail -4 /tmp/r/let-go/log.txt
(cd /tmp && tar czf $OUT/r.tgz r)
rm -rf .cfx/*
(time timeout 240 python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --seed 0 --background --idle --conversations 8 --json --out /tmp/r/traffic-8) > /tmp/r/traffic-8/log.txt 2>&1; echo "traffic rc=$?"; grep -v '^{' /tmp/r/traffic-8/log.txt | tail -30
(cd /tmp && tar czf $OUT/r.tgz r)
(time timeout 180 python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --seed 0 --background --idle --pace --conversations 8 --json --out /tmp/r/traffic-8-paced) > /tmp/r/traffic-8-paced/log.txt 2>&1; echo "paced rc=$?"; grep -v '^{' /tmp/r/traffic-8-paced/log.txt | tail -30
(cd /tmp && tar czf $OUT/r.tgz r)
