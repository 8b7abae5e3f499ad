"""One graph for a shared step's calls (runtime.graphs, ``SHARE_CALLS``), on the CPU: which
regions may replay the first call's graph, and which arena reads may go through a copy.
Capture and replay faked on the CPU (helpers/fake_capture.py: a "graph" re-runs its piece
on the tensors it was captured on) check what replaying one call's graph for the others
computes; on CUDA, the released model's test is in test_token2wav.py
(``test_a_replayed_chunk_is_one_graph_per_stretch_and_the_shared_calls_one_and_exact``,
with ``CADENCE_FX_SHARED_CAPTURE=1``)."""

from __future__ import annotations

import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from cadence_fx import step as meta
from cadence_fx.passes.lower_cudagraph import LowerCudaGraph
from cadence_fx.passes.partition import Partition
from cadence_fx.passes.step_share import share_calls
from cadence_fx.passes.trace import autocast_recorded
from cadence_fx.runtime.pools import copyable as _copyable
from cadence_fx.runtime.graphs import CapturedRegion, shared_regions

from helpers.fake_capture import fake_capture, flat


class Est(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, t, cache):
        return torch.tanh(self.lin(x) * t + cache.sum(0))  # reads its cache slot, writes nothing


class Flow(torch.nn.Module):
    """Three flow steps, each reading its own cache slot; ``keep``: every step's output is
    also returned at the end (alive after the next step: its graph cannot be shared)."""

    def __init__(self, keep: bool = False, autocast: bool = False):
        super().__init__()
        self.est, self.keep, self.autocast = Est(), keep, autocast

    def forward(self, x, caches):
        if self.autocast:  # as a flow runs on CUDA: every piece sets it again at its start
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self.steps(x, caches)
        return self.steps(x, caches)

    def steps(self, x, caches):
        outs = []
        for k in range(3):
            t, slot = torch.full((1,), (k + 1) / 3), caches[k]  # per step: its time and its cache slot
            with meta.scope("estimator"):
                v = self.est(x, t, slot)
            outs.append(v)
            x = x + v
        return (x, *outs) if self.keep else x


def lowered(keep: bool = False, apart: bool = True, autocast: bool = False) -> torch.fx.GraphModule:
    torch.manual_seed(0)
    with torch.no_grad(), autocast_recorded():  # as trace_step traces (torch 2.5 would drop the autocast)
        gm = make_fx(Flow(keep, autocast), pre_dispatch=True)(torch.randn(2, 4), torch.zeros(3, 5, 4))
    gm, record = share_calls(gm, lambda n: "estimator" in meta.scopes(n))
    assert record.shared
    split = Partition(None, "chunk", calls_apart=apart)(gm).graph_module
    return LowerCudaGraph(CapturedRegion)(split).graph_module


def calls(parent) -> list[str]:
    return [n.target for n in parent.graph.nodes if n.op == "call_module"
            and any(m.op == "call_module" for m in parent.get_submodule(n.target).piece.graph.nodes)]


def test_the_later_calls_replay_the_first_calls_graph():
    parent = lowered()
    names = calls(parent)
    assert len(names) == 3  # every call a region of its own (chunk granularity, calls apart)
    assert not any(parent.get_submodule(n).trivial for n in names)  # a call launches what its step does
    assert shared_regions(parent) == {names[1]: names[0], names[2]: names[0]}


def test_calls_under_autocast_share_too():
    """Each region of a step traced under autocast sets it again at its start (partition's
    dispatcher state): alike calls, alike pieces (the H200 found calls that did not share
    before the structure key took those nodes in)."""
    parent = lowered(autocast=True)
    names = calls(parent)
    assert len(names) == 3
    assert any(m.op == "call_function" and m.target is not operator.getitem
               for m in parent.get_submodule(names[0]).piece.graph.nodes)  # the autocast, set again
    assert shared_regions(parent) == {names[1]: names[0], names[2]: names[0]}


def test_calls_inside_one_chunk_region_are_recorded_where_they_stand():
    parent = lowered(apart=False)
    assert calls(parent) == [] or len(calls(parent)) == 1  # one piece holds the calls and what lies between
    assert shared_regions(parent) == {}


def test_a_call_whose_output_is_used_after_the_next_call_gets_its_own_graph():
    parent = lowered(keep=True)
    assert len(calls(parent)) == 3
    assert shared_regions(parent) == {}  # the graph's outputs are alive at the end: sharing would overwrite them


