"""``serve-sim`` and ``soak`` (issue 6): the simulator's pieces, its command line, a tiny
exact run and sweep, and soak's checkpoints against stock; rule S on the CPU on the
shared ``t2w_mini`` model (tests/conftest.py)."""

from __future__ import annotations

import copy
import json
import types

import pytest
import torch

import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.tools import cli, registry
from cadence_fx.tools.serve import sim, soak

from helpers import mini_token2wav as mini
from helpers.mini_token2wav import mini_tail

STEPS = 2  # flow-matching steps of the shared ``t2w_mini`` fixture


@pytest.fixture(scope="module")
def t2w(t2w_mini):
    """This file's Token2Wav is the mini one (tests/conftest.py ``t2w_mini``)."""
    return t2w_mini
HOOKS = registry.get("token2wav").serve


def tokens_of(seed: int, n: int) -> list[int]:
    return torch.randint(0, s2.VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_speaking_schedule_and_helpers():
    assert sim.speaking_schedule("speak-heavy", 3, 2, 0) == [[0, 1, 2], [0, 1, 2]]
    mixed = sim.speaking_schedule("mixed", 8, 20, 1)
    assert mixed == sim.speaking_schedule("mixed", 8, 20, 1)  # seeded
    assert 0 < sum(map(len, mixed)) < 8 * 20
    with pytest.raises(cadence_fx.InputError, match="unknown mix 'loud'"):
        sim.speaking_schedule("loud", 1, 1, 0)
    assert sim.largest_holding([{"sessions": 1, "holds_cadence": True}, {"sessions": 2, "holds_cadence": True},
                                  {"sessions": 3, "holds_cadence": False}]) == 2
    assert sim.largest_holding([{"sessions": 1, "holds_cadence": False}]) == 0
    feed = sim.TokenFeed(0, 1, HOOKS.tokens(None))
    c0, c1 = feed.chunk(0), feed.chunk(1)
    assert len(c0) == len(c1) == 28 and c0[25:] == c1[:3]  # the lookahead is the next chunk's start
    assert feed.take() == (0, c0) and feed.take() == (1, c1)


def test_device_time_is_the_sum_and_the_union_of_the_kernels_intervals():
    ev = lambda s, e: types.SimpleNamespace(time_range=types.SimpleNamespace(start=s, end=e))  # noqa: E731 (us)
    # two kernels overlapping 1-3 and 2-5 ms, one alone at 7-8, and an empty one
    out = sim.device_time([ev(2000, 5000), ev(1000, 3000), ev(7000, 8000), ev(9000, 9000)])
    assert out == {"device_ops": 3, "kernel_ms": 6.0, "gpu_busy_ms": 5.0, "concurrency": 1.2}
    assert sim.device_time([]) == {"device_ops": 0, "kernel_ms": 0.0, "gpu_busy_ms": 0.0, "concurrency": None}


def test_serve_sim_cli_arguments():
    with pytest.raises(SystemExit, match="--overlap launches sessions on their own CUDA streams"):
        cli.main(["serve-sim", "--device", "cpu", "--overlap"])
    with pytest.raises(SystemExit, match="--profile reads the GPU's kernel times"):
        cli.main(["serve-sim", "--device", "cpu", "--profile"])
    with pytest.raises(SystemExit, match="--modes: choose from stock,optimized"):
        cli.main(["serve-sim", "--modes", "fast"])
    with pytest.raises(SystemExit) as e:
        cli.main(["soak", "--help"])
    assert e.value.code == 0


def test_serve_sim_tiny_run_is_exact_and_reports_the_schema(t2w):
    """N = 2 sessions, 2 ticks, speak-heavy: each optimized session's PCM is its stock
    counterpart's (one stock tail per session, as upstream serves)."""
    tail = t2w.tail

    def make_stock(i):
        return tail if i == 0 else s2.Token2WavTail(copy.deepcopy(tail.flow), copy.deepcopy(tail.hift),
                                                    n_timesteps=STEPS)

    cfg = sim.SimConfig(seconds=2, warmup_ticks=0)
    report = sim.serve_sim_report(make_optimized=lambda: t2w.opt, make_stock=make_stock,
                                    make_prompt=lambda i: s2.synthetic_prompt(5, seed=20 + i), hooks=HOOKS,
                                    device=torch.device("cpu"), cfg=cfg, sessions=2, meta={"model": "token2wav"})
    json.dumps(report)
    assert report["exact"] is True and report["exact_sessions"] == [True, True]
    assert list(report["modes"]) == ["optimized", "stock"]
    for mode, r in report["modes"].items():
        assert r["status"] == "ok" and r["sessions"] == 2 and r["ticks"] == 2 and r["chunks"] == 4
        assert set(r["speak_ms"]) == {"mean", "p50", "p99", "max"} and len(r["speak_ms_per_tick"]) == 2
        assert r["deadline_misses"] == sum(ms > 1000.0 for ms in r["speak_ms_per_tick"])
        assert r["peak_memory_bytes"] is None  # CPU
        assert len(r["pcm_sha256"]) == 2 and r["pcm_sha256"][0] != r["pcm_sha256"][1]
    opt = report["modes"]["optimized"]
    assert opt["fallbacks"] == {} and opt["capture_failures"] == {}
    assert opt["arena_bytes_per_session"] > 0 and opt["weights_bytes"] > opt["arena_bytes_per_session"]
    assert [s["steps"] for s in opt["stats"]] == [2, 2]
    assert "max_sessions_holding_cadence" not in report


def test_serve_sim_sweep_stops_at_the_first_miss(t2w, tmp_path):
    cfg = sim.SimConfig(seconds=1, warmup_ticks=0, budget_ms=1e-3)  # nothing holds a 1 us budget
    report = sim.serve_sim_report(make_optimized=lambda: t2w.opt, make_stock=None,
                                    make_prompt=lambda i: s2.synthetic_prompt(5, seed=30 + i), hooks=HOOKS,
                                    device=torch.device("cpu"), cfg=cfg, sessions=1, modes=["optimized"],
                                    sweep_to=4, meta={"model": "token2wav", "rules": "S"})
    points = report["sweep"]["optimized"]
    assert len(points) == 1 and points[0]["status"] == "miss" and points[0]["deadline_misses"] == 1
    assert report["max_sessions_holding_cadence"] == {"optimized": 0} and report["exact"] is None
    png = sim.plot_sweep(report, str(tmp_path / "sweep.png"))
    assert png is None or (tmp_path / "sweep.png").stat().st_size > 0


def test_a_sweep_checks_every_session_at_every_n_against_stock_alone(t2w):
    """Each point keeps every session's PCM hash; ``check_sweep`` replays each session on a
    stock model of its own and compares at every N.  A stock model of other weights fails it."""
    tail = t2w.tail

    def make_stock(i):
        return tail  # one stream at a time: the check opens each session's stream in turn

    cfg = sim.SimConfig(seconds=1, warmup_ticks=0, budget_ms=1e9)  # every N holds: the sweep reaches N = 2
    report = sim.serve_sim_report(make_optimized=lambda: t2w.opt, make_stock=make_stock,
                                    make_prompt=lambda i: s2.synthetic_prompt(5, seed=50 + i), hooks=HOOKS,
                                    device=torch.device("cpu"), cfg=cfg, sessions=1, modes=["optimized"],
                                    sweep_to=2, meta={"model": "token2wav", "rules": "S"})
    points = report["sweep"]["optimized"]
    assert [p["sessions"] for p in points] == [1, 2] and [p["chunks_per_session"] for p in points] == [[1], [2, 1]]
    assert [p["exact"] for p in points] == [True, True] and report["exact"] is True
    other = mini_tail(STEPS, seed=1)  # seed 1 weights: not the same model
    assert sim.check_sweep(copy.deepcopy(points), lambda i: other, lambda i: s2.synthetic_prompt(5, seed=50 + i),
                           cfg, HOOKS.tokens(None)) is False


def test_a_sweep_at_given_points_opens_the_sessions_each_point_adds(t2w):
    cfg = sim.SimConfig(seconds=1, warmup_ticks=0, budget_ms=1e9)
    report = sim.serve_sim_report(make_optimized=lambda: t2w.opt, make_stock=lambda i: t2w.tail,
                                    make_prompt=lambda i: s2.synthetic_prompt(5, seed=50 + i), hooks=HOOKS,
                                    device=torch.device("cpu"), cfg=cfg, sessions=1, modes=["optimized"],
                                    sweep_to=3, points=[1, 3], meta={"model": "token2wav", "rules": "S"})
    points = report["sweep"]["optimized"]
    assert [p["sessions"] for p in points] == [1, 3] and [p["chunks_per_session"] for p in points] == [[1], [2, 1, 1]]
    assert [p["exact"] for p in points] == [True, True] and report["max_sessions_holding_cadence"] == {"optimized": 3}
    for bad, message in (([3, 1], "ascending"), ([0, 2], ">= 1"), ([1, 4], "above --max-sessions 3")):
        with pytest.raises(cadence_fx.InputError, match=message):
            sim.sweep_sizes(3, bad)
    with pytest.raises(SystemExit, match="--sweep-points needs --sweep"):
        cli.main(["serve-sim", "--sweep-points", "1,2"])
    with pytest.raises(SystemExit, match="--sweep-points '2,x'"):
        cli.main(["serve-sim", "--sweep", "--sweep-points", "2,x"])


def test_the_exactness_check_in_worker_processes_hashes_what_one_process_does(t2w, monkeypatch):
    """``--check-workers``: each spawned process builds the model from the command's
    options and replays whole sessions on stock; its hashes are the parent's, bit for bit
    (same weights, same thread count), and a session's chunks hash differently.  The
    workers know the mini model through ``CADENCE_FX_MODELS`` (they import what registers it)."""
    import argparse

    from cadence_fx.tools.serve import check
    monkeypatch.setenv(registry.PLUGINS_ENV, "helpers.mini_models")
    args = argparse.Namespace(model=mini.MODEL, device="cpu", n_timesteps=STEPS, dtype="float32", prompt_tokens=5,
                              seed=0, checkpoint=None, rules="S", json=True, func=print)
    cfg = sim.SimConfig(seconds=1, seed=3)
    try:
        mini.register()  # here; the spawned workers register it by importing what the variable names
        spec = registry.get(mini.MODEL)
        jobs = [(0, 2), (1, 1)]  # t2w.tail is what --seed 0 --n-timesteps 2 builds; one stream at a time
        here = [sim.stock_prefixes(t2w.tail, spec.serve.prompt(args, i, torch.device("cpu")), cfg,
                                   HOOKS.tokens(None), i, upto) for i, upto in jobs]
        there = check.in_processes(args, cfg, workers=2)(jobs)
    finally:
        registry.unregister(mini.MODEL)
    assert there == here
    assert len(set(here[0].values())) == 3 and here[0][1] != here[1][1]


def test_a_model_module_that_cannot_be_imported_is_named(monkeypatch):
    monkeypatch.setenv(registry.PLUGINS_ENV, "helpers.no_such_models")
    with pytest.raises(cadence_fx.InputError, match="CADENCE_FX_MODELS: cannot import 'helpers.no_such_models'"):
        registry.get("not-registered-anywhere")


# ------------------------------------------------------------------------- soak
def test_soak_checkpoints_are_exact_against_stock_from_the_session_state(t2w):
    prompt = s2.synthetic_prompt(5, seed=40)
    report = soak.soak(t2w.opt, t2w.tail, prompt, HOOKS, chunks=7, check_every=3, seed=2)
    json.dumps(report)
    assert [r["chunk"] for r in report["checkpoints"]] == [0, 3, 6]  # 3 and 6: steady, after the trim
    assert report["all_exact"], [r for r in report["checkpoints"] if not r["exact"]]
    assert report["memory_flat_bytes"] is None and report["memory_flat"] is None  # CPU: no allocator counter
    assert report["stats"]["steps"] == 7 and report["fallbacks"] == {}
    assert report["arena_bytes"] > 0 and report["chunk_ms"]["p50"] > 0


def test_soak_check_detects_a_different_chunk(t2w, monkeypatch):
    """The checkpoint is not vacuous: stock run from another generator state differs."""
    session = t2w.opt.open_session(*s2.synthetic_prompt(5, seed=41))
    real, seeds = torch.manual_seed, iter([1, 2])  # stock draws from seed 1, the session from seed 2
    monkeypatch.setattr(torch, "manual_seed", lambda s: real(next(seeds)))
    try:
        row = soak.check_chunk_against_stock(t2w.tail, session, tokens_of(60, 28), seed=0, hooks=HOOKS)
    finally:
        monkeypatch.undo()
        session.close()
    assert row["exact"] is False and row["wave_equal"] is False and row["pcm_equal"] is False
