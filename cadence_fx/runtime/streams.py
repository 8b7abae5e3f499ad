"""Capture streams that no two live sessions share.

PyTorch keys cuBLAS's workspace by (handle, stream), and a CUDA graph bakes in the
workspace of the stream it was captured on.  ``torch.cuda.Stream()`` does not make a CUDA
stream: it hands out a pool of 32 per device and priority, round robin.  So sessions that
captured on ``torch.cuda.Stream()`` shared a stream once 32 had been made, and with it one
workspace: replayed at once (overlapped sessions, ``Token2WavSession.submit``), their
GEMMs wrote each other's partial sums.  Measured on the H200, torch 2.11
(``benchmarks/stream_workspace_probe.py``, ``docs/results/h200-2026-12-03-session30/
call3-probe-traffic/``): 64 streams made, 32 distinct; two live graphs captured on one
stream, replayed together on two other streams, differed from their solo replays in 23 of
200 rounds (64 x 65536 @ 65536 x 64, fp32) and in 400 of 400 (256 x 32768); each on a
stream from ``take``, in 0 of 200 and 0 of 400 (``--capture-on own``,
``h200-2026-12-04-session31/call1-streams-suite/``).

``take(device)`` gives a session a capture stream of its own: one a session gave back, else
a new CUDA stream (``cuStreamCreate`` through the driver, non-blocking as PyTorch's own,
wrapped as ``torch.cuda.ExternalStream``).  A stream is never destroyed (cuBLAS keeps its
workspaces keyed by the stream's handle for the process); it is given back when its
session can replay no more: ``Session.close()`` with no step running, or the session
collected (``held``).  The next owner's capture begins with a device synchronize
(``graphs.capture_entry``), after which nothing the old owner launched still runs.

A session's first entry warms its capture stream up (each region run eagerly before it
is captured: cuBLAS's workspace for the stream and the thread's handle, and whatever
else a library makes on first use, made outside capture), and its later entries capture
unwarmed.  ``warmed`` / ``is_warm``: a stream warmed on a thread stays warm for that
thread, so the next session that takes it back there captures its first entry unwarmed
too (a capture that fails unwarmed is still warmed up and captured again,
``graphs.capture_entry``): a new voice's set-up then skips one eager run of an entry.
``prime``: a stream new to a thread that has warmed another stream up (its libraries'
handles made, its kernels loaded: what is per thread or per process) needs only what is
per stream, cuBLAS's workspace; a few tiny GEMMs on it make that, instead of an entry's
eager run (a drop-in's second voice, set up while the first still holds its stream).
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any

import torch

_lock = threading.Lock()
_free: dict[int, list] = {}  # device index -> streams given back
_made = 0
_driver_lib = None
_contexts: dict[int, Any] = {}  # device index -> its primary context, retained once for the process
_warm: set = set()  # (device index, stream handle, thread) of each stream a capture warmed up on a thread


def take(device: "torch.device | str | int") -> Any:
    """A capture stream on ``device`` that no live session holds."""
    index = _index(device)
    with _lock:
        free = _free.get(index)
        if free:
            return free.pop()
    return _create(index)


def give_back(device: "torch.device | str | int", stream: Any) -> None:
    """``stream`` may go to the next session: its own can replay no more."""
    with _lock:
        _free.setdefault(_index(device), []).append(stream)


def _warm_key(stream: Any) -> tuple:
    device = getattr(stream, "device", None)
    return getattr(device, "index", None), getattr(stream, "cuda_stream", id(stream)), threading.get_ident()


def warmed(stream: Any) -> None:
    """A capture on ``stream`` from this thread was warmed up (its regions ran eagerly first)."""
    with _lock:
        _warm.add(_warm_key(stream))


def is_warm(stream: Any) -> bool:
    """Whether a capture on ``stream`` from this thread was warmed up before (streams are
    never destroyed, so a handle names one stream for the process)."""
    with _lock:
        return _warm_key(stream) in _warm


def needs_warm_up(stream: Any, cuda: bool, warmed_before: bool) -> bool:
    """Whether a capture on ``stream`` runs its regions eagerly first (every capture path
    asks here): on CUDA, not where this thread warmed it up or primes it now; a CPU fake
    (``cuda`` False, tests), until its owner's first capture ran (``warmed_before``)."""
    return not (is_warm(stream) or prime(stream)) if cuda else not warmed_before


