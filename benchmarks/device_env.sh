# Sourced at the start of a device call (the `device` tool's H200, no network there):
#   . benchmarks/device_env.sh <commit> [files to hash...]
# installs the wheels carried in .whl/ (`run`'s carry: [".whl"]; which ones: docs/results/README.md)
# into .site, sets the deterministic protocol and the program cache, and writes /tmp/r/gpu.txt:
# GPU, driver, torch, Python, date, the commit the caller names (the device copy's git metadata can
# lag the working tree it got: name the commit here, then check every sha256 line on this side
# against `git show <commit>:<file> | sha256sum`), and the sha256 of every pass, compiler.py and
# runtime file plus the files given.  Outputs go under /tmp/r; `tar czf $OUT/r.tgz -C /tmp r` sends
# them back.
rm -rf /tmp/r; mkdir -p .site .cfx /tmp/r  # a warm machine keeps /tmp: nothing of an earlier call comes back
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl >/dev/null 2>&1 \
  || echo "device_env: installing the carried wheels failed (is .whl/ carried?)" >&2
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 \
  CADENCE_FX_CACHE_DIR=$PWD/.cfx
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"
  date -u
  echo "tree: ${1:-unknown} (check: sha256 below against git show ${1:-<commit>}:<file>)"
  shift 2>/dev/null
  sha256sum cadence_fx/passes/*.py cadence_fx/compiler.py cadence_fx/runtime/*.py "$@"; } > /tmp/r/gpu.txt
