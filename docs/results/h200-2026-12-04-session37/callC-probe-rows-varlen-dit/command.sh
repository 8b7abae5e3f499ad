#!/bin/bash
# session 37 call C (cbe385c): the chunk-length rows again (call B's run failed on its own conv at n=1),
# every n from 56 to 1; then the DiT at stock's own call (no mask) with the efficient kernel's
# variable-length form (seqlen_k read only with cu_seqlens; call B passed none), fp32 and fp16, zeros;
# then the whole DiT chunk: upstream's own padded graphs against its eager DiT (dit_padded_cache.py)
set -u
C=cbe385c
. benchmarks/device_env.sh $C benchmarks/length_free_attention.py benchmarks/dit_padded_cache.py
mkdir -p /tmp/r/probe
start=$SECONDS
timeout 150 python3 benchmarks/length_free_attention.py --device cuda --rows --chunks $(seq -s, 56 -1 1) --lengths 0 --capacity 1100 --json /tmp/r/probe/rows.json > /tmp/r/probe/rows.out 2> /tmp/r/probe/rows.err
echo "probe rows rc=$? at $((SECONDS-start)) s"; cat /tmp/r/probe/rows.out; grep -v Warning /tmp/r/probe/rows.err | grep -v "return F" | tail -2
(cd /tmp && tar czf $OUT/r.tgz r)
L=0,1,2,31,32,33,63,64,65,127,128,129,150,255,256,257,333,500,777,1000,1040
timeout 150 python3 benchmarks/length_free_attention.py --device cuda --dtypes float32,float16 --chunks 56,50,22,16,2,1 --lengths $L --capacity 1100 --json /tmp/r/probe/none-zeros-varlen.json > /tmp/r/probe/none-zeros-varlen.out 2> /tmp/r/probe/none-zeros-varlen.err
echo "probe varlen rc=$? at $((SECONDS-start)) s"; cat /tmp/r/probe/none-zeros-varlen.out; grep -v Warning /tmp/r/probe/none-zeros-varlen.err | grep -v "return F" | tail -3
(cd /tmp && tar czf $OUT/r.tgz r)
timeout 200 python3 benchmarks/dit_padded_cache.py --device cuda --json /tmp/r/probe/dit-padded.json > /tmp/r/probe/dit-padded.out 2> /tmp/r/probe/dit-padded.err
echo "dit padded rc=$? at $((SECONDS-start)) s"; tail -1 /tmp/r/probe/dit-padded.out; grep -c '"exact": true' /tmp/r/probe/dit-padded.out; grep -v Warning /tmp/r/probe/dit-padded.err | grep -v "return F" | tail -3
(cd /tmp && tar czf $OUT/r.tgz r)
