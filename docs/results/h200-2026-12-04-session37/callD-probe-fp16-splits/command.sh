#!/bin/bash
# session 37 call D (35780b9): fp16's DiT attention: stock runs flash (no mask), whose split of the keys
# follows the length; for each length, which num_splits reproduce stock's call at the exact length,
# and whether flash's variable-length form on the capacity (the key count on the device) with that
# count does; zeros in the padding
set -u
C=35780b9
. benchmarks/device_env.sh $C benchmarks/length_free_attention.py
mkdir -p /tmp/r/probe
start=$SECONDS
L=0,1,2,31,32,33,63,64,65,127,128,129,150,255,256,257,333,500,777,1000,1040
timeout 200 python3 benchmarks/length_free_attention.py --device cuda --dtypes float16 --chunks 56,50,22,16,2,1 --lengths $L --capacity 1100 --json /tmp/r/probe/fp16-splits.json > /tmp/r/probe/fp16-splits.out 2> /tmp/r/probe/fp16-splits.err
echo "probe fp16 splits rc=$? at $((SECONDS-start)) s"; cat /tmp/r/probe/fp16-splits.out; grep -v Warning /tmp/r/probe/fp16-splits.err | grep -v "return F" | tail -3
python3 -c "import json; d=json.load(open('/tmp/r/probe/fp16-splits.json'))
for r in d['rows']:
    if 'stock_equals_splits' in r: print(r['n'], r['L'], 'stock', r['stock_equals_splits'], 'varlen', r['varlen_equals_splits'])" | head -130
(cd /tmp && tar czf $OUT/r.tgz r)