def test_an_arena_read_goes_through_a_copy_only_apart_from_writes_and_aligned():
    base = torch.zeros(4096 + 64)
    skip = (-base.data_ptr() % 256) // 4
    arena = base[skip:skip + 4096]  # starts 256-byte aligned, as a device allocation does
    slot, scratch = arena[:1024].view(16, 64), arena[2048:3072]
    assert _copyable(slot, [scratch])
    assert not _copyable(slot, [arena[1000:1100]])  # overlaps a write: the copy would miss it
    assert not _copyable(arena[1:1025], [scratch])  # 4 bytes past an aligned start: another kernel may run
    assert _copyable(arena[16:1040], [scratch])  # 64 bytes past: a fresh CPU allocation's alignment
    assert _copyable(slot, [torch.zeros(8)])  # a write elsewhere (another storage)


@pytest.fixture
def recording_cuda(monkeypatch):
    fake_capture(monkeypatch)


@pytest.mark.parametrize("keep", [False, True])
@torch.no_grad()
def test_replaying_the_first_calls_graph_computes_what_each_call_computes(recording_cuda, keep):
    """Captured (faked on the CPU as above) and replayed on other inputs: the later calls
    replay the first call's graph, each reading its own cache slot through the copy, and
    every output is what the uncaptured pieces compute; where a call's output lives on
    (``keep``) each call has its own graph, with the same results."""
    from cadence_fx.runtime.graphs import capture_entry, fresh_regions
    parent = lowered(keep=keep)
    names = calls(parent)
    base = torch.zeros(3 * 5 * 4 * 16 + 64)
    skip = (-base.data_ptr() % 256) // 4
    caches = base[skip:skip + 3 * 5 * 4 * 16].view(3, 5, 4, 16)[..., 0]  # the "arena"'s slots, 256-byte aligned
    ptr = caches.untyped_storage().data_ptr()
    session = fresh_regions(parent)
    assert capture_entry(session, [torch.randn(2, 4), caches], "pool", ptr) == {}
    regions = [session.get_submodule(n) for n in names]
    if keep:
        assert all(r.leader is None and r.graph is not None for r in regions)
    else:
        assert regions[0].leader is None and regions[1].leader is regions[0] is regions[2].leader
        assert regions[0].copy_reads and not all(regions[0].bound)  # the slot: a static copy
        # its graph replays after regions recorded later: in the session's pool their live
        # tensors may sit where its intermediates were; it records into a pool of its own
        pools = [r.graph.pool for r in session.children() if isinstance(r, CapturedRegion) and r.graph is not None]
        assert regions[0].graph.pool != "pool" and pools.count(regions[0].graph.pool) == 1
        assert pools.count("pool") == len(pools) - 1
    for trial in range(3):  # new values in the same memory: what a replay meets
        x = torch.randn(2, 4)
        caches.copy_(torch.randn(3, 5, 4))
        want = fresh_regions(parent)(x, caches)  # every piece run as it stands, uncaptured
        got = session(x, caches)
        for w, g in zip(flat(want), flat(got)):
            assert torch.equal(w, g), trial
    # shared: the later calls' replays at capture (their outputs feed what follows) and 3 a trial
    assert regions[0].replays == (3 if keep else 2 + 3 * 3)


