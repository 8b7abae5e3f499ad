"""The real Token2Wav tail (stepaudio2-minicpmo 0.1.1) at the released configuration.

CPU: rule S against the stock streaming path, bit for bit, past warm-up, growth,
trim and steady state.  CUDA (skipped without a GPU): the stock restatement against
upstream's own ``Token2wav.stream``, and every replay rule.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import sys
import weakref

import numpy as np
import pytest
import torch

import cadence_fx
from cadence_fx.tools import cli
from cadence_fx.compiler import build_plan
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.integrations.upstream import installed_version
from cadence_fx.lockstep import compare_streams

from helpers.graph_structure import assert_later_steps_share_one
from helpers.marks import cuda, keep_report
from helpers.upstream_token2wav import upstream_token2wav_class



#: one cell per rule by default (each traces for about a minute on the H200 host);
#: CADENCE_FULL_MATRIX=1 runs every rule x dtype x step count (20 cells);
#: CADENCE_CELLS="SRc:float32:5,S:float16:10" runs the cells named
FULL_MATRIX = os.environ.get("CADENCE_FULL_MATRIX") == "1"
REPLAY_CELLS = ([(r, d, k) for r in ("S", "R", "SR", "Rc", "SRc") for d in ("float32", "float16") for k in (5, 10)]
                if FULL_MATRIX else
                [(r, d, int(k)) for r, d, k in (c.split(":") for c in os.environ["CADENCE_CELLS"].split(","))]
                if os.environ.get("CADENCE_CELLS") else
                [("R", "float32", 5), ("SR", "float32", 5), ("Rc", "float16", 10), ("SRc", "float32", 5),
                 ("SRc", "float16", 10)])


def test_upstream_is_the_pinned_version_imported_without_its_init():
    assert installed_version(s2.UPSTREAM_DISTRIBUTION) == s2.UPSTREAM_VERSION
    classes = s2.upstream_modules()
    assert getattr(sys.modules["stepaudio2"], "__cadence_bare__", False), "package __init__ must not run"
    assert "stepaudio2.token2wav" not in sys.modules  # the heavy front end stays unimported
    assert classes["DiT"].__module__ == "stepaudio2.cosyvoice2.flow.decoder_dit"


def test_explain_default_plan_is_demand_sized():
    plan = build_plan(s2.explain_adapter(50, 5, False, "cpu"))
    doc = plan.to_json()
    widths = {r["name"]: r["catalog_width"] for r in doc["regions"]}
    assert widths["estimator_att_cache"] == widths["conformer_att_cache"] == 3
    assert len(doc["catalog"]) == 3
    assert doc["arena_bytes"] <= 0.10 * doc["stock_state_bytes"]
    # estimator K|V: 5 steps x 16 blocks x 2 (CFG) x 8 heads x (100 + 100 + 56) frames x 128 x 4
    # bytes: prompt, retained, and the longest step (a flush of 28 tokens: the mel clock's max_stride)
    est = next(r for r in doc["regions"] if r["name"] == "estimator_att_cache")
    assert est["bytes"] == 5 * 16 * 2 * 8 * 256 * 128 * 4
    json.dumps(doc)


def test_optimized_model_does_not_keep_the_stock_buffer_alive():
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow, hift)
    big = weakref.ref(flow.decoder.att_cache_buffer)
    q_weight = flow.decoder.estimator.blocks[0].attn.to_q.weight
    assert big().nbytes == 16 * 16 * 2 * 8 * 1000 * 128 * 4
    opt = cadence_fx.optimize(tail)
    del tail, flow
    gc.collect()
    assert big() is None, "the optimized model must share parameters, not the 2,000 MiB buffer"
    assert opt.flow.decoder.att_cache_buffer.numel() == 0
    assert opt.flow.decoder.estimator.blocks[0].attn.to_q.weight is q_weight  # shared, not copied


@pytest.fixture(scope="module")
def released_default():
    """The released default configuration (5 steps, prompt 50, seed 0) built and traced once
    for this module's two CLI runs (verify, then demo): the registry keeps what a command built
    and hands it to the next command of the same configuration."""
    from cadence_fx.tools import registry
    registry.reuse_built_models()
    yield
    registry.reuse_built_models(False)


def test_verify_cli_rule_s_default_configuration_is_exact(released_default, capsys):
    code = cli.main(["verify", "--model", "token2wav", "--rules", "S", "--device", "cpu",
                     "--chunks", "8", "--json", "--quiet"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert report["exact"] is True and report["mismatches"] == []
    assert report["chunks"] == 8 and report["fallbacks"] == 0
    assert report["arena_bytes"] <= 0.10 * report["stock_state_bytes"]
    routes = [c["route"] for c in report["per_chunk"]]
    assert routes[:3] == ["graph entry 0", "graph entry 1", "graph entry 2"]
    assert set(routes[3:]) == {"graph entry 2"}  # trim and steady state stay on the steady entry
    assert report["pcm_sha256_stock"] == report["pcm_sha256_optimized"]
    # the released model's flow steps 1..4 of each entry's symbolic program are one step
    # called four times (passes/step_share; ten steps: the mini model's test below)
    from cadence_fx.tools import registry
    [opt] = [m for m in registry.kept_models() if isinstance(m, s2.OptimizedToken2Wav)]
    programs = list(opt.programs.items())
    assert len(programs) == 3
    for _, sym in programs:
        assert_later_steps_share_one(sym, 5)


def test_ten_steps_other_prompt_and_seed_with_a_flush_chunk_is_exact():
    """Ten flow steps (nine calls of one shared step), seed 3, a 7-token prompt and a flush,
    then a second stream on the same graphs.  On the mini Token2Wav (helpers/mini_token2wav.py:
    upstream's classes, 2 DiT blocks): what ten steps change is how many times the step is
    called and at which times, not the blocks inside it; the released model runs ten steps on
    the GPU (``test_replay_rules_are_exact_on_cuda``'s 10-step cells, test_upstream_token2wav)."""
    from helpers.mini_token2wav import mini_tail
    tail = mini_tail(n_timesteps=10, seed=3)
    pt, pm, spk = s2.synthetic_prompt(7, seed=3)
    opt = cadence_fx.optimize(tail)
    opt.set_stream_cache(pt, pm, spk)
    tail.set_stream_cache(pt, pm, spk)
    chunks = s2.synthetic_chunks(6, seed=3, final_tokens=17)
    torch.manual_seed(3)
    report = compare_streams(tail, opt, chunks, torch.device("cpu"))
    assert report["exact"], report["mismatches"]
    stats = opt.stats()
    assert stats["fallbacks"] == {"flags last_chunk outside the catalog (eager)": 1}
    assert sum(stats["graph_runs"].values()) == 6
    # the state after the flush is upstream's, trimmed to prompt + 100 frames
    # (upstream's cache buffer holds 16 blocks whatever the depth: helpers/mini_token2wav.py)
    assert opt.state()["estimator_att_cache"].shape == (10, 16, 2, 8, 14 + 100, 128)
    # a second stream of the same prompt length reuses the graphs and is exact again
    opt.set_stream_cache(pt, pm, spk)
    tail.set_stream_cache(pt, pm, spk)
    again = compare_streams(tail, opt, chunks[:3], torch.device("cpu"))
    assert again["exact"]
    assert len(opt._executables) == 1
    # steps 1..9 of each entry's symbolic program are one step called nine times (passes/step_share)
    for _, sym in opt.programs.items():
        assert_later_steps_share_one(sym, 10)


def test_bad_input_is_rejected_and_loses_no_state():
    flow, hift = s2.build_modules(0)
    opt = cadence_fx.optimize(s2.Token2WavTail(flow, hift))
    with pytest.raises(ValueError, match="stream_cache is not set"):
        opt.stream([1] * 28)
    pt, pm, spk = s2.synthetic_prompt(4)
    with pytest.raises(cadence_fx.InputError, match="prompt_mels has 7 frames; 4 prompt tokens need exactly 8"):
        opt.set_stream_cache(pt, pm[:, :7], spk)
    with pytest.raises(cadence_fx.InputError, match="prompt_mels is on meta"):
        opt.set_stream_cache(pt, pm.to("meta"), spk)
    with pytest.raises(cadence_fx.InputError, match="NaN or inf"):
        opt.set_stream_cache(pt, torch.full_like(pm, float("nan")), spk)
    with pytest.raises(cadence_fx.InputError, match=r"ints in \[0, 6561\); got \[6561\]"):
        s2.tokens_tensor([1, 2, 6561], "cpu")
    with pytest.raises(cadence_fx.InputError, match="must be integers"):
        s2.tokens_tensor(torch.ones(3), "cpu")
    # the plan for another prompt length, without tracing anything
    text = opt.explain(2 * 7)
    assert "estimator_att_cache" in text and "K=3" in text and opt._executables == {}
    assert "symbolic: prompt_frames" in text and "programs held: none yet (nothing traced)" in text
    with pytest.raises(cadence_fx.RulesError, match="need a CUDA device"):
        cadence_fx.optimize(s2.Token2WavTail(flow, hift), rules="SRc")
    with pytest.raises(cadence_fx.RulesError, match="unknown rules"):
        cadence_fx.optimize(s2.Token2WavTail(flow, hift), rules="X")


# ----------------------------------------------------------------------- CUDA only
@cuda
@pytest.mark.parametrize("n_timesteps", [5, 10])
def test_stock_restatement_equals_upstream_token2wav_stream(n_timesteps):
    from cadence_fx.lockstep import deterministic_protocol
    deterministic_protocol()
    Token2wav = upstream_token2wav_class()
    flow, hift = s2.build_modules(0)
    flow, hift = flow.cuda(), hift.cuda()
    ours = s2.Token2WavTail(flow, hift, n_timesteps=n_timesteps)
    pt, pm, spk = s2.synthetic_prompt(50, device="cuda")
    ours.set_stream_cache(pt, pm, spk)
    up = Token2wav.__new__(Token2wav)  # attributes only: no checkpoint files needed
    # its own modules: the stock state aliases the flow's cache buffers, so two streams
    # on one flow would overwrite each other's state (same weights, copied bit for bit)
    up.float16, up.n_timesteps, up.flow, up.hift = False, n_timesteps, copy.deepcopy(flow), copy.deepcopy(hift)
    up.mel_cache_len, up.source_cache_len = 8, 3840
    up.speech_window = torch.from_numpy(np.hamming(2 * 3840)).cuda()
    lens = torch.tensor([pt.shape[1]], device="cuda")
    up.cache = (pt, lens, spk, pm, torch.tensor([pm.shape[1]], device="cuda"))
    up.stream_cache = {k: v.clone() for k, v in ours.state().items() if not k.startswith("hift")}
    up.hift_cache_dict = {"mel": torch.zeros(1, 80, 0, device="cuda"), "source": torch.zeros(1, 1, 0, device="cuda"),
                          "speech": torch.zeros(1, 0, device="cuda")}
    for tokens, last in s2.synthetic_chunks(14, final_tokens=10):
        rng = torch.cuda.get_rng_state()  # the flow's noise and HiFT's draws are all on the device
        a = ours.stream(tokens, last_chunk=last, return_waveform=True)
        torch.cuda.set_rng_state(rng)
        b = up.stream(tokens, prompt_wav=None, last_chunk=last, return_waveform=True)
        assert np.array_equal(a, b)
        for k in ("conformer_att_cache", "estimator_att_cache", "conformer_cnn_cache", "estimator_cnn_cache"):
            assert torch.equal(ours.state()[k], up.stream_cache[k]), k


@cuda
@pytest.mark.parametrize("rules,dtype,steps", REPLAY_CELLS)
def test_replay_rules_are_exact_on_cuda(capsys, rules, dtype, steps):
    code = cli.main(["verify", "--device", "cuda", "--rules", rules, "--dtype", dtype, "--n-timesteps", str(steps),
                     "--chunks", "14", "--final-tokens", "10", "--json", "--quiet"])
    out = capsys.readouterr()
    assert out.out.strip(), f"verify printed no report (exit {code}): {out.err[-3000:]}"
    line = out.out.strip().splitlines()[-1]
    keep_report(f"verify-{rules}-{dtype}-nt{steps}.json", line)
    report = json.loads(line)
    assert code == 0 and report["exact"], report["mismatches"]
    # only the flush chunk runs eagerly; every other chunk replays (or runs its graph, rule S)
    assert report["fallback_reasons"] == {"flags last_chunk outside the catalog (eager)": 1}
    routes = [c["route"] for c in report["per_chunk"]]
    graph = "graph" if rules == "S" else "replay"
    assert all(r.startswith(graph) for r in routes[:-1]), routes


def test_demo_writes_two_identical_wavs(released_default, tmp_path, capsys):
    code = cli.main(["demo", "--chunks", "2", "--out", str(tmp_path), "--json"])
    out = capsys.readouterr()
    report = json.loads(out.out.strip().splitlines()[-1])
    assert code == 0 and report["exact"] is True and report["rules"] == "S"
    wavs = {k: (tmp_path / f"token2wav-{k}.wav").read_bytes() for k in ("stock", "optimized")}
    assert wavs["stock"] == wavs["optimized"] and len(wavs["stock"]) > 44 + 2 * 20160
    assert "needs a GPU" in out.err


@cuda
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_replayed_chunk_is_one_graph_per_stretch_and_the_shared_calls_one_and_exact(dtype):
    """Rules SRc: istft's per-call host read is gone (passes.istft_check), so every catalog
    entry is captured whole, without an eager island: the four later flow steps' calls of
    the shared step each a region of their own (``SHARE_CALLS``; else the entry is one
    region), between them one graph per stretch, and the calls all replay the first
    call's graph (recorded once per entry); every chunk bit-exact against stock."""
    from cadence_fx.lockstep import deterministic_protocol
    from cadence_fx.runtime.graphs import SHARE_CALLS, CapturedRegion
    deterministic_protocol()
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=5, float16=dtype == "float16")
    opt = cadence_fx.optimize(tail, rules="SRc")
    prompt = s2.synthetic_prompt(20, seed=2, device="cuda")
    opt.set_stream_cache(*prompt)
    tail.set_stream_cache(*prompt)
    regions = 2 * 4 + 1 if SHARE_CALLS else 1
    for idx, text in opt.session.executable.notes["rewrite"].items():
        parts = {p.split(": ", 1)[0]: p for p in text.split("; ") if ": " in p}
        istft = text[text.find("IstftWithoutHostRead"):text.find("Partition")]
        assert istft.startswith("IstftWithoutHostRead: 1 istft without host read"), (idx, istft)
        assert parts.get("Partition", "").startswith(f"Partition: {regions} region{'s' if regions > 1 else ''} "
                                                     f"({regions} capturable, 0 eager)"), (idx, parts)
    for idx, program in opt.session._programs.items():
        captured = [m for m in program.run.children() if isinstance(m, CapturedRegion)]
        followers = [m for m in captured if m.leader is not None]
        assert len(followers) == (3 if SHARE_CALLS else 0), idx  # steps 2..4 replay step 1's call
        assert len({id(m.leader) for m in followers}) <= 1 and all(m.leader.graph is not None for m in followers)
        assert all(m.graph is not None for m in captured if m.leader is None), idx
    report = compare_streams(tail, opt, s2.synthetic_chunks(6, final_tokens=5), torch.device("cuda"), seed=3)
    assert report["exact"], report["mismatches"]
    routes = [c["route"] for c in report["per_chunk"]]
    assert all(r.startswith("replay") for r in routes[:-1]), routes
