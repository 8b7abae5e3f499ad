"""Fast unit tests of the bench driver's pure parts (no model is built)."""

import pytest

from cadence_fx import CadenceError
from cadence_fx import bench


def _rec(block, ms, pcm="p0", wave="w0", peak=None, kernel=None, launches=None):
    return {"block": block, "chunk_ms": list(ms), "peak_bytes": peak, "pcm_sha256": pcm, "wave_sha256": wave,
            "compile_s": 1.0, "kernel_ms": kernel, "launches": launches}


META = {"gpu": None, "torch": "x", "date": "d", "command": "c", "n_timesteps": 5, "dtype": "float32"}


def test_paired_speedups_median_of_block_ratios():
    b0 = [[10, 10, 10], [20, 22, 18], [30, 30, 31]]
    v = [[5, 5, 6], [10, 10, 10], [10, 10, 10]]
    sp = bench.paired_speedups(b0, v)
    assert sp["ratios"] == pytest.approx([2.0, 2.0, 3.0])
    assert sp["median"] == pytest.approx(2.0)
    # pairing is by block, not a ratio of pooled medians
    assert bench.paired_speedups([[10], [100]], [[10], [50]])["median"] == pytest.approx(1.5)
    assert bench.paired_speedups([[10]], [])["median"] is None


def test_summary_schema_and_exactness():
    results = {
        "B0": [_rec(0, [10, 12]), _rec(1, [11, 13])],
        "S": [_rec(1, [5, 6]), _rec(0, [5, 5])],
        "SRc": [_rec(0, [2, 2], pcm="other"), _rec(1, [2, 2])],
    }
    rep = bench.summarize(results, META)
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
    assert rep["b0_reproducible"] is True


def test_summary_cuda_fields_and_wave_mismatch():
    results = {"B0": [_rec(0, [10], peak=2 * 2**20, kernel=8.0, launches=900)],
               "SR": [_rec(0, [4], wave="w1", peak=3 * 2**20, kernel=3.0, launches=40)]}
    v = bench.summarize(results, META)["variants"]
    assert v["SR"]["exact"] is False  # same PCM, different float waveform
    assert v["SR"]["peak_mib"] == pytest.approx(3.0)
    assert v["SR"]["kernel_ms"] == 3.0 and v["SR"]["launches"] == 40
    assert v["B0"]["p90_ms"] == 10


def test_markdown_table_lists_every_variant():
    results = {"B0": [_rec(0, [10])], "S": [_rec(0, [5])], "compile-ro": [_rec(0, [7], pcm="x")]}
    table = bench.markdown_table(bench.summarize(results, META))
    lines = table.splitlines()
    assert lines[0].startswith("| variant |")
    for name in results:
        assert any(line.startswith(f"| {name} |") for line in lines), name
    assert "2.00x" in table and "NO" in table and "(ref)" in table


def test_rotating_block_order():
    order = bench.rotating_order(["B0", "S", "SRc"], 4)
    assert order == [(0, "B0"), (0, "S"), (0, "SRc"),
                     (1, "S"), (1, "SRc"), (1, "B0"),
                     (2, "SRc"), (2, "B0"), (2, "S"),
                     (3, "B0"), (3, "S"), (3, "SRc")]
    for b in range(4):  # every block runs every variant once
        assert sorted(v for bb, v in order if bb == b) == ["B0", "S", "SRc"]


@pytest.mark.parametrize("variant", ["compile-ro", "compile-ro-auto", "compile", "cudagraphs", "vendor", "SR", "SRc"])
def test_cuda_only_variant_on_cpu_is_a_clear_error(variant):
    with pytest.raises(CadenceError, match=rf"variant '{variant}' needs CUDA"):
        bench.check_variants(["B0", variant], "cpu")
    with pytest.raises(bench.BenchError, match="needs CUDA"):
        bench.run_bench(["B0", variant], device="cpu", python="/nonexistent-python")
    assert bench.check_variants(["B0", variant], "cuda") == ["B0", variant]


def test_unknown_and_duplicate_variants():
    with pytest.raises(bench.BenchError, match="unknown variant 'X'"):
        bench.check_variants(["B0", "X"], "cpu")
    with pytest.raises(bench.BenchError, match="duplicate"):
        bench.check_variants(["S", "S"], "cpu")


def test_worker_command_line():
    cmd = bench._worker_cmd("py", "S", 2, {"device": "cpu", "chunks": 3, "checkpoint": None, "no_profile": True,
                                           "verbose": False})
    assert cmd[:4] == ["py", "-m", "cadence_fx.bench", "--worker"]
    assert cmd[cmd.index("--variant") + 1] == "S" and cmd[cmd.index("--block") + 1] == "2"
    assert "--no-profile" in cmd and "--checkpoint" not in cmd and "--verbose" not in cmd


def statistics_median(xs):
    import statistics
    return statistics.median(xs)
