"""``runtime/midstream.py`` on the CPU (capture faked: ``helpers/fake_capture.py``): a
capture that runs out of memory keeps what it captured (the rest runs eagerly, counted,
exact) and is captured whole again once ``OOM_RETRY_S`` have passed, at set-up, for an
off-catalog specialization and through ``idle``; a build holding the device then defers
it (the part-way capture runs meanwhile, exact)."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from cadence_fx import compiler
from cadence_fx.runtime import device_work, graphs, midstream, streams
from cadence_fx.runtime.variants import OOM_RETRY_S
from helpers.fake_capture import fake_capture
from helpers.toy_models import ToyAdapter, ToyLockstep, make_toy, toy_inputs

OOM = "CUDA out of memory. Tried to allocate 2.00 GiB (injected)"


@pytest.fixture
def clock(monkeypatch):
    """Fake capture on the CPU, replay rules allowed there, and ``midstream``'s clock at [0].
    The sessions' faked capture streams go back to a free list of this test's alone (collected
    here, before the fakes are undone: never into a later test's)."""
    fake_capture(monkeypatch)
    monkeypatch.setattr(streams, "_free", {})
    monkeypatch.setattr(compiler, "check_rules", lambda rules, device: rules)
    now = [0.0]
    monkeypatch.setattr(midstream, "_now", lambda: now[0])
    yield now
    gc.collect()


def _oom_at(monkeypatch, when) -> list[str]:
    """The ``n``-th region capture (from 0) raises out of memory where ``when(n)`` (as a static
    copy's allocation would, before the capture); returns the names of the regions asked for."""
    real, asked = graphs.CapturedRegion.capture, []

    def capture(self, *args, **kwargs):
        asked.append(self.name)
        if when(len(asked) - 1):
            raise torch.OutOfMemoryError(OOM)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(graphs.CapturedRegion, "capture", capture)
    return asked


REFUSED = "fallback: region refused replay: submod_0: not captured"


def test_cut_by_memory_reads_both_ways_a_capture_reports_it():
    assert midstream.cut_by_memory({"*": f"out of memory while capturing: {OOM}"})
    assert midstream.cut_by_memory({"submod_1": "submod_1: capture failed: OutOfMemoryError: oom"})
    assert not midstream.cut_by_memory({"submod_1": "submod_1: capture failed: RuntimeError: boom"})
    assert not midstream.cut_by_memory({})


@pytest.mark.parametrize("rules", ["SRc", "Rc"])
def test_an_entry_set_up_could_not_capture_for_memory_is_captured_again_once_due(rules, clock, monkeypatch):
    """Entry 2's capture at set-up runs out of memory: its chunks run part-way (the region
    eager, counted, exact), not captured again before ``OOM_RETRY_S``; then a build holding
    the device defers it (still part-way, nothing counted as deferred); the next chunk
    captures it again, out of memory again (due one period later); then it captures and
    replays.  Every step exact against stock, on the arena (SRc) and on stock-managed state
    (Rc: ``StockStateSession``)."""
    fail = [False]
    _oom_at(monkeypatch, lambda n: n == 2 or fail[0])  # set-up: the third entry's capture
    adapter = ToyAdapter(make_toy(4), 2)
    exe = compiler.compile_executable(adapter, rules)
    run = ToyLockstep(adapter, exe, 2)
    session = run.session
    assert session.capture_failures[2] == {"*": f"out of memory while capturing: {OOM}"}, session.capture_failures
    xs = toy_inputs(9, seed=3)
    assert [run.step(x) for x in xs[:4]] == ["replay entry 0", "replay entry 1", REFUSED, REFUSED]
    clock[0] = OOM_RETRY_S - 0.5
    assert run.step(xs[4]) == REFUSED and session._recaptures.done == {}  # not due yet
    clock[0] = OOM_RETRY_S
    with device_work.LOCK:  # a build holds the device: the part-way capture runs, nothing waits
        t = threading.Thread(target=run.step, args=(xs[5],))
        t.start()
        t.join(60)
    assert run.routes[-1] == REFUSED and session._recaptures.done == {}
    assert device_work.DEFERRED not in session.stats()["fallbacks"]
    fail[0] = True  # memory is still short: captured again, cut again
    assert run.step(xs[6]) == REFUSED and session._recaptures.done == {"2": 1}
    assert midstream.cut_by_memory(session.capture_failures[2])
    fail[0] = False
    clock[0] = 2 * OOM_RETRY_S - 0.5
    assert run.step(xs[7]) == REFUSED and session._recaptures.done == {"2": 1}  # due one period after
    clock[0] = 2 * OOM_RETRY_S
    assert run.step(xs[8]) == "replay entry 2" and session._recaptures.done == {"2": 2}
    assert session.capture_failures[2] == {} and session._recaptures.pending() == []
    assert session.stats()["fallbacks"] == {REFUSED.removeprefix("fallback: "): 6}, session.stats()["fallbacks"]


def test_idle_captures_again_what_memory_cut_short_once_due(clock, monkeypatch):
    """A session whose set-up ran out of memory on every entry: ``idle`` captures none
    before ``OOM_RETRY_S``, then every one (returning them); the chunks then replay, exact."""
    fail = [True]
    _oom_at(monkeypatch, lambda n: fail[0])
    adapter = ToyAdapter(make_toy(4), 2)
    exe = compiler.compile_executable(adapter, "SRc")
    run = ToyLockstep(adapter, exe, 2)
    fail[0] = False
    assert all(midstream.cut_by_memory(f) for f in run.session.capture_failures.values())
    xs = toy_inputs(4, seed=4)
    assert run.step(xs[0]) == REFUSED
    assert run.session.idle() == []
    clock[0] = OOM_RETRY_S
    assert run.session.idle() == [0, 1, 2] and run.session._recaptures.done == {"0": 1, "1": 1, "2": 1}
    assert [run.step(x) for x in xs[1:]] == ["replay entry 1", "replay entry 2", "replay entry 2"]


def test_an_off_catalog_capture_cut_by_memory_runs_part_way_then_is_captured_again(clock, monkeypatch):
    """A specialization's mid-stream capture (a 1-frame chunk) runs out of memory: that
    chunk and the key's next ones run part-way (exact, counted) until ``OOM_RETRY_S`` have
    passed; then the next one captures it whole and replays it."""
    fail = [False]
    asked = _oom_at(monkeypatch, lambda n: fail[0])
    adapter = ToyAdapter(make_toy(4), 2)
    exe = compiler.compile_executable(adapter, "SRc", off_catalog="specialize")
    run = ToyLockstep(adapter, exe, 2)
    xs = toy_inputs(3, seed=5)
    short = toy_inputs(4, seed=6, frames=1)
    assert [run.step(x) for x in xs] == ["replay entry 0", "replay entry 1", "replay entry 2"]
    fail[0] = True
    n = len(asked)
    first = run.step(short[0])
    fail[0] = False
    assert len(asked) == n + 1 and first == REFUSED, (first, asked)
    (label,) = [k for k in run.session.capture_failures if isinstance(k, str)]
    assert midstream.cut_by_memory(run.session.capture_failures[label])
    assert run.step(xs[0]) == "replay entry 2" and run.step(short[1]) == REFUSED  # the key, part-way
    clock[0] = OOM_RETRY_S
    assert run.step(xs[1]) == "replay entry 2"
    route = run.step(short[2])
    assert route.startswith("replay") and label in route and run.session._recaptures.done == {label: 1}, route
    assert label not in run.session.capture_failures
    assert run.step(short[3]) == route  # it stays captured


def test_a_working_sessions_entry_the_working_arena_could_not_capture_is_captured_there_again(clock, monkeypatch):
    """Shared captures (``runtime/working.py``): the working arena's capture of entry 2 runs out
    of memory at the first session's set-up (not kept there); that session's entry-2 chunks run
    part-way until ``OOM_RETRY_S`` have passed, then the next one captures it on the working
    arena and replays it; a second session whose set-up ran out of memory there too takes it in
    ``idle`` once due; a session opened after that finds it held.  Every step exact."""
    from cadence_fx.runtime.working import WorkingArena
    fail = [False]
    _oom_at(monkeypatch, lambda n: n == 2 or fail[0])
    adapter = ToyAdapter(make_toy(4), 2)
    exe = compiler.compile_executable(adapter, "SRc")
    exe.working = WorkingArena(exe.plan.layout, torch.device("cpu"))
    run = ToyLockstep(adapter, exe, 2)
    assert midstream.cut_by_memory(run.session.capture_failures[2]) and not exe.working.holds(exe.programs[2])
    fail[0] = True  # a second voice's set-up tries entry 2 again (not kept there), and runs out of memory too
    other = ToyLockstep(adapter, exe, 2)
    fail[0] = False
    assert midstream.cut_by_memory(other.session.capture_failures[2]) and other.session.idle() == []
    xs = toy_inputs(6, seed=7)
    assert [run.step(x) for x in xs[:3]] == ["replay entry 0", "replay entry 1", REFUSED]
    clock[0] = OOM_RETRY_S
    assert run.step(xs[3]) == "replay entry 2" and run.session._recaptures.done == {"2": 1}
    assert exe.working.holds(exe.programs[2]) and not run.session.capture_failures.get(2)
    assert other.session.idle() == [2] and other.session._recaptures.done == {"2": 1}  # held there: no capture
    assert [other.step(x) for x in xs[:4]] == ["replay entry 0", "replay entry 1"] + ["replay entry 2"] * 2
    later = ToyLockstep(adapter, exe, 2)
    assert later.session.capture_failures == {}
    assert [later.step(x) for x in xs[:4]] == ["replay entry 0", "replay entry 1"] + ["replay entry 2"] * 2
