"""``graphs.GraphPool`` and ``CapturedRegion.capture``'s failure path, on the CPU with
``torch.cuda.graph`` faked as PyTorch 2.11 behaves (``benchmarks/capture_fault_probe.py``):
a capture the device invalidates leaves its pool recording, and every later capture
into that pool fails at its start ("already recording to mempool_id"); a capture that
raised without invalidating leaves its pool usable.  The CUDA test is
``tests/runtime/test_capture_warmup.py::test_an_invalidated_capture_*``."""

from __future__ import annotations

import contextlib
import sys
from typing import NamedTuple

import pytest
import torch

from cadence_fx.runtime import graphs
from cadence_fx.runtime.graphs import CaptureFailed, CapturedRegion, GraphPool


class _Graph:
    """Stands for ``torch.cuda.CUDAGraph``; ``capture_begin``/``capture_end`` as
    ``pools.recording`` calls them, faked as ``graph`` below fakes ``torch.cuda.graph``."""

    fake: "_FakeCuda | None" = None

    def capture_begin(self, pool=None, **kwargs):
        _begin(_Graph.fake, pool)
        self.pool = pool

    def capture_end(self):
        # cudaStreamEndCapture fails on an invalidated capture, before the pool is released
        raised = sys.exc_info()[1]  # what the captured body raised, if it did
        if isinstance(raised, RuntimeError) and "invalidated" in str(raised):
            _Graph.fake.recording.add(self.pool)
            raise RuntimeError("capture invalidated: cudaStreamEndCapture failed") from raised


class _FakeCuda(NamedTuple):
    recording: set  # the pools a capture left recording
    begin_fault: list  # a test appends a message: the next capture raises it as it begins
    stream: object  # the stream captures are given: None (torch.cuda.graph's own) or a side stream


def _begin(fake: _FakeCuda, pool) -> None:
    if pool in fake.recording:
        raise RuntimeError("beginAllocateToPool: already recording to mempool_id")
    if fake.begin_fault:  # once: capture_begin raised (e.g. out of memory registering the generator)
        raise RuntimeError(fake.begin_fault.pop())


class _Piece(torch.nn.Module):
    def __init__(self, fault: str | None = None):
        super().__init__()
        self.fault = fault

    def forward(self, x):
        if self.fault is not None:
            raise RuntimeError(self.fault)
        return x * 2


@pytest.fixture(params=["torch.cuda.graph", "recording"])
def fake_cuda(monkeypatch, request):
    """``torch.cuda.graph`` as PyTorch 2.11 behaves, and ``CUDAGraph.capture_begin`` /
    ``capture_end`` alike; each test runs both ways: a region captured without a stream
    (``torch.cuda.graph``) and on a side stream (``pools.recording``'s own begin and end)."""
    handles = iter(range(1000))
    side = object() if request.param == "recording" else None
    fake = _FakeCuda(set(), [], side)

    @contextlib.contextmanager
    def graph(cuda_graph, pool=None, stream=None):
        _begin(fake, pool)
        try:
            yield
        except RuntimeError as e:
            if "invalidated" in str(e):  # cudaStreamEndCapture fails before the pool is released
                fake.recording.add(pool)
            raise

    def stream_context(s):
        assert s is side, "a capture ran on another stream than it was given"
        return contextlib.nullcontext()

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool", next(handles)))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "stream", stream_context)
    monkeypatch.setattr(_Graph, "fake", fake)
    return fake


@pytest.fixture
def kept(monkeypatch):
    """``graphs._KEPT`` for this test alone: the graphs it keeps for the process."""
    kept: list = []
    monkeypatch.setattr(graphs, "_KEPT", kept)
    return kept


def _fail_once(why: str, stream) -> tuple[GraphPool, object, CapturedRegion]:
    """A session's pool, its first handle, and a region whose capture failed with ``why``."""
    pool = GraphPool()
    first = pool.handle
    bad = CapturedRegion(_Piece(why), [False], name="bad")
    with pytest.raises(CaptureFailed, match=why):
        bad.capture([torch.ones(2)], pool, stream=stream)
    return pool, first, bad


