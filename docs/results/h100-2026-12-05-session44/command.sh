# Session forty-four, 2026-12-05, through the device tool (asked for nvidia-h200, given one NVIDIA H100
# 80GB HBM3, torch 2.11.0+cu130), carry [".whl"], library at 3fcea42 (every sha256 in gpu.txt checked
# against `git show 3fcea42:<file>`: 40 files, all equal).  First call, 539.6 s:
bash benchmarks/issue15_call.sh 3fcea42 575 --idle
# which ran
python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --conversations 8 --seed 0 \
  --capacity 500 --prepare --shared-captures --idle --json --out /tmp/r/traffic
# Outputs: traffic/ (traffic.json, .md, .png, stdout.txt, log.txt: progress lines), gpu.txt.
