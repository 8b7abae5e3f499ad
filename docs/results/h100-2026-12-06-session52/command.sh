# Session fifty-two, 2026-12-06: three device calls on nvidia-h100-x1 (NVIDIA H100 80GB HBM3, driver
# 580.159.04, torch 2.11.0+cu130, Python 3.12.3), carry [".whl"], after five calls no machine could
# be started for (90 s of device time each).  Budget 1,800 s -> 1,349 s before the first ran -> 166 s.
# Tree 6d0d26b in all three (the library as at 4999735; the commits after it touch docs only).
# Each gpu.txt's sha256 lines (call1-prepare/, call2-*/, call3-*/) were checked here against
# `git show 6d0d26b:<file>`: 44 files a call, all equal.
#
# Call 1 (12:28, a fresh machine, timeout 600, wall 367 s): the GPU suite, then issue 15's shards.
C=6d0d26b; mkdir -p $OUT/suite; (OUT=$OUT/suite COMMIT=$C SUITE_TIMEOUT=330 bash benchmarks/h200_suite.sh > $OUT/suite/stdout.txt 2>&1); echo "suite rc=$? at $SECONDS s"; tail -4 $OUT/suite/stdout.txt; PREPARE_ONLY=1 PREPARE_WORKERS=8 SEED=0 bash benchmarks/issue15_call.sh $C 250 --idle
#   call1-suite/: **77 passed, 3 skipped in 211.2 s**, 8 workers (skipped: the two Ray tests, no Ray
#   wheel carried; one test that needs two GPUs).  The first GPU suite on 4f999c1's working-arena
#   copy buffer (GraphPool(every_input=True)) and the rest of session 51's code.
#   call1-prepare/: the 8 shard processes built every window and flush shape of both capacities
#   (500 and 476 mel frames, 96 shapes) into .cfx in 149 s (prepare-*.json).
#
# Call 2 (12:35, warm, timeout 600, wall 364 s): the traffic at seed 0 (loads the shards' graphs).
SEED=0 bash benchmarks/issue15_call.sh 6d0d26b 585 --idle
#   call2-traffic-seed0/ (traffic.json/.md/.png also at the top level as traffic-h100.*):
#   prepared 96/96 shapes in 208.6 s (94 loaded from .cfx); 8 conversations, 161 chunks, exact
#   (waveform, PCM, state, every chunk), program_share 1.0, replayed_share 1.0, no fallback;
#   time to first audio p50 276.4 ms (stock 350.6: 0.79x); chunk p50/p99 57.29/59.44 ms (1.04x;
#   stock 184.73/190.96); peak 42,229 MiB (session 51 at 7e627a4: out of memory at 72.8 GiB).
#
# Call 3 (12:41, warm, timeout 580, wall 410 s): the traffic at seed 5 (three windows and flushes
# of a voice's other branch class, built and captured in idle time).
SEED=5 bash benchmarks/issue15_call.sh 6d0d26b 570 --idle
#   call3-traffic-seed5/: prepared 96/96 in 212.6 s (94 loaded); 8 conversations, 157 chunks,
#   exact, program_share 1.0, replayed_share 1.0, no fallback; time to first audio p50 281.3 ms
#   (stock 366.3: 0.77x); chunk p50/p99 58.07/63.54 ms (1.09x; stock 201.69/239.27); peak
#   42,847.8 MiB; two working arenas (500 and 476 mel frames: 60 and 55 graphs, their copy
#   buffers 1,361.6 and 1,307.7 MiB, each grown 13 times).
