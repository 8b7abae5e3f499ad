#!/bin/bash
# session 32 third device call (24e2675, as calls 1-2): setup_time at 10 and 5 flow steps again, on
# whatever host this machine is (issue 14's 3 s across hosts); then issue 15's traffic paced (--pace),
# 8 conversations, background builds and idle time, on the cache the 5-step rows left
set -u
C=24e2675
mkdir -p .site .cfx /tmp/r/setup-10 /tmp/r/setup-5 /tmp/r/traffic-8-paced
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"; date -u; echo "tree: $C (check: sha256 below against git show $C:<file>)"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py benchmarks/setup_time.py cadence_fx/tools/traffic.py; } > /tmp/r/gpu.txt
for S in 10 5; do
  rm -rf .cfx/*
  timeout 160 python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps $S --prompt-tokens 75,150,250 --chunks 4 --timeout 130 --out /tmp/r/setup-$S > /tmp/r/setup-$S/log.txt 2>&1; echo "setup-$S rc=$?"; grep -E '"ready_s"' /tmp/r/setup-$S/log.txt | cut -c1-200
  (cd /tmp && tar czf $OUT/r.tgz r)
done
(time timeout 260 python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --seed 0 --background --idle --pace --conversations 8 --json --out /tmp/r/traffic-8-paced) > /tmp/r/traffic-8-paced/log.txt 2>&1; echo "paced rc=$?"; grep -v '^{' /tmp/r/traffic-8-paced/log.txt | tail -30
(cd /tmp && tar czf $OUT/r.tgz r)
