# Session forty-five, 2026-12-05, through the device tool (kind nvidia-h100-x1: one NVIDIA H100 80GB HBM3,
# driver 580.159.04, torch 2.11.0+cu130, Python 3.12.3), carry [".whl"], library at 58ede31 (every sha256
# in suite-58ede31/gpu-files.txt (41 files) and traffic-seed5/gpu.txt (40 files) checked against
# `git show 58ede31:<file>`: all equal).
#
# First call (fresh machine, 184.7 s): the GPU suite at 10 workers, first run on the idle-time builds
# and captures of a voice's own programs of another branch class (session 44's 42c6ec1, 078d72a, f67537d).
C=58ede31; . benchmarks/device_env.sh $C cadence_fx/capacity_executable.py cadence_fx/capacity_class.py \
  cadence_fx/integrations/stepaudio2/dropin.py cadence_fx/tools/traffic.py cadence_fx/tools/traffic_report.py \
  tests/conftest.py
mkdir -p /tmp/r/suite
OUT=/tmp/r/suite COMMIT=$C WORKERS=10 SUITE_TIMEOUT=450 bash benchmarks/h200_suite.sh
# suite-58ede31/: 67 passed, 3 skipped (the two Ray tests: no ray wheel carried; one needs two GPUs)
# in 172.7 s.  No failures.txt: nothing failed.
#
# Second call (warm, 550.8 s), same library: issue 15's traffic at seed 5, the seed whose traffic sends
# windows and flushes of a voice's other branch class (session 44's count):
SEED=5 bash benchmarks/issue15_call.sh 58ede31 575 --idle
# = python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --conversations 8 --seed 5 \
#     --capacity 500 --prepare --shared-captures --idle --json --out /tmp/r/traffic
# traffic-seed5/: exact (all 157 chunks: waveform, PCM, state), program and replayed share 1.0, no
# fallback; TTFA p50 348.0 ms against stock's 466.2 (0.75x); chunk p50 59.05 ms, p99 8454.59 ms (143x):
# the p99 target is NOT met.  Why: conversation 8's voice (138 tokens, 276 mel frames; 276 + 99 = 375,
# which 25 divides) is in the steady chunk's other branch class, so capacity 500's graphs refuse it
# and it ran on its class's capacity, 476 frames, built when it came (its time to first audio:
# 43,712.8 ms against stock's 411.8) with none of the window and flush shapes --prepare built at 500:
# its 13- and 30-token windows and 14-, 3- and 12-token flushes each built on the chunk (4.2-12.9 s).
# The idle-time builds of a voice's own programs did their job elsewhere: 10 built and captured in
# idle time (conversations 1, 4 and 5's other-class windows and flushes), none left to a chunk.
#
# Since: prepare_capacity builds the capacities of the other branch classes too (449d971: prompt_tokens=,
# default every length upstream streams; traffic --prepare passes its prompt range).
#
# Third call (fresh machine, 230.8 s), library at 449d971 (every sha256 in suite-449d971/gpu-files.txt,
# 42 files, checked against `git show 449d971:<file>`: all equal):
C=449d971; . benchmarks/device_env.sh $C cadence_fx/capacity_executable.py cadence_fx/capacity_class.py \
  cadence_fx/capacity_prepare.py cadence_fx/integrations/stepaudio2/dropin.py cadence_fx/tools/traffic.py \
  cadence_fx/tools/traffic_report.py tests/integrations/test_capacity_executable.py
OUT=/tmp/r/suite COMMIT=$C WORKERS=10 SUITE_TIMEOUT=280 bash benchmarks/h200_suite.sh
# suite-449d971/: 68 passed, 3 skipped in 128.1 s; the new CUDA test
# test_a_prepared_class_voice_replays_exactly_building_and_capturing_nothing took 56.1 s.
timeout 275 python3 -m cadence_fx traffic --device cuda --rules SRc --n-timesteps 5 --conversations 2 --turns 2 \
  --seed 5 --prompt-range 138,138 --window-range 10,10 --flush-range 3,3 --capacity 500 --prepare \
  --shared-captures --idle --json --out /tmp/r/class
# class-voices/: two voices of seed 5's class length (138 tokens, 276 frames), prepare covering it: capacity
# 500's graphs, its class's capacity (476 frames) built and both capacities' 13-token window and 3-token
# flush built and captured, in 69.9 s.  Exact (27 chunks), replayed share 1.0, no fallback; time to first
# audio 243.9 and 173.3 ms against stock's 257.1 and 258.0 (43,712.8 ms in the seed-5 traffic above,
# without it); chunk p50/p99 52.78/53.12 ms.  The 3-token flush's graph at 476 serves 7 of its class's
# 10 lengths, not 276: that voice's own program was built in idle time (ahead.built 1), none on a chunk.
# Not run: issue 15's full 8-conversation traffic with the class prepared.  Preparing 48 shapes at 500
# took 290.7 s on this H100; with the class's capacity it would take about twice that, so preparing and
# the traffic no longer fit one 600-s call.
#
# Fourth call (fresh machine, 509.8 s), library at 64acc8a (code as 449d971; every sha256 in
# traffic-seed5-classes/gpu.txt checked against `git show 64acc8a:<file>`: all equal), to measure how
# long preparing takes with the class's capacity:
SEED=5 bash benchmarks/issue15_call.sh 64acc8a 500 --idle
# traffic-seed5-classes/log.txt: cut at 500 s (rc 124) while still capturing capacity 500's graphs
# (26 of 50), before its class's capacity: on this fresh machine capacity 500's own preparing took
# longer than 500 s, against 290.7 s in the second call (a warm machine) and 425.2 s in session 44's
# (fresh).  Device time left after it: 61 s.
