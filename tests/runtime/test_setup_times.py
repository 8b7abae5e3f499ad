"""``Session.stats()["setup_s"]``: what it took to make a session ready, on the toy model.

An executable is compiled once and serves many sessions: the first session opened on
it carries the compile's seconds (``compiled``), every later one reports 0 for them;
capture is each session's own.
"""

from __future__ import annotations

import json
import time

import torch

from cadence_fx.compiler import _compile

from helpers.toy_models import ToyAdapter, make_toy, toy_inputs, toy_prompt

SPLIT_KEYS = {"trace_s", "specialize_s", "passes_s", "waited_s", "capture_s", "total_s", "compiled", "how"}


def test_the_first_session_carries_the_compile_and_later_ones_report_none():
    adapter = ToyAdapter(make_toy(4), 2)
    exe = _compile(adapter, "S")
    first, second = (adapter.open_session(exe, toy_prompt(2)) for _ in range(2))
    split = first.stats()["setup_s"]
    assert set(split) == SPLIT_KEYS
    json.dumps(first.stats())  # stays plain data
    compiled = exe.notes["setup_s"]
    assert split["compiled"] is True and split["trace_s"] == compiled["trace_s"] > 0
    assert split["passes_s"] == compiled["passes_s"] > 0
    assert split["specialize_s"] == 0 and split["capture_s"] == 0  # no symbolic dims; rule S captures nothing
    assert split["waited_s"] == 0  # no other process traced it
    assert split["total_s"] == round(split["trace_s"] + split["passes_s"], 3)
    assert split["how"] == {str(e.index): "traced" for e in exe.plan.catalog}
    assert second.stats()["setup_s"] == {"trace_s": 0.0, "specialize_s": 0.0, "passes_s": 0.0, "waited_s": 0.0,
                                         "capture_s": 0.0,
                                         "total_s": 0.0, "compiled": False, "how": {}}


def test_a_session_replaced_before_its_first_step_hands_over_the_compile():
    """A frame codec's drop-in opens a stream when it compiles and ``reset()`` replaces it:
    the compile was paid for the stream in use.  A stream that stepped keeps its share."""
    adapter = ToyAdapter(make_toy(4), 2)
    exe = _compile(adapter, "S")
    unused, used = (adapter.open_session(exe, toy_prompt(2)) for _ in range(2))
    trace_s = unused.stats()["setup_s"]["trace_s"]
    used.adopt_setup(unused)
    assert used.stats()["setup_s"]["compiled"] is True and used.stats()["setup_s"]["trace_s"] == trace_s
    assert unused.stats()["setup_s"]["compiled"] is False and unused.stats()["setup_s"]["total_s"] == 0
    with torch.no_grad():
        used.step(toy_inputs(1, seed=0)[0])
    later = adapter.open_session(exe, toy_prompt(2))
    later.adopt_setup(used)  # used stepped: its set-up was its own
    assert used.stats()["setup_s"]["compiled"] is True and later.stats()["setup_s"]["compiled"] is False


def test_capture_time_is_the_sessions_own(monkeypatch):
    """``prepare_replay`` on the CPU with ``capture_entry`` faked to take 50 ms an entry
    (as tests/serving/test_multi_session.py fakes it): every session reports its own capture."""
    from cadence_fx import compiler
    from cadence_fx.runtime import graphs

    monkeypatch.setattr(compiler, "check_rules", lambda rules, device: rules)  # lower for replay on the CPU
    adapter = ToyAdapter(make_toy(4), 2)
    exe = compiler.compile_executable(adapter, "SRc")
    monkeypatch.setattr(graphs, "capture_entry", lambda parent, args, pool, ptr, stream, warm_up=True: time.sleep(0.05) or {})
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    entries = len(exe.plan.catalog)
    for k in range(2):
        split = adapter.open_session(exe, toy_prompt(2)).stats()["setup_s"]
        assert split["capture_s"] >= 0.05 * entries and split["compiled"] is (k == 0)
        assert split["total_s"] == round(split["trace_s"] + split["specialize_s"] + split["passes_s"]
                                         + split["capture_s"], 3)
