#!/bin/bash
# paired set-up times on the H200: 7949bbe (.old) and the new commit alternately, SRc fp32
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1
steps=${STEPS:-5}; tmo=${TMO:-110}; rounds=${ROUNDS:-2}
if [ -n "${RERUN:-}" ]; then
  PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider -m cuda "$RERUN" 2>&1 | tail -3 > $OUT/rerun.txt
fi
for r in $(seq 1 $rounds); do
  for tree in ${ORDER:-old new}; do
    d=$PWD; [ $tree = old ] && d=$PWD/.old
    tag=$tree-${TAG:-$r}; mkdir -p $OUT/$tag
    (cd $d && PYTHONPATH=/tmp/site:$d python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps $steps \
      --prompt-tokens 75,150,250,200 --chunks 4 --timeout $tmo --out $OUT/$tag >> $OUT/logs.txt 2>&1)
    echo "$tag rc=$?" | tee -a $OUT/logs.txt
  done
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
