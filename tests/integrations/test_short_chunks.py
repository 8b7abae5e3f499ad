"""Every chunk length stock runs and can continue from streams exactly; the rest is refused
up front (issue 13).  The shared ``t2w_mini`` model (tests/conftest.py: 2 flow steps), prompt 5."""

from __future__ import annotations

import pytest
import torch

from cadence_fx import InputError
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.lockstep import compare_streams


@pytest.fixture(scope="module")
def t2w(t2w_mini):
    """This file's Token2Wav is the mini one (tests/conftest.py ``t2w_mini``): what it checks
    is mechanism, which the released configuration's own tests do not need to repeat."""
    return t2w_mini

CPU = torch.device("cpu")


def test_short_windows_and_a_one_token_flush_are_exact(t2w):
    prompt = s2.synthetic_prompt(5, seed=1)
    full = s2.synthetic_chunks(2, seed=4)
    # a steady chunk, the shortest window stock continues from (5 = 3 lookahead + 2), a 1-token flush
    chunks = [full[0], (full[1][0][:5], False), (full[1][0][5:6], True)]
    t2w.tail.set_stream_cache(*prompt)
    t2w.opt.set_stream_cache(*prompt)
    before = t2w.opt.stats()
    report = compare_streams(t2w.tail, t2w.opt, chunks, CPU, seed=7)
    assert report["exact"], report["mismatches"]
    assert report["pcm_sha256_stock"] == report["pcm_sha256_optimized"]
    # the flush left the encoder's conv carry at 5 frames: no chunk can follow, in stock either
    assert t2w.opt.state()["conformer_cnn_cache"].shape == (1, 512, 5)
    # the mini model's encoder keeps 1 + 1 layers of K|V: the declaration read them off the model
    assert t2w.opt.state()["conformer_att_cache"].shape[0] == 2 == t2w.tail.state()["conformer_att_cache"].shape[0]
    state = {k: v.clone() for k, v in t2w.opt.state().items()}
    with pytest.raises(InputError, match="cannot take another chunk"):
        t2w.opt.stream(full[1][0])
    assert all(torch.equal(state[k], v) for k, v in t2w.opt.state().items())
    assert t2w.opt.stats()["steps"] == before["steps"] + 3  # the refused chunk counted nothing


@pytest.mark.parametrize("n,message", [(4, "at least 5 tokens"), (6, "first chunk that is not last needs at least 7")])
def test_chunks_stock_cannot_continue_from_are_refused_and_lose_nothing(t2w, n, message):
    t2w.opt.set_stream_cache(*s2.synthetic_prompt(5, seed=1))
    state = {k: v.clone() for k, v in t2w.opt.state().items()}
    steps = t2w.opt.stats()["steps"]
    with pytest.raises(InputError, match=message):
        t2w.opt.stream(list(range(n)))
    assert all(torch.equal(state[k], v) for k, v in t2w.opt.state().items())
    assert t2w.opt.stats()["steps"] == steps
