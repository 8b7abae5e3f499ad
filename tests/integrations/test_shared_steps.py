"""The later flow steps are specialized once and called (passes/step_share), rule S here:
the mini Token2Wav (tests/helpers/mini_token2wav.py: the released architecture, two DiT
blocks; the released model's later steps share one step in test_token2wav.py's ten-step
test) at 3 flow steps (the fewest with two alike steps; the suite's shared models have
2), seed 5 weights, every chunk of a real turn against stock: two voices (the second
specialized from the first's symbolic programs), warm-up, growth, steady state and a
flush (specialized on first use), and a reset.  (A shorter window goes through the
same specialization as the flush: its own symbolic step, another trace here.)"""

from __future__ import annotations

import pytest
import torch

import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.lockstep import compare_streams
from cadence_fx.passes.step_share import SHARED

from helpers.mini_token2wav import mini_tail

CPU = torch.device("cpu")


def test_three_steps_share_one_step_through_voices_flushes_and_a_reset():
    tail = mini_tail(n_timesteps=3, seed=5)
    opt = cadence_fx.optimize(tail, off_catalog="specialize")
    for tokens, seed in ((11, 5), (29, 6)):
        prompt = s2.synthetic_prompt(tokens, seed=seed)
        session = opt.open_session(*prompt)
        for program in session.session.executable.programs.values():  # each entry: steps 1 and 2 call one step
            calls = [n for n in program.run.graph.nodes if n.op == "call_module"]
            assert [n.target for n in calls] == [SHARED, SHARED]
        chunks = s2.synthetic_chunks(3, seed=seed, final_tokens=13)  # warm-up, growth, steady, a flush
        tail.set_stream_cache(*prompt)
        report = compare_streams(tail, session, chunks, CPU, seed=seed)
        assert report["exact"], report["mismatches"]
        assert report["pcm_sha256_stock"] == report["pcm_sha256_optimized"]
        routes = [c["route"] for c in report["per_chunk"]]
        assert all(r.startswith("graph") for r in routes), routes  # the flush too
        setup = session.session.executable.notes["setup"]
        assert all(e["how"].endswith("specialized") for e in setup.values()), setup
        session.reset()
        tail.set_stream_cache(*prompt)
        again = compare_streams(tail, session, chunks[:2], CPU, seed=seed + 1)
        assert again["exact"], again["mismatches"]
        assert session.stats()["specializations"]["built"] == 1  # the flush's program
        session.close()


