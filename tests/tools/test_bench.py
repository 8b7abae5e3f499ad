"""Fast tests of the bench: its pure parts, and the driver against fake workers (no model is built)."""

import json
import os
import pathlib
import sys
import types

import pytest

from cadence_fx import CadenceError
from cadence_fx.tools.bench import BenchError, cmd, controls, fleet, models, report, stats, worker

FAKE_WORKER = pathlib.Path(__file__).parents[1] / "helpers" / "fake_bench_worker.py"


def _rec(block, ms, pcm="p0", wave="w0", peak=None, kernel=None, launches=None, state=None):
    return {"block": block, "chunk_ms": list(ms), "peak_bytes": peak, "pcm_sha256": pcm, "wave_sha256": wave,
            "state_sha256": state, "compile_s": 1.0, "kernel_ms": kernel, "launches": launches}


META = {"gpu": None, "torch": "x", "date": "d", "command": "c", "n_timesteps": 5, "dtype": "float32"}


def test_paired_speedups_median_of_block_ratios():
    b0 = [[10, 10, 10], [20, 22, 18], [30, 30, 31]]
    v = [[5, 5, 6], [10, 10, 10], [10, 10, 10]]
    sp = stats.paired_speedups(b0, v)
    assert sp["ratios"] == pytest.approx([2.0, 2.0, 3.0])
    assert sp["median"] == pytest.approx(2.0)
    # pairing is by block, not a ratio of pooled medians
    assert stats.paired_speedups([[10], [100]], [[10], [50]])["median"] == pytest.approx(1.5)
    assert stats.paired_speedups([[10]], [])["median"] is None


def test_summary_schema_and_exactness():
    results = {
        "B0": [_rec(0, [10, 12]), _rec(1, [11, 13])],
        "S": [_rec(1, [5, 6]), _rec(0, [5, 5])],
        "SRc": [_rec(0, [2, 2], pcm="other"), _rec(1, [2, 2])],
    }
    rep = report.summarize(results, META)
    for k in ("gpu", "torch", "date", "command", "n_timesteps", "dtype", "variants"):
        assert k in rep
    for name, v in rep["variants"].items():
        for k in ("p50_ms", "p90_ms", "kernel_ms", "peak_mib", "launches", "exact"):
            assert k in v, (name, k)
    assert rep["variants"]["B0"]["exact"] is None
    assert rep["variants"]["S"]["exact"] is True
    assert rep["variants"]["SRc"]["exact"] is False
    assert rep["variants"]["B0"]["p50_ms"] == pytest.approx(11.5)
    assert rep["variants"]["S"]["speedup"] == pytest.approx(statistics_median([11 / 5, 12 / 5.5]))
    assert rep["variants"]["S"]["peak_mib"] is None and rep["variants"]["S"]["kernel_ms"] is None
    assert rep["variants"]["SRc"]["mismatched"] == ["pcm"]
    assert rep["b0_reproducible"] is None  # no replica


def test_b0_reproducible_compares_the_replica_block_by_block():
    b0 = [_rec(0, [10], pcm="a", state="s0"), _rec(1, [10], pcm="b", state="s1")]
    same = [_rec(1, [11], pcm="b", state="s1"), _rec(0, [9], pcm="a", state="s0")]
    rep = report.summarize({"B0": b0}, META, b0_replica=same)
    assert rep["b0_reproducible"] is True and rep["b0_replica_p50_ms"] == [9, 11]
    other_state = [_rec(0, [9], pcm="a", state="zz")]
    assert report.summarize({"B0": b0}, META, b0_replica=other_state)["b0_reproducible"] is False


def test_state_hash_mismatch_is_inexact_and_named():
    results = {"B0": [_rec(0, [10], state="s")], "S": [_rec(0, [5], state="t")]}
    v = report.summarize(results, META)["variants"]["S"]
    assert v["exact"] is False and v["mismatched"] == ["state"]
    assert "NO (state)" in report.markdown_table(report.summarize(results, META))


def test_summary_cuda_fields_and_wave_mismatch():
    results = {"B0": [_rec(0, [10], peak=2 * 2**20, kernel=8.0, launches=900)],
               "SR": [_rec(0, [4], wave="w1", peak=3 * 2**20, kernel=3.0, launches=40)]}
    v = report.summarize(results, META)["variants"]
    assert v["SR"]["exact"] is False  # same PCM, different float waveform
    assert v["SR"]["peak_mib"] == pytest.approx(3.0)
    assert v["SR"]["kernel_ms"] == 3.0 and v["SR"]["launches"] == 40
    assert v["SR"]["floor_ratio"] == pytest.approx(4 / 3.0)
    assert v["B0"]["p90_ms"] == 10


