"""``runtime.collector.held``: Python's collector off while CUDA graphs are captured (a
finalizer mid-capture invalidates it or aborts the process), back on after, as the caller had it."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from cadence_fx.runtime import collector

from helpers.toy_models import ToyAdapter, make_toy, toy_prompt


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


def test_a_collector_the_caller_disabled_stays_disabled():
    gc.disable()
    with collector.held():
        assert not gc.isenabled()
    assert not gc.isenabled()


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