@pytest.mark.parametrize("compact", [False, True])
@torch.inference_mode()  # as the drop-in steps (its arena is made under it)
def test_captured_the_later_calls_replay_one_graph_and_compute_what_the_program_computes(monkeypatch, compact):
    """``SHARE_CALLS`` on the mini model's real entries, with capture and replay faked on
    the CPU (helpers/fake_capture.py): each entry's rule-S graph through the replay passes
    with the calls apart; the second later step's call replays the first's graph, its
    cache slot read through the copy, the step's scratch bound.  The three entries are
    captured into one session pool, as ``prepare_replay`` does: their first calls' copies
    share one buffer sized before capture (each entry's copies from its start) and their
    graphs one pool apart from the rest.  A stream from the voice's set-up (entries 0, 1,
    2, 2: warm-up, growth, trim, steady): every chunk's waveform and the whole arena after
    it are what the rule-S graphs compute from the same state and draws.  ``compact``: the
    lowered entries first let their pieces' graphs go, and the shared step's, as the
    compiler does (``graphs.compact_entry``): capture and replay walk the kept step lists,
    the shared calls and copy sizes come from what it kept, and the results are the same."""
    from cadence_fx.passes.istft_check import IstftWithoutHostRead
    from cadence_fx.passes.lower_cudagraph import LowerCudaGraph
    from cadence_fx.passes.partition import Partition
    from cadence_fx.passes.specialize import _lazy_module
    from cadence_fx.runtime.pools import need, nbytes
    from cadence_fx.runtime.graphs import (CapturedRegion, GraphPool, capture_entry, compact_entry, fresh_regions,
                                           reserve_copies)

    from helpers.fake_capture import fake_capture, flat
    tail = mini_tail(n_timesteps=3, seed=5)
    opt = cadence_fx.optimize(tail)
    prompt = s2.synthetic_prompt(11, seed=5)
    stream = opt.open_session(*prompt)
    session = stream.session
    exe, arena = session.executable, session.arena.storage
    set_up = arena.clone()
    fake_capture(monkeypatch)
    pool, parents, call_names = GraphPool(), {}, {}
    for idx, program in sorted(exe.programs.items()):
        graph = torch.fx.Graph()
        graph.output(graph.graph_copy(program.run.graph, {}))
        gm = torch.fx.GraphModule(program.run, graph)
        if compact:  # a shared step of its own, as the compiler's specialization has (the rule-S
            # program, the reference below, runs its shared step by generated code)
            step = gm.get_submodule(SHARED)
            graph = torch.fx.Graph()
            graph.output(graph.graph_copy(step.graph, {}))
            own = _lazy_module(torch.fx.GraphModule(step, graph))  # no code yet, as specialize leaves it
            own.meta.update(step.meta)
            gm.add_submodule(SHARED, own)
        IstftWithoutHostRead()(gm)
        parent = LowerCudaGraph(CapturedRegion)(Partition(None, "chunk", calls_apart=True)(gm).graph_module).graph_module
        call_names[idx] = [name for name, m in parent.named_children() if isinstance(m, CapturedRegion)
                           and any(n.op == "call_module" for n in m.piece.graph.nodes)]
        if compact:
            pieces = [m.piece for m in parent.children() if isinstance(m, CapturedRegion) and not m.trivial]
            steps = {id(m): m for p in pieces for n in p.graph.nodes if n.op == "call_module"
                     for m in [p.get_submodule(n.target)]}
            assert len(steps) == 1, steps  # the shared step, called by both call pieces
            assert compact_entry(parent) == len(pieces) and all(len(p.graph.nodes) == 0 for p in pieces)
            [step] = steps.values()
            assert len(step.graph.nodes) == 0  # walked by its own step list from the pieces'
            for dropped in (pieces[0], step):
                with pytest.raises(RuntimeError, match="let go"):
                    dropped(*[None] * 3)  # a direct call would run code made from the empty graph
        parents[idx] = fresh_regions(parent)
    reserve_copies(pool, list(parents.values()), CPU)
    reserved = pool.copies.buffer.numel()
    captured, copied = {}, {}
    for idx, regions in parents.items():
        program = exe.programs[idx]
        example = opt.adapter_for(int(prompt[1].shape[1]), prompt[2]).example_inputs()
        with torch.random.fork_rng():
            assert capture_entry(regions, [example[n] for n in exe.inputs] + session._state_args(program), pool,
                                 session._bound_storage()) == {}
        arena.copy_(set_up)  # capture ran the entry on the arena
        calls = [regions.get_submodule(n) for n in call_names[idx]]
        assert len(calls) == 2 and calls[1].leader is calls[0] and calls[0].copy_reads, idx
        assert not all(calls[0].bound) and any(calls[0].bound)  # the slot copied, the scratch bound
        assert calls[0].graph.pool is pool.leaders.handle and pool.leaders.handle is not pool.handle
        assert all(m.graph.pool is pool.handle for m in regions.children()
                   if isinstance(m, CapturedRegion) and m.graph is not None and m is not calls[0])
        copies = [t for t in calls[0].static_in if t is not None]
        storage = pool.copies.buffer.untyped_storage().data_ptr()
        assert copies and all(t.untyped_storage().data_ptr() == storage for t in copies)  # the session's buffer
        starts = sorted(t.data_ptr() - storage for t in copies)
        assert starts[0] == 0 and all(b - a >= nbytes(t) for (a, b), t in zip(zip(starts, starts[1:]), copies))
        copied[idx] = [nbytes(t) for t in copies]
        captured[idx] = regions
    assert pool.copies.grown == 0 and reserved == need([[]] + [[torch.empty(n, dtype=torch.uint8)]
                                                               for n in map(sum, copied.values())])
    assert reserved < sum(map(sum, copied.values()))  # the largest entry's copies, not the sum
    for k, idx in enumerate([0, 1, 2, 2]):
        program = exe.programs[idx]
        tokens = torch.tensor([s2.synthetic_chunks(1, seed=40 + k)[0][0]], dtype=torch.int32)
        args = [{"token": tokens, "spk": prompt[2]}[n] for n in exe.inputs] + session._state_args(program)
        before = arena.clone()
        torch.manual_seed(k)
        want = [t.clone() for t in flat(program.run(*args))]
        want_arena = arena.clone()
        assert all(torch.isfinite(w).all() for w in want), k
        arena.copy_(before)
        torch.manual_seed(k)
        got = flat(captured[idx](*args))
        assert all(torch.equal(w, g) for w, g in zip(want, got)), k
        assert torch.equal(arena, want_arena), k
    stream.close()


@torch.inference_mode()
def test_a_replayed_program_keeps_step_lists_for_its_pieces_and_its_shared_step():
    """Rules SRc compiled on the CPU (``compiler._compile``: no device check; nothing is
    captured here): every non-trivial piece of each entry, and the shared step its call
    pieces call, keeps its step list and lets its graph go (``graphs.compact_entry``), so
    a kept executable leaves the collector a few objects a piece; a direct call of either
    raises rather than run code made from an empty graph.  (The walk of such an entry,
    captured and replayed, is the test above with ``compact``.)"""
    from cadence_fx import compiler
    from cadence_fx.runtime.graphs import CapturedRegion
    from cadence_fx.runtime.interpret import has_code

    tail = mini_tail(n_timesteps=3, seed=5)
    opt = cadence_fx.optimize(tail)
    pt, pm, spk = s2.synthetic_prompt(11, seed=5)
    exe = compiler._compile(opt.adapter_for(int(pm.shape[1]), spk), "SRc", programs=opt.programs)
    for idx, program in exe.programs.items():
        pieces = [m.piece for m in program.run.children() if isinstance(m, CapturedRegion) and not m.trivial]
        steps = {id(s): s for p in pieces for s in p.modules() if s is not p and isinstance(s, torch.fx.GraphModule)}
        assert pieces and all(len(p.graph.nodes) == 0 and not has_code(p) for p in pieces), idx
        assert len(steps) == 1, idx  # the entry's shared step, called by its call pieces
        [step] = steps.values()
        assert len(step.graph.nodes) == 0, idx
        with pytest.raises(RuntimeError, match="let go"):
            step(*[None] * 3)
