"""ChunkPad(chunk, pad) end to end on CPU: a stateless codec decoder shaped like
Freeze-Omni's TiCodec tail (tests/helpers/chunkpad_model.py).

The plan has K = 2 entries (left context 0, then 10 tokens: windows of 50, then 60);
the rewritten graph writes the next left context back into the arena; and a stream
through a Session equals the stock step bit for bit, output and state, chunk by chunk,
including a shorter final flush that runs eagerly and is counted.
"""

from __future__ import annotations

import re

import pytest
import torch

from cadence_fx import ChunkPad
from cadence_fx.compiler import build_plan, compile_executable

from helpers.chunkpad_model import (CHUNK, PAD, SPT, WINDOW, ChunkPadAdapter, decode_step, make_decoder,
                            token_stream)
from helpers.toy_models import assert_stream_exact

N_CHUNKS = 6
SEEDS = (0, 7)

_compiled: dict = {}


def compiled(seed: int):
    """(decoder, adapter, executable), compiled once per weight seed for the module."""
    if seed not in _compiled:
        decoder = make_decoder(seed)
        adapter = ChunkPadAdapter(decoder)
        _compiled[seed] = (decoder, adapter, compile_executable(adapter, "S"))
    return _compiled[seed]


class Lockstep:
    """The stock step and a Session fed the same chunks."""

    def __init__(self, seed: int):
        self.decoder, self.adapter, self.exe = compiled(seed)
        self.stock_state = {"left_tokens": torch.zeros(1, 0, dtype=torch.int64)}
        self.session = self.adapter.open_session(self.exe)

    def step(self, tokens: torch.Tensor, **flags) -> tuple[dict, dict]:
        inputs = {"tokens": tokens}
        with torch.no_grad():
            stock_out, self.stock_state = decode_step(self.decoder, inputs, self.stock_state, **flags)
            opt_out = self.session.step(inputs, **flags)
        return stock_out, opt_out

    def assert_exact(self, stock_out, opt_out, where: str) -> None:
        assert_stream_exact(self.session.state(), self.stock_state, stock_out, opt_out, where)


def test_plan_is_two_entries_left_context_0_then_10():
    _, adapter, exe = compiled(SEEDS[0])
    plan = exe.plan
    region = plan.declaration.region("left_tokens")
    assert region.retention == ChunkPad(chunk=CHUNK, pad=PAD)
    assert region.retention.catalog_width(CHUNK) == 2  # Table 3, Freeze-Omni: W=10, s=10 -> K=2
    assert len(plan.catalog) == 2 == len(exe.programs)
    assert [e.regions["left_tokens"].shape for e in plan.catalog] == [(1, 0), (1, PAD)]
    assert [e.steps for e in plan.catalog] == [(0,), "1+"]
    for e in plan.catalog:
        assert tuple(e.inputs["tokens"].shape) == (1, WINDOW) and e.inputs["tokens"].dtype == "int64"
    slot = plan.layout.slot("left_tokens")
    assert slot.axis == 1 and slot.capacity == PAD + CHUNK and slot.dtype == "int64"
    assert plan == build_plan(adapter)


def test_explain_mentions_chunkpad_and_k2():
    text = build_plan(compiled(SEEDS[0])[1]).explain()
    assert "ChunkPad(chunk=40, pad=10)" in text
    assert re.search(r"left_tokens\s+token\s+ChunkPad\(chunk=40, pad=10\)\s+2\s", text), text
    assert "K=2" in text  # the region's scope verdict
    assert "Catalog: 2 entries" in text


def test_rewrite_writes_left_context_back_into_the_arena():
    _, _, exe = compiled(SEEDS[0])
    for idx in (0, 1):
        record = exe.notes["rewrite"][idx]
        assert "StateRewrite: arena inputs ['left_tokens']; in place []; written back ['left_tokens']" in record
        program = exe.programs[idx]
        assert program.arena_inputs == ("left_tokens",)
        assert program.next_extents == {"left_tokens": PAD}
        gm = program.run
        copies = [n for n in gm.graph.nodes if n.target is torch.ops.aten.copy_.default]
        assert len(copies) == 1, gm.code
        assert not any(n.op == "placeholder" and n.name.startswith("state_") for n in gm.graph.nodes)
        out = next(n for n in gm.graph.nodes if n.op == "output")
        assert len(out.args[0]) == 1  # pcm only: the state stays in the arena


