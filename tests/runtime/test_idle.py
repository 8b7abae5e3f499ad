"""``PendingSession.idle`` on the CPU, the lowest level that runs without CUDA: the toy
compiled for replay (``check_rules`` patched, as ``tests/serving/test_multi_session.py``
does), handed over by a gated background build, its captures faked (each records which
entry it was and whether it warmed the stream; the regions stay uncaptured, so on the
CPU they run eagerly, counted).  ``idle()`` never waits (for a build that has not
landed, nor for one that holds the device), stops at its time budget, captures each
landed entry once, in catalog order, on the caller's thread, and the chunks after it
capture nothing; every chunk is exact against the stock toy.  The CUDA test that
captures for real is ``tests/integrations/test_background.py::test_on_cuda_idle_time_*``."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest
import torch

from cadence_fx.errors import InputError, SessionClosed
from cadence_fx.runtime import streams


def test_idle_captures_each_landed_entry_once_between_chunks_and_never_waits(monkeypatch):
    from cadence_fx import compiler
    from cadence_fx.runtime import collector, device_work, graphs
    from cadence_fx.runtime.pending import WAITING, Build, PendingSession
    from helpers.toy_models import ToyAdapter, assert_lockstep_exact, make_toy, toy_inputs, toy_prompt

    monkeypatch.setattr(compiler, "check_rules", lambda rules, device: rules)  # lowered for replay on the CPU
    adapter = ToyAdapter(make_toy(4), 2)
    exe = compiler.compile_executable(adapter, "SRc")  # in the foreground: the build below hands it over
    assert all(p.kind == "cudagraph" for p in exe.programs.values())
    gate = threading.Event()
    worker = concurrent.futures.ThreadPoolExecutor(1)
    build = Build("toy", lambda: gate.wait(60) and exe, worker)
    prompt = toy_prompt(2)
    session = compiler.open_pending_session(adapter, "SRc", build, prompt)
    assert isinstance(session, PendingSession)

    captured = []

    def capture_variant(program, args, pool, arena_ptr, stream, device, rng=None, warm_up=None):
        index = next(i for i, p in exe.programs.items() if p.run is program)
        captured.append((index, warm_up, threading.current_thread() is threading.main_thread()))
        return graphs.fresh_regions(program, rng), {}, None

    monkeypatch.setattr(graphs, "capture_variant", capture_variant)
    monkeypatch.setattr(streams, "take", lambda device: "the session's capture stream")

    stock = make_toy(4)
    with torch.no_grad():
        stock_state = stock.setup(prompt)
    xs = toy_inputs(6, seed=5)
    try:
        assert session.idle() == []  # nothing landed: the build starts after the first chunk
        stock_state = assert_lockstep_exact(stock, stock_state, session, xs[:1], 2)  # eager (WAITING)
        assert build.submitted is not None
        t0 = time.perf_counter()
        assert session.idle() == []  # the build waits at its gate: idle() returns at once
        assert time.perf_counter() - t0 < 5.0
        gate.set()
        assert build.wait(60)
        held = []
        with device_work.LOCK:  # another voice's build holds the device: idle() neither waits nor captures
            other = threading.Thread(target=lambda: held.append(session.idle()))
            other.start()
            other.join(30)
        assert held == [[]] and captured == []
        assert session.idle(seconds=0.0) == [] and captured == []  # no time given: nothing started
        for bad in ("soon", -1, True, float("nan")):  # refused before anything runs
            with pytest.raises(InputError, match=r"idle\(seconds=...\) takes None .* or a number of seconds >= 0"):
                session.idle(bad)
        assert captured == [] and session.stats()["background"]["captured_idle"] == []
        budgets = []  # after its captures, a due full collection with the time left (collector.collect_if_due)
        monkeypatch.setattr(collector, "collect_if_due", lambda seconds=None: budgets.append(seconds) or False)
        assert session.idle() == [0, 1, 2] and budgets == [None]
        # once each, in catalog order, on this thread; the first warmed the session's new stream
        assert captured == [(0, True, True), (1, False, True), (2, False, True)]
        assert session.idle() == []  # nothing left
        stock_state = assert_lockstep_exact(stock, stock_state, session, xs[1:], 2)
        assert len(captured) == 3  # no chunk captured anything
        stats = session.stats()
        assert stats["background"]["captured_idle"] == [0, 1, 2] and stats["background"]["idle_s"] >= 0
        assert stats["background"]["taken"] and stats["fallbacks"][WAITING] == 1
        # the fake left every region uncaptured: on the CPU they run eagerly, each run counted
        assert all(why == WAITING or why.endswith(": not captured") for why in stats["fallbacks"]), stats
        session.close()
        with pytest.raises(SessionClosed, match="this session is closed"):
            session.idle()
    finally:
        gate.set()
        worker.shutdown(wait=True)
