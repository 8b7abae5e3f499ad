"""``runtime.collector.held``: Python's collector off while CUDA graphs are captured (a
finalizer mid-capture invalidates it or aborts the process) and while a program is built
(its garbage collected young, not promoted), back on after, as the caller had it."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from cadence_fx.runtime import collector

from helpers.toy_models import CHANNELS, ToyAdapter, make_toy, toy_prompt


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_held_nests_restores_and_survives_errors():
    with collector.held():
        assert not gc.isenabled()
        with collector.held():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still holds it
    assert gc.isenabled()
    with pytest.raises(KeyError):
        with collector.held():
            raise KeyError("x")
    assert gc.isenabled()


class _Collections:
    """The collections ``gc`` runs while the block is open, by generation."""

    def __enter__(self):
        self.seen = []
        gc.callbacks.append(self._on)
        return self

    def _on(self, phase, info):
        if phase == "start":
            self.seen.append(info["generation"])

    def __exit__(self, *exc):
        gc.callbacks.remove(self._on)


class _Cycle:
    def __init__(self):
        self.me = self


def test_the_last_block_ends_with_one_young_collection_of_what_it_left():
    with _Collections() as c:
        with collector.held():
            with collector.held():
                for _ in range(5000):  # past the young threshold: held, nothing is collected
                    _Cycle()
            assert c.seen == [] and gc.get_count()[0] >= 5000  # the inner block's end collects nothing
        assert c.seen == [1]  # generations 0 and 1, once, before the collector came back
    assert gc.isenabled() and gc.get_count()[0] < 700


def test_a_finalizer_run_by_the_young_collection_may_hold_it_again():
    entered = []

    class Finalized(_Cycle):
        def __del__(self):
            with collector.held():
                entered.append(gc.isenabled())

    with collector.held():
        Finalized()
    assert entered == [False] and gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled():
    gc.disable()
    with _Collections() as c:
        with collector.held():
            assert not gc.isenabled()
            _Cycle()
    assert not gc.isenabled() and c.seen == []  # and nothing was collected for it


def test_concurrent_blocks_hold_it_until_the_last_ends():
    entered, release, seen = threading.Event(), threading.Event(), []

    def other():
        with collector.held():
            entered.set()
            release.wait(5)

    t = threading.Thread(target=other)
    t.start()
    entered.wait(5)
    with collector.held():
        pass
    seen.append(gc.isenabled())  # this block ended; the other thread's still runs
    release.set()
    t.join(5)
    assert seen == [False] and gc.isenabled()


def test_a_build_runs_with_the_collector_held(monkeypatch):
    """``compile_executable`` (trace, passes) and an off-catalog variant's build: the
    collector off inside each, on after."""
    from cadence_fx import compiler

    during = []
    trace = compiler.trace_step
    monkeypatch.setattr(compiler, "trace_step", lambda *a, **k: during.append(gc.isenabled()) or trace(*a, **k))
    adapter = ToyAdapter(make_toy(4), 2)
    exe = compiler.compile_executable(adapter, "S")
    assert during == [False] * len(exe.plan.catalog) and gc.isenabled()
    exe = compiler.compile_executable(adapter, "S", off_catalog="specialize")
    session = adapter.open_session(exe, toy_prompt(2))
    x = torch.randn(1, CHANNELS, 2, generator=torch.Generator().manual_seed(0))  # a short chunk: off the catalog
    session.step({"x": x})
    assert session.stats()["specializations"]["built"] == 1
    assert during[-1] is False and gc.isenabled() and len(during) == 2 * len(exe.plan.catalog) + 1


def test_capture_runs_with_the_collector_held(monkeypatch):
    """A session's capture of its entries (``prepare_replay``) and a mid-stream one
    (``capture_variant``), on the CPU with ``capture_entry`` faked as
    tests/runtime/test_setup_times.py fakes it: the collector is off inside, on after."""
    from cadence_fx import compiler
    from cadence_fx.runtime import graphs

    monkeypatch.setattr(compiler, "check_rules", lambda rules, device: rules)  # lower for replay on the CPU
    adapter = ToyAdapter(make_toy(4), 2)
    exe = compiler.compile_executable(adapter, "SRc")
    during = []
    monkeypatch.setattr(graphs, "capture_entry",
                        lambda parent, args, pool, ptr, stream, warm_up=True: during.append(gc.isenabled()) or {})
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    adapter.open_session(exe, toy_prompt(2))
    assert during == [False] * len(exe.plan.catalog) and gc.isenabled()
    program = exe.programs[0].run
    _, failed, error = graphs.capture_variant(program, [], "pool", None, None, torch.device("cpu"))
    assert (failed, error) == ({}, None) and during[-1] is False and gc.isenabled()


def test_a_full_collection_comes_due_from_what_held_blocks_keep_and_runs_where_time_allows():
    """``collect_if_due``: held blocks' young collections count what they find alive;
    once that passes an eighth of what the last full collection kept, one full
    collection runs, but not where ``seconds`` are fewer than the last one took, nor
    while a block holds the collector; any full collection starts the count again."""
    gc.collect()  # the count starts again
    assert collector.stats()["promoted"] == 0 and not collector.collect_if_due()  # nothing kept since
    kept = len(gc.get_objects())
    alive = []
    with collector.held():
        alive.extend([i] for i in range(kept // 8 + 1000))  # lists: tracked objects, kept past the block
    assert collector.stats()["promoted"] >= kept // 8 + 1000
    assert collector.stats()["kept"] is None  # counted when a collection may be due, not before
    with collector.held():
        assert not collector.collect_if_due()  # never inside a held block
    full_s = collector.stats()["full_s"]
    assert full_s is not None and full_s > 0  # the gc.collect() above was timed
    with _Collections() as c:
        assert not collector.collect_if_due(seconds=0.0)  # no time for it
        assert c.seen == []
        ran = collector.stats()["idle_collections"]
        assert collector.collect_if_due(seconds=None)
        assert c.seen == [2] and collector.stats()["idle_collections"] == ran + 1
    assert collector.stats()["promoted"] == 0 and not collector.collect_if_due()
    del alive


def test_idle_runs_a_due_full_collection_with_the_time_left(monkeypatch):
    adapter = ToyAdapter(make_toy(4), 2)
    from cadence_fx import compiler
    session = adapter.open_session(compiler.compile_executable(adapter, "S"), toy_prompt(2))
    budgets = []
    monkeypatch.setattr(collector, "collect_if_due", lambda seconds=None: budgets.append(seconds) or False)
    assert session.idle(5.0) == [] and session.idle() == []
    assert budgets[1] is None and 0 < budgets[0] <= 5.0
