# CPU (this machine: 2 cores, torch 2.13.0), one run at each commit, released Token2Wav, 5 steps:
python benchmarks/capacity_voices.py --device cpu --rules S --n-timesteps 5 --capacity 500 \
  --prompt-tokens 90,150,237 --turns 1 --steady 2 --json voices-5steps-<commit>.json > stdout-<commit>.txt
# 6c22479: before; 216d101: the hazard walk on unwritten shared scratch regions, collector held
