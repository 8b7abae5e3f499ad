"""Do sessions' CUDA graphs share a capture stream, and with it cuBLAS's workspace? (CUDA probe)

Each session captures on ``torch.cuda.Stream()``, which PyTorch hands out round robin from a
pool per device and priority (not a new CUDA stream), and PyTorch keys cuBLAS's workspace by
(handle, stream): graphs captured on one stream bake in one workspace address.  Open PyTorch
reports (pytorch#193402) say that destroying a graph clears the workspaces of its capture
stream while other live graphs captured there still use them.  This probe measures, on this
torch and device, under the deterministic protocol (``CUBLAS_WORKSPACE_CONFIG=:4096:8``):

1. ``pool``: distinct CUDA streams among 64 ``torch.cuda.Stream()`` objects.
2. ``freed_on_destroy`` (read with ``--capture-on one``): device memory freed when a graph captured on a stream is destroyed
   while another graph captured on the same stream lives (its workspace?).
3. ``after_free``: that live graph replayed after a tensor took the freed memory: does it
   still compute what eager computes, and is the tensor untouched?
4. ``concurrent``: two live graphs captured on one stream (``--capture-on two``: each on a
   pooled stream of its own; ``own``: each on a session's stream, ``runtime/streams.py``)
   replayed at once on two streams, ``--rounds`` times: every output against its graph's
   replay alone.

The GEMM is skinny with a long inner dimension (``--m``, ``--k``), shapes cuBLAS tends to
split over K through its workspace.  Prints one JSON line.

    CUBLAS_WORKSPACE_CONFIG=:4096:8 python3 benchmarks/stream_workspace_probe.py
"""

from __future__ import annotations

import argparse
import gc
import json

import torch


def capture(fn, stream: torch.cuda.Stream):
    stream.wait_stream(torch.cuda.current_stream())  # the inputs are made on the current stream
    with torch.cuda.stream(stream):
        fn()  # warm-up on the stream: the handle's workspace for this stream
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        out = fn()
    torch.cuda.synchronize()
    return g, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--k", type=int, default=1 << 16)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--capture-on", choices=["one", "two", "own"], default="one",
                    help="one: both graphs captured on one pooled stream (the hazard); two: each on a pooled "
                         "stream of its own; own: each on a stream runtime/streams.py gives a session (made "
                         "outside PyTorch's pool: what sessions capture on)")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}

    streams = [torch.cuda.Stream() for _ in range(64)]
    out["pool"] = {"created": 64, "distinct": len({s.cuda_stream for s in streams})}

    torch.manual_seed(0)
    a1, b1 = torch.randn(args.m, args.k, device=dev), torch.randn(args.k, args.m, device=dev)
    a2, b2 = torch.randn(args.m, args.k, device=dev), torch.randn(args.k, args.m, device=dev)
    want1, want2 = a1 @ b1, a2 @ b2  # eager, on the current stream
    if args.capture_on == "own":
        from cadence_fx.runtime import streams as own
        s, s2 = own.take(dev), own.take(dev)
    else:
        s = torch.cuda.Stream()
        s2 = s
        while args.capture_on == "two" and s2.cuda_stream == s.cuda_stream:
            s2 = torch.cuda.Stream()  # the pool's next stream
    out["capture_on"] = {"mode": args.capture_on, "distinct_streams": s.cuda_stream != s2.cuda_stream}
    g1, o1 = capture(lambda: a1 @ b1, s)
    g1.replay(); torch.cuda.synchronize()
    solo1 = o1.clone()
    g2, o2 = capture(lambda: a2 @ b2, s2)
    g2.replay(); torch.cuda.synchronize()
    solo2 = o2.clone()
    out["solo_equals_eager"] = [bool(torch.equal(solo1, want1)), bool(torch.equal(solo2, want2))]

    # 4. concurrent replays of two live graphs captured on the same stream
    x, y = torch.cuda.Stream(), torch.cuda.Stream()
    bad = 0
    for _ in range(args.rounds):
        torch.cuda.synchronize()
        with torch.cuda.stream(x):
            g1.replay()
        with torch.cuda.stream(y):
            g2.replay()
        torch.cuda.synchronize()
        bad += int(not torch.equal(o1, solo1)) + int(not torch.equal(o2, solo2))
    out["concurrent"] = {"rounds": args.rounds, "outputs_differing": bad}

    # 2. destroy g2 while g1 (same capture stream) lives
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    del g2, o2
    gc.collect()
    torch.cuda.synchronize()
    freed = before - torch.cuda.memory_allocated()
    out["freed_on_destroy_bytes"] = int(freed)

    # 3. a tensor takes freed memory; g1 replays
    fill = torch.full((max(freed, 1 << 25) // 4,), 7.0, device=dev)
    torch.cuda.synchronize()
    ok, untouched = True, True
    for _ in range(20):
        g1.replay()
        torch.cuda.synchronize()
        ok &= bool(torch.equal(o1, solo1))
        untouched &= bool((fill == 7.0).all())
    out["after_free"] = {"replay_equal": ok, "other_tensor_untouched": untouched}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
