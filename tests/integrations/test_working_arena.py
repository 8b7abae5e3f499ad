"""Captures shared by voices (``runtime.working``): one capacity's graphs captured once, on a
working arena, for every voice, each voice's state copied onto it before each chunk and back
after; against the stock tail, every chunk.

Capture and replay are faked on the CPU (``helpers/fake_capture.py``: a "graph" re-runs its
piece on the very tensors it was captured on), which is what a CUDA graph does for the
runtime: so a replay that read the capturing voice's memory instead of its own would be a
wrong chunk here too (the length-bound views found by the first shared run were exactly
that, refused by the replay's address check).  The mini Token2Wav at a capacity of 200 prompt
frames, rules SR (lowered for replay on the CPU); the CUDA test is
``test_capacity_executable.py::test_capacity_graphs_replay_exactly_under_src`` (``shared``).
"""

from __future__ import annotations

import collections
import copy
import dataclasses

import pytest
import torch

from cadence_fx import capacity_executable as ce
from cadence_fx.capacity_prepare import capture, chunk_inputs
from cadence_fx.compiler import open_session
from cadence_fx.errors import CadenceError, RulesError
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.integrations.stepaudio2.session import Token2WavSession
from cadence_fx.lockstep import compare_streams
from cadence_fx.runtime import graphs
from cadence_fx.runtime.arena import Arena
from cadence_fx.runtime.working import WorkingArena, WorkingSession
from helpers.fake_capture import fake_capture
from helpers.mini_token2wav import catalog_steps, mini_tail

CPU = torch.device("cpu")
CAPACITY = 200


