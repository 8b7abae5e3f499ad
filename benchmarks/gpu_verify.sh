#!/usr/bin/env bash
# GPU exactness matrix (run on the lent H200): verify --device cuda for each rules/dtype/steps cell.
# Usage: benchmarks/gpu_verify.sh OUTDIR "SRc:float32:5 SRc:float16:5 ..." [JOBS]
# Cells run JOBS at a time (default 1).  Verify checks exactness, which concurrency does
# not change (each process is deterministic under the protocol); its per-chunk timings
# are only indicative when JOBS > 1 -- speed claims come from `cadence-fx bench`.
set -u
out=${1:-.}; cells=${2:-"SRc:float32:5 SRc:float16:5 SRc:float32:10 SR:float32:5"}; jobs=${3:-1}
mkdir -p "$out"
cell() {
  IFS=: read -r rules dtype nt <<<"$1"
  name="verify-${rules}-${dtype}-nt${nt}"
  OMP_NUM_THREADS=2 python3 -m cadence_fx verify --device cuda --rules "$rules" --dtype "$dtype" --n-timesteps "$nt" \
    --chunks 14 --final-tokens 10 --json >"$out/$name.json" 2>"$out/$name.log"
  rc=$?
  python3 - "$out/$name.json" "$rc" "$name" <<'PY'
import json, sys
try:
    d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
    print(f"{sys.argv[3]}: rc={sys.argv[2]} exact={d['exact']} chunks={d['chunks']} fallbacks={d['fallback_reasons']} "
          f"mismatched_chunks={[m['chunk'] for m in d['mismatches']]} compile_s={d['compile_s']}", flush=True)
except Exception as e:
    print(f"{sys.argv[3]}: rc={sys.argv[2]} no JSON ({e})", flush=True)
PY
}
export -f cell
export out
printf '%s\n' $cells | xargs -P "$jobs" -I{} bash -c 'cell {}'
