# Session forty-four, 2026-12-05, through the device tool (asked for nvidia-h200, given one NVIDIA H100
# 80GB HBM3, torch 2.11.0+cu130), carry [".whl"], library at 3fcea42 (every sha256 in gpu.txt checked
# against `git show 3fcea42:<file>`: 40 files, all equal).  First call, 539.6 s:
bash benchmarks/issue15_call.sh 3fcea42 575 --idle
# which ran
python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --conversations 8 --seed 0 \
  --capacity 500 --prepare --shared-captures --idle --json --out /tmp/r/traffic
# Outputs: traffic/ (traffic.json, .md, .png, stdout.txt, log.txt: progress lines), gpu.txt.

# Second call (warm, 592.3 s), same library:
bash benchmarks/capacity_r_call.sh 3fcea42 --shared-captures
# Every part ran out of its time (rc 124): the GPU suite on 16 workers reached 64 of 68 tests in 280 s
# with 12 failures whose names pytest prints only at its end (call2-capacity_r-3fcea42/
# pytest-cuda-16-workers.log; the next call, on 10 workers, peaked at 75.7 GB of the H100's 80: 16
# workers ran it out); capacity_voices.py finished only the per-length variant (voices-stdout.txt, every
# voice exact); the 3-conversation traffic with --prepare did not get past preparing (425 s on an H100).
# Its traffic/ folder came back holding the first call's files (a warm machine keeps /tmp), not kept.
# Since: failures.txt (tests/conftest.py writes each failure as reported), /tmp/r and /tmp/suite cleared
# at a call's start, capacity_r_call.sh on 10 workers without the traffic part.

# Third call (fresh machine, 187.7 s), library as 3fcea42 (ddc1eb5 adds failures.txt):
(nvidia-smi --query-gpu=memory.used --format=csv,noheader -l 10 > $OUT/mem.txt 2>&1 &)
OUT=$OUT COMMIT=ddc1eb5 WORKERS=10 SUITE_TIMEOUT=330 bash benchmarks/h200_suite.sh
# suite-ddc1eb5/: 65 passed, 2 failed, 3 skipped in 175.6 s.  Both failures (failures.txt) are
# test_capacity_graphs_replay_exactly_under_src[SR-True] and [SRc-True] at the test's last lines: it read
# capacity_stats()["built"]["256 mel frames"], whose key with shared captures is "256 mel frames, shared
# captures"; every chunk before that was replayed and exact.  Fixed in e515bc6 (the test only).

# Fourth call (warm, 118.4 s), at e515bc6:
OUT=$OUT COMMIT=e515bc6 WORKERS=2 SUITE_TIMEOUT=120 bash benchmarks/h200_suite.sh \
  -k "test_capacity_graphs_replay_exactly_under_src and True"
# suite-rerun-e515bc6/: 2 passed (the two ray tests skipped: no ray wheel carried).
