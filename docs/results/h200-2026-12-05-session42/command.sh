# device tool, nvidia-h200 (NVIDIA H200, torch 2.11.0+cu130), carry [".whl"], 2026-12-05 11:23 UTC:
bash benchmarks/issue15_call.sh 89bb2ac59b44610a8dec4b4f527aa87540b2a18e 560
# which runs
python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --conversations 8 \
  --seed 0 --capacity 512 --prepare --shared-captures --json --out /tmp/r/traffic
# gpu.txt's sha256 lines checked against `git show 89bb2ac:<file> | sha256sum`: all equal.
# traffic.json/.md/.png of this run are docs/results/traffic-h200.* (the earlier file, 2026-12-01 at f84e490: h200-2026-12-01-traffic/traffic-f84e490.*)
