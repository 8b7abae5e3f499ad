"""Moshi's Mimi decoder (moshi 0.2.13) at the released configuration, seeded weights.

CPU: rule S against moshi's own streaming ``decode`` (``mimi.streaming(1)``), bit for
bit on every frame's waveform, PCM and every declared state tensor, past the ring
wrap (250 slots, 2 per frame: the ring wraps at frame 125).  The step is traced
once per module (``optimized`` fixture).  CUDA (skipped without a GPU): rule SRc.
Every test but the ``module_constants`` one skips cleanly when moshi is absent.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from cadence_fx import InputError
from cadence_fx.tools import cli
from cadence_fx.compiler import build_plan
from cadence_fx.integrations.upstream import installed_version, module_constants
from cadence_fx.lockstep import compare_streams

from helpers.marks import cuda, keep_report

needs_moshi = pytest.mark.skipif(importlib.util.find_spec("moshi") is None,
                                 reason="moshi is not installed: pip install --no-deps moshi==0.2.13 (README)")
RING_WRAP_FRAMES = 250 // 2  # RingKVCache capacity / transformer steps per frame


@pytest.fixture(scope="module")
def mm():
    from cadence_fx.integrations import moshi
    return moshi


@pytest.fixture(scope="module")
def optimized(mm):
    """(stock decoder, optimized decoder) at seed 0; the step traced once for the module."""
    import cadence_fx
    stock = mm.MimiDecoder(mm.build_mimi(seed=0))
    return stock, cadence_fx.optimize(stock, rules="S")


def test_module_constants_reads_config_without_running_the_module(tmp_path, monkeypatch):
    pkg = tmp_path / "cadence_probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('the package __init__ must not run')\n")
    (pkg / "loaders.py").write_text("import not_installed_anywhere\n"
                                    "_a = {'dimension': 512, 'ratios': [8, 6]}\n"
                                    "_b = {'input_dimension': _a['dimension'], 'n_q': 32}\n"
                                    "_c = open('/etc/hostname').read()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    got = module_constants("cadence_probe_pkg", "loaders", ("_a", "_b"))
    assert got == {"_a": {"dimension": 512, "ratios": [8, 6]}, "_b": {"input_dimension": 512, "n_q": 32}}
    assert "cadence_probe_pkg.loaders" not in sys.modules
    with pytest.raises(NameError):  # no builtins: a constant can only be a literal expression
        module_constants("cadence_probe_pkg", "loaders", ("_c",))


@needs_moshi
def test_upstream_is_the_pinned_version_imported_without_its_init(mm):
    assert installed_version(mm.UPSTREAM_DISTRIBUTION) == mm.UPSTREAM_VERSION
    up = mm.upstream_modules()
    assert getattr(sys.modules["moshi"], "__cadence_bare__", False), "moshi/__init__ must not run"
    assert getattr(sys.modules["moshi.models"], "__cadence_bare__", False), "moshi/models/__init__ must not run"
    assert "moshi.models.loaders" not in sys.modules and "moshi.models.lm" not in sys.modules
    assert up["MimiModel"].__module__ == "moshi.models.compression"
    assert up["config"]["_transformer_kwargs"]["context"] == 250
    assert up["config"]["_seanet_kwargs"]["ratios"] == [8, 6, 5, 4]


@needs_moshi
def test_explain_plan_is_one_entry_with_a_250_slot_ring(mm, capsys):
    plan = build_plan(mm.explain_adapter("cpu"))
    assert len(plan.catalog) == 1 and plan.catalog[0].steps == "0+"
    kv = next(s for s in plan.layout.slots if s.name == "kv")
    assert kv.shape == (8, 2, 1, 8, 250, 64) and kv.capacity == 250
    assert abs(plan.arena_bytes - plan.stock_state_bytes) < 4096  # Mimi's state is already demand-sized
    assert cli.main(["explain", "--model", "mimi", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {r["name"]: r["catalog_width"] for r in doc["regions"]}["kv"] == 1
    assert len(doc["catalog"]) == 1


@needs_moshi
def test_rule_s_is_exact_past_the_ring_wrap(mm, optimized):
    stock, opt = optimized
    stock.reset()
    opt.reset()
    frames = RING_WRAP_FRAMES + 7
    report = compare_streams(stock, opt, mm.synthetic_codes(frames, seed=0), torch.device("cpu"))
    assert report["exact"], report["mismatches"]
    assert report["pcm_sha256_stock"] == report["pcm_sha256_optimized"]
    assert {c["route"] for c in report["per_chunk"]} == {"graph entry 0"}
    assert opt.stats()["fallback_total"] == 0
    # past the wrap: 2 transformer steps per frame, written mod 250
    assert opt.state()["kv_end"].flatten().tolist() == [2 * frames] * 8 and 2 * frames > 250
    assert opt.state()["kv"].data_ptr() == opt.session.arena.full("kv").data_ptr()


@needs_moshi
def test_rewritten_step_holds_no_undeclared_state(optimized):
    stock, opt = optimized
    exe = opt.executable
    assert "in place ['kv', 'kv_end'" in exe.notes["rewrite"][0] and "written back []" in exe.notes["rewrite"][0]
    gm = exe.programs[0].run
    params = {id(p) for p in stock.mimi.parameters()}
    codebooks = {id(b) for n, b in stock.mimi.named_buffers() if n.endswith("._embedding")}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            folded = node.meta.get("cadence", {}).get("role") == "folded"
            assert id(value) in params or id(value) in codebooks or folded, node.target
    # the optimized decoder shares weights, and holds no stock state of its own
    assert opt.mimi.decoder.model[0].conv.conv.weight is stock.mimi.decoder.model[0].conv.conv.weight
    assert opt.mimi.encoder_transformer.transformer._streaming_state is None


@needs_moshi
def test_other_seed_via_cli_and_an_eager_fallback_are_exact(mm, optimized, capsys):
    code = cli.main(["verify", "--model", "mimi", "--rules", "S", "--device", "cpu", "--chunks", "3",
                     "--seed", "5", "--json", "--quiet"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and report["exact"] and report["fallbacks"] == 0 and report["chunks"] == 3
    # A frame whose codes fail the gate (strides) runs moshi eagerly on the arena state.
    stock, opt = optimized
    stock.reset()
    opt.reset()
    frames = mm.synthetic_codes(3, seed=6)
    for i, (codes, _) in enumerate(frames):
        wav = stock.stream(codes, return_waveform=True)
        # every other element of a [1, 16, 1] tensor: strides (16, 2, 1), not (8, 1, 1)
        t = torch.tensor(codes).repeat_interleave(2).reshape(1, 16, 1)[:, ::2] if i == 1 \
            else mm.codes_tensor(codes, "cpu")
        out = opt.session.step({"codes": t})["pcm"]
        assert torch.equal(out, stock.last_speech) and wav.shape == (1, 1920)
        assert all(torch.equal(stock.state()[k], v) for k, v in opt.state().items())
    assert list(opt.stats()["fallbacks"]) == ["input 'codes' stride (16, 2, 1) != catalog (8, 1, 1)"]


@needs_moshi
def test_bad_codes_are_rejected(mm):
    with pytest.raises(InputError, match="8 integer codes"):
        mm.codes_tensor([1] * 7, "cpu")
    with pytest.raises(InputError, match=r"ints in \[0, 2048\)"):
        mm.codes_tensor([0] * 7 + [2048], "cpu")
    with pytest.raises(InputError, match="8 integer codes"):
        mm.codes_tensor(torch.zeros(8), "cpu")


@needs_moshi
@cuda
@pytest.mark.parametrize("rules", ["S", "SRc"])
def test_rules_are_exact_on_cuda_past_the_ring_wrap(capsys, rules):
    code = cli.main(["verify", "--model", "mimi", "--device", "cuda", "--rules", rules,
                     "--chunks", str(RING_WRAP_FRAMES + 7), "--json", "--quiet"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    keep_report(f"verify-mimi-{rules}.json", line)
    report = json.loads(line)
    assert code == 0 and report["exact"], report["mismatches"]
    assert report["fallbacks"] == 0
