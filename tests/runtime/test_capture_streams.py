"""``runtime/streams.py``: every live session captures on a CUDA stream of its own.

``torch.cuda.Stream()`` hands out 32 pooled streams per device and priority, and a CUDA
graph bakes in the cuBLAS workspace of its capture stream: two sessions that captured on
one pooled stream wrote each other's GEMM partial sums when replayed at once (H200, torch
2.11, ``benchmarks/stream_workspace_probe.py``).  On the CPU the stream factory is faked
(what is checked is who holds which stream when); on CUDA, real streams and real graphs."""

from __future__ import annotations

import gc
import itertools

import pytest
import torch

from cadence_fx.compiler import _compile
from cadence_fx.errors import SessionClosed
from cadence_fx.runtime import streams

from helpers.marks import cuda
from helpers.toy_models import ToyAdapter, make_toy, toy_prompt


class _Stream:
    def __init__(self, n: int):
        self.n = n

    def __repr__(self):
        return f"stream {self.n}"


@pytest.fixture
def fake_streams(monkeypatch):
    """Streams made by a counter; an empty free list for this test alone."""
    made = itertools.count()
    monkeypatch.setattr(streams, "_free", {})
    monkeypatch.setattr(streams, "_create", lambda index: _Stream(next(made)))
    return made


def test_a_stream_is_never_held_twice_and_a_given_back_one_is_taken_again(fake_streams):
    a, b = streams.take(torch.device("cuda", 0)), streams.take(torch.device("cuda", 0))
    assert a is not b
    other = streams.take(torch.device("cuda", 1))
    streams.give_back(torch.device("cuda", 0), a)
    assert streams.stats()["free"] == {0: 1}  # what Session.stats()["capture_streams"] reports
    assert streams.take(torch.device("cuda", 1)) is not a  # another device's free list
    assert streams.take("cuda:0") is a  # the one given back, before a new one
    assert streams.stats()["free"] == {}
    assert streams.take(0) not in (a, b, other)  # none free: a new one


def test_a_stream_is_warm_only_on_the_thread_that_warmed_it(fake_streams, monkeypatch):
    """What lets a session capture its first entry unwarmed (``Session.prepare_replay``):
    the stream, and the thread whose library handles warmed up on it."""
    import threading
    monkeypatch.setattr(streams, "_warm", set())
    a, b = streams.take(0), streams.take(0)
    assert not streams.is_warm(a)
    assert streams.prime(a) is False and not streams.is_warm(a)  # this thread warmed nothing yet: no priming
    streams.warmed(a)
    assert streams.is_warm(a) and not streams.is_warm(b)
    seen = []
    worker = threading.Thread(target=lambda: seen.append((streams.is_warm(a), streams.prime(b))))
    worker.start(), worker.join()
    assert seen == [(False, False)]  # another thread: neither warm nor primed

    class _OnDevice(_Stream):
        device = torch.device("cuda", 1)

    assert streams.prime(_OnDevice(99)) is False  # warmed on this thread, but on another device


def test_a_collected_owner_gives_its_stream_back_once(fake_streams):
    class Owner:
        pass

    owner = Owner()
    s = streams.take(torch.device("cuda", 0))
    give = streams.held(owner, torch.device("cuda", 0), s)
    del owner
    gc.collect()
    assert not give.alive and streams._free[0] == [s]
    give()  # already given back: nothing more
    assert streams._free[0] == [s]


def _session_on_fake_cuda():
    """A real Session (the toy, rule S, on the CPU) that takes its capture stream as a CUDA
    session does: only ``_expect_device`` says cuda."""
    adapter = ToyAdapter(make_toy(), 2)
    session = adapter.open_session(_compile(adapter, "S"), toy_prompt(2))
    session._expect_device = torch.device("cuda", 0)
    return session


def test_two_live_sessions_take_two_streams_and_a_closed_one_gives_its_back(fake_streams):
    first, second = _session_on_fake_cuda(), _session_on_fake_cuda()
    s1, s2 = first._own_capture_stream(), second._own_capture_stream()
    assert s1 is not s2 and first._own_capture_stream() is s1  # taken once, kept
    first.close()
    third = _session_on_fake_cuda()
    assert third._own_capture_stream() is s1  # the closed session's, not the live one's
    with pytest.raises(SessionClosed, match="capture stream went back"):
        first._own_capture_stream()  # e.g. prepare_replay after close: never on third's stream
    assert _session_on_fake_cuda()._own_capture_stream() not in (s1, s2)


def test_a_session_closed_while_a_step_runs_keeps_its_stream_until_collected(fake_streams):
    session = _session_on_fake_cuda()
    s = session._own_capture_stream()
    session._busy.acquire()  # a step running on another thread
    session.close()
    assert streams._free.get(0, []) == []  # it may still launch a graph captured on s
    session._busy.release()
    del session
    gc.collect()
    assert streams._free[0] == [s]


