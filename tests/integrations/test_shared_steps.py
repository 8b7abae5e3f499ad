"""The later flow steps are specialized once and called (passes/step_share), rule S here:
the mini Token2Wav (tests/helpers/mini_token2wav.py: the released architecture, two DiT
blocks; the released model's later steps share one step in test_token2wav.py's ten-step
test) at 3 flow steps (the fewest with two alike steps; the suite's shared models have
2), seed 5 weights, every chunk of a real turn against stock: two voices (the second
specialized from the first's symbolic programs), warm-up, growth, steady state and a
flush (specialized on first use), and a reset.  (A shorter window goes through the
same specialization as the flush: its own symbolic step, another trace here.)"""

from __future__ import annotations

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
