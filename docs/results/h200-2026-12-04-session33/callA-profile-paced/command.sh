#!/bin/bash
# session 33 call A (63812a8): setup_time at 10 flow steps with the second length profiled (cProfile);
# then 8 paced conversations (the backlog + first-slice change), as session 32's call 3
set -u
C=63812a8
. benchmarks/device_env.sh $C benchmarks/setup_time.py cadence_fx/tools/traffic.py cadence_fx/foreground.py
mkdir -p /tmp/r/setup-10p /tmp/r/traffic-8-paced
rm -rf .cfx/*
timeout 170 python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps 10 --prompt-tokens 75,150,250 --chunks 4 --timeout 140 --skip-warm --profile /tmp/r/setup-10p/prof.txt --out /tmp/r/setup-10p > /tmp/r/setup-10p/log.txt 2>&1; echo "setup-10p rc=$?"; grep -E '"ready_s"' /tmp/r/setup-10p/log.txt | cut -c1-300
(cd /tmp && tar czf $OUT/r.tgz r)
rm -rf .cfx/*
(time timeout 280 python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --seed 0 --background --idle --pace --conversations 8 --json --out /tmp/r/traffic-8-paced) > /tmp/r/traffic-8-paced/log.txt 2>&1; echo "paced rc=$?"; grep -v '^{' /tmp/r/traffic-8-paced/log.txt | tail -30
(cd /tmp && tar czf $OUT/r.tgz r)
