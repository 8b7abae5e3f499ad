"""Token2Wav's off-catalog chunks with their own programs (``off_catalog="specialize"``):
a first chunk shorter than 25 + 3 (its caches then sit off the catalog until the trim
brings them back), windows at a turn's end and flushes, replayed and exact against stock
on CUDA; the CPU path is ``tests/runtime/test_variants.py`` (toy) and
``tests/tools/test_traffic.py`` (Token2Wav)."""

from __future__ import annotations

import pytest
import torch

import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.lockstep import compare_streams, deterministic_protocol

from helpers.marks import cuda


def _tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, s2.VOCAB, (n,), generator=g).tolist()


@cuda
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_windows_flushes_and_the_steps_after_them_replay_exactly(dtype):
    deterministic_protocol()
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=5, float16=dtype == "float16")
    opt = cadence_fx.optimize(tail, rules="SRc", off_catalog="specialize")
    prompt = s2.synthetic_prompt(37, seed=5, device="cuda")
    device = torch.device("cuda")
    # turn 1: a 15-token first chunk (the caches go off the catalog: 74 + 24 frames), three
    # steady chunks (the second brings them back through the trim), an 11-token window, a flush of 5
    turn1 = [(_tokens(15, 1), False)] + [(_tokens(28, 2 + i), False) for i in range(3)] + \
            [(_tokens(11, 5), False), (_tokens(5, 6), True)]
    # turn 2 (a new set-up of the same voice): the same window and flush lengths, nothing built again
    turn2 = [(_tokens(28, 7 + i), False) for i in range(2)] + [(_tokens(11, 9), False), (_tokens(5, 10), True)]
    built = []
    for turn, chunks in enumerate((turn1, turn2)):
        tail.set_stream_cache(*prompt)
        opt.set_stream_cache(*prompt)
        report = compare_streams(tail, opt, chunks, device, seed=20 + turn)
        assert report["exact"], report["mismatches"]
        routes = [c["route"] for c in report["per_chunk"]]
        assert all(r.startswith("replay") for r in routes), routes
        spec = opt.stats()["specializations"]
        assert spec["refused"] == {} and spec["policy"] == "specialize"
        built.append(spec["built"])
    assert "replay specialization entry 2 | token (1, 11), spk (1, 192)" in routes
    assert built[1] == built[0] >= 4  # the window and the flush were built once, in turn 1
    labels = list(opt.stats()["specializations"]["held"])
    assert any(label.startswith("off-catalog") for label in labels), labels


@cuda
@pytest.mark.parametrize("rules,dtype", [("R", "float32"), ("Rc", "float16")])
def test_stock_managed_state_replays_again_after_an_eager_window(rules, dtype):
    """Rules R/Rc keep stock's own state and build no off-catalog programs: a window and a
    flush run eagerly.  The steady chunks after the window must replay again once the trim
    brings the caches back: the eager step runs on the model's own buffers, so it leaves the
    state stock leaves (the 16-slot DiT conv carry); and in fp16 the set-up's fp16 encoder
    conv carry is widened to the float32 the programs take, so the first chunk replays."""
    deterministic_protocol()
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=5, float16=dtype == "float16")
    opt = cadence_fx.optimize(tail, rules=rules)
    prompt = s2.synthetic_prompt(37, seed=5, device="cuda")
    chunks = [(_tokens(28, 2 + i), False) for i in range(2)] + [(_tokens(11, 5), False)] + \
             [(_tokens(28, 12 + i), False) for i in range(3)] + [(_tokens(5, 6), True)]
    tail.set_stream_cache(*prompt)
    opt.set_stream_cache(*prompt)
    report = compare_streams(tail, opt, chunks, torch.device("cuda"), seed=21)
    assert report["exact"], report["mismatches"]
    routes = [c["route"] for c in report["per_chunk"]]
    replayed = [r.startswith("replay") for r in routes]
    # the window (chunk 2) and the flush run eagerly; the chunk after the window still finds
    # its caches off the catalog; from the next one on, every chunk replays
    assert replayed[:2] == [True, True] and not replayed[2] and replayed[4:6] == [True, True] \
        and not replayed[6], routes