@pytest.mark.parametrize("seed", SEEDS)
def test_stream_is_bit_exact_with_counted_flush(seed):
    run = Lockstep(seed)
    ptr = run.session.arena.full("left_tokens").data_ptr()
    chunks = token_stream(N_CHUNKS, seed=seed + 1)
    total_samples = 0
    for i, tokens in enumerate(chunks[:-1]):
        stock_out, opt_out = run.step(tokens)
        run.assert_exact(stock_out, opt_out, f"seed {seed} chunk {i}")
        assert stock_out["pcm"].shape == (1, CHUNK * SPT)
        total_samples += opt_out["pcm"].shape[1]
        assert run.session.state()["left_tokens"].data_ptr() == ptr
    # the left context matters: the same chunk decoded without it gives other samples
    empty = torch.zeros(1, 0, dtype=torch.int64)
    with torch.no_grad():
        cold, _ = decode_step(run.decoder, {"tokens": chunks[1]}, {"left_tokens": empty})
        warm, _ = decode_step(run.decoder, {"tokens": chunks[1]}, {"left_tokens": chunks[0][:, CHUNK - PAD:CHUNK]})
    assert cold["pcm"].shape == warm["pcm"].shape and not torch.equal(cold["pcm"], warm["pcm"])
    flush = chunks[-1]
    assert flush.shape[1] < WINDOW
    stock_out, opt_out = run.step(flush, last=True)
    run.assert_exact(stock_out, opt_out, f"seed {seed} flush")
    assert stock_out["pcm"].shape == (1, flush.shape[1] * SPT)
    stats = run.session.stats()
    assert stats["steps"] == N_CHUNKS + 1
    assert stats["graph_runs"] == {"0": 1, "1": N_CHUNKS - 1}
    assert stats["fallbacks"] == {"flags last outside the catalog (eager)": 1}
    # every token of the stream was decoded to audio exactly once
    total_tokens = N_CHUNKS * CHUNK + flush.shape[1]
    assert total_samples + flush.shape[1] * SPT == total_tokens * SPT


def test_wrong_chunk_length_is_refused_by_the_gate_and_counted():
    run = Lockstep(SEEDS[0])
    chunks = token_stream(3, seed=5)
    stock_out, opt_out = run.step(chunks[0])
    run.assert_exact(stock_out, opt_out, "chunk 0")
    short = chunks[1][:, :45].clone(memory_format=torch.contiguous_format)  # 35 new + 10 lookahead: not the catalog's 50
    stock_out, opt_out = run.step(short)
    run.assert_exact(stock_out, opt_out, "short chunk")  # ran eagerly: the stock result, not a wrong run
    stats = run.session.stats()
    assert stats["fallbacks"] == {"input 'tokens' shape (1, 45) != catalog (1, 50)": 1}
    assert stats["graph_runs"] == {"0": 1}
    # a non-contiguous chunk of the right shape is refused too (stride mismatch)
    strided = torch.stack([chunks[2][0], chunks[2][0]], dim=1)[:, 0][None]
    assert strided.shape == (1, WINDOW) and not strided.is_contiguous()
    stock_out, opt_out = run.step(strided)
    run.assert_exact(stock_out, opt_out, "strided chunk")
    stats = run.session.stats()
    assert stats["fallback_total"] == 2
    assert any(k.startswith("input 'tokens' stride") for k in stats["fallbacks"])
    # and the stream carries on through the graph
    stock_out, opt_out = run.step(chunks[2])
    run.assert_exact(stock_out, opt_out, "chunk after fallbacks")
    assert run.session.stats()["graph_runs"] == {"0": 1, "1": 1}
