# Session forty-eight, 2026-12-06: the one device call that found a machine (fourteen tries before
# it did not; 1,800 s of budget down to 193 s).  run(kind unnamed -> nvidia-h100-x1: one NVIDIA
# H100 80GB HBM3, driver 580.159.04, torch 2.11.0+cu130, Python 3.12.3), carry [".whl"],
# timeout_s 590; the working tree was 4047508, clean.  The call hit its 590-s limit (rc 124).
C=4047508; rm -f /tmp/suite.done; mkdir -p $OUT/suite; ( OUT=$OUT/suite COMMIT=$C WORKERS=6 SUITE_TIMEOUT=300 bash benchmarks/h200_suite.sh > $OUT/suite/stdout.txt 2>&1; echo "suite rc=$? at $SECONDS s" > /tmp/suite.done ) & SEED=5 PREPARE_WORKERS=8 WAIT_FOR=/tmp/suite.done bash benchmarks/issue15_call.sh $C 540 --idle; cat /tmp/suite.done; tail -22 $OUT/suite/stdout.txt | cut -c1-220
# suite-4047508/: the suite's gpu.txt, stdout (pytest -rs --durations), failures.txt and the
# verify JSONs it keeps.  prepare/: the eight shard processes' JSON and stderr (prepare-1 died
# of CUDA out of memory).  The traffic itself never started: the script waited at a bare
# `wait` for its own tar ticker (fixed after this call).
