#!/bin/bash
# session 37 call B (66b34a0): architecture item 4's kernel question again, now against stock's own DiT call
# (no mask: upstream's eager DiT.forward_chunk passes mask=None; call A compared against an all-true
# mask), with the device-length forms (seqlen), at lengths around the kernels' key blocks; zeros and
# random values in the padding; then the chunk-length rows (linears, conv) at every n from 1 to 56
set -u
C=66b34a0
. benchmarks/device_env.sh $C benchmarks/length_free_attention.py
mkdir -p /tmp/r/probe
start=$SECONDS
L=0,1,2,31,32,33,63,64,65,127,128,129,150,255,256,257,333,500,777,1000,1040
for g in "" "--garbage"; do
  name=none-zeros; [ -n "$g" ] && name=none-garbage
  timeout 150 python3 benchmarks/length_free_attention.py --device cuda --chunks 56,50,22,16,2,1 --lengths $L --capacity 1100 $g --json /tmp/r/probe/$name.json > /tmp/r/probe/$name.out 2> /tmp/r/probe/$name.err
  echo "probe $name rc=$? at $((SECONDS-start)) s"; cat /tmp/r/probe/$name.out; grep -v Warning /tmp/r/probe/$name.err | grep -v "return F" | tail -3
  (cd /tmp && tar czf $OUT/r.tgz r)
done
timeout 150 python3 benchmarks/length_free_attention.py --device cuda --rows --chunks $(seq -s, 56 -1 1) --lengths 0 --capacity 1100 --json /tmp/r/probe/rows.json > /tmp/r/probe/rows.out 2> /tmp/r/probe/rows.err
echo "probe rows rc=$? at $((SECONDS-start)) s"; cat /tmp/r/probe/rows.out; tail -2 /tmp/r/probe/rows.err
(cd /tmp && tar czf $OUT/r.tgz r)
