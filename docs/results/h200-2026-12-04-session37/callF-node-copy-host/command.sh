#!/bin/bash
# session 37 call F (8e1b501): why did node_copy_cost's made-up graph copy in 0.31x the time on this host
# (session 36, torch 2.11) when this CPU machine with torch 2.11 gives 1.26x? node_copy_profile.py
# (each copy timed twice, then profiled), and node_copy_cost.py with the GPU visible and hidden
set -u
C=8e1b501
. benchmarks/device_env.sh $C benchmarks/node_copy_cost.py benchmarks/node_copy_profile.py
mkdir -p /tmp/r/ncc
start=$SECONDS
timeout 120 python3 benchmarks/node_copy_profile.py > /tmp/r/ncc/profile.txt 2> /tmp/r/ncc/profile.err; echo "profile rc=$? at $((SECONDS-start)) s"; head -6 /tmp/r/ncc/profile.txt
timeout 120 python3 benchmarks/node_copy_cost.py --blocks 600 --reps 9 > /tmp/r/ncc/cost-gpu-visible.json 2>/dev/null; echo "visible rc=$? $(cat /tmp/r/ncc/cost-gpu-visible.json)"
CUDA_VISIBLE_DEVICES= timeout 120 python3 benchmarks/node_copy_cost.py --blocks 600 --reps 9 > /tmp/r/ncc/cost-gpu-hidden.json 2>/dev/null; echo "hidden rc=$? $(cat /tmp/r/ncc/cost-gpu-hidden.json)"
(cd /tmp && tar czf $OUT/r.tgz r)
