#!/bin/bash
# scratch (not committed): session 25 second device call: traffic with the shared flow step
set -u
mkdir -p .site .cfx
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; date -u; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py; } > $OUT/gpu.txt
for spec in "--conversations 4 --pace" "--conversations 8"; do
  name=$(echo "$spec" | tr ' ' '_' | tr -d '-')
  mkdir -p $OUT/$name
  echo "== $spec"; date
  ( time timeout ${T:-260} python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --seed 0 --background --idle $spec --json --out /tmp/$name ) > /tmp/$name.log 2>&1
  echo "rc=$?"; tail -4 /tmp/$name.log; mv /tmp/$name.log /tmp/$name/log.txt
  (cd /tmp && tar czf $OUT/$name.tgz $name)
done
for n in 10 5; do
  mkdir -p /tmp/setup-$n
  ( time timeout 150 python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps $n --prompt-tokens 75,150,250 --chunks 4 --timeout 120 --out /tmp/setup-$n ) > /tmp/setup-$n/log.txt 2>&1; echo "setup $n rc=$?"; tail -c 250 /tmp/setup-$n/log.txt
  (cd /tmp && tar czf $OUT/setup-$n.tgz setup-$n)
done
