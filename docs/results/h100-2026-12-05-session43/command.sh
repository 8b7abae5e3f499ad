# Session forty-three, 2026-12-05, through the device tool (nvidia-h100-x1: one NVIDIA H100 80GB HBM3,
# torch 2.11.0+cu130), carry [".whl"], library at 622268d (every sha256 in gpu.txt checked against
# `git show 622268d:<file>`: 40 files, all equal).  One call, 550.7 s:
bash benchmarks/issue15_call.sh 622268d6d48c3f3a137e4fc6c0f0efc642e487ec 578 --idle
# which ran
python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --conversations 8 --seed 0 \
  --capacity 512 --prepare --shared-captures --idle --json --out /tmp/r/traffic
# Outputs: traffic/ (traffic.json, .md, .png, stdout.txt, log.txt: progress lines), gpu.txt.
