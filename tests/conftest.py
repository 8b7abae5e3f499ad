import os

# The deterministic protocol needs cuBLAS's workspace fixed before the first CUDA
# call of the process (GPU tests only; harmless on CPU).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

# Under pytest-xdist (README's test command: two workers on the 2-core CI machine) each
# worker runs one torch thread, so the workers do not contend for the cores; set before
# torch is imported, and inherited by the CLI subprocesses the tests start.  Every test
# compares stock and optimized in one process, at one thread count.
# Inductor (moshi compiles its rope on CUDA: tests/tools/test_bench_mimi.py) compiles in the
# worker itself, not in a pool of subprocesses that each hold a CUDA context for the worker's life
# (session fifty: 7 processes of 1.1 GiB that were not the GPU suite's workers helped run the
# card out of memory; perhaps those, not confirmed).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import sys
    if "torch" in sys.modules:  # imported already (by a plugin): set it directly too
        sys.modules["torch"].set_num_threads(1)

import tempfile
import types

# The program cache on disk (cadence_fx.programs.disk): one temporary directory per
# test session, never the user's (every optimize() in the suite, and every CLI
# subprocess, reads and writes here; removed when the session's process exits).
# Shared by the pytest-xdist workers: the controller makes it and the workers (started
# with the controller's environment) reuse it, so a program one worker traced is a disk
# hit in the other (the cache serializes a key's trace across processes: programs/disk.py).
_SHARED = "_CADENCE_FX_TEST_CACHE_DIR"
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(_SHARED) \
        and os.environ.get("CADENCE_FX_CACHE_DIR") == os.environ[_SHARED]:
    _PROGRAM_CACHE = None  # the controller's, removed when it exits
else:
    _PROGRAM_CACHE = tempfile.TemporaryDirectory(prefix="cadence_fx_test_cache_")
    os.environ["CADENCE_FX_CACHE_DIR"] = os.environ[_SHARED] = _PROGRAM_CACHE.name

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


@pytest.fixture(scope="session")
def t2w_mini():
    """The tests of mechanisms' Token2Wav: the released architecture with fewer blocks and
    narrower HiFT channels (tests/helpers/mini_token2wav.py says what it keeps), seed 0,
    2 flow steps, and ONE optimized model on it (rule S), shared like ``t2w``."""
    from helpers.mini_token2wav import mini_tail
    import cadence_fx
    tail = mini_tail(n_timesteps=2, seed=0)
    return types.SimpleNamespace(tail=tail, opt=cadence_fx.optimize(tail), steps=2)


# Seconds per file in a run of the suite (2 cores, two workers; session fifty's
# ``--durations=0``, 2026-12-06: setup, call and teardown summed, files of 12 s and more),
# heaviest first: pytest-xdist's ``--dist loadfile`` hands files out in order, and by
# default orders them by their number of tests, which put the few-test, minutes-long files
# last and left one worker idle while the other finished them.  Only the order depends on
# these numbers (a stale one costs minutes, never a check); a file not listed runs after
# them, in collection order.  (Session twenty-seven tried its own durations against another
# order: within the machine's spread.)
_FILE_SECONDS = {
    "tests/integrations/test_capacity_executable.py": 215, "tests/integrations/test_token2wav.py": 109,
    "tests/serving/test_ray.py": 96, "tests/integrations/test_working_arena.py": 57,
    "tests/integrations/test_mimi.py": 49, "tests/tools/test_traffic.py": 45,
    "tests/programs/test_disk_cache.py": 40, "tests/integrations/test_shared_steps.py": 38,
    "tests/tools/test_serve_cmd.py": 34, "tests/integrations/test_prompt_lengths.py": 28,
    "tests/passes/test_capacity.py": 25, "tests/runtime/test_misuse.py": 23,
    "tests/integrations/test_background.py": 23, "tests/serving/test_multi_session.py": 13,
    "tests/tools/test_bench.py": 13, "tests/integrations/test_generic.py": 12,
}


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # the controller's scheduler: keep our order
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: -_FILE_SECONDS.get(item.nodeid.split("::")[0], 0))  # stable: in-file order kept


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test in a process that uses the GPU (its fixtures torn down): the memory the
    caching allocator still holds goes back to the device.  The GPU suite's workers share one
    card, and a worker keeps what its allocator reserved for a heavy test through its later
    tests: in session fifty (an H100, 8 workers) the restart test ran out of memory while the
    7 other workers held 5.7-13.2 GiB each (not all of it in use, which this hook frees).  Skipped
    while a build or capture holds ``device_work.LOCK`` (a test's background worker): nothing
    is freed beside a capture.
    With ``CADENCE_RESULTS_DIR`` set (the device scripts), each such test's peak device memory
    (allocated and reserved, MiB, since the last test of its process) is appended to
    ``gpu_memory.txt`` there: which tests are the heavy ones."""
    yield
    import sys
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    where = os.environ.get("CADENCE_RESULTS_DIR")
    if where:
        mib = 2 ** 20
        line = (f"{item.nodeid} allocated {torch.cuda.max_memory_allocated() // mib} MiB reserved "
                f"{torch.cuda.max_memory_reserved() // mib} MiB worker {os.environ.get('PYTEST_XDIST_WORKER', '-')}\n")
        with open(os.path.join(where, "gpu_memory.txt"), "a") as out:  # one short append per test
            out.write(line)
        torch.cuda.reset_peak_memory_stats()
    from cadence_fx.runtime import device_work
    if not device_work.LOCK.acquire(blocking=False):
        return
    try:
        import gc
        gc.collect()
        torch.cuda.empty_cache()
    finally:
        device_work.LOCK.release()


def pytest_runtest_logreport(report):
    """With ``CADENCE_RESULTS_DIR`` set (the device scripts), write each failure there the
    moment it is reported (``failures.txt``), so a run the device's time limit kills still
    says which tests failed and why (pytest prints its summary only at the end)."""
    where = os.environ.get("CADENCE_RESULTS_DIR")
    if not where or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):  # the controller writes
        return
    text = str(report.longrepr)
    with open(os.path.join(where, "failures.txt"), "a") as out:
        out.write(f"==== {report.nodeid} ({report.when}, {report.duration:.1f} s)\n")
        out.write("\n".join(text.splitlines()[-80:]) + "\n")
