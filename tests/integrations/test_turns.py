"""Turns of one voice (issue 15): ``reset()`` puts a session back to its post-prompt state.

MiniCPM-o's duplex demo restores a clone of the post-prompt caches at every new turn.
A session keeps that state when it is opened and ``reset()`` copies it back into the
same arena: no set-up, no new executable, the same graphs.  Stock does the same turn by
setting the prompt up again; every chunk of the next turn is compared with it
(waveform, PCM, every state tensor).
"""

from __future__ import annotations

import pytest
import torch

import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.lockstep import compare_streams


@pytest.fixture(scope="module")
def t2w(t2w_mini):
    """This file's Token2Wav is the mini one (tests/conftest.py ``t2w_mini``): what it checks
    is mechanism, which the released configuration's own tests do not need to repeat."""
    return t2w_mini

CPU = torch.device("cpu")


def _state(session) -> dict:
    return {k: v.clone() for k, v in session.state().items()}


def test_reset_starts_a_turn_exactly_as_stock_set_up_again(t2w):
    prompt = s2.synthetic_prompt(5, seed=21)
    session = t2w.opt.open_session(*prompt)
    after_setup = _state(session)
    assert session.setup_bytes == sum(t.nbytes for t in after_setup.values()) > 0
    executables = len(t2w.opt._executables)

    t2w.tail.set_stream_cache(*prompt)
    first = compare_streams(t2w.tail, session, s2.synthetic_chunks(2, seed=22), CPU, seed=22)  # a turn cut short
    assert first["exact"], first["mismatches"]

    session.reset()
    assert all(torch.equal(session.state()[k], v) for k, v in after_setup.items())
    t2w.tail.set_stream_cache(*prompt)  # stock: the prompt's caches again
    chunks = s2.synthetic_chunks(4, seed=23, final_tokens=7)  # warm-up, growth, trim, steady, flush
    report = compare_streams(t2w.tail, session, chunks, CPU, seed=23)
    assert report["exact"], report["mismatches"]
    assert report["pcm_sha256_stock"] == report["pcm_sha256_optimized"]
    routes = [c["route"] for c in report["per_chunk"]]
    assert routes[:3] == ["graph entry 0", "graph entry 1", "graph entry 2"], routes  # the clock went back too
    session.reset()  # after a flush too
    assert all(torch.equal(session.state()[k], v) for k, v in after_setup.items())
    assert len(t2w.opt._executables) == executables  # nothing set up or compiled again
    assert session.stats()["fallbacks"] == {"flags last_chunk outside the catalog (eager)": 1}
    session.close()
    with pytest.raises(cadence_fx.SessionClosed, match="reset"):
        session.reset()


def test_reset_without_a_kept_setup_is_refused_and_changes_nothing(t2w):
    session = t2w.opt.open_session(*s2.synthetic_prompt(5, seed=25), keep_setup=False)
    assert session.setup_bytes == 0
    tokens, last = s2.synthetic_chunks(1, seed=26)[0]
    torch.manual_seed(0)
    session.stream(tokens, last_chunk=last)
    before = _state(session)
    with pytest.raises(cadence_fx.InputError, match="keep_setup=False"):
        session.reset()
    assert all(torch.equal(session.state()[k], v) for k, v in before.items())
    session.close()


def test_snapshot_and_restore_replay_a_chunk_bit_for_bit_in_this_session_or_another(t2w):
    prompt = s2.synthetic_prompt(5, seed=27)
    a = t2w.opt.open_session(*prompt)
    chunks = s2.synthetic_chunks(4, seed=28)
    for k in range(2):
        torch.manual_seed(100 + k)
        a.stream(*chunks[k][:1], last_chunk=chunks[k][1])
    snap = a.snapshot()

    def third(session):
        torch.manual_seed(102)
        session.stream(chunks[2][0], last_chunk=chunks[2][1])
        return session.last_speech.clone(), _state(session)

    speech, state = third(a)
    a.restore(snap)
    again, state_again = third(a)
    b = t2w.opt.open_session(*prompt, keep_setup=False)  # a fork: another session, the same prompt length
    b.restore(snap)
    forked, state_forked = third(b)
    for got, st in ((again, state_again), (forked, state_forked)):
        assert torch.equal(got, speech)
        assert all(torch.equal(st[k], v) for k, v in state.items())
    a.close()
    b.close()