def test_an_invalidated_capture_moves_the_later_captures_to_a_fresh_pool(fake_cuda, kept):
    pool, first, bad = _fail_once("capture invalidated by a host sync", fake_cuda.stream)
    assert first in fake_cuda.recording and pool.handle != first and pool.renewed == 1
    # the failed graph (kept for the process: the allocator's stale filter reads it) and the
    # empty capture that reset the generator in the fresh pool (that pool's first user)
    assert len(bad.failed_graphs) == 2 and bad.failed_graphs[0] in kept and bad.failed_graphs[1] not in kept
    # and the empty capture that could not begin in the old pool, kept for the process too
    assert len(kept) == 2
    good = CapturedRegion(_Piece(), [False], name="good")
    good.capture([torch.ones(2)], pool, stream=fake_cuda.stream)  # into the fresh pool
    assert isinstance(good.graph, _Graph) and torch.equal(good.static_out, torch.full((2,), 2.0))
    # the old pool would have refused it
    with pytest.raises(CaptureFailed, match="already recording"):
        CapturedRegion(_Piece(), [False], name="late").capture([torch.ones(2)], first, stream=fake_cuda.stream)


def test_a_capture_that_raised_without_invalidating_keeps_its_pool(fake_cuda, kept):
    pool, first, bad = _fail_once("initialized on first use, under capture", fake_cuda.stream)
    assert pool.handle == first and pool.renewed == 0 and not fake_cuda.recording
    assert len(bad.failed_graphs) == 1 and kept == []  # the failed graph, held with the region
    good = CapturedRegion(_Piece(), [False], name="good")
    good.capture([torch.ones(2)], pool, stream=fake_cuda.stream)
    assert isinstance(good.graph, _Graph)


def test_a_raw_pool_handle_is_used_as_given(fake_cuda, kept):
    """Callers that pass a handle (not a ``GraphPool``) keep it: nothing to renew."""
    handle = torch.cuda.graph_pool_handle()
    bad = CapturedRegion(_Piece("capture invalidated"), [False], name="bad")
    with pytest.raises(CaptureFailed):
        bad.capture([torch.ones(2)], handle, stream=fake_cuda.stream)
    assert handle in fake_cuda.recording and len(bad.failed_graphs) == 1
    assert graphs.pool_handle(handle) is handle


def test_a_capture_that_raised_as_it_began_is_kept_for_the_process(fake_cuda, kept):
    """PyTorch 2.11's ``capture_begin`` can raise after naming the generator state in the
    graph and before registering the graph with it (an out-of-memory allocating the
    state's graph tensors): freeing that graph aborts the process, so it is kept.  The
    pool is not renewed (nothing recorded into it) and the region's retry captures."""
    fake_cuda.begin_fault.append("CUDA out of memory (registering the generator state)")
    pool = GraphPool()
    region = CapturedRegion(_Piece(), [False], name="region")
    with pytest.raises(CaptureFailed, match="out of memory"):
        region.capture([torch.ones(2)], pool, stream=fake_cuda.stream)
    assert kept == region.failed_graphs and len(kept) == 1 and pool.renewed == 0
    first = kept[0]
    region.capture([torch.ones(2)], pool, stream=fake_cuda.stream)
    assert isinstance(region.graph, _Graph) and region.graph is not first
    assert torch.equal(region.static_out, torch.full((2,), 2.0)) and len(kept) == 1


def test_a_kept_graph_outlives_its_list(kept):
    """The interpreter clears module globals at exit, and a kept graph freed there aborted
    processes whose tests had all passed: ``keep_if_unsafe`` adds a reference nothing
    releases.  Graphs that are safe to free are not kept."""
    g = _Graph()
    before = sys.getrefcount(g)
    graphs.keep_if_unsafe(g, began=True, ended=True)
    after_safe = sys.getrefcount(g)
    assert not kept and after_safe == before
    graphs.keep_if_unsafe(g, began=False, ended=True)
    after_kept = sys.getrefcount(g)
    assert len(kept) == 1 and kept[0] is g
    assert after_kept == before + 2  # the list's, and the one nothing releases
    kept.clear()  # as the interpreter's exit does
    after_exit = sys.getrefcount(g)
    assert after_exit == before + 1
