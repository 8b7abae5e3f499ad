"""VibeVoice's acoustic decoder (vibevoice 0.0.1), seeded weights.

The released decoder (343 M parameters, 16 catalog entries) takes minutes to trace on
2 CPU cores, so its plan is checked here without a model (``explain``) and its
exactness by ``cadence-fx verify --model vibevoice`` (docs/adapters.md).  The CPU
tests stream a decoder of the same classes with fewer filters, fewer and shorter stages
and ratios 2 (``SMALL``; traced in seconds): its first upsampler's carry grows 0, 1,
2, 3 frames (4 catalog entries), its second 0, 2, 3, its third 0 then 3, as the
released ones grow over 16 steps.  Rule S against upstream's own streaming ``decode`` with its
``VibeVoiceTokenizerStreamingCache``, bit for bit on every waveform, PCM and every
carry.  CUDA (skipped without a GPU): rules S and SRc at the released configuration.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

import cadence_fx
from cadence_fx import DeclarationError, InputError, TraceError
from cadence_fx.tools import cli
from cadence_fx.compiler import build_plan, preview_partition
from cadence_fx.integrations import vibevoice as vv
from cadence_fx.integrations.upstream import installed_version
from cadence_fx.lockstep import compare_streams

from helpers.marks import cuda, keep_report

needs_vibevoice = pytest.mark.skipif(
    importlib.util.find_spec("vibevoice") is None or importlib.util.find_spec("transformers") is None,
    reason="vibevoice is not installed: pip install --no-deps vibevoice==0.0.1 and the models extra (README)")


#: the released classes with 2 filters, three upsamplers of ratio 2 and stages of 2, 1, 1, 1 blocks
SMALL = dict(decoder_n_filters=2, encoder_n_filters=2, decoder_ratios=[2] * 3, encoder_ratios=[2] * 3,
             encoder_depths="1-1-1-2")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def optimized():
    """(stock decoder, optimized decoder) of the SMALL decoder at seed 0, traced once for the module."""
    stock = vv.VibeVoiceDecoder(vv.build_acoustic_tokenizer(seed=0, **SMALL))
    return stock, cadence_fx.optimize(stock, rules="S")


def test_released_plan_needs_no_model(capsys):
    plan = build_plan(vv.explain_adapter("cpu"))
    assert len(plan.layout.slots) == 34 and len(plan.catalog) == 16
    assert [e.steps for e in plan.catalog][-2:] == [(14,), "15+"]
    hz = {c.name: (c.hz, c.stride) for c in plan.declaration.clocks}
    assert hz["latent"] == (7.5, 1) and hz["sample"] == (24000.0, 3200)
    up = {n: [e.regions[n].shape[2] for e in plan.catalog] for n in ("up1", "up2", "up6")}
    assert up["up1"] == list(range(16)) and up["up2"] == [0, 8] + [9] * 14 and up["up6"] == [0] + [3] * 15
    # stock pins channels x (context + step frames) per conv: its entries are views of each step's input
    assert plan.stock_state_bytes == 4 * (64 * 7 + 8 * 2048 * 7 + 2048 * 16 + 3 * 1024 * 14 + 1024 * 17
                                          + 3 * 512 * 46 + 512 * 49 + 3 * 256 * 206 + 256 * 207 + 3 * 128 * 806
                                          + 128 * 803 + 3 * 64 * 1606 + 64 * 1603 + 4 * 32 * 3206)
    assert plan.arena_bytes == 1_876_480 and plan.stock_state_bytes == 6_995_456
    assert cli.main(["explain", "--model", "vibevoice", "--json", "--dtype", "bfloat16"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(doc["catalog"]) == 16 and doc["stock_state_bytes"] == 6_995_456 // 2
    assert {s["dtype"] for s in doc["catalog"][0]["regions"].values()} == {"bfloat16"}
    with pytest.raises(SystemExit, match="--model token2wav runs float32 or float16, not --dtype bfloat16"):
        cli.main(["explain", "--model", "token2wav", "--dtype", "bfloat16"])


@needs_vibevoice
def test_upstream_is_the_pinned_version_imported_without_its_init():
    assert installed_version(vv.UPSTREAM_DISTRIBUTION) == vv.UPSTREAM_VERSION
    up = vv.upstream_modules()
    assert getattr(sys.modules["vibevoice"], "__cadence_bare__", False), "vibevoice/__init__ must not run"
    assert getattr(sys.modules["vibevoice.modular"], "__cadence_bare__", False)
    assert "vibevoice.modular.modeling_vibevoice_inference" not in sys.modules  # the LM, diffusion head, ...
    assert up["Model"].__module__ == "vibevoice.modular.modular_vibevoice_tokenizer"
    defaults = up["Config"]()  # the released config is upstream's defaults
    assert all(getattr(defaults, k) == v for k, v in vv.RELEASED_CONFIG.items())


@needs_vibevoice
@pytest.mark.parametrize("seed, steps", [(0, 24), (7, 26)])
def test_rule_s_is_exact_through_warm_up(optimized, seed, steps):
    stock, opt = optimized
    stock.reset()
    opt.reset()
    ptrs = opt.session.arena.data_ptrs()
    latents = vv.synthetic_latents(steps, seed)
    stock_ptrs = []
    for i in range(steps):
        report = compare_streams(stock, opt, latents[i:i + 1], CPU)
        assert report["exact"], (i, report["mismatches"])
        assert report["per_chunk"][0]["route"] == f"graph entry {min(i, 3)}"
        ss, so = stock.state(), opt.state()
        assert {r: tuple(t.shape) for r, t in ss.items()} == {r: tuple(t.shape) for r, t in so.items()}
        assert all(t.data_ptr() == ptrs[r] for r, t in so.items() if t.numel())  # the arena never moves
        stock_ptrs.append(ss["head"].data_ptr())
    assert so["up1"].shape[2] == so["up2"].shape[2] == so["up3"].shape[2] == 3
    assert so["stage0_block1"].shape == (1, 16, 6) and so["head"].shape == (1, 2, 6)
    assert len(set(stock_ptrs)) > 1  # upstream's cache entries are new tensors every step
    assert opt.stats()["fallback_total"] == 0 and opt.stats()["steps"] == steps
    # stock keeps whole concatenated inputs alive; the plan counts exactly that
    assert stock.state_storage_bytes() == opt.adapter.stock_state_bytes() == opt.executable.plan.stock_state_bytes


@needs_vibevoice
def test_rewritten_step_allocates_no_state(optimized):
    stock, opt = optimized
    exe = opt.executable
    assert len(exe.programs) == 4
    for program in exe.programs.values():
        record = exe.notes["rewrite"][program.entry.index]
        assert "in place []" in record and f"written back {list(opt.adapter.signature.regions)}" in record
        gm = program.run
        assert [n.name for n in gm.graph.nodes if n.op == "placeholder"] == \
            ["in_latent"] + [f"arena_{r}" for r in opt.adapter.signature.regions]
        params = {id(p) for p in stock.model.parameters()}
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                assert id(getattr(gm, node.target)) in params, node.target
    # SRc would capture every entry whole: no host sync, no eager island
    for record in preview_partition(exe, "chunk").values():
        assert not record.islands and all(capturable for _, capturable, _ in record.regions)


@needs_vibevoice
def test_a_strided_latent_runs_eagerly_on_the_arena_and_stays_exact(optimized):
    stock, opt = optimized
    stock.reset()
    opt.reset()
    for i, (latent, _) in enumerate(vv.synthetic_latents(6, seed=3)):
        stock.stream(latent)
        # every other element of [1, 128, 1]: strides (128, 2, 1), not the catalog's (64, 1, 1)
        fed = latent.repeat_interleave(2, dim=1)[:, ::2] if i in (1, 4) else latent
        out = opt.session.step({"latent": fed})["audio"]
        assert torch.equal(out, stock.last_speech), i
        assert all(torch.equal(stock.state()[k], v) for k, v in opt.state().items()), i
    assert opt.stats()["fallbacks"] == {"input 'latent' stride (128, 2, 1) != catalog (64, 1, 1)": 2}


@needs_vibevoice
def test_other_seed_length_and_dtype_via_cli_are_exact(monkeypatch, capsys):
    build = vv.build_acoustic_tokenizer
    monkeypatch.setattr(vv, "build_acoustic_tokenizer", lambda seed, checkpoint=None: build(seed, checkpoint, **SMALL))
    for dtype, chunks in (("float32", 30), ("bfloat16", 6)):
        code = cli.main(["verify", "--model", "vibevoice", "--rules", "S", "--device", "cpu", "--chunks", str(chunks),
                         "--seed", "5", "--dtype", dtype, "--json", "--quiet"])
        report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert code == 0 and report["exact"] and report["fallbacks"] == 0 and report["chunks"] == chunks, dtype
        assert report["pcm_sha256_stock"] == report["pcm_sha256_optimized"]
        assert report["per_chunk"][-1]["samples"] == 8 and report["dtype"] == dtype


@needs_vibevoice
def test_declaration_fails_closed_when_upstreams_cache_differs(optimized, monkeypatch):
    stock, opt = optimized
    model = stock.model
    up2 = model.get_submodule("decoder.upsample_layers.2.0")
    # statically: a transposed conv keeping one more frame than 2r - 1
    monkeypatch.setattr(up2, "context_size", 4)
    with pytest.raises(DeclarationError, match=r"region 'up2': decoder.upsample_layers.2.0 has .* = \(8, 4, 2, True\)"):
        vv.check_declaration(model)
    # at run time (past the static check): the cache entry it writes is not the declared window
    step = opt.adapter.bind({})
    steady = {r: torch.zeros(s.shape) for r, s in opt.executable.plan.catalog[-1].regions.items()}
    latent = vv.synthetic_latents(1)[0][0]
    with pytest.raises(DeclarationError, match=r"region 'up2': upstream wrote \(1, 8, 4\) .* holds \(1, 8, 3\)"):
        step({"latent": latent}, steady)
    monkeypatch.undo()
    # a conv whose cache key no region owns
    monkeypatch.setattr(up2, "_layer_id", "sconvtr1d_elsewhere")
    with pytest.raises(DeclarationError, match="cache entry 'sconvtr1d_elsewhere', no declared region's"):
        step({"latent": latent}, steady)
    monkeypatch.undo()
    # and the trace fails closed with the same message
    monkeypatch.setattr(up2, "context_size", 4)
    with pytest.raises(TraceError, match="region 'up2'"):
        cadence_fx.compiler.compile_executable(opt.adapter, "S")
    monkeypatch.undo()
    assert step({"latent": latent}, steady)[0]["audio"].shape == (1, 8)


@needs_vibevoice
def test_bad_latents_are_rejected(optimized):
    stock, opt = optimized
    for bad, match in ((torch.zeros(1, 64, 2), r"one latent frame \[1, 64, 1\].*got shape \(1, 64, 2\)"),
                       (torch.zeros(64), r"got shape \(64,\)"),
                       (torch.zeros(1, 64, 1, dtype=torch.float64), "latent is torch.float64; this decoder runs "
                                                                      "torch.float32"),
                       (torch.zeros(1, 64, 1, dtype=torch.int64), "latent is torch.int64"),
                       (torch.zeros(1, 64, 1, device="meta"), "latent is on meta; this decoder runs on cpu"),
                       ([0.0] * 64, "a VibeVoice latent is a tensor")):
        for decoder in (stock, opt):
            with pytest.raises(InputError, match=match):
                decoder.stream(bad)
    with pytest.raises(InputError, match="no flush step"):
        opt.stream(torch.zeros(1, 64, 1), last_chunk=True)
    # VibeVoice's generate passes [1, 1, 64]: decode permutes it, so it is the same frame
    stock.reset()
    opt.reset()
    latent = vv.synthetic_latents(1, seed=9)[0][0]
    assert stock.stream(latent.reshape(1, 1, 64)) == opt.stream(latent)


@needs_vibevoice
@cuda
@pytest.mark.parametrize("rules, dtype", [("S", "float32"), ("SRc", "float32"), ("SRc", "bfloat16")])
def test_released_decoder_is_exact_on_cuda(capsys, rules, dtype):
    code = cli.main(["verify", "--model", "vibevoice", "--device", "cuda", "--rules", rules, "--dtype", dtype,
                     "--chunks", "24", "--json", "--quiet"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    keep_report(f"verify-vibevoice-{rules}-{dtype}.json", line)
    report = json.loads(line)
    assert code == 0 and report["exact"], report["mismatches"]
    assert report["fallbacks"] == 0 and report["chunks"] == 24
    if rules == "SRc":
        assert all(r["route"].startswith("replay entry") for r in report["per_chunk"])


@needs_vibevoice
@cuda
def test_replay_over_stock_state_is_refused_with_the_reason():
    stock = vv.VibeVoiceDecoder(vv.build_acoustic_tokenizer(seed=0, **SMALL).to("cuda"))
    with pytest.raises(cadence_fx.RulesError, match="new tensor each step"):
        cadence_fx.optimize(stock, rules="R")


@needs_vibevoice
def test_serve_sim_runs_vibevoice_sessions_each_exact_against_its_own_stock_decoder(optimized):
    """serve-sim on VibeVoice's decoder: the feed is seeded float latents
    (``SeededFrames``), a tick one frame per session (3,200 samples: its budget
    133 ms); two sessions on one optimized decoder (``open_session``) against one stock
    decoder per session, PCM equal per session, then a sweep checked at every N."""
    import argparse

    from cadence_fx.tools import registry
    from cadence_fx.tools.serve import sim
    stock, opt = optimized
    hooks = registry.get("vibevoice").serve
    frames = hooks.tokens(argparse.Namespace(dtype="float32", device="cpu"))
    assert torch.equal(frames.frame(0, 1, 2), frames.frame(0, 1, 2)) and not torch.equal(frames.frame(0, 1, 2),
                                                                                         frames.frame(0, 2, 2))

    def make_stock(i):
        return vv.VibeVoiceDecoder(vv.build_acoustic_tokenizer(seed=0, **SMALL))

    cfg = sim.SimConfig(seconds=2, warmup_ticks=0, budget_ms=1000.0 * 3200 / 24000)
    common = dict(make_optimized=lambda: opt, make_stock=make_stock, make_prompt=lambda i: None, hooks=hooks,
                  device=torch.device("cpu"), cfg=cfg, tokens=frames, meta={"model": "vibevoice"})
    report = sim.serve_sim_report(sessions=2, **common)
    assert report["exact"] is True and report["exact_sessions"] == [True, True]
    o = report["modes"]["optimized"]
    assert o["chunks"] == 4 and o["fallbacks"] == {} and o["weights_bytes"] > o["arena_bytes_per_session"] > 0
    cfg.budget_ms = 1e9  # every N holds on a loaded CPU: the sweep reaches N = 2
    report = sim.serve_sim_report(sessions=1, modes=["optimized"], sweep_to=2, **common)
    assert [p["exact"] for p in report["sweep"]["optimized"]] == [True, True] and report["exact"] is True

