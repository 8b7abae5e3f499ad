"""Which failed CUDA-graph capture leaves the process able to abort later (GPU only).

Two GPU test runs with the capture without warm-up (34a5df2) had a pytest worker die
with "Fatal Python error: Aborted" while collecting garbage, in a later test than the
one that made the garbage.  Each case below runs in its own process (an abort kills
only it), without pytest-xdist (so PyTorch's C++ message reaches stderr), and then
collects garbage, allocates, frees, synchronizes and captures again:

- ``raise``: the body of ``torch.cuda.graph`` raises a Python exception after one
  kernel (what ``test_capture_warmup.py`` injects), then ``_release_generator``;
- ``invalidated``: the body synchronizes the device, which invalidates the capture
  (``cudaStreamEndCapture`` then fails: pytorch/pytorch#180395 before 2.12);
- ``invalidated_end``: the same, then ``torch._C._cuda_endAllocateToPool`` on the pool;
- ``invalidated_rng``: the same invalidation inside ``GraphRng.capturing()`` (what a
  session's capture does): is the default generator usable after, and the session's own?
  (On 2.11 the next capture into the pool fails: ``beginAllocateToPool: already
  recording to mempool_id``.)
- ``invalidated_rng_end``: the same, then ``torch._C._cuda_endAllocateToPool`` on the
  pool: does that let the pool take captures again?
- ``invalidated_rng_fresh``: the same invalidation, then what ``graphs.GraphPool`` does
  after a failed capture: the generator's empty capture and every later one go to a
  fresh pool (``graph_pool_handle()``) on the same stream.
- ``warmup_tests``: ``tests/runtime/test_capture_warmup.py`` three times in one process,
  garbage collected between, then ``tests/runtime/test_replay_cuda.py``.

Usage: python benchmarks/capture_fault_probe.py [case ...] > report.json
"""

from __future__ import annotations

import contextlib
import gc
import json
import subprocess
import sys
import time

CASES = ("raise", "invalidated", "invalidated_end", "invalidated_rng", "invalidated_rng_end", "invalidated_rng_fresh",
         "warmup_tests")


def _after(torch, pool, stream) -> None:
    """What a later test does: collect, allocate and free on both streams, sync, capture again."""
    gc.collect()
    for s in (torch.cuda.current_stream(), stream):
        with torch.cuda.stream(s):
            xs = [torch.randn(1 << 16, device="cuda") for _ in range(8)]
            del xs
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    g = torch.cuda.CUDAGraph()
    x = torch.ones(4, device="cuda")
    with torch.cuda.graph(g, pool=pool, stream=stream):
        y = x * 2
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full((4,), 2.0, device="cuda"))
    del g, y
    gc.collect()
    torch.cuda.synchronize()


def case(name: str) -> None:
    import torch
    torch.cuda.init()
    dev = torch.cuda.current_device()
    if name == "warmup_tests":
        import pytest
        rcs = []
        for _ in range(3):
            rcs.append(int(pytest.main(["-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                                        "tests/runtime/test_capture_warmup.py"])))
            gc.collect()
            torch.cuda.synchronize()
        rcs.append(int(pytest.main(["-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                                    "tests/runtime/test_replay_cuda.py"])))
        gc.collect()
        torch.cuda.synchronize()
        print(json.dumps({"pytest_rcs": rcs}))
        return
    from cadence_fx.runtime.graphs import GraphRng, _release_generator
    rng = GraphRng.for_device(torch.device("cuda")) if name.startswith("invalidated_rng") else None
    pool = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream()
    x = torch.randn(1024, device="cuda")
    with torch.cuda.stream(stream):
        x * 2  # warm the stream
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    error = None
    try:
        with rng.capturing() if rng is not None else contextlib.nullcontext():
            with torch.cuda.graph(g, pool=pool, stream=stream):
                x * 3  # one kernel captured
                if name == "raise":
                    raise RuntimeError("injected")
                torch.cuda.synchronize()  # invalidates the capture
    except Exception as e:  # noqa: BLE001
        error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        if name.endswith("_end"):
            try:
                torch._C._cuda_endAllocateToPool(dev, pool)
                error += " | endAllocateToPool: ok"
            except Exception as e2:  # noqa: BLE001
                error += f" | endAllocateToPool: {type(e2).__name__}: {str(e2).splitlines()[0][:200]}"
        if name.endswith("_fresh"):  # as GraphPool.renew after a failed capture
            pool = torch.cuda.graph_pool_handle()
        with rng.capturing() if rng is not None else contextlib.nullcontext():  # as CapturedRegion.capture
            _release_generator(pool, stream)
    del g
    own = None
    if rng is not None:  # the session's own state: can a graph still be captured with it?
        try:
            g2 = torch.cuda.CUDAGraph()
            with rng.capturing(), torch.cuda.graph(g2, pool=pool, stream=stream):
                torch.rand(4, device="cuda")
            rng.replay(g2)
            torch.cuda.synchronize()
            own = "ok"
        except Exception as e:  # noqa: BLE001
            own = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    _after(torch, pool, stream)
    print(json.dumps({"error": error, "own_state_after": own, "after": "ok"}))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--case"]:
        case(argv[1])
        return 0
    import torch
    report = {"torch": torch.__version__, "cases": {}}
    for name in argv or CASES:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-X", "faulthandler", __file__, "--case", name],
                           capture_output=True, text=True, timeout=400)
        report["cases"][name] = {"rc": p.returncode, "s": round(time.perf_counter() - t0, 1),
                                 "stdout_tail": p.stdout[-1500:], "stderr_tail": p.stderr[-3000:]}
        print(f"{name}: rc {p.returncode}", file=sys.stderr, flush=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
