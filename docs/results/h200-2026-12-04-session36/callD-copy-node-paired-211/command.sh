#!/bin/bash
# session 36 call D (0a49674; library as 9c6c146): what copy_node changes in a new length's host work
# on this host's torch (2.11), paired: benchmarks/new_length.py (the released Token2Wav, 10 steps,
# the replay pipeline's passes on the CPU graphs, the collector held, 5 repetitions) with the library
# at 1075673 (before; `git archive 1075673 cadence_fx` unpacked into oldtree/) and at this tree,
# alternating, two rounds, one program cache
set -u
C=0a49674
. benchmarks/device_env.sh $C benchmarks/new_length.py
mkdir -p /tmp/r/paired
git -C . rev-parse HEAD > /tmp/r/paired/device_head.txt 2>&1
sha256sum oldtree/cadence_fx/passes/*.py oldtree/cadence_fx/programs/serialize.py > /tmp/r/paired/oldtree.sha256
start=$SECONDS
for round in 1 2; do
  for v in before after; do
    if [ $v = before ]; then P=$PWD/.site:$PWD/oldtree; else P=$PWD/.site:$PWD; fi
    PYTHONPATH=$P python3 -c "import cadence_fx, sys; print(cadence_fx.__file__)" > /tmp/r/paired/$v-$round.where
    PYTHONPATH=$P timeout 200 python3 benchmarks/new_length.py --n-timesteps 10 --rules SRc --gc-off --reps 5 > /tmp/r/paired/$v-$round.json 2> /tmp/r/paired/$v-$round.err
    echo "$v round $round rc=$? at $((SECONDS-start)) s ($(cat /tmp/r/paired/$v-$round.where)): $(python3 -c "import json; d=json.load(open('/tmp/r/paired/$v-$round.json')); m=d['median_s']; print({k: m[k] for k in ('specialize','EarlyWriteback','Partition','passes')})" 2>&1)"
    (cd /tmp && tar czf $OUT/r.tgz r)
  done
done