def test_duplex_view_shares_of_the_one_second_budget():
    d = report.duplex_view({"B0": [400.0, 1200.0, 800.0], "SRc": [100.0, 150.0, 120.0], "S": []})
    assert d["budget_ms"] == 1000.0 and d["stock"] == "B0" and d["optimized"] == "SRc"
    assert d["variants"]["B0"]["share_per_chunk"] == pytest.approx([0.4, 1.2, 0.8])
    assert d["variants"]["B0"]["share_p50"] == pytest.approx(0.8)
    assert d["variants"]["B0"]["share_max"] == pytest.approx(1.2)
    assert d["variants"]["B0"]["misses"] == 1 and d["variants"]["SRc"]["misses"] == 0
    assert d["variants"]["S"]["share_p50"] is None and d["variants"]["S"]["chunks"] == 0
    assert report.duplex_view({"S": [1.0]})["stock"] is None


def test_report_markdown_has_the_duplex_comparison_and_notes():
    results = {"B0": [_rec(0, [500, 1100])], "SRc": [_rec(0, [200, 210])]}
    rep = report.summarize(results, {**META, "failures": {"SR": "timed out"}})
    assert rep["duplex"]["variants"]["B0"]["misses"] == 1
    md = report.report_markdown(rep)
    assert "### Duplex view" in md and "| SRc | 20.5% |" in md
    assert "B0 uses 80.0% of each second at p50" in md and "SRc uses 20.5%" in md
    assert "FAILED SR: timed out" in md
    # without SRc the section still shows B0 alone
    assert "B0 uses" in report.duplex_markdown(report.summarize({"B0": results["B0"]}, META))


def test_vendor_note_says_whether_its_graphs_ran():
    rec = {**_rec(0, [10]), "vendor_graph_calls": 0, "vendor_eager_calls": 40,
           "vendor_call_frames": {"50": 40}, "vendor_buckets": {"30": 500, "48": 500, "96": 1000}}
    rep = report.summarize({"B0": [_rec(0, [10])], "vendor": [rec]}, META)
    assert rep["variants"]["vendor"]["vendor_eager_calls"] == 40
    (note,) = rep["notes"]
    assert "0 of 40" in note and "30/48/96" in note and "50 frames" in note and "never used" in note
    assert "vendor_graph_calls" not in rep["variants"]["B0"]


def test_markdown_table_lists_every_variant():
    results = {"B0": [_rec(0, [10])], "S": [_rec(0, [5])], "compile-ro": [_rec(0, [7], pcm="x")]}
    table = report.markdown_table(report.summarize(results, META))
    lines = table.splitlines()
    assert lines[0].startswith("| variant |")
    for name in results:
        assert any(line.startswith(f"| {name} |") for line in lines), name
    assert "2.00x" in table and "NO" in table and "(ref)" in table


def test_rotating_block_order():
    order = cmd.rotating_order(["B0", "S", "SRc"], 4)
    assert order == [(0, "B0"), (0, "S"), (0, "SRc"),
                     (1, "S"), (1, "SRc"), (1, "B0"),
                     (2, "SRc"), (2, "B0"), (2, "S"),
                     (3, "B0"), (3, "S"), (3, "SRc")]
    for b in range(4):  # every block runs every variant once
        assert sorted(v for bb, v in order if bb == b) == ["B0", "S", "SRc"]


@pytest.mark.parametrize("variant", ["compile-ro", "compile-ro-auto", "compile", "cudagraphs", "vendor",
                                     "R", "SR", "Rc", "SRc"])
def test_cuda_only_variant_on_cpu_is_a_clear_error(variant):
    with pytest.raises(CadenceError, match=rf"variant '{variant}' needs CUDA"):
        cmd.check_variants(["B0", variant], "cpu")
    with pytest.raises(BenchError, match="needs CUDA"):
        cmd.run_bench(["B0", variant], device="cpu", python="/nonexistent-python")
    assert cmd.check_variants(["B0", variant], "cuda") == ["B0", variant]


def test_unknown_and_duplicate_variants():
    with pytest.raises(BenchError, match="unknown variant 'X'"):
        cmd.check_variants(["B0", "X"], "cpu")
    with pytest.raises(BenchError, match="duplicate"):
        cmd.check_variants(["S", "S"], "cpu")


