# CPU (2 cores), torch 2.13.0+cpu, main at 956a76e (the library this session started from), one after another:
for s in 101 202 303; do
  cadence-fx traffic --device cpu --conversations 2 --turns 2 --n-timesteps 2 --seed $s --json --out /tmp/seeds/s$s
done
# issue 15's first done-when line ("exact with program_share >= 0.98 for any seed") at three new seeds:
# each exact, program_share 1.0 (32, 41 and 17 chunks); wall times 146.4, 117.5 and 62.2 s (/usr/bin/time).
