# Session fifty-one, 2026-12-06: four device calls on nvidia-h100-x1 (NVIDIA H100 80GB HBM3, driver
# 580.159.04, torch 2.11.0+cu130, Python 3.12.3), carry [".whl"].  Budget 1,800 s -> 42 s.
# Each gpu.txt's sha256 lines were checked here against `git show <commit>:<file>`: 44 files a
# call, all equal.
#
# Call 1 (09:03, a fresh machine, timeout 600, wall 490 s, tree 7e627a4): issue 15's traffic,
# shards and traffic in one call.
PREPARE_WORKERS=8 SEED=5 bash benchmarks/issue15_call.sh 7e627a4 575 --idle
#   call1-traffic-seed5/: the 8 shards built every one of the 96 shapes (prepare-*.json) in 125 s;
#   the traffic loaded and captured them all (188.1 s), ran conversations 1-7, and raised CUDA out
#   of memory opening conversation 8, in the driver's copy.deepcopy of a stock tail (its 1.95 GiB
#   att_cache_buffer): 72.76 GiB allocated by PyTorch, 1.0 GiB of it in private pools (log.txt,
#   its end).  No chunk was compared wrong; no report (it raised).
#
# Call 2 (09:11, warm, timeout 600, wall 204 s, tree 7e627a4): the GPU suite, 8 workers.
C=7e627a4; mkdir -p $OUT/suite; OUT=$OUT/suite COMMIT=$C bash benchmarks/h200_suite.sh > $OUT/suite/stdout.txt 2>&1
#   call2-suite/: **77 passed, 3 skipped in 198.6 s** (skipped: the two Ray tests, no Ray wheel
#   carried; one test that needs two GPUs).  The first full pass of the GPU suite in one run since
#   session 49's (85decae): sessions 49-50's code, the recapture after out of memory (runtime/midstream.py) with
#   its working-session and R/Rc extensions, the conftest memory hooks.  gpu_memory.txt: each
#   test's peak device memory, heaviest first (11.7 GiB: the restart test).
#
# Call 3 (09:15, warm, timeout 600, wall 304 s, tree 7e627a4): the traffic at seed 0, loading the
# shards' graphs from .cfx (the machine kept it).
SEED=0 bash benchmarks/issue15_call.sh 7e627a4 560 --idle
#   call3-traffic-seed0/: loaded and captured the 96 shapes (192.1 s), conversations 1-7, then the
#   same CUDA out of memory opening conversation 8 (73.50 GiB allocated, 0.88 GiB in private pools).
#   Session 44 ran these 8 conversations at 61,269 MiB peak with one capacity's 48 shapes; since
#   session 45 --prepare also captures the 476-frame class's 48.  Found on the CPU (capture faked,
#   benchmarks/working_copies.py): each graph on a working arena held clones of its own of its
#   static inputs (what it reads from the eager islands), 200-380 MB a graph at capacity 500 and
#   2 flow steps.  Fixed in 4f999c1: every graph's static inputs in the working pool's one copy
#   buffer (runtime/pools.py).
#
# Call 4 (10:00, a fresh machine, timeout 600, wall 600 s: cut, tree 4f999c1): the traffic with
# the fix, shards and traffic in one call.
PREPARE_WORKERS=8 SEED=5 bash benchmarks/issue15_call.sh 4f999c1 575 --idle
#   call4-traffic-seed5-fix/ (the last 60-s tarball): shards 128-153 s (every shape served); the
#   traffic's loading and captures took 292.6 s this time (188-192 s in calls 1 and 3: loading a
#   graph 0.4-0.7 s against 0.2-0.3 s, the whole host slower), then conversations 1-4 with no
#   error until the device's limit cut the call (the script's limit counted from after its
#   set-up: fixed, issue15_call.sh).  No verdict: the traffic did not finish.