def test_worker_command_line():
    line = fleet.worker_cmd("py", "S", {"device": "cpu", "chunks": 3, "blocks": 2, "checkpoint": None,
                                        "no_profile": True})
    assert line[:3] == ["py", "-m", "cadence_fx.tools.bench.worker"]
    assert line[line.index("--variant") + 1] == "S" and line[line.index("--blocks") + 1] == "2"
    assert "--no-profile" in line and "--checkpoint" not in line
    # the module the fleet names is the worker: its command line parses these options
    import importlib
    assert importlib.import_module(fleet.WORKER_MODULE) is worker


def statistics_median(xs):
    import statistics
    return statistics.median(xs)


# ---------------------------------------------------------------------------- driver with fake workers
def _fake_run(tmp_path, variants, behaviours=None, **kw):
    """``run_bench`` on fake workers (``tests/helpers/fake_bench_worker.py``); returns (report, trace, messages)."""
    trace = tmp_path / "trace.jsonl"
    trace.touch()
    behaviours = behaviours or {}
    said = []
    kw = {"device": "cuda", "chunks": 3, "blocks": 3, "setup_timeout": 20, "block_timeout": 20, **kw}
    rep = cmd.run_bench(variants, out=str(tmp_path / "out"), progress=said.append,
                          worker_command=lambda v: [sys.executable, str(FAKE_WORKER), v,
                                                    behaviours.get(v, "ok"), str(trace)], **kw)
    return rep, [json.loads(line) for line in trace.read_text().splitlines()], said


