"""``cadence_fx.optimize`` on stepaudio2's own ``Token2wav`` (CUDA, as upstream), against an
untouched upstream object: same weights, same calls, bit-equal waveforms, PCM and caches.

The calls are the services' own (MiniCPM-o, Step-Audio2): ``set_stream_cache(prompt_wav)``
and assigning the returned caches; ``stream(tokens, prompt_wav, last_chunk=...)``; at a new
turn, deep copies of the post-prompt caches assigned back.  fp16 is upstream's fp16: its
``set_stream_cache`` runs the flow's ``setup_cache`` outside autocast on fp16 prompt
features (the front end here hands them over in half precision).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.lockstep import live_extent

from helpers.marks import cuda
from helpers.upstream_token2wav import upstream_token2wav

#: (rules, dtype, steps): the released duplex setting in fp32, and fp16 at 10 steps
CELLS = [("SRc", "float32", 5), ("SRc", "float16", 10), ("S", "float16", 5)]


def _turn(n_chunks: int, seed: int, window: int, flush: int) -> list[tuple[list[int], bool]]:
    """Steady 25 + 3 chunks, then a shorter window (``window`` + 3), then a flush."""
    chunks = s2.synthetic_chunks(n_chunks, seed=seed)
    g = torch.Generator().manual_seed(seed + 99)
    tail = torch.randint(0, s2.VOCAB, (window + 3 + flush,), generator=g).tolist()
    return chunks + [(tail[:window + 3], False), (tail[window:window + flush], True)]


@cuda
@pytest.mark.parametrize("rules,dtype,steps", CELLS)
def test_optimize_on_upstream_token2wav_keeps_its_api_and_bits(rules, dtype, steps):
    from cadence_fx.lockstep import deterministic_protocol
    deterministic_protocol()
    float16 = dtype == "float16"
    flow, hift = s2.build_modules(0)
    prompt = s2.synthetic_prompt(37, seed=4, device="cuda", dtype=torch.float16 if float16 else torch.float32)
    ref = upstream_token2wav(copy.deepcopy(flow).cuda(), copy.deepcopy(hift).cuda(), prompt, steps, float16)
    mine = upstream_token2wav(flow.cuda(), hift.cuda(), prompt, steps, float16)
    opt = cadence_fx.optimize(mine, rules=rules)
    saved = {}
    for name, t2w in (("ref", ref), ("opt", opt)):
        stream_cache, hift_cache = t2w.set_stream_cache("voice.wav")
        t2w.stream_cache, t2w.hift_cache_dict = stream_cache, hift_cache
        saved[name] = copy.deepcopy(stream_cache), copy.deepcopy(hift_cache)
    turns = [_turn(6, 1, window=12, flush=7), _turn(3, 2, window=20, flush=1)]
    for turn, chunks in enumerate(turns):
        if turn:  # a new turn: the post-prompt caches again, as the demo restores them
            for name, t2w in (("ref", ref), ("opt", opt)):
                t2w.stream_cache, t2w.hift_cache_dict = copy.deepcopy(saved[name][0]), copy.deepcopy(saved[name][1])
        for i, (tokens, last) in enumerate(chunks):
            wave = i % 2 == 0
            torch.manual_seed(1000 * turn + i)
            a = ref.stream(tokens, "voice.wav", last_chunk=last, return_waveform=wave)
            torch.manual_seed(1000 * turn + i)
            b = opt.stream(tokens, "voice.wav", last_chunk=last, return_waveform=wave)
            where = f"turn {turn} chunk {i} ({len(tokens)} tokens{', last' if last else ''})"
            assert (np.array_equal(a, b) if wave else a == b), where
            for k, v in ref.stream_cache.items():  # upstream keeps 16 step slots; the arena n_timesteps
                assert torch.equal(opt.stream_cache[k], live_extent(v, opt.stream_cache[k])), f"{where}: {k}"
            for k, v in ref.hift_cache_dict.items():
                assert torch.equal(opt.hift_cache_dict[k], v), f"{where}: hift {k}"
    stats = opt.stats()
    assert stats["steps"] == sum(len(c) for c in turns)
    runs = sum(stats["replays" if rules != "S" else "graph_runs"].values())
    assert runs >= 6 + 3, stats  # the steady chunks of both turns ran the optimized program
    assert opt.flow is mine.flow and opt.n_timesteps == steps  # everything else is the upstream object's


@cuda
def test_bad_assignments_are_refused_and_lose_no_state():
    flow, hift = s2.build_modules(0)
    prompt = s2.synthetic_prompt(9, seed=5, device="cuda")
    opt = cadence_fx.optimize(upstream_token2wav(flow.cuda(), hift.cuda(), prompt, 5, False))
    with pytest.raises(ValueError, match="stream_cache is not set"):
        opt.stream([1] * 28, "voice.wav")
    stream_cache, hift_cache = opt.set_stream_cache("voice.wav")
    before = {k: v.clone() for k, v in opt.stream_cache.items()}
    with pytest.raises(cadence_fx.InputError, match="keys"):
        opt.stream_cache = {"conformer_cnn_cache": before["conformer_cnn_cache"]}
    with pytest.raises(cadence_fx.InputError, match="float32 tensor"):
        opt.stream_cache = {k: v.half() for k, v in before.items()}
    assert all(torch.equal(opt.stream_cache[k], v) for k, v in before.items())
