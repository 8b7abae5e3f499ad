"""One executable for every prompt length (``cadence_fx.capacity_executable``), against stock.

The mini Token2Wav's catalog entries, each rewritten once at a capacity of 200 prompt
frames from the symbolic steps a 40-token prompt traced, serve sessions at other prompt
lengths: every chunk against the stock tail (waveform, PCM, every state tensor), through
warm-up, growth, the trim, steady chunks and a flush (the flush: the eager fallback, no
variants yet), two voices interleaved on the one set of graphs.
"""

from __future__ import annotations

import pytest
import torch

from cadence_fx.capacity_executable import at_length, capacity_executable
from cadence_fx.compiler import open_session
from cadence_fx.errors import SpecializationRefused
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.integrations.stepaudio2.session import Token2WavSession
from cadence_fx.lockstep import compare_streams
from helpers.mini_token2wav import catalog_steps, mini_tail

CPU = torch.device("cpu")
CAPACITY = 200  # prompt frames: 100 tokens


@pytest.fixture(scope="module")
def shared(t2w_mini):
    """The capacity executable, from the symbolic steps (variant 0) of each catalog entry."""
    opt = t2w_mini.opt
    spk = s2.synthetic_prompt(40, seed=1)[2]
    steps = catalog_steps(opt)
    return opt, capacity_executable(opt.adapter_for(CAPACITY, spk), steps)


def stream_at(opt, cexe, prompt_tokens: int):
    """A session at ``prompt_tokens`` on the capacity executable, and the stock tail set up alike."""
    tokens, mels, spk = s2.synthetic_prompt(prompt_tokens, seed=prompt_tokens)
    adapter = opt.adapter_for(2 * prompt_tokens, spk)
    session = Token2WavSession(open_session(at_length(cexe, adapter), adapter, tokens, mels, spk), spk,
                               2 * prompt_tokens, CPU)
    stock = mini_tail(n_timesteps=2, seed=0)
    stock.set_stream_cache(tokens, mels, spk)
    return session, stock


def test_two_voices_interleaved_on_one_set_of_graphs_exact(shared):
    opt, cexe = shared
    voices = {p: stream_at(opt, cexe, p) for p in (41, 57)}  # 82 and 114 prompt frames
    chunks = {p: s2.synthetic_chunks(5, seed=p, final_tokens=11) for p in voices}
    routes = {p: [] for p in voices}
    for i in range(6):
        for p, (session, stock) in voices.items():  # one chunk of each voice in turn
            report = compare_streams(stock, session, chunks[p][i:i + 1], CPU, seed=1000 * p + i)
            assert report["exact"], (p, i, report["mismatches"])
            routes[p].append(report["per_chunk"][0]["route"])
    for p in voices:  # warm-up, growth, the trimmed steady entry: the shared graphs; the flush: eager
        assert routes[p][:5] == ["graph entry 0", "graph entry 1"] + ["graph entry 2"] * 3, routes[p]
        assert routes[p][5].startswith("fallback"), routes[p]


def test_at_the_capacity_exact_and_past_it_refused(shared):
    opt, cexe = shared
    session, stock = stream_at(opt, cexe, CAPACITY // 2)
    report = compare_streams(stock, session, s2.synthetic_chunks(4, seed=3), CPU, seed=3)
    assert report["exact"] and all(r["route"].startswith("graph") for r in report["per_chunk"]), report["mismatches"]
    spk = s2.synthetic_prompt(40, seed=1)[2]
    with pytest.raises(SpecializationRefused, match="past the capacity"):
        at_length(cexe, opt.adapter_for(CAPACITY + 2, spk))


def test_a_read_after_a_write_that_moves_with_the_length_is_found_at_that_length():
    """The rule-S passes prove the arena's reads come before its writes at the capacity only:
    here the buffer's write sits at frames 4-8 and the old state's read at its last four
    frames, apart at 40 frames and overlapping at 8. ``hazards_at`` (what ``at_length`` runs
    for each entry and length) finds it at 8, not at 40."""
    from cadence_fx import step as meta
    from cadence_fx.capacity_executable import hazards_at
    from cadence_fx.compiler import rewrite_pipeline
    from cadence_fx.passes import capacity as cap
    from cadence_fx.passes.state_rewrite import RegionBinding
    from cadence_fx.passes.trace_symbolic import trace_symbolic
    from cadence_fx.step import StepSignature

    def bind(buffers, dims=None):
        buf = buffers["buf"]

        def step(inputs, state):
            p = state["c"].shape[1]
            buf[:, 4:8].copy_(inputs["x"])  # the buffer's write, at a fixed place
            return {"y": state["c"][:, -4:] * 1}, {"c": buf[:, :p]}  # the old state's tail, read after it
        return step
    f32 = torch.float32
    sym = trace_symbolic(bind, StepSignature(("x",), ("c",), ("y",)), {"p": 12}, {"x": ((1, 4), f32)},
                         {"c": ((1, ("p", 1, 0)), f32)}, {"c": ((1, ("p", 1, 8)), f32, ("buf",))}, CPU)
    arena = torch.zeros(1, 48)
    gm, plan = cap.capacity_form(sym, {"p": 40}, buffers={"c": arena}, keep_values=True)
    gm.meta[meta.EXAMPLE_INPUTS] = [torch.zeros(1, 4), torch.tensor(40)]
    with cap.at_dims({"p": 40}):
        gm, _ = rewrite_pipeline([RegionBinding("c", (1, 48), "float32", 1, 40, 40, True)], "S", "cpu")(gm)
    slots = {"c": ((1, 48), f32)}
    assert hazards_at(gm, slots, CPU, [torch.zeros(1, 4)], {"p": 40}, [torch.tensor(40)]) == []
    problems = hazards_at(gm, slots, CPU, [torch.zeros(1, 4)], {"p": 8}, [torch.tensor(8)])
    assert problems and "reads old state of region 'c'" in problems[0], problems
