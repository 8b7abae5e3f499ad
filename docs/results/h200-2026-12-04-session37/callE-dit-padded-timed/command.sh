#!/bin/bash
# session 37 call E (e4d4ea0): what upstream's padded DiT graph would save an eager chunk: dit_padded_cache.py
# with each path's DiT call timed (median of 20, to a device sync), fp32 (the exactness of call C again)
set -u
C=e4d4ea0
. benchmarks/device_env.sh $C benchmarks/dit_padded_cache.py
mkdir -p /tmp/r/probe
start=$SECONDS
timeout 300 python3 benchmarks/dit_padded_cache.py --device cuda --dtypes float32 --lengths 1,150,333,499,777 --time-reps 20 --json /tmp/r/probe/dit-padded-timed.json > /tmp/r/probe/dit-padded-timed.out 2> /tmp/r/probe/dit-padded-timed.err
echo "dit padded timed rc=$? at $((SECONDS-start)) s"; cat /tmp/r/probe/dit-padded-timed.out; grep -v Warning /tmp/r/probe/dit-padded-timed.err | tail -3
(cd /tmp && tar czf $OUT/r.tgz r)
