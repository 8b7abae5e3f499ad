"""``SessionPool``: sessions placed on the least-loaded device, admission up to a limit."""

from __future__ import annotations

import pytest

import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.serving import PoolFull, SessionPool


@pytest.fixture(scope="module")
def t2w(t2w_mini):
    """This file's Token2Wav is the mini one (tests/conftest.py ``t2w_mini``): what it checks
    is mechanism, which the released configuration's own tests do not need to repeat."""
    return t2w_mini


def test_session_pool_places_on_the_least_loaded_device_and_admits_up_to_its_limit(t2w):
    """Two replicas (the CPU model listed twice stands in for two devices)."""
    pool = SessionPool([t2w.opt, t2w.opt], max_per_device=1)
    prompt = s2.synthetic_prompt(5, seed=50)
    a = pool.open(*prompt)
    b = pool.open(*prompt)
    assert (a.device_index, b.device_index) == (0, 1) and pool.load() == [1, 1]
    with pytest.raises(PoolFull, match=r"every device holds 1 sessions \(load \[1, 1\]\)"):
        pool.open(*prompt)
    b.close()
    assert pool.load() == [1, 0]
    c = pool.open(*prompt)
    assert c.device_index == 1
    for s in (a, c):
        s.close()
    assert pool.load() == [0, 0]
    with pytest.raises(cadence_fx.InputError, match="at least one model"):
        SessionPool([])
