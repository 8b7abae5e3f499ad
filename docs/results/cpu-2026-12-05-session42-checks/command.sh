# CPU (this machine: 2 cores, torch 2.13.0), released Token2Wav, 5 steps, rule S, capacity 512;
# one run at each commit, one after another, nothing else running:
python benchmarks/stream_checks.py --json checks-<commit>.json > stdout-<commit>.txt
# dd07e3a: before (the benchmark file copied into a worktree of it, PYTHONPATH at that worktree);
# 7a2e339: aliasing.WalkPlan, guards parsed once, collector held in a window's check;
# 3a34add: region_hazards by region.
