"""Captures shared by voices (``runtime.working``): one capacity's graphs captured once, on a
working arena, for every voice, each voice's state copied onto it before each chunk and back
after; against the stock tail, every chunk.

Capture and replay are faked on the CPU (``helpers/fake_capture.py``: a "graph" re-runs its
piece on the very tensors it was captured on, with the host sizes of its capture), which is
what a CUDA graph does for the runtime: so a replay that read the capturing voice's memory,
or a host size of its length, instead of its own would be a wrong chunk here too.  The
mini Token2Wav at a capacity of 200 prompt frames, rules SR (lowered for replay on the CPU);
the CUDA test is ``test_capacity_executable.py::test_capacity_graphs_replay_exactly_under_src``
(``shared``).
"""

from __future__ import annotations

import pytest
import torch

from cadence_fx import capacity_executable as ce
from cadence_fx.compiler import open_session
from cadence_fx.errors import CadenceError
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.integrations.stepaudio2.session import Token2WavSession
from cadence_fx.lockstep import compare_streams
from cadence_fx.runtime.arena import Arena
from cadence_fx.runtime.working import WorkingSession
from cadence_fx.step import Rules
from helpers.fake_capture import fake_capture
from helpers.mini_token2wav import catalog_steps, mini_tail

CPU = torch.device("cpu")
CAPACITY = 200


def _capacity(opt, monkeypatch, length_free: bool = True):
    """The capacity executable under rules SR with shared captures (lowered for replay on the
    CPU); ``length_free=False``: its graphs lowered as for a session's own captures."""
    monkeypatch.setattr(ce, "check_rules", lambda rules, device: rules)
    if not length_free:
        real = ce.lowered_copy
        monkeypatch.setattr(ce, "lowered_copy", lambda *a, **k: real(*a, **{**k, "length_free": False}))
    spk = s2.synthetic_prompt(40, seed=1)[2]
    return ce.capacity_executable(opt.adapter_for(CAPACITY, spk), catalog_steps(opt), "probe", programs=opt.programs,
                                  rules="SR", shared_captures=True)


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


def test_voices_share_one_capture_of_each_graph_on_the_working_arena_exact(t2w_mini, monkeypatch):
    """Two voices of new lengths (82 and 114 frames) interleaved chunk by chunk through two
    turns (warm-up, growth, the trim, steady chunks, a 14-token window and a 7-token flush,
    a reset between): every chunk replayed and exact against the stock tail (waveform, PCM,
    every state tensor); each graph captured once for both voices, on the working arena:
    the three entries and the window before any voice (``capacity_prepare.capture``, at the
    capacity's own length), the flush by the first voice that sends it."""
    from cadence_fx.capacity_prepare import capture, chunk_inputs, prepare
    fake_capture(monkeypatch)
    opt = t2w_mini.opt
    cexe = _capacity(opt, monkeypatch)
    window = [(chunk_inputs(cexe.adapter, {"chunk_tokens": 14}), {})]
    assert list(prepare(cexe, window).values())[0].startswith("built")
    got = capture(cexe, window)
    assert len(got) == 4 and all(h.startswith("captured in") for h in got.values()), got
    assert set(capture(cexe, window).values()) == {"held"}
    voices = {p: _voice(opt, cexe, p) for p in (41, 57)}
    working = cexe.working()
    assert working is not None and all(isinstance(s.session, WorkingSession) and s.session.working is working
                                       for s, _ in voices.values())
    assert working.stats()["captures"] == 4  # the voices' set-ups found every entry captured
    turn = [(_tokens(28, 2 + i), False) for i in range(3)] + [(_tokens(14, 5), False), (_tokens(7, 6), True)]
    routes = {p: [] for p in voices}
    for t in range(2):
        for i in range(len(turn)):
            for p, (session, stock) in voices.items():
                report = compare_streams(stock, session, turn[i:i + 1], CPU, seed=100 * p + 10 * t + i)
                assert report["exact"], (p, t, i, report["mismatches"])
                routes[p].append(report["per_chunk"][0]["route"])
        for p, (session, stock) in voices.items():
            session.reset()
            stock.set_stream_cache(*s2.synthetic_prompt(p, seed=p))
    for p, (session, _) in voices.items():
        assert all(r.startswith("replay") for r in routes[p]), (p, routes[p])
        stats = session.stats()
        assert not any(k.startswith("region refused replay") for k in stats["fallbacks"]), stats["fallbacks"]
        assert stats["working_arena"]["captures"] == 5, stats["working_arena"]  # and the flush, once
    w = working.stats()
    assert w["turns"] == 5 + 2 * 2 * len(turn) and w["copies"] == 2 * 2 * 2 * len(turn), w
    assert cexe.stats()["working_arena"] == w


