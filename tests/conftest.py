import os

# The deterministic protocol needs cuBLAS's workspace fixed before the first CUDA
# call of the process (GPU tests only; harmless on CPU).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

# Under pytest-xdist (README's test command: two workers on the 2-core CI machine) each
# worker runs one torch thread, so the workers do not contend for the cores; set before
# torch is imported, and inherited by the CLI subprocesses the tests start.  Every test
# compares stock and optimized in one process, at one thread count.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    import sys
    if "torch" in sys.modules:  # imported already (by a plugin): set it directly too
        sys.modules["torch"].set_num_threads(1)

import tempfile
import types

# The program cache on disk (cadence_fx.programs.disk): one temporary directory per
# test session, never the user's (every optimize() in the suite, and every CLI
# subprocess, reads and writes here; removed when the session's process exits).
_PROGRAM_CACHE = tempfile.TemporaryDirectory(prefix="cadence_fx_test_cache_")
os.environ["CADENCE_FX_CACHE_DIR"] = _PROGRAM_CACHE.name

import pytest


@pytest.fixture(scope="session")
def t2w():
    """The released Token2Wav tail (seed 0) at 2 flow steps and ONE optimized model on it
    (rule S), shared by every test file: its executables (one per prompt length) are
    traced once per test run.  Tests must not assume it is fresh (other files may have
    opened sessions or traced other prompt lengths): compare counts before and after."""
    from cadence_fx.integrations import stepaudio2 as s2
    import cadence_fx
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow, hift, n_timesteps=2)
    return types.SimpleNamespace(tail=tail, opt=cadence_fx.optimize(tail), steps=2)