def prime(stream: Any) -> bool:
    """Warm ``stream`` for this thread with a few tiny GEMMs (cuBLAS's workspace for the
    stream and this thread's handle, through the plain and the bias-fused paths), if this
    thread has warmed another stream of its device up before; returns whether it did
    (then ``is_warm``)."""
    index, _, ident = _warm_key(stream)
    with _lock:
        if not any(dev == index and thread == ident for dev, _, thread in _warm):
            return False
    device = stream.device
    with torch.cuda.stream(stream):
        a = torch.ones(16, 16, device=device)
        torch.mm(a, a), torch.bmm(a[None], a[None]), torch.nn.functional.linear(a, a, a[0])
    torch.cuda.synchronize(device)
    warmed(stream)
    return True


def held(owner: object, device: "torch.device | str | int", stream: Any) -> weakref.finalize:
    """Give ``stream`` back when ``owner`` is collected, or when the returned finalizer is
    called (at most once either way)."""
    return weakref.finalize(owner, give_back, device, stream)


def stats() -> dict:
    """``made``: CUDA streams created; ``free``: given back and not taken again, per device."""
    with _lock:
        return {"made": _made, "free": {i: len(s) for i, s in _free.items() if s}}


def _index(device: "torch.device | str | int") -> int:
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        return -1  # (a CPU test's faked capture stream)
    return device.index if device.index is not None else torch.cuda.current_device()


def _driver():
    global _driver_lib
    if _driver_lib is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")  # the driver PyTorch's CUDA runtime runs on
        except OSError as e:
            raise RuntimeError(f"cadence_fx: cannot load the CUDA driver library libcuda.so.1 ({e}) to make a "
                               f"session's capture stream (runtime/streams.py: pooled streams would share cuBLAS "
                               f"workspaces across sessions); replay needs it on the library path") from e
        p, i = ctypes.c_void_p, ctypes.c_int
        for name, args in (("cuInit", [ctypes.c_uint]), ("cuDeviceGet", [ctypes.POINTER(i), i]),
                           ("cuDevicePrimaryCtxRetain", [ctypes.POINTER(p), i]),
                           ("cuCtxPushCurrent_v2", [p]), ("cuCtxPopCurrent_v2", [ctypes.POINTER(p)]),
                           ("cuStreamCreate", [ctypes.POINTER(p), ctypes.c_uint])):
            getattr(lib, name).argtypes, getattr(lib, name).restype = args, i
        _driver_lib = lib
    return _driver_lib


def _check(result: int, call: str) -> None:
    if result != 0:
        raise RuntimeError(f"cadence_fx: {call} failed with CUDA driver error {result} while making a capture "
                           f"stream of a session's own")


def _create(index: int) -> Any:
    """A new CUDA stream on device ``index``, in the primary context the CUDA runtime uses."""
    global _made
    torch.cuda.init()
    lib = _driver()
    _check(lib.cuInit(0), "cuInit")
    handle = ctypes.c_void_p()
    with _lock:
        ctx = _contexts.get(index)
        if ctx is None:  # retained once (every stream made lives as long as the process)
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            _check(lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
            _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            _contexts[index] = ctx
    _check(lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
    try:
        _check(lib.cuStreamCreate(ctypes.byref(handle), 1), "cuStreamCreate")  # CU_STREAM_NON_BLOCKING
    finally:
        lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    with _lock:
        _made += 1
    return torch.cuda.ExternalStream(handle.value, device=torch.device("cuda", index))
