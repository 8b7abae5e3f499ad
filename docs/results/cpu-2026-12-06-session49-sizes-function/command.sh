# Session forty-nine, 2026-12-06, this 2-core CPU machine, torch 2.13.0+cpu, nothing else running.
# The prepare's reports ("served": how many prompt lengths of the range each shared graph serves)
# read every padded extent of a shape's plan at every length through capacity_ops.sizes_function
# (one compiled Python function, the sizes at the capacity computed once), where they called
# size_at twice per extent and length (32k calls, ~1 s a shape in a profile).
git worktree add /tmp/before 98af620   # before
python benchmarks/capacity_build_speed.py --trees /tmp/before,. --pairs 2 --out /tmp/bs
# Released Token2Wav, 5 steps, capacity 500, cache off, windows 12-14 and flushes 4-5 timed (5 shapes):
# 15.62 s before, 11.81 s after (medians), paired ratios 0.811 and 0.703 (median 0.757); every process
# built the same graphs (one sha256 of all five shared graphs' printouts).
