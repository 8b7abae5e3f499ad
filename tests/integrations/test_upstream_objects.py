"""``cadence_fx.optimize`` on the upstream objects users already hold, their APIs kept.

Each optimized object is streamed beside an untouched upstream object of the same
weights, called exactly as upstream documents it, and every output must be bit-equal
(``torch.equal``; the same SHA-256 over all output bytes).
"""

from __future__ import annotations

import hashlib

import pytest
import torch

import cadence_fx
from cadence_fx import CadenceError, InputError

moshi = pytest.importorskip("cadence_fx.integrations.moshi")
vibevoice = pytest.importorskip("cadence_fx.integrations.vibevoice")


#: the released classes at a small size (as tests/integrations/test_vibevoice.py builds them)
SMALL = dict(decoder_n_filters=2, encoder_n_filters=2, decoder_ratios=[2] * 3, encoder_ratios=[2] * 3,
             encoder_depths="1-1-1-2")


def _codes(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, moshi.CARDINALITY, (1, moshi.N_Q, 1), generator=g) for _ in range(n)]


def _sha(ts) -> str:
    h = hashlib.sha256()
    for t in ts:
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def test_moshi_mimi_model_streams_exactly_with_its_own_api():
    upstream, mine = moshi.build_mimi(seed=0), moshi.build_mimi(seed=0)
    opt = cadence_fx.optimize(mine)
    assert not mine.is_streaming  # the user's object is left as it was given
    codes = _codes(12)
    with torch.no_grad():
        with upstream.streaming(1):
            want = [upstream.decode(c) for c in codes[:6]]
        with opt.streaming(1):
            got = [opt.decode(c) for c in codes[:6]]
            assert opt.stats()["fallback_total"] == 0 and sum(opt.stats()["graph_runs"].values()) == 6
        upstream.streaming_forever(1)  # moshi.server's way: one stream until reset_streaming
        opt.streaming_forever(1)
        want += [upstream.decode(c) for c in codes[6:]]
        got += [opt.decode(c) for c in codes[6:]]
    assert all(g.shape == w.shape == (1, 1, moshi.FRAME_SAMPLES) for g, w in zip(got, want))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert _sha(got) == _sha(want)
    assert opt.sample_rate == upstream.sample_rate and opt.frame_rate == upstream.frame_rate  # attributes pass through
    with pytest.raises(InputError, match="one frame"):
        opt.decode(torch.zeros(1, moshi.N_Q, 2, dtype=torch.int64))
    with pytest.raises(CadenceError, match="batch_size=1"):
        opt.streaming_forever(2)


def test_vibevoice_tokenizer_streams_exactly_with_its_own_api():
    Cache = vibevoice.upstream_modules()["Cache"]
    upstream = vibevoice.build_acoustic_tokenizer(seed=0, **SMALL)
    mine = vibevoice.build_acoustic_tokenizer(seed=0, **SMALL)
    opt = cadence_fx.optimize(mine)
    latents = [x[0] for x in vibevoice.synthetic_latents(8, seed=3)]
    idx = torch.tensor([0])
    want, got = [], []
    caches = (Cache(), Cache())
    ours = (Cache(), Cache())
    for i, x in enumerate(latents):  # two streams interleaved, each its own cache object
        k = i % 2
        want.append(upstream.decode(x, cache=caches[k], sample_indices=idx, use_cache=True))
        got.append(opt.decode(x, cache=ours[k], sample_indices=idx, use_cache=True))
    assert all(g.shape == w.shape for g, w in zip(got, want)) and got[0].dim() == 3 and got[0].shape[:2] == (1, 1)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert _sha(got) == _sha(want)
    assert opt.stats()["fallback_total"] == 0
    whole = torch.cat(latents, dim=2)  # a decode without a cache is upstream's own
    assert torch.equal(opt.decode(whole), upstream.decode(whole))
    with pytest.raises(InputError, match="already holds upstream state"):
        opt.decode(latents[0], cache=caches[0], sample_indices=idx, use_cache=True)
    with pytest.raises(InputError, match="one integer index"):
        opt.decode(latents[0], cache=Cache(), sample_indices=torch.tensor([0, 1]), use_cache=True)
