"""``cadence-fx bench --model mimi``: the Mimi part of the bench (one 80 ms frame per chunk).

CPU: the variant checks and the report from synthetic records (no model), and one tiny
real run (B0 and S, a few frames, real workers) that must produce the schema and exact
verdicts.  CUDA (skipped without a GPU): every variant, moshi's own graphs included,
past the KV ring's wrap (frame 125).
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from cadence_fx.tools import registry
from cadence_fx.tools.bench import BenchError, cmd, fleet, models, report

from helpers.marks import cuda

needs_moshi = pytest.mark.skipif(importlib.util.find_spec("moshi") is None,
                                 reason="moshi is not installed: pip install --no-deps moshi==0.2.13 (README)")




MIMI = {"model": "mimi", "gpu": "H", "torch": "x", "date": "d", "command": "c", "dtype": "float32", "warmup": 3,
        "blocks": 2, "chunks": 3}


def _rec(block, ms, pcm="p", state="s", **kw):
    return {"block": block, "chunk_ms": list(ms), "pcm_sha256": pcm, "wave_sha256": "w", "state_sha256": state,
            "compile_s": 1.0, **kw}


# ---------------------------------------------------------------------------- variants
@pytest.mark.parametrize("variant, what", [("vendor", "CUDAGraphed"), ("vendor-nocompile", "no_compile"),
                                           ("SR", "CUDA-graph replay"), ("SRc", "CUDA-graph replay")])
def test_cuda_only_mimi_variants_are_refused_on_cpu(variant, what):
    with pytest.raises(BenchError, match=rf"variant '{variant}' needs CUDA \(.*{what}"):
        cmd.check_variants(["B0", variant], "cpu", "mimi")
    with pytest.raises(BenchError, match="needs CUDA"):  # before any worker starts
        cmd.run_bench(["B0", variant], model="mimi", device="cpu", python="/nonexistent-python")
    assert cmd.check_variants(["B0", "S", variant], "cuda", "mimi") == ["B0", "S", variant]


def test_cli_refuses_vendor_on_the_cpu_before_starting_anything(capsys):
    from cadence_fx.tools import cli
    assert cli.main(["bench", "--model", "mimi", "--variants", "B0,vendor"]) == 2  # --chunks: the model's default
    err = capsys.readouterr().err
    assert "variant 'vendor' needs CUDA" in err and "off CUDA moshi disables its CUDAGraphed wrappers" in err


def test_mimi_refuses_what_it_has_not():
    for r in ("R", "Rc"):
        with pytest.raises(BenchError, match=rf"'{r}' is not built for --model mimi: .*streaming dataclasses"):
            cmd.check_variants([r], "cuda", "mimi")
    with pytest.raises(BenchError, match="unknown variant 'compile-ro' for --model mimi"):
        cmd.check_variants(["compile-ro"], "cuda", "mimi")
    with pytest.raises(BenchError, match="float32"):
        cmd.run_bench(["B0"], model="mimi", dtype="float16", python="/nonexistent-python")
    with pytest.raises(BenchError, match="unknown model 'x'"):
        cmd.check_variants(["B0"], "cpu", "x")
    # token2wav's variants are unchanged
    assert cmd.check_variants(["R", "vendor"], "cuda") == ["R", "vendor"]


def test_worker_command_carries_the_model():
    line = fleet.worker_cmd("py", "vendor", {"model": "mimi", "device": "cuda", "chunks": 150})
    assert line[line.index("--model") + 1] == "mimi" and line[line.index("--chunks") + 1] == "150"


# ---------------------------------------------------------------------------- report
def _report():
    b0 = [_rec(0, [40, 40, 40], kernel_ms=3.0, launches=2000, kernel_launches=2000, graph_launches=0),
          _rec(1, [40, 44, 40])]
    vendor = {"vendor_graphed_calls": 12, "vendor_replays": 12, "vendor_graphed": ["decoder_transformer", "decoder"],
              "vendor_eager": ["quantizer.decode", "upsample"], "vendor_compile": True,
              "kernel_ms": 3.0, "launches": 152, "kernel_launches": 150, "graph_launches": 2}
    srcc = {"kernel_ms": 3.0, "launches": 1, "kernel_launches": 0, "graph_launches": 1}
    results = {"B0": b0,
               "vendor": [_rec(0, [5, 5, 5], **vendor), _rec(1, [6, 6, 6], **vendor)],
               "SRc": [_rec(1, [3.3, 3.3, 3.3], **srcc), _rec(0, [3.4, 3.4, 3.4], **srcc)]}
    return report.summarize(results, dict(MIMI))


def test_mimi_report_budget_is_the_80_ms_frame():
    rep = _report()
    d = rep["duplex"]
    assert d["budget_ms"] == 80.0 and d["stock"] == "B0" and d["optimized"] == "SRc"
    assert d["variants"]["B0"]["share_p50"] == pytest.approx(0.5)
    md = report.report_markdown(rep)
    assert md.startswith("**Mimi bench**") and "2 blocks x 3 frames" in md
    assert "time per frame as a share of its 80 ms cadence budget" in md and "late frames" in md
    assert "B0 uses 50.0% of each 80 ms frame at p50" in md
    table = report.markdown_table(rep)
    assert "vocoder" not in table and "| kernel ms | p50 / kernel | launches |" in table
    assert rep["variants"]["vendor"]["exact"] is True and rep["variants"]["SRc"]["speedup"] > 10


def test_mimi_notes_say_what_moshi_leaves_eager_and_the_targets():
    rep = _report()
    v = rep["variants"]["vendor"]
    assert v["vendor_replays"] == 12 and v["vendor_graphed"] == ["decoder_transformer", "decoder"]
    assert "vendor_replays" not in rep["variants"]["B0"]
    vendor_note, launches, targets = rep["notes"]
    assert "(decoder_transformer and decoder) replayed 12 of their 12 calls" in vendor_note
    assert "quantizer.decode and upsample run eagerly between them" in vendor_note
    assert "150 kernels launched outside its graphs, 2 graph launches" in vendor_note
    assert "torch.compile'd" in vendor_note
    assert launches == "Launches in the profiled frame, kernels + CUDA graphs: B0 2000 + 0; vendor 150 + 2; SRc 0 + 1."
    t = rep["targets"]
    # per block: vendor 5 / 3.4 and 6 / 3.3 -> median of the two paired ratios
    assert t["vs"]["vendor"] == pytest.approx((5 / 3.4 + 6 / 3.3) / 2)
    assert t["vs_met"] == {"vendor": True} and t["floor_ratio"] == pytest.approx(3.35 / 3.0)
    assert t["floor_ratio_met"] is True and t["one_replay"] is True
    assert "SRc is 1.64x vendor" in targets and "target <= 1.15: met" in targets
    assert "one exact replay: yes" in targets


def test_vendor_whose_graphs_never_replayed_says_so():
    rec = _rec(0, [40], vendor_graphed_calls=6, vendor_replays=0, vendor_graphed=["decoder_transformer", "decoder"],
               vendor_eager=["quantizer.decode", "upsample"], vendor_compile=False)
    rep = report.summarize({"B0": [_rec(0, [40])], "vendor-nocompile": [rec]}, dict(MIMI))
    (note,) = rep["notes"]
    assert note.startswith("vendor-nocompile:") and "never replayed" in note and "eager (no_compile)" in note
    assert "targets" not in rep  # no SRc


def test_the_whole_stream_hash_counts_where_both_have_it():
    b0 = [_rec(0, [1], stream_pcm_sha256="a")]
    assert report.summarize({"B0": b0, "S": [_rec(0, [1], stream_pcm_sha256="b")]}, MIMI)["variants"]["S"][
        "mismatched"] == ["stream"]
    assert report.summarize({"B0": b0, "S": [_rec(0, [1])]}, MIMI)["variants"]["S"]["exact"] is True
    assert report.summarize({"B0": b0}, MIMI, b0_replica=[_rec(0, [1])])["b0_reproducible"] is True


def test_token2wav_report_is_unchanged_by_the_model_split():
    rep = report.summarize({"B0": [_rec(0, [500])]}, {"n_timesteps": 5, "dtype": "float32"})
    assert rep["duplex"]["budget_ms"] == 1000.0 and "targets" not in rep
    assert "vocoder ms" in report.markdown_table(rep)
    md = report.report_markdown(rep)
    assert md.startswith("**Token2Wav bench**") and "share of its 1 s cadence budget" in md
    assert "late chunks (share > 1)" in md


# ---------------------------------------------------------------------------- real workers
@needs_moshi
def test_mimi_bench_model_builds_and_counts_the_vendor_path():
    """The worker's Mimi pieces in-process: B0 is the stock decoder, vendor wraps the same
    weights in moshi's own streaming state (graphs off on the CPU: B0's bits), counted."""
    import types
    from cadence_fx.integrations import moshi as mm
    bm = models.MimiBench(types.SimpleNamespace(model="mimi", device="cpu", dtype="float32", seed=0, checkpoint=None),
                          registry.get("mimi"))
    stock = bm.build()
    assert bm.apply(stock, "B0", print) is stock and bm.counters(stock) == {}
    (codes, last), = bm.chunks(1)
    want = bm.pcm_bytes(stock.stream(codes, last_chunk=last, return_waveform=True))
    want_state = bm.state_sha256(stock)
    vendor = bm.apply(stock, "vendor-nocompile", print)
    assert isinstance(vendor, mm.VendorMimi) and vendor.mimi is stock.mimi and not vendor.compile
    assert bm.pcm_bytes(vendor.stream(codes, last_chunk=last, return_waveform=True)) == want
    assert bm.state_sha256(vendor) == want_state
    c = bm.counters(vendor)
    assert c["vendor_graphed_calls"] == 2 and c["vendor_replays"] == 0 and c["vendor_compile"] is False
    assert c["vendor_graphed"] == ["decoder_transformer", "decoder"]
    assert c["vendor_eager"] == ["quantizer.decode", "upsample"]
    bm.reset_counters(vendor)
    assert bm.counters(vendor)["vendor_graphed_calls"] == 0
    assert bm.apply(stock, "vendor", print).compile is True  # moshi's default: its lazy compile of rope on


@needs_moshi
def test_mimi_bench_on_cpu_is_exact(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # three workers share the CI machine's cores
    said = []
    rep = cmd.run_bench(["B0", "S"], model="mimi", device="cpu", chunks=1, blocks=1, warmup=1,
                          out=str(tmp_path), progress=said.append, setup_timeout=240, block_timeout=120)
    assert rep["failures"] == {} and rep["complete"] is True
    assert rep["model"] == "mimi" and rep["budget_ms"] == 80.0 and rep["unit"] == "frame"
    assert rep["frame_samples"] == 1920 and "n_timesteps" not in rep
    v = rep["variants"]
    assert list(v) == ["B0", "S"] and v["S"]["exact"] is True and v["S"]["mismatched"] == []
    assert rep["b0_reproducible"] is True
    for name in ("B0", "S"):
        assert v[name]["chunks"] == 1 and v[name]["blocks"] == 1 and v[name]["p50_ms"] > 0
        assert v[name]["vocoder_ms"] is None and v[name]["kernel_ms"] is None  # no vocoder; no profiler on CPU
        assert v[name]["stream_pcm_sha256"] == v["B0"]["stream_pcm_sha256"]
    assert v["S"]["fallbacks"] == 0 and v["S"]["compile_s"] > 0
    assert os.path.basename(rep["json"]) == "bench-mimi-cpu-float32.json"
    assert json.load(open(rep["json"]))["variants"]["S"]["exact"] is True
    assert "**Mimi bench**" in open(rep["md"]).read()


@needs_moshi
@cuda
def test_mimi_bench_on_cuda_every_variant_past_the_ring_wrap(tmp_path):
    variants = ["B0", "S", "SR", "SRc", "vendor", "vendor-nocompile"]
    rep = cmd.run_bench(variants, model="mimi", device="cuda", chunks=70, blocks=2, warmup=3,
                          out=str(tmp_path), setup_timeout=600, block_timeout=120)
    print(report.report_markdown(rep))
    assert rep["failures"] == {} and rep["deterministic_protocol"] is True
    v = rep["variants"]
    assert rep["b0_reproducible"] is True
    for name in ("S", "SR", "SRc"):  # ours: exact, past the wrap (3 + 140 frames > 125)
        assert v[name]["exact"] is True, (name, v[name]["mismatched"])
        assert v[name]["fallbacks"] == 0
    for name in variants:
        assert v[name]["kernel_ms"] > 0 and v[name]["launches"] > 0 and v[name]["peak_mib"] > 0, name
    assert v["SRc"]["graph_launches"] >= 1 and v["B0"]["graph_launches"] == 0
    for name in ("vendor", "vendor-nocompile"):  # moshi's two graphs replayed on every timed frame
        assert v[name]["vendor_replays"] == v[name]["vendor_graphed_calls"] == 2 * 140, name
        assert v[name]["graph_launches"] == 2
    assert set(rep["targets"]["vs"]) == {"vendor", "vendor-nocompile"}