def test_a_sessions_copies_are_laid_out_like_clones_apart_within_an_entry_shared_across():
    """runtime/pools.py: each copy has a clone's values, shape and strides (a dense
    tensor's own, else contiguous) at a 512-byte step of one buffer; an entry's copies lie
    apart, the next entry's start again at the buffer's start; one that does not fit takes
    a larger buffer and the copies made before keep theirs."""
    from cadence_fx.runtime.pools import ALIGN, StaticCopies, need, nbytes
    copies = StaticCopies()
    dense, sliced = torch.randn(3, 5, 7).permute(2, 0, 1), torch.randn(6, 10)[::2, 1:4]
    copies.reserve(need([[dense, sliced], [dense]]), torch.device("cpu"))
    assert copies.buffer.numel() == nbytes(dense) + nbytes(sliced) == 2 * ALIGN  # 420 and 36 bytes, aligned
    copies.start_entry()
    a, b = copies.copy_of(dense), copies.copy_of(sliced)
    for copy, t in ((a, dense), (b, sliced)):
        assert torch.equal(copy, t) and copy.stride() == t.clone().stride() and copy.dtype == t.dtype
    base = copies.buffer.data_ptr()
    assert (a.data_ptr() - base, b.data_ptr() - base) == (0, ALIGN)  # apart
    copies.start_entry()
    c = copies.copy_of(dense * 2)
    assert c.data_ptr() == base and torch.equal(a, dense * 2)  # the next entry reuses the memory
    big = torch.randn(100, 100)
    d = copies.copy_of(big)  # does not fit after c: a larger buffer, c keeps the old one
    assert copies.grown == 1 and copies.buffer.data_ptr() != base and torch.equal(d, big)
    assert torch.equal(c, dense * 2) and copies.held_bytes == 2 * ALIGN + copies.buffer.numel()
    assert copies.buffer.numel() >= ALIGN + nbytes(big)  # room for this entry's whole layout next time
    # every input copied (a working arena's pool): a larger buffer is at least twice the last,
    # so copies that each just miss take a few buffers, not one each
    doubling = StaticCopies(doubling=True)
    doubling.reserve(ALIGN, torch.device("cpu"))
    sizes = []
    for _ in range(6):
        doubling.start_entry()
        doubling.copy_of(torch.randn(doubling.buffer.numel() // 4 + 1))  # one element more than the buffer holds
        sizes.append(doubling.buffer.numel())
    assert all(b >= 2 * a for a, b in zip(sizes, sizes[1:])) and doubling.grown == 6, sizes
    assert doubling.held_bytes == ALIGN + sum(sizes) < 3 * sizes[-1]


@pytest.mark.parametrize("sync_each", [False, True])
@torch.no_grad()
def test_an_entry_records_its_regions_without_a_device_synchronize_between_them(monkeypatch, sync_each):
    """``pools.recording``: an entry on a warm stream synchronizes and empties the cache once
    before its first region and once at its end, not around every region as
    ``torch.cuda.graph`` does (``CADENCE_FX_CAPTURE_SYNC=1``: the control, which does);
    what it computes is the same either way."""
    from cadence_fx.runtime import graphs, pools
    from cadence_fx.runtime.graphs import capture_entry, fresh_regions
    fake_capture(monkeypatch)
    syncs, emptied, through_graph = [], [], []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(1))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    fake_graph = torch.cuda.graph
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **k: (through_graph.append(1), fake_graph(*a, **k))[1])
    monkeypatch.setattr(pools, "SYNC_EACH_CAPTURE", sync_each)
    parent = lowered()
    caches = torch.zeros(3, 5, 4)
    session = fresh_regions(parent)
    x = torch.randn(2, 4)
    assert capture_entry(session, [x, caches], "pool", caches.untyped_storage().data_ptr(),
                         stream=torch.cuda.Stream(), warm_up=False) == {}
    regions = [m for m in session.children() if isinstance(m, CapturedRegion) and not m.trivial]
    captured = [m for m in regions if m.graph is not None]
    assert len(regions) >= 3 and len(captured) >= 2  # the first call's and the rest: more than one capture
    if sync_each:
        assert len(through_graph) == len(captured) and len(syncs) >= len(regions) + 1
    else:
        assert through_graph == [] and len(syncs) == 2 and len(emptied) == 1
    want = fresh_regions(parent)(x, caches)
    for w, g in zip(flat(want), flat(session(x, caches))):
        assert torch.equal(w, g)


@torch.no_grad()
def test_an_entry_captured_without_a_stream_gives_the_one_it_took_back_when_collected(monkeypatch):
    """``capture_entry(..., stream=None)`` takes a capture stream of its own
    (``runtime/streams.py``): no one else's while its graphs live, given back once they
    are collected (before, it was never given back)."""
    import gc
    from cadence_fx.runtime import streams
    from cadence_fx.runtime.graphs import capture_entry, fresh_regions
    fake_capture(monkeypatch)
    gc.collect()  # earlier tests' garbage gives its streams back to the real list, not to this test's
    monkeypatch.setattr(streams, "_free", {})  # this test's alone (a faked stream never reaches a real session)
    taken, fake_take = [], streams.take
    monkeypatch.setattr(streams, "take", lambda device: taken.append(fake_take(device)) or taken[-1])
    caches = torch.zeros(3, 5, 4)
    session = fresh_regions(lowered())
    assert capture_entry(session, [torch.randn(2, 4), caches], "pool", caches.untyped_storage().data_ptr()) == {}
    assert len(taken) == 1 and streams.stats()["free"] == {}  # held while its graphs may replay
    del session
    gc.collect()
    assert streams._free == {0: taken}
