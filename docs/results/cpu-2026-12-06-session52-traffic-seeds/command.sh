# Session fifty-two, 2026-12-06, this machine's CPU (2 cores, torch 2.13.0+cpu), library at 1c5876b
# (the same as 4999735's), one run after another: issue 15's CPU line at seeds no session had used,
# and one run with more conversations, turns and steps under rule S.
for s in 4242 17 90001 31337; do
  python -m cadence_fx traffic --device cpu --conversations 2 --turns 2 --n-timesteps 2 --seed $s --json --quiet > traffic-seed$s.json
done
#   4242: 21 chunks, 17: 24, 90001: 30, 31337: 17; every one exact (waveform, PCM, state, every
#   chunk against its own stock tail), program_share 1.0, no fallback.
python -m cadence_fx traffic --device cpu --conversations 3 --turns 3 --n-timesteps 3 --seed 8 --rules S --json --quiet > traffic-seed8-rules-S-3x3-nt3.json
#   29 chunks, exact, program_share 1.0, no fallback (4 min 4 s).
