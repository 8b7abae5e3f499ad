"""``graphs.capture_entry``'s warm-up (CUDA only).

A session warms its capture stream up on its first entry (each region runs eagerly,
then is captured); its later entries are captured without that run.  A capture that
fails unwarmed (what a library initialized on first use would do under strict
capture) is warmed up and captured again: the region still replays, and the stream
is exact against stock.
"""

from __future__ import annotations

import gc

import pytest
import torch

from helpers.marks import cuda, deterministic_protocol_restored


@pytest.fixture
def deterministic():
    """The protocol stock eager needs to be bit-reproducible on a GPU; restored after."""
    with deterministic_protocol_restored():
        yield


def _regions(program):
    from cadence_fx.runtime.graphs import CapturedRegion
    return [m for m in program.run.children() if isinstance(m, CapturedRegion) and not m.trivial]


def _stream_exact_against_stock(session, prompt, seed: int) -> None:
    """Six steps of ``session`` in lockstep with the stock toy set up from ``prompt``."""
    from helpers.toy_models import assert_lockstep_exact, make_toy, toy_inputs
    dev = prompt.device
    stock = make_toy(4).to(dev)
    with torch.no_grad():
        stock_state = stock.setup(prompt)
    inputs = [{k: v.to(dev) for k, v in x.items()} for x in toy_inputs(6, seed=seed)]
    assert_lockstep_exact(stock, stock_state, session, inputs, 2)


@cuda
def test_later_entries_capture_unwarmed_and_a_failed_one_is_warmed_up_and_captured_again(monkeypatch, deterministic):
    from cadence_fx.compiler import compile_executable
    from cadence_fx.runtime import graphs
    from helpers.toy_models import ToyAdapter, make_toy, toy_prompt

    from cadence_fx.runtime import streams
    monkeypatch.setattr(streams, "_warm", set())  # its first entry warms up: a stream no capture warmed
    dev = torch.device("cuda")
    adapter = ToyAdapter(make_toy(4).to(dev), 2)
    exe = compile_executable(adapter, "SRc")
    assert sorted(exe.programs) == [0, 1, 2]
    lazy = {id(m.piece) for m in _regions(exe.programs[1])}  # entry 1's pieces need a first eager run
    assert lazy
    real, eager_runs, captures = graphs.run_piece, [], []

    def run_piece(piece, args):
        if not torch.cuda.is_current_stream_capturing():
            eager_runs.append(id(piece))
        elif id(piece) in lazy and id(piece) not in eager_runs:
            raise RuntimeError("initialized on first use, under capture (injected)")
        else:
            captures.append(id(piece))
        return real(piece, args)

    monkeypatch.setattr(graphs, "run_piece", run_piece)
    prompt = toy_prompt(2).to(dev)
    session = adapter.open_session(exe, prompt)
    monkeypatch.undo()

    assert session.capture_failures == {0: {}, 1: {}, 2: {}}
    first, failed_once, unwarmed = (_regions(session._programs[i]) for i in (0, 1, 2))
    # entry 0: warmed up, then captured; entry 2: captured without an eager run
    assert {id(m.piece) for m in first} <= set(eager_runs)
    assert not {id(m.piece) for m in unwarmed} & set(eager_runs)
    assert all(m.graph is not None and m.unwarmed_failure is None and not m.failed_graphs for m in first + unwarmed)
    # entry 1: the unwarmed capture failed, the warm-up ran, the second capture held
    for m in failed_once:
        assert m.graph is not None
        assert "initialized on first use, under capture (injected)" in m.unwarmed_failure
        assert len(m.failed_graphs) == 1  # the failed capture's graph, held with the region
        assert eager_runs.count(id(m.piece)) == 1 and captures.count(id(m.piece)) == 1
    assert session.stats()["graph_pools_renewed"] == 0  # a capture that raised leaves its pool usable

    _stream_exact_against_stock(session, prompt, seed=3)
    stats = session.stats()
    assert not stats["fallbacks"], stats["fallbacks"]
    assert stats["capture_retried"] == {f"1/{m.name}": m.unwarmed_failure for m in failed_once}
    assert all(stats["replays"].get(str(i), 0) >= 1 for i in (0, 1, 2)), stats["replays"]