def _alive(pid):
    """Running, i.e. neither gone nor a zombie (a killed orphan waits for init to reap it)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_driver_runs_rotating_blocks_one_worker_at_a_time(tmp_path):
    rep, trace, said = _fake_run(tmp_path, ["B0", "S", "compile"], {"S": "noisy", "compile": "inexact"})
    spans = [t for t in trace if "block" in t]
    expected = [(b, v) for b in range(3) for v in [*[v for bb, v in cmd.rotating_order(["B0", "S", "compile"], 3)
                                                     if bb == b], "B0"]]
    assert [(t["block"], t["name"]) for t in spans] == expected  # the replica (B0) closes every block
    for a, b in zip(spans, spans[1:]):  # never two workers timing at once
        assert a["end"] <= b["start"]
    assert rep["failures"] == {} and rep["complete"] is True
    v = rep["variants"]
    assert list(v) == ["B0", "S", "compile"]
    assert v["S"]["exact"] is True and v["compile"]["exact"] is False and v["compile"]["mismatched"] == ["pcm"]
    assert v["S"]["speedup"] == pytest.approx(2.0) and v["S"]["blocks"] == 3 and v["S"]["chunks"] == 9
    assert v["S"]["kernel_ms"] == 2.5 and v["S"]["floor_ratio"] == pytest.approx(2.0)
    assert v["S"]["peak_mib"] == 1.0 and v["S"]["vocoder_ms"] == 1.0 and v["S"]["setup_s"] == 0.2
    assert rep["b0_reproducible"] is True and len(rep["b0_replica_p50_ms"]) == 3
    assert rep["duplex"]["variants"]["B0"]["share_p50"] == pytest.approx(0.01)
    assert rep["torch"] == "fake"
    # progress: one line per ready worker and per block, then the total
    assert sum("ready after" in m for m in said) == 4
    assert sum(m.startswith("block ") for m in said) == 12 and said[-1].startswith("done in")
    for path in (rep["json"], rep["md"]):
        assert os.path.exists(path)
    assert json.load(open(rep["json"]))["complete"] is True
    assert "### Duplex view" in open(rep["md"]).read()
    assert all(not _alive(t["pid"]) for t in trace if "pid" in t)


@pytest.mark.parametrize("behaviour, reason", [
    ("setup-error", "RuntimeError: no kernel image"),
    ("setup-hang", "setup timed out after 3 s"),
    ("crash-block1", "exited (rc=139): Segmentation fault"),
    ("hang-block1", "'block 1' timed out after 3 s"),
    ("idle-crash", "exited (rc=1)"),
])
def test_a_failing_worker_is_reported_and_the_others_go_on(tmp_path, behaviour, reason):
    rep, trace, said = _fake_run(tmp_path, ["B0", "S", "SR"], {"SR": behaviour}, setup_timeout=3, block_timeout=3)
    assert set(rep["failures"]) == {"SR"} and reason in rep["failures"]["SR"]
    assert rep["variants"]["S"]["blocks"] == 3 and rep["variants"]["S"]["exact"] is True
    assert rep["variants"]["S"]["kernel_ms"] == 2.5  # S still finished
    assert rep["variants"].get("SR", {}).get("blocks", 0) == {"crash-block1": 1, "hang-block1": 1,
                                                              "idle-crash": 1}.get(behaviour, 0)
    assert any("SR FAILED" in m for m in said)
    pids = [t["pid"] for t in trace if "pid" in t] + [t["child"] for t in trace if "child" in t]
    assert all(not _alive(p) for p in pids)  # no orphans, the hung worker's child included


def test_interrupt_kills_every_worker(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.touch()

    def interrupt(msg):
        if msg.startswith("block 1/"):
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        cmd.run_bench(["B0", "S"], device="cpu", chunks=1, blocks=3, progress=interrupt,
                        worker_command=lambda v: [sys.executable, str(FAKE_WORKER), v, "ok", str(trace)])
    pids = [json.loads(line)["pid"] for line in trace.read_text().splitlines() if '"pid"' in line]
    assert len(pids) == 3 and all(not _alive(p) for p in pids)


# ---------------------------------------------------------------------------- worker pieces
class _FakeBenchWorker:
    def __init__(self, args, say):
        if args.variant == "boom":
            raise RuntimeError("setup exploded")
        self.args = args

    def ready(self):
        return {"event": "ready"}

    def block(self, b):
        if b == 7:
            raise RuntimeError("device lost")
        if b == 9:
            raise BenchError("block 9 asked; next is block 0")
        return {"event": "block", "block": b}

    def finish(self):
        return {"event": "finish"}


def _serve(monkeypatch, variant, lines):
    monkeypatch.setattr(worker, "BenchWorker", _FakeBenchWorker)
    sent, feed = [], iter(lines)
    rc = worker.serve(types.SimpleNamespace(variant=variant), sent.append, lambda: next(feed, ""))
    return rc, sent


def test_serve_answers_blocks_and_finish(monkeypatch):
    rc, sent = _serve(monkeypatch, "S", ["block 0\n", "bogus\n", "block 9\n", "block 1\n", "finish\n", "block 2\n"])
    assert rc == 0
    assert [m["event"] for m in sent] == ["ready", "block", "error", "error", "block", "finish"]
    assert "unknown command 'bogus'" in sent[2]["error"] and "BenchError" in sent[3]["error"]


def test_serve_reports_failures_and_exits(monkeypatch):
    rc, sent = _serve(monkeypatch, "S", ["block 7\n", "finish\n"])
    assert rc == 2 and sent[-1] == {"event": "error", "variant": "S", "error": "RuntimeError: device lost"}
    rc, sent = _serve(monkeypatch, "boom", [])
    assert rc == 2 and sent == [{"event": "error", "variant": "boom", "error": "RuntimeError: setup exploded"}]
    assert _serve(monkeypatch, "S", [])[0] == 0  # EOF: the driver went away


class _Graph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


class _FakeDiT:
    """Upstream's dispatch: replay the bucket's graph if the frame count has one, else eager."""

    def __init__(self):
        self.graph_chunk = {30: _Graph(), 48: _Graph()}

    def forward_chunk(self, x, att_cache=None):
        if x.shape[2] in self.graph_chunk:
            self.graph_chunk[x.shape[2]].replay()
            return "graph"
        return "eager"


def test_count_vendor_calls_counts_replays_and_eager_calls():
    est = _FakeDiT()
    inner = est.graph_chunk[30]
    counts = controls.count_vendor_calls(est)
    x50, x30 = types.SimpleNamespace(shape=(2, 320, 50)), types.SimpleNamespace(shape=(2, 320, 30))
    assert est.forward_chunk(x=x50) == "eager" and est.forward_chunk(x50) == "eager"
    assert est.forward_chunk(x=x30, att_cache=1) == "graph"
    assert counts == {"calls": 3, "graph": 1, "frames": {50: 2, 30: 1}}
    assert inner.replays == 1  # the real graph still replayed


def test_state_hash_covers_only_the_live_flow_steps():
    import torch
    live = torch.arange(2 * 3, dtype=torch.float32).reshape(2, 3)
    stock = {"estimator_att_cache": torch.cat([live, torch.ones(14, 3)]), "hift_mel": torch.zeros(1, 2)}
    arena = {"hift_mel": torch.zeros(1, 2), "estimator_att_cache": live.clone()}
    assert models.state_sha256(stock, 2) == models.state_sha256(arena, 2)
    arena["hift_mel"] = torch.zeros(1, 2, dtype=torch.float16)
    assert models.state_sha256(stock, 2) != models.state_sha256(arena, 2)
    arena = {"hift_mel": torch.zeros(1, 2), "estimator_att_cache": live + 1}
    assert models.state_sha256(stock, 2) != models.state_sha256(arena, 2)
