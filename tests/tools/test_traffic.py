"""``cadence-fx traffic`` on the shared small Token2Wav (tests/conftest.py ``t2w``: 2 flow
steps, one optimized model): two interleaved conversations, each with its own voice
length, two turns with a reset, steady chunks, a shorter window and a flush, every chunk
checked against its own stock stream."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.tools import cli, registry, traffic

SMALL = "t2w-traffic"


@pytest.fixture
def small(t2w):
    def build(args):
        if (args.n_timesteps, args.seed, args.checkpoint, args.dtype) != (t2w.steps, 0, None, "float32"):
            raise SystemExit(f"{SMALL} is the shared t2w model: --n-timesteps {t2w.steps}, seed 0, float32")
        return t2w.tail, s2.synthetic_prompt(args.prompt_tokens, args.seed)

    registry.register(dataclasses.replace(registry.get("token2wav"), name=SMALL, build=build,
                                          optimize=lambda stock, rules, progress: t2w.opt, bench=None))
    yield t2w
    registry.unregister(SMALL)
    t2w.opt.set_off_catalog("eager")  # the shared model's default again (traffic switched it)


def test_the_plan_is_seeded_and_shaped_like_the_demo():
    a = traffic.plan(3, 8, 4, traffic.DEFAULTS, 6561, 25, 3)
    assert a == traffic.plan(3, 8, 4, traffic.DEFAULTS, 6561, 25, 3)
    assert len({c.prompt_tokens for c in a}) == 8 and all(75 <= c.prompt_tokens <= 250 for c in a)
    for c in a:
        assert 1 <= len(c.turns) <= 4
        for turn in c.turns:
            assert 2 <= len(turn) - 2 <= 12 and all(len(t) == 28 and not last for t, last in turn[:-2])
            assert 11 <= len(turn[-2][0]) <= 30 and not turn[-2][1]
            assert 1 <= len(turn[-1][0]) <= 28 and turn[-1][1]


def test_traffic_is_exact_and_every_chunk_runs_the_program(small, capsys, tmp_path):
    """Windows and flushes get their own programs (``--off-catalog specialize``, the
    default): one symbolic trace for every window length and one for every flush length
    (the chunk length is symbolic), specialized per voice and length, reused in later
    turns; every chunk of both conversations runs the traced program."""
    code = cli.main(["traffic", "--model", SMALL, "--n-timesteps", "2", "--conversations", "2", "--turns", "2",
                     "--prompt-range", "5,6", "--steady-range", "2,3", "--window-range", "8,10", "--flush-range",
                     "3,5", "--idle", "--json", "--quiet", "--out", str(tmp_path)])
    out = capsys.readouterr()
    report = json.loads(out.out.strip().splitlines()[-1])
    assert code == 0 and report["exact"] is True, report
    assert report["conversations"] == 2 and {p["prompt_tokens"] for p in report["per_conversation"]} == {5, 6}
    full = json.loads((tmp_path / "traffic.json").read_text())
    rows = full["per_chunk"]
    assert len(rows) == report["chunks"] and all(r["wave_equal"] and r["pcm_equal"] and r["state_equal"] for r in rows)
    steady = [r for r in rows if r["tokens"] == 28]
    assert steady and all(r["route"].startswith("graph entry") for r in steady)  # the catalog's chunks
    ends = [r for r in rows if r["tokens"] != 28]
    assert ends and all(r["route"].startswith("graph specialization entry 2 | token (1, ") for r in ends), ends
    assert report["program_share"] == 1.0 and report["fallbacks"] == {}
    assert report["replayed_share"] == 0.0  # rule S on the CPU replays nothing
    assert report["off_catalog"] == "specialize"
    # --idle: every session had time after each event; rule S on the CPU has nothing to capture there
    assert report["idle"] is True and report["captured_idle"] == 0 and report["idle_s"] >= 0
    # one program per voice and end-of-turn shape; its symbolic steps: one per flag, any length
    shapes = {(r["conversation"], r["tokens"], r["last"]) for r in ends}
    assert report["specializations"]["built"] == len(shapes) and report["specializations"]["refused"] == {}
    chunk_keys = {k[:-1] for k, _ in small.opt.programs.items()
                  if any(not isinstance(size, int) for _, shape, _ in k[2] for size in shape)}
    assert len(chunk_keys) == 2, chunk_keys  # the window's and the flush's
    assert (tmp_path / "traffic.md").read_text().startswith("# traffic: 2 conversations")