@cuda
def test_a_session_on_a_stream_warmed_on_this_thread_captures_its_first_entry_unwarmed_too(monkeypatch, deterministic):
    """A closed session's capture stream goes to the next session (``runtime/streams.py``),
    warm on the thread that warmed it: the next session's first entry is captured without
    the eager run (one entry's run less for a new voice), and streams exact; a new stream
    on that thread is primed (``streams.prime``) and captured unwarmed too; on a thread
    that warmed nothing the stream is cold and its first entry warms it up."""
    import threading

    from cadence_fx.compiler import compile_executable
    from cadence_fx.runtime import graphs, streams
    from helpers.toy_models import ToyAdapter, make_toy, toy_prompt

    monkeypatch.setattr(streams, "_warm", set())  # no stream warmed yet, as far as this test goes
    dev = torch.device("cuda")
    adapter = ToyAdapter(make_toy(4).to(dev), 2)
    exe = compile_executable(adapter, "SRc")
    real, warm = graphs.capture_entry, []

    def capture_entry(*args, warm_up=True, **kwargs):
        warm.append(warm_up)
        return real(*args, warm_up=warm_up, **kwargs)

    monkeypatch.setattr(graphs, "capture_entry", capture_entry)
    prompt = toy_prompt(2).to(dev)
    first = adapter.open_session(exe, prompt)
    stream = first._capture_stream
    first.close()
    second = adapter.open_session(exe, prompt)
    assert second._capture_stream is stream  # the one the first gave back
    assert warm == [True, False, False, False, False, False]
    assert second.capture_failures == {0: {}, 1: {}, 2: {}}
    _stream_exact_against_stock(second, prompt, seed=5)
    stats = second.stats()
    assert not stats["fallbacks"] and not stats["capture_retried"], stats
    assert all(stats["replays"].get(str(i), 0) >= 1 for i in (0, 1, 2)), stats["replays"]
    # a new stream (the second still holds its own), on a thread that warmed one: primed with a
    # few GEMMs (streams.prime), every entry captured unwarmed
    third = adapter.open_session(exe, prompt)
    primed = third._capture_stream  # (a closed session's reads False)
    assert primed is not stream and streams.is_warm(primed)
    assert warm[6:] == [False, False, False] and third.capture_failures == {0: {}, 1: {}, 2: {}}
    _stream_exact_against_stock(third, prompt, seed=7)
    stats = third.stats()
    assert not stats["fallbacks"] and not stats["capture_retried"], stats
    assert all(stats["replays"].get(str(i), 0) >= 1 for i in (0, 1, 2)), stats["replays"]
    second.close(), third.close()
    out = {}
    worker = threading.Thread(target=lambda: out.update(s=adapter.open_session(exe, prompt)))
    worker.start(), worker.join()
    # a thread that warmed nothing: its first entry warms the stream up (no priming there)
    assert out["s"]._capture_stream in (stream, primed) and warm[9:] == [True, False, False]
    _stream_exact_against_stock(out["s"], prompt, seed=6)


@cuda
def test_a_pending_sessions_first_capture_between_chunks_asks_the_same_warm_stream_registry(monkeypatch, deterministic):
    """A session opened before its build landed (``PendingSession``) captures its entries
    between chunks (``idle``), through ``Session._capture_mid_stream``; it decides warm-up
    where ``prepare_replay`` does (``Session._must_warm_up``): on a stream this thread
    warmed, its first capture is unwarmed too, exact against stock and replayed."""
    import concurrent.futures

    from cadence_fx import compiler
    from cadence_fx.runtime import graphs, streams
    from cadence_fx.runtime.pending import Build, PendingSession
    from helpers.toy_models import ToyAdapter, assert_lockstep_exact, make_toy, toy_inputs, toy_prompt

    monkeypatch.setattr(streams, "_warm", set())
    dev = torch.device("cuda")
    adapter = ToyAdapter(make_toy(4).to(dev), 2)
    exe = compiler.compile_executable(adapter, "SRc")
    prompt = toy_prompt(2).to(dev)
    first = adapter.open_session(exe, prompt)  # warms its new stream up, on this thread
    stream = first._capture_stream
    first.close()
    real, warm = graphs.capture_variant, []

    def capture_variant(*args, warm_up=None, **kwargs):
        warm.append(warm_up)
        return real(*args, warm_up=warm_up, **kwargs)

    monkeypatch.setattr(graphs, "capture_variant", capture_variant)
    worker = concurrent.futures.ThreadPoolExecutor(1)
    try:
        build = Build("toy", lambda: exe, worker)
        session = compiler.open_pending_session(adapter, "SRc", build, prompt)
        assert isinstance(session, PendingSession)
        stock = make_toy(4).to(dev)
        with torch.no_grad():
            stock_state = stock.setup(prompt)
        xs = [{k: v.to(dev) for k, v in x.items()} for x in toy_inputs(6, seed=9)]
        stock_state = assert_lockstep_exact(stock, stock_state, session, xs[:1], 2)  # eager: the build starts
        assert build.wait(60)
        assert session.idle() == [0, 1, 2]
        assert session._capture_stream is stream  # the one the first session gave back, warm on this thread
        assert warm == [False, False, False]  # before: the first capture warmed up (a stream new to the session)
        assert session.capture_failures == {0: {}, 1: {}, 2: {}}
        assert_lockstep_exact(stock, stock_state, session, xs[1:], 2)
        stats = session.stats()
        assert not stats["capture_retried"], stats
        assert sum(stats["replays"].values()) == 5, stats["replays"]
        session.close()
    finally:
        worker.shutdown(wait=True)


