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
    invalidated = len(graphs._INVALIDATED)
    prompt = toy_prompt(2).to(dev)
    session = adapter.open_session(exe, prompt)
    monkeypatch.undo()

    assert len(attempts) == 2  # captured unwarmed, then again after the warm-up: both invalidated
    assert len(graphs._INVALIDATED) == invalidated + 2  # both graphs kept for the process's life
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
    # entries read the kept graphs, never freed memory (a freed one's address taken by a new
    # graph made a later capture's allocations go to the dead pool: a worker aborted)
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