def _capacity(opt):
    """The capacity executable under rules SR with shared captures (lowered for replay on the CPU)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ce, "check_rules", lambda rules, device: rules)
        spk = s2.synthetic_prompt(40, seed=1)[2]
        return ce.capacity_executable(opt.adapter_for(CAPACITY, spk), catalog_steps(opt), "probe",
                                      programs=opt.programs, rules="SR", shared_captures=True)


def _lowered_per_session(cexe):
    """``cexe``'s entries lowered as for a session's own captures (pieces that take host sizes,
    baked at capture), from its rule-S graphs, on a working arena of their own."""
    from cadence_fx.compiler import lowered_copy
    graphs_ = {i: (lowered_copy(cexe.checked[i], cexe.rules, "cpu", cexe.adapter.step_boundary()), plan, sym)
               for i, (_, plan, sym) in cexe.graphs.items()}
    return dataclasses.replace(cexe, graphs=graphs_, shared=collections.OrderedDict(), _working=None)


@pytest.fixture(scope="module")
def shared(t2w_mini):
    return _capacity(t2w_mini.opt)


def _voice(opt, cexe, prompt_tokens: int):
    tokens, mels, spk = s2.synthetic_prompt(prompt_tokens, seed=prompt_tokens)
    adapter = opt.adapter_for(2 * prompt_tokens, spk)
    session = Token2WavSession(open_session(ce.at_length(cexe, adapter), adapter, tokens, mels, spk), spk,
                               2 * prompt_tokens, CPU)
    stock = mini_tail(n_timesteps=2, seed=0)
    stock.set_stream_cache(tokens, mels, spk)
    return session, stock


def _tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, s2.VOCAB, (n,), generator=g).tolist()


def _exact(session, stock, chunk, seed: int) -> str:
    report = compare_streams(stock, session, [chunk], CPU, seed=seed)
    assert report["exact"], (seed, report["mismatches"])
    return report["per_chunk"][0]["route"]


def test_voices_share_one_capture_of_each_graph_on_the_working_arena_exact(t2w_mini, shared, monkeypatch):
    """Through the drop-in (``optimize(..., rules="SR", capacity=(200,), shared_captures=True)``,
    holding the capacity's graphs built above): two voices of new lengths (82 and 114 frames)
    interleaved chunk by chunk through a turn (warm-up, growth, the trim, steady chunks, a
    14-token window and a 7-token flush), then a reset and a second turn of the first voice
    while the second is reset and starts again: every chunk replayed and exact
    against the stock tail (waveform, PCM, every state tensor); each graph captured once for
    both voices, on the working arena: the three entries and the window before any voice
    (``prepare_capacity``, in inference mode, at the capacity's own length), the flush by the
    first voice that sends it.  Then a failure part-way in one voice's replay breaks that
    voice alone (the other stays exact), ``restore`` brings it back exact, and an eager chunk
    on a working session (the fallback, on its parked state) is exact, as is the replay after."""
    import cadence_fx
    from cadence_fx import compiler
    from cadence_fx.integrations import dropin
    fake_capture(monkeypatch)
    monkeypatch.setattr(compiler, "check_rules", lambda rules, device: rules)  # SR on the CPU: faked captures
    monkeypatch.setattr(dropin, "check_rules", lambda rules, device: rules)
    cexe = shared
    opt = cadence_fx.optimize(t2w_mini.tail, rules="SR", capacity=(CAPACITY,), shared_captures=True,
                              off_catalog="specialize")
    opt._capacities[(CAPACITY, (1, 192), torch.float32, True)] = cexe  # the capacity's graphs, built above
    got = opt.prepare_capacity(windows=[14], flushes=[], prompt_tokens=())  # (another class's: test_capacity_executable)
    made = list(got[f"{CAPACITY} mel frames"].values())[0]  # prepared here, not held (another file's
    assert made.startswith(("built", "loaded from disk")), got  # process may have stored the same graph)
    captured = got["captured"][f"{CAPACITY} mel frames, shared captures"]
    assert len(captured) == 4 and all(h.startswith("captured in") for h in captured.values()), captured
    window = [(chunk_inputs(cexe.adapter, {"chunk_tokens": 14}), {})]
    assert set(capture(cexe, window).values()) == {"held"}

    def voice(p: int):
        prompt = s2.synthetic_prompt(p, seed=p)
        stock = mini_tail(n_timesteps=2, seed=0)
        stock.set_stream_cache(*prompt)
        return opt.open_session(*prompt), stock
    voices = {p: voice(p) for p in (41, 57)}
    working = cexe.working()
    assert working is not None and all(isinstance(s.session, WorkingSession) and s.session.working is working
                                       for s, _ in voices.values())
    assert working.stats()["captures"] == 4  # the voices' set-ups found every entry captured
    turn = [(_tokens(28, 2 + i), False) for i in range(3)] + [(_tokens(14, 5), False), (_tokens(7, 6), True)]
    routes = {p: [] for p in voices}
    for t in range(2):
        for i in range(len(turn)):
            for p, (session, stock) in voices.items():
                if t == 0 or p == 41:  # (the second voice's second turn: the first's, at another length)
                    routes[p].append(_exact(session, stock, turn[i], 100 * p + 10 * t + i))
        for p, (session, stock) in voices.items():
            session.reset()
            stock.set_stream_cache(*s2.synthetic_prompt(p, seed=p))
    for p, (session, _) in voices.items():
        assert all(r.startswith("replay") for r in routes[p]), (p, routes[p])
        stats = session.stats()
        assert not any(k.startswith("region refused replay") for k in stats["fallbacks"]), stats["fallbacks"]
        assert stats["working_arena"]["captures"] == 5, stats["working_arena"]  # and the flush, once
    w = working.stats()
    assert w["turns"] == 5 + 3 * len(turn) and w["copies"] == 2 * 3 * len(turn), w
    # every graph's static inputs lie in the working pool's copy buffers, which its graphs share
    # (one chunk at a time on the arena): not a clone of its own per graph (runtime/pools.py)
    held = working.static_inputs()
    assert 0 < held["held"] <= working.pool.copies.held_bytes < held["summed"], (held, working.pool.copies.held_bytes)
    assert opt.capacity_stats()["built"][f"{CAPACITY} mel frames, shared captures"]["working_arena"] == w

    (a, stock_a), (b, stock_b) = voices[41], voices[57]
    for i in range(3):  # the first voice's warm-up, then steady (the second's state: right after its reset)
        _exact(a, stock_a, turn[i], 900 + i)
    saved, stock_saved = a.snapshot(), copy.deepcopy(stock_a)
    real, calls = graphs.CapturedRegion.forward, []

    def fails_once(region, *args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("a fault part-way in the replay (the test's)")
        return real(region, *args)
    monkeypatch.setattr(graphs.CapturedRegion, "forward", fails_once)
    with pytest.raises(RuntimeError, match="the test's"):
        a.stream(turn[0][0])
    monkeypatch.setattr(graphs.CapturedRegion, "forward", real)
    assert a.session.broken is not None and b.session.broken is None
    assert _exact(b, stock_b, turn[1], 950).startswith("replay")  # the other voice, on the same working arena
    a.restore(saved)
    assert _exact(a, stock_saved, turn[0], 951).startswith("replay")
    a.session.executable.variants.policy = "eager"  # a 13-token window: the fallback, on the parked state
    assert _exact(a, stock_saved, (_tokens(13, 8), False), 952).startswith("fallback")
    assert _exact(a, stock_saved, turn[1], 953).startswith("replay")
    assert _exact(b, stock_b, turn[2], 954).startswith("replay")


def test_a_step_outside_inference_mode_after_captures_inside_it_replays_as_inside(t2w_mini, shared, monkeypatch):
    """Captures made in inference mode (``prepare_capacity``, the drop-in's set-ups) must not
    bind a session that steps outside it (the runtime API): the working arena captures outside
    inference mode whatever its caller's.  Two sessions of one voice, one stepping inside
    inference mode and one outside, give equal outputs and state, both replayed."""
    fake_capture(monkeypatch)
    opt, cexe = t2w_mini.opt, shared
    tokens, mels, spk = s2.synthetic_prompt(41, seed=41)
    adapter = opt.adapter_for(82, spk)
    with torch.inference_mode():
        inside = open_session(ce.at_length(cexe, adapter), adapter, tokens, mels, spk)
    outside = open_session(ce.at_length(cexe, adapter), adapter, tokens, mels, spk)
    for i in range(3):
        inputs = {"token": torch.tensor([_tokens(28, 70 + i)], dtype=torch.int32), "spk": spk}
        torch.manual_seed(i)
        with torch.inference_mode():
            want = inside.step(inputs)
        torch.manual_seed(i)
        got = outside.step(inputs)
        assert all(torch.equal(want[k], got[k]) for k in want), i
        assert all(torch.equal(inside.state()[r], outside.state()[r]) for r in inside.state()), i
    assert outside.broken is None and sum(outside.stats()["replays"].values()) == 3
    assert sum(inside.stats()["replays"].values()) == 3


def test_a_graph_not_lowered_length_free_is_refused_at_another_length_never_wrong(t2w_mini, shared, monkeypatch):
    """Graphs lowered as for a session's own captures (their pieces take host sizes, baked at
    capture) on a working arena: the voice whose set-up captured them replays; a voice of
    another length is refused by the replay's check, piece by piece, and runs those pieces
    eagerly, counted: exact, never the capture's length."""
    fake_capture(monkeypatch)
    opt = t2w_mini.opt
    cexe = _lowered_per_session(shared)
    voices = {p: _voice(opt, cexe, p) for p in (41, 57)}
    chunks = [(_tokens(28, 20 + i), False) for i in range(3)]
    for p, (session, stock) in voices.items():
        report = compare_streams(stock, session, chunks, CPU, seed=p)
        assert report["exact"], (p, report["mismatches"])
    refused = {p: sum(n for k, n in s.stats()["fallbacks"].items() if k.startswith("region refused replay"))
               for p, (s, _) in voices.items()}
    assert refused[41] == 0 and refused[57] > 0, refused
    assert any("captured the value" in k for k in voices[57][0].stats()["fallbacks"]), voices[57][0].stats()


def test_a_capture_that_failed_is_tried_again_not_kept(t2w_mini, shared, monkeypatch):
    """A capture that runs out of memory (or raises) leaves its pieces eager for that caller
    and is not kept: the next caller captures it (a transient failure costs one set-up, not
    every later voice's chunks)."""
    fake_capture(monkeypatch)
    from cadence_fx.capacity_executable import at_stream
    from cadence_fx import step as meta
    working = WorkingArena(shared.plan.layout, CPU)  # a fresh one: nothing captured yet
    gm, _, sym = shared.graphs[0]
    program = at_stream(gm, shared.dims, [torch.tensor(shared.dims[d]) for d in sym.dims], shared.plan.catalog[0],
                        meta.arena_inputs(gm), {})
    real = graphs.capture_entry
    monkeypatch.setattr(graphs, "capture_entry", lambda *a, **k: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")))
    parent, failed, error = working.capture(program, shared.adapter.example_inputs(), shared.signature.inputs)
    assert failed == {"*": "out of memory while capturing: oom"} and error is None
    assert not working.holds(program) and working.stats()["failed_captures"] == 1
    monkeypatch.setattr(graphs, "capture_entry", real)
    parent, failed, error = working.capture(program, shared.adapter.example_inputs(), shared.signature.inputs)
    assert (failed, error) == ({}, None) and working.holds(program) and working.stats()["captures"] == 1


def test_misuse_of_shared_captures_is_a_clear_error(t2w_mini, shared):
    """``shared_captures`` not a bool, without a capacity, or with rules that do not replay; a
    parked arena laid out otherwise; ``capture`` where captures are per session, or at an
    entry that is none: each a clear error."""
    import cadence_fx
    opt = t2w_mini.opt
    spk = s2.synthetic_prompt(40, seed=1)[2]
    adapter = opt.adapter_for(CAPACITY, spk)
    with pytest.raises(CadenceError, match="shared_captures=1 must be True or False"):
        ce.capacity_executable(adapter, {}, shared_captures=1)
    with pytest.raises(RulesError, match="rules SR or SRc"):
        ce.capacity_executable(adapter, {}, shared_captures=True)
    with pytest.raises(CadenceError, match="needs capacity"):
        cadence_fx.optimize(t2w_mini.tail, shared_captures=True)
    with pytest.raises(CadenceError, match="must be True or False"):
        cadence_fx.optimize(t2w_mini.tail, capacity=200, shared_captures="yes")
    with pytest.raises(RulesError, match="rules SR or SRc"):
        cadence_fx.optimize(t2w_mini.tail, capacity=200, shared_captures=True)
    drop = cadence_fx.optimize(t2w_mini.tail, capacity=200)
    with pytest.raises(RulesError, match="rules SR or SRc"):
        drop.set_capacity(200, shared_captures=True)
    assert drop.shared_captures is False and drop.capacity == (200,)  # the setting as it was
    plain = ce.capacity_executable(adapter, catalog_steps(opt), programs=opt.programs)
    assert plain.working() is None and "working_arena" not in plain.stats()
    with pytest.raises(CadenceError, match="captured per session"):
        capture(plain)
    for entry in (7, "2", True, -1):
        with pytest.raises(CadenceError, match="is no catalog entry"):
            capture(shared, entry=entry)
    exe = ce.at_length(plain, opt.adapter_for(82, spk))
    assert exe.working is None
    own_length = Arena(ce.build_plan(opt.adapter_for(82, spk)).layout, CPU)  # laid out at 82 frames
    with pytest.raises(CadenceError, match="laid out as its working arena"):
        WorkingSession(exe, own_length, adapter.fallback, {}, WorkingArena(plain.plan.layout, CPU))


def test_idle_time_builds_and_captures_a_voices_own_program_of_another_branch_class(t2w_mini, shared, monkeypatch):
    """A voice of the 7-token flush's other branch class (45 tokens: 90 frames, one length in 7;
    ``test_capacity_executable``'s flush tests) on shared captures: ``session.idle()`` builds its
    own program of the flush (``Variants.build_ahead``) and captures it there (on the working
    arena: ``Session._work_ahead``), so the flush's chunk replays it with no build and no
    capture; every chunk exact.  A voice of the capacity's class gets nothing built."""
    fake_capture(monkeypatch)
    cexe = shared
    opt = t2w_mini.opt
    steady = [(_tokens(28, 70 + i), False) for i in range(3)]
    flush = (_tokens(7, 74), True)
    session, stock = _voice(opt, cexe, 41)  # the capacity's class: the flush's shared graph, built here if not yet
    for i, chunk in enumerate(steady + [flush]):
        _exact(session, stock, chunk, 700 + i)
    session, stock = _voice(opt, cexe, 45)
    for i, chunk in enumerate(steady):
        assert _exact(session, stock, chunk, 710 + i).startswith("replay")
    variants = session.session.executable.variants
    captures = cexe.working().stats()["captures"]
    session.idle()
    own = "entry 2 | token (1, 7), spk (1, 192) | last_chunk"
    assert variants.stats()["ahead"]["built"] == 1 and own in variants.stats()["held"], variants.stats()
    assert cexe.working().stats()["captures"] == captures + 1  # captured in idle time, once
    built = variants.built
    route = _exact(session, stock, flush, 713)
    assert route == "replay specialization " + own, route
    assert variants.built == built and cexe.working().stats()["captures"] == captures + 1  # nothing on the chunk
    assert session.stats()["specializations"]["captured_here_s"], session.stats()["specializations"]
