#!/bin/bash
# session 33 call C (5543401): reuse_cost.py at 10 steps with more pairs (12 new lengths); 8 paced conversations again
set -u
C=5543401
. benchmarks/device_env.sh $C benchmarks/reuse_cost.py cadence_fx/tools/traffic.py cadence_fx/foreground.py
mkdir -p /tmp/r/reuse-10 /tmp/r/traffic-8-paced
timeout 230 python3 benchmarks/reuse_cost.py --device cuda --n-timesteps 10 --prompt-tokens 80,90,100,110,120,130,140,150,160,170,180,190 > /tmp/r/reuse-10/out.json 2> /tmp/r/reuse-10/log.txt; echo "reuse rc=$?"; grep '"variant"' /tmp/r/reuse-10/log.txt | cut -c1-160; python3 -c "import json; d=json.load(open('/tmp/r/reuse-10/out.json')); print(d['median'], d['paired_after_over_before'], 'exact', d['exact'])"
(cd /tmp && tar czf $OUT/r.tgz r)
rm -rf .cfx/*
(time timeout 270 python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --seed 0 --background --idle --pace --conversations 8 --json --out /tmp/r/traffic-8-paced) > /tmp/r/traffic-8-paced/log.txt 2>&1; echo "paced rc=$?"; grep -v '^{' /tmp/r/traffic-8-paced/log.txt | grep -E "exact|paced|fallbacks|real" | cut -c1-400
(cd /tmp && tar czf $OUT/r.tgz r)
