# 2026-12-03, the CPU machine (2 cores, torch 2.13.0+cpu, Python 3.11), tree at d8ad28b
# (the scratch plugin this run used is benchmarks/suite_breakdown.py's WRAPPED list, verbatim)
mkdir -p /tmp/sb && SUITE_BREAKDOWN_DIR=/tmp/sb PYTHONPATH=benchmarks CADENCE_FX_CACHE_DIR=$(mktemp -d) \
    python -m pytest tests -q -n 2 --dist loadfile -p suite_breakdown -p no:cacheprovider
# -> 575 passed, 59 skipped in 634.36 s (10 min 38 s wall; user 16 min 0 s, sys 1 min 52 s)
python benchmarks/suite_breakdown.py /tmp/sb > report.txt
