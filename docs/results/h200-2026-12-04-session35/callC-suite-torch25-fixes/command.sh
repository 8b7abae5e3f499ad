#!/bin/bash
# session 35 call C (985136c): the GPU suite after the torch 2.5 fixes (trace memo key, one fake mode
# asked once, autocast recorded where make_fx drops it (a no-op where torch records it: which, printed
# below), StateRewrite through whole-dim slices, the stock-state drift check on a returned constant)
set -u
C=985136c
. benchmarks/device_env.sh $C cadence_fx/passes/trace.py cadence_fx/passes/trace_memo.py cadence_fx/passes/state_rewrite.py cadence_fx/passes/trace_symbolic.py cadence_fx/compiler.py
mkdir -p /tmp/r/suite
python3 -c "from cadence_fx.passes import trace; print('torch records autocast itself:', trace._records_autocast(), '| make_fx asks the tracing context:', trace.make_fx_asks_the_context())" | tee /tmp/r/probes.txt
OUT=/tmp/r/suite COMMIT=$C WORKERS=16 SUITE_TIMEOUT=300 bash benchmarks/h200_suite.sh > /tmp/r/suite/stdout.txt 2>&1; echo "suite rc=$?"; grep -E " passed| failed" /tmp/r/suite/pytest-cuda.log | tail -2; grep -E "^FAILED|^E  " /tmp/r/suite/pytest-cuda.log | head -12
(cd /tmp && tar czf $OUT/r.tgz r)
