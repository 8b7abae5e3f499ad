#!/bin/bash
# session 30 third device call (main at HEAD): the capture-stream / cuBLAS-workspace probe, then traffic (4 conversations, back to back)
set -u
mkdir -p .site .cfx /tmp/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CADENCE_FX_CACHE_DIR=$PWD/.cfx
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; date -u; echo "tree: 79af76e + benchmarks/stream_workspace_probe.py (uncommitted)"; sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py benchmarks/stream_workspace_probe.py cadence_fx/tools/traffic.py; } > /tmp/r/gpu.txt
mkdir -p /tmp/r/probe
( time timeout 90 python3 benchmarks/stream_workspace_probe.py ) > /tmp/r/probe/log.txt 2>&1; echo "probe rc=$?"; cat /tmp/r/probe/log.txt | head -c 1500
( time timeout 90 python3 benchmarks/stream_workspace_probe.py --m 256 --k 32768 --rounds 400 ) > /tmp/r/probe/log-256.txt 2>&1; echo "probe-256 rc=$?"; head -c 1200 /tmp/r/probe/log-256.txt
(cd /tmp && tar czf $OUT/r.tgz r)
mkdir -p /tmp/r/traffic-b2b-4
( time timeout 230 python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --seed 0 --background --idle --conversations 4 --json --out /tmp/r/traffic-b2b-4 ) > /tmp/r/traffic-b2b-4/log.txt 2>&1; echo "traffic rc=$?"
python3 -c "import sys,json; d=json.load(open('/tmp/r/traffic-b2b-4/traffic.json')); print({k: d.get(k) for k in ('exact','chunks','program_share','replayed_share','ttfa_ms_p50','stock_ttfa_ms_p50','chunk_ms_p50','chunk_ms_p99','stock_chunk_ms_p50','peak_mib','collector','fallbacks')})" 2>&1 | head -c 2500
grep real /tmp/r/traffic-b2b-4/log.txt
(cd /tmp && tar czf $OUT/r.tgz r)