def test_a_graph_not_lowered_length_free_is_refused_at_another_length_never_wrong(t2w_mini, monkeypatch):
    """Graphs lowered as for a session's own captures (their pieces take host sizes, baked at
    capture) on a working arena: the voice whose set-up captured them replays; a voice of
    another length is refused by the replay's check, piece by piece, and runs those pieces
    eagerly, counted: exact, never the capture's length."""
    fake_capture(monkeypatch)
    opt = t2w_mini.opt
    cexe = _capacity(opt, monkeypatch, length_free=False)
    voices = {p: _voice(opt, cexe, p) for p in (41, 57)}
    chunks = [(_tokens(28, 20 + i), False) for i in range(3)]
    for p, (session, stock) in voices.items():
        report = compare_streams(stock, session, chunks, CPU, seed=p)
        assert report["exact"], (p, report["mismatches"])
    refused = {p: sum(n for k, n in s.stats()["fallbacks"].items() if k.startswith("region refused replay"))
               for p, (s, _) in voices.items()}
    assert refused[41] == 0 and refused[57] > 0, refused
    assert any("captured the value" in k for k in voices[57][0].stats()["fallbacks"]), voices[57][0].stats()


def test_misuse_of_a_working_arena_is_a_clear_error(t2w_mini):
    """A parked arena laid out otherwise, ``shared_captures`` not a bool or without a capacity:
    each a clear error; under rule S (nothing replays) no working arena is made."""
    import cadence_fx
    opt = t2w_mini.opt
    spk = s2.synthetic_prompt(40, seed=1)[2]
    with pytest.raises(CadenceError, match="shared_captures=1 must be True or False"):
        ce.capacity_executable(opt.adapter_for(CAPACITY, spk), {}, shared_captures=1)
    with pytest.raises(CadenceError, match="needs capacity"):
        cadence_fx.optimize(t2w_mini.tail, shared_captures=True)
    with pytest.raises(CadenceError, match="must be True or False"):
        cadence_fx.optimize(t2w_mini.tail, capacity=200, shared_captures="yes")
    cexe = ce.capacity_executable(opt.adapter_for(CAPACITY, spk), catalog_steps(opt), programs=opt.programs,
                                  shared_captures=True)
    assert cexe.working() is None and "working_arena" not in cexe.stats()
    exe = ce.at_length(cexe, opt.adapter_for(82, spk))
    assert exe.working is None
    cexe.rules = Rules.parse("SR")  # (the graphs are S's: only the working arena is asked for here)
    working = cexe.working()
    adapter = opt.adapter_for(82, spk)
    own_length = Arena(ce.build_plan(adapter).layout, CPU)  # laid out at 82 frames, not at the capacity
    with pytest.raises(ValueError, match="laid out as its working arena"):
        WorkingSession(exe, own_length, adapter.fallback, {}, working)
    from cadence_fx.capacity_prepare import capture
    cexe.rules = Rules.parse("S")
    with pytest.raises(CadenceError, match="captured per session"):
        capture(cexe)