@cuda
def test_sessions_capture_on_streams_no_one_else_holds_and_replay_at_once_exactly():
    """Streams taken while held are all distinct and none of PyTorch's pooled ones; two GEMM
    graphs captured each on its own stream replay together on two streams exactly as
    alone (on one pooled stream the probe saw them differ in 400 of 400 rounds)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda", torch.cuda.current_device())
    pooled = {torch.cuda.Stream().cuda_stream for _ in range(64)}
    taken = [streams.take(dev) for _ in range(40)]
    handles = {s.cuda_stream for s in taken}
    assert len(handles) == 40 and not handles & pooled
    torch.manual_seed(0)
    outs, graphs, solo, inputs = [], [], [], []
    for s in taken[:2]:
        a, b = torch.randn(256, 32768, device=dev), torch.randn(32768, 256, device=dev)
        inputs.append((a, b))  # a graph reads its inputs' memory: keep them alive past the next capture
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            a @ b  # warm-up: the stream's workspace outside capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            out = a @ b
        g.replay()
        torch.cuda.synchronize()
        graphs.append(g), outs.append(out), solo.append(out.clone())
    x, y = torch.cuda.Stream(), torch.cuda.Stream()
    for _ in range(100):
        torch.cuda.synchronize()
        with torch.cuda.stream(x):
            graphs[0].replay()
        with torch.cuda.stream(y):
            graphs[1].replay()
        torch.cuda.synchronize()
        assert torch.equal(outs[0], solo[0]) and torch.equal(outs[1], solo[1])
    for s in taken:
        streams.give_back(dev, s)


@cuda
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_stream_taken_for_another_device_is_that_devices_and_its_graph_replays_exactly_there():
    """Taken while device 0 is current, a stream for device 1 lives in device 1's primary
    context (``cuDeviceGet`` by the runtime's ordinal): a GEMM graph captured on it replays
    what eager computes there."""
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    s = streams.take(dev)
    assert s.device == dev
    with torch.cuda.device(dev):
        torch.manual_seed(0)
        a, b = torch.randn(256, 4096, device=dev), torch.randn(4096, 256, device=dev)
        want = a @ b
        s.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(s):
            a @ b  # warm-up outside capture
        torch.cuda.synchronize(dev)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            out = a @ b
        g.replay()
        torch.cuda.synchronize(dev)
        assert out.device == dev and torch.equal(out, want)
    del g
    streams.give_back(dev, s)


def test_a_driver_library_that_does_not_load_is_named_in_the_error(monkeypatch):
    """No libcuda.so.1 on the path: taking a stream says which library and why, never a
    pooled stream instead."""
    def fail(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(streams, "_driver_lib", None)
    monkeypatch.setattr(streams, "_free", {})
    monkeypatch.setattr(streams.ctypes, "CDLL", fail)
    monkeypatch.setattr(streams.torch.cuda, "init", lambda: None)
    with pytest.raises(RuntimeError, match="libcuda.so.1.*cannot open shared object file"):
        streams._create(0)


def test_the_primary_context_is_retained_once_per_device_not_once_per_stream(monkeypatch):
    """Every stream made is made in the device's primary context; that context is retained
    once per device for the process (a retain per stream was never released), and a driver
    error is named.  A fake driver counts the calls (no GPU here)."""
    calls: list[tuple] = []

    class Driver:
        def __getattr__(self, name):
            def call(*args):
                calls.append((name, args[-1] if name == "cuDeviceGet" else None))
                if name == "cuStreamCreate" and len([c for c in calls if c[0] == name]) == 4:
                    return 700  # CUDA_ERROR_ILLEGAL_ADDRESS, say
                return 0
            return call

    monkeypatch.setattr(streams, "_driver_lib", Driver())
    monkeypatch.setattr(streams, "_contexts", {})
    monkeypatch.setattr(streams.torch.cuda, "init", lambda: None)
    monkeypatch.setattr(streams.torch.cuda, "ExternalStream", lambda handle, device: (handle, device))
    for index in (0, 0, 1):
        assert streams._create(index)[1] == torch.device("cuda", index)
    retained = [c for c in calls if c[0] == "cuDevicePrimaryCtxRetain"]
    assert len(retained) == 2 and [c[1] for c in calls if c[0] == "cuDeviceGet"] == [0, 1]
    assert len([c for c in calls if c[0] == "cuStreamCreate"]) == 3
    pushes, pops = ([c for c in calls if c[0] == n] for n in ("cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2"))
    assert len(pushes) == len(pops) == 3
    with pytest.raises(RuntimeError, match="cuStreamCreate failed with CUDA driver error 700"):
        streams._create(0)
    assert len([c for c in calls if c[0] == "cuCtxPopCurrent_v2"]) == 4  # popped after the failure too
    assert len([c for c in calls if c[0] == "cuDevicePrimaryCtxRetain"]) == 2