@cuda
def test_sessions_capture_while_a_build_traces_symbolically_and_both_hold(monkeypatch, deterministic):
    """A build lets go of ``device_work.LOCK`` while it traces symbolically (fake tensors:
    ``device_work.host_only``), so a session set up meanwhile captures beside the trace
    (CUDA's global capture mode: a device call from the tracing thread would invalidate
    the capture or fail the trace).  Both hold: each session captured every entry and
    streams exact against stock, replayed; the build's programs are traced symbolically."""
    import threading

    from cadence_fx import foreground
    from cadence_fx.compiler import compile_executable
    from cadence_fx.programs import ProgramStore, entry
    from cadence_fx.runtime import device_work
    from helpers.toy_models import SymbolicToyAdapter, ToyAdapter, make_toy, toy_prompt

    dev = torch.device("cuda")
    model = make_toy(4).to(dev)
    adapter = ToyAdapter(model, 2)
    exe = compile_executable(adapter, "SRc")
    compile_executable(SymbolicToyAdapter(model, 5), "S", programs=ProgramStore())  # its first uses, for real
    prompt = toy_prompt(2).to(dev)
    opened, real = [], entry.trace_symbolic

    def traced(*args, **kwargs):
        other = threading.Thread(target=lambda: opened.append(adapter.open_session(exe, prompt)))
        other.start()  # its capture runs while this thread traces
        try:
            return real(*args, **kwargs)
        finally:
            other.join(120)

    monkeypatch.setattr(entry, "trace_symbolic", traced)
    store = ProgramStore()
    store.traced_clean = True
    with device_work.LOCK, foreground.background():  # as runtime.pending.Build._run
        built = compile_executable(SymbolicToyAdapter(model, 7), "S", programs=store)
    monkeypatch.undo()
    assert [e["how"] for e in built.notes["setup"].values()] == ["traced symbolic, specialized"] * len(built.programs)
    assert len(opened) == len(built.programs)
    for n, session in enumerate(opened):
        assert session.capture_failures == {0: {}, 1: {}, 2: {}}
        _stream_exact_against_stock(session, prompt, seed=20 + n)
        stats = session.stats()
        assert not stats["fallbacks"] and not stats["capture_retried"], stats
        assert all(stats["replays"].get(str(i), 0) >= 1 for i in (0, 1, 2)), stats["replays"]
        session.close()


