# CPU (this machine: 2 cores, torch 2.13.0), released Token2Wav (seeded random weights), 2 flow steps,
# rule S, library at 4ad70b1 (42c6ec1's idle-time builds), nothing else running; 1 min 59 s:
python benchmarks/other_class.py --n-timesteps 2 --capacity 500 --flush 3 --prompt-tokens 150,156,162,168 \
  --json other_class.json > stdout.txt
# Voices of 150, 156, 162 and 168 tokens (300-336 frames: frames + 99 a multiple of 3, capacity 500's
# 599 not): the 3-token flush's shared graph does not serve them.  150 and 162 get no idle time (the
# flush's chunk traces their own program); 156 and 168 get session.idle() after their steady chunks
# (the program built there).  Every chunk against stock (waveform, PCM, state): exact.