@cuda
def test_an_invalidated_capture_leaves_one_region_eager_and_the_later_captures_take_a_fresh_pool(
        monkeypatch, deterministic):
    """A host sync inside a capture invalidates it, and PyTorch's allocator then keeps
    recording into that pool (every later capture into it raises "already recording";
    benchmarks/capture_fault_probe.py).  The session takes a fresh pool after each failed
    capture (``graphs.GraphPool``): the faulty region runs eagerly, counted, and every
    other region of every entry is captured and replays; the stream is exact."""
    from cadence_fx.compiler import compile_executable
    from cadence_fx.runtime import graphs
    from helpers.toy_models import ToyAdapter, make_toy, toy_prompt

    dev = torch.device("cuda")
    adapter = ToyAdapter(make_toy(4).to(dev), 2)
    exe = compile_executable(adapter, "SRc")
    faulty = _regions(exe.programs[1])[0]
    real, attempts = graphs.run_piece, []

    def run_piece(piece, args):
        if torch.cuda.is_current_stream_capturing() and piece is faulty.piece:
            attempts.append(1)
            torch.cuda.synchronize()  # not permitted while capturing: invalidates the capture
        return real(piece, args)

    monkeypatch.setattr(graphs, "run_piece", run_piece)
    kept = len(graphs._KEPT)
    prompt = toy_prompt(2).to(dev)
    session = adapter.open_session(exe, prompt)
    monkeypatch.undo()

    assert len(attempts) == 2  # captured unwarmed, then again after the warm-up: both invalidated
    # kept for the process's life: both invalidated graphs, and both empty captures that
    # could not begin in the pools they left recording
    assert len(graphs._KEPT) == kept + 4
    assert set(session.capture_failures) == {0, 1, 2}
    assert session.capture_failures[0] == {} and session.capture_failures[2] == {}
    assert list(session.capture_failures[1]) == [faulty.name]
    others = [m for i in (0, 1, 2) for m in _regions(session._programs[i]) if m.name != faulty.name or i != 1]
    assert others and all(m.graph is not None for m in others)  # before the fresh pool, these all failed
    stats = session.stats()
    assert stats["graph_pools_renewed"] == 2  # one per invalidated capture
    faulty_now = _regions(session._programs[1])[0]
    assert len(faulty_now.failed_graphs) == 4  # each failed capture and the fresh pool's empty first user

    _stream_exact_against_stock(session, prompt, seed=4)
    stats = session.stats()
    assert stats["replays"].get("0", 0) >= 1 and stats["replays"].get("2", 0) >= 1, stats["replays"]
    # each step of entry 1 (a replay if it has other regions, else a graph run) ran the faulty region eagerly
    entry1_steps = stats["replays"].get("1", 0) + stats["graph_runs"].get("1", 0)
    assert entry1_steps >= 1
    assert stats["fallbacks"] == {f"region refused replay: {faulty.name}: not captured": entry1_steps}

    # the process stays healthy once the session is gone: the allocator's stale recording
    # entries read the kept graphs, never freed memory
    del session, faulty_now, others
    gc.collect()
    for k in range(3):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        x = torch.full((4,), float(k), device=dev)
        with torch.cuda.stream(side):
            x * 2  # warm the stream
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            y = x * 3
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, torch.full((4,), 3.0 * k, device=dev))
        del graph, y
        gc.collect()


@cuda
def test_a_capture_that_fails_as_it_begins_is_kept_so_that_freeing_it_never_aborts(deterministic):
    """PyTorch 2.11's ``capture_begin`` names the generator state in the graph, then
    registers the graph with the state, which allocates the state's graph tensors when
    it has no graph yet.  An error at that allocation (out of memory; here a fault
    injected at that very op) leaves a graph whose destructor raises, and a destructor
    that raises aborts the process: a GPU suite worker aborted so in test_misuse
    (2026-12-02).  The graph is kept for the process (``graphs.keep_if_unsafe``), the
    region captures again, and the process and its random draws stay sound."""
    from cadence_fx.runtime import graphs
    from cadence_fx.runtime.graphs import CaptureFailed, CapturedRegion, GraphPool, GraphRng
    from helpers.faults import FaultAt

    dev = torch.device("cuda")
    rng = GraphRng.for_device(dev)
    if rng is None:
        pytest.skip("this PyTorch lacks the graph-safe generator API")

    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x * 2 + torch.rand_like(x)

    x = torch.ones(8, device=dev)
    stream = torch.cuda.Stream()
    pool, kept = GraphPool(), len(graphs._KEPT)
    # bound by address: no static copy, so the capture's first op is capture_begin's own
    region = CapturedRegion(torch.fx.symbolic_trace(Noisy()), [True], name="noisy", rng=rng)
    fault = FaultAt(0, RuntimeError("injected at the first op of the capture"))
    with pytest.raises(CaptureFailed, match="injected"), fault:
        region.capture([x], pool, stream)
    # the first op the capture dispatched was the generator state's allocation in capture_begin
    assert fault.fired and fault.func is torch.ops.aten.empty.memory_format, fault.func
    assert len(graphs._KEPT) == kept + 1 and graphs._KEPT[-1] is region.failed_graphs[0]
    assert pool.renewed == 0 and region.graph is None
    region.failed_graphs.clear()  # the region lets it go: only the process's list holds it now
    gc.collect()  # a freed half-registered graph would abort the process here
    region.capture([x], pool, stream)  # the retry captures on the same state and pool
    torch.manual_seed(7)
    expected = x * 2 + torch.rand_like(x)
    torch.manual_seed(7)
    with torch.cuda.stream(stream):
        region.launch()
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(region.static_out, expected)  # the replay drew as eager does
    del region
    gc.collect()
    torch.rand(4, device=dev)  # the default generator is not left mid-capture
