"""``cadence-fx traffic`` on the shared mini Token2Wav (tests/conftest.py ``t2w_mini``: 2 flow
steps, one optimized model): two interleaved conversations, each with its own voice
length, two turns with a reset, steady chunks, a shorter window and a flush, every chunk
checked against its own stock stream."""

from __future__ import annotations

import dataclasses
import json
import types

import pytest
import torch

from cadence_fx import foreground
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.tools import cli, registry, traffic


@pytest.fixture(scope="module")
def t2w(t2w_mini):
    """This file's Token2Wav is the mini one (tests/conftest.py ``t2w_mini``): what it checks
    is mechanism, which the released configuration's own tests do not need to repeat."""
    return t2w_mini

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
    def chunk_keys():  # the symbolic steps whose chunk length is symbolic (a shared model: other tests' too)
        return {k[:-1] for k, _ in small.opt.programs.items()
                if any(not isinstance(size, int) for _, shape, _ in k[2] for size in shape)}
    before = chunk_keys()
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
    assert report["collector"]["full_collections"] >= report["collector"]["idle_collections"] >= 0
    # one program per voice and end-of-turn shape; its symbolic steps: one per flag, any length
    shapes = {(r["conversation"], r["tokens"], r["last"]) for r in ends}
    assert report["specializations"]["built"] == len(shapes) and report["specializations"]["refused"] == {}
    # each chunk's own work: every build on the first chunk of its voice and shape, none on a steady one
    built = [r for r in rows if r["work"]["built"]]
    assert sum(r["work"]["built"] for r in rows) == len(shapes) and all(r["work"]["build_s"] > 0 for r in built)
    assert {(r["conversation"], r["tokens"], r["last"]) for r in built} == shapes, built
    assert all(len(r["work"]["gc"]) == 3 and min(r["work"]["gc"]) >= 0 for r in rows)
    keys = chunk_keys()
    assert len(keys) <= len(before) + 2 and {k for k in keys if k[0] == 2} >= keys - before, keys
    assert len({k for k in keys if k[0] == 2}) == 2, keys  # at the steady entry: the window's and the flush's
    assert (tmp_path / "traffic.md").read_text().startswith("# traffic: 2 conversations")


def test_traffic_on_capacity_graphs_is_exact_and_restores_the_models_setting(small, capsys):
    """``--capacity``: both voices (14 and 16 prompt frames: lengths no other test here has
    compiled, whose executables the kept model would hold) run the graphs of one capacity
    (20 frames), windows and flushes on its shared graphs, every one built before the traffic
    (``--prepare``: windows of 11-13 tokens with the lookahead, flushes of 3-5); exact, every
    chunk the program's, with idle time between chunks (``--idle``: the checks of the shared
    graphs made there); the kept model's own setting comes back after."""
    code = cli.main(["traffic", "--model", SMALL, "--n-timesteps", "2", "--conversations", "2", "--turns", "1",
                     "--prompt-range", "7,8", "--steady-range", "2,2", "--window-range", "8,10", "--flush-range",
                     "3,5", "--capacity", "20", "--prepare", "--idle", "--json", "--quiet"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["prepare"]["shapes"] == report["prepare"]["served"] == 6, report["prepare"]
    assert report["prepare"]["classes"] == {"20 mel frames": {}}, report["prepare"]  # both prompts in its class
    ahead = report["specializations"]["ahead"]  # idle time, unbounded: every check made, every own program built
    assert ahead["checked"] >= 1 and ahead["own_waiting"] == 0, ahead
    assert code == 0 and report["exact"] is True and report["program_share"] == 1.0, (
        report["fallbacks"], report["per_conversation"])
    assert report["capacity"] == [20] and report["fallbacks"] == {}
    stats = small.opt.capacity_stats()
    assert small.opt.capacity is None and stats["refused"] == {}, stats  # restored; no voice refused
    assert not any(exe.notes.get("capacity") for exe in small.opt._executables.values())  # let go with it
    shared = stats["built"]["20 mel frames"]
    assert shared["held"] and shared["refused"] == {}, shared  # the windows' and flushes' shapes, for both voices
    assert shared["built"] == 6, shared  # all before the traffic: its voices built none
    with pytest.raises(SystemExit):
        cli.main(["traffic", "--model", SMALL, "--capacity", "2x0"])
    with pytest.raises(SystemExit, match="give --capacity too"):
        cli.main(["traffic", "--model", SMALL, "--prepare"])
    with pytest.raises(SystemExit, match="--shared-captures shares a capacity's captures"):
        cli.main(["traffic", "--model", SMALL, "--shared-captures"])
    with pytest.raises(SystemExit, match="shares captured CUDA graphs: rules SR or SRc"):
        cli.main(["traffic", "--model", SMALL, "--capacity", "20", "--shared-captures"])
    assert report["shared_captures"] is False and report["working_arenas"] == []
    assert report["prepare"]["captured"] is None  # (shared: on a GPU, capacity_r_call.sh --shared-captures)


def test_prepare_only_builds_one_shard_of_the_shapes_and_runs_no_conversation(small, capsys, tmp_path):
    """``--prepare-only --prepare-shard I/N`` (processes sharing the program cache, each building
    a part before the traffic loads it all): every N-th window and flush length from the I-th,
    the capacity's own graphs, no conversation; its report printed and written; misuse refused."""
    args = ["traffic", "--model", SMALL, "--n-timesteps", "2", "--conversations", "2", "--turns", "1",
            "--prompt-range", "7,8", "--window-range", "8,10", "--flush-range", "3,5", "--capacity", "20", "--prepare"]
    code = cli.main(args + ["--prepare-only", "--prepare-shard", "1/2", "--quiet", "--out", str(tmp_path)])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and report["shard"] == [1, 2] and report["capacity"] == [20], report
    shapes = set(report["prepare"]["by_capacity"]["20 mel frames"])  # windows 11-13 (lookahead in), flushes 3-5
    assert shapes == {"entry 2 | token (1, 12), spk (1, 192)", "entry 2 | token (1, 4), spk (1, 192) | last_chunk"}, \
        shapes
    assert report["prepare"]["served"] == report["prepare"]["shapes"] == 2, report["prepare"]
    assert json.loads((tmp_path / "prepare.json").read_text()) == report
    assert not (tmp_path / "traffic.json").exists()  # no conversation ran
    assert small.opt.capacity is None  # the kept model's setting restored
    for extra, why in ((["--prepare-only"], "give --prepare too"), (["--prepare-shard", "0/2"], "give --prepare too")):
        with pytest.raises(SystemExit, match=why):
            cli.main(args[:-1] + extra)
    with pytest.raises(SystemExit, match="give --prepare-only"):
        cli.main(args + ["--prepare-shard", "0/2"])
    for bad in ("2/2", "x", "-1/2"):
        with pytest.raises(SystemExit):
            cli.main(args + ["--prepare-only", "--prepare-shard", bad])


def test_each_shard_prepares_its_lengths_and_the_odd_ones_the_classes_first():
    """``--prepare-shard I/N``: every N-th window (lookahead in) and flush length from the I-th, every
    prompt length; the odd shards prepare the classes' capacities first (the order only: shards
    sharing the program cache then trace different programs at once)."""
    import types
    from cadence_fx.tools.traffic_prepare import prepare_for
    calls = []

    class Opt:
        def prepare_capacity(self, windows, flushes, prompt_tokens, classes_first):
            calls.append((windows, flushes, list(prompt_tokens), classes_first))
            return {}
    ranges = {"window": (8, 11), "flush": (3, 6), "prompt": (7, 8)}
    for shard in ((0, 2), (1, 2), None):
        prepare_for(types.SimpleNamespace(prepare_shard=shard), Opt(), ranges, 3, None)
    assert calls == [([11, 13], [3, 5], [7, 8], False), ([12, 14], [4, 6], [7, 8], True),
                     ([11, 12, 13, 14], [3, 4, 5, 6], [7, 8], False)], calls


def test_the_warm_up_voices_are_two_adjacent_free_lengths_never_both_of_token2wavs_rare_class():
    """A length whose 2P + 49 frames divide by 25 takes another branch of Token2Wav's code
    (its own symbolic trace): one warm-up voice of it left the common class to trace with
    the clock running (H200, 2026-12-03).  Two adjacent lengths cannot both be of it."""
    def rare(p):
        return (2 * p + 49) % 25 == 0
    assert [p for p in range(75, 251) if rare(p)][:2] == [88, 113]  # 163 (the old warm-up voice) is one too
    for used in ({163}, {162, 163, 164}, set(range(75, 162)), set(range(75, 251))):
        pair = traffic.warm_up_lengths(used, 75, 250)
        assert len(pair) == 2 and pair[1] == pair[0] + 1 and not used & set(pair), (used, pair)
        assert not all(rare(p) for p in pair)
    assert traffic.warm_up_lengths({5, 6}, 5, 6) == [7, 8]  # no free pair in the range: past it
    assert traffic.warm_up_lengths(set(), 75, 250) == [162, 163]  # from the middle outward


def test_the_warm_up_builds_every_voice_at_its_set_up_even_with_background_builds_on():
    """With background on, a second voice would only queue a build that starts at its
    first chunk; the warm-up sends none, so it builds with background off, then puts it back."""
    class Opt:
        def __init__(self, background):
            self.background, self.seen = background, []

        def set_background(self, on):
            self.background = on

        def open_session(self, *prompt):
            if prompt == ("bad",):
                raise ValueError("bad prompt")
            self.seen.append((prompt, self.background))
            return types.SimpleNamespace(close=lambda: None)

    for background in (True, False):
        opt = Opt(background)
        traffic.warm_up(opt, [(1,), (2,)])
        assert opt.seen == [((1,), False), ((2,), False)] and opt.background is background
    opt = Opt(True)
    with pytest.raises(ValueError, match="bad prompt"):
        traffic.warm_up(opt, [(1,), ("bad",)])
    assert opt.background is True  # put back on an error too


def test_the_player_stalls_only_when_a_chunk_is_late_for_the_audio_before_it():
    rows = [dict(ready_s=1.0, audio_s=1.0, turn_start=True),   # plays 1.0-2.0
            dict(ready_s=1.5, audio_s=1.0, turn_start=False),  # ready before 2.0: plays 2.0-3.0
            dict(ready_s=3.25, audio_s=0.5, turn_start=False),  # 250 ms late: plays 3.25-3.75
            dict(ready_s=3.5, audio_s=0.25, turn_start=False),  # ready: plays 3.75-4.0
            dict(ready_s=9.0, audio_s=1.0, turn_start=True)]   # a new turn starts afresh: no stall
    traffic.player(rows)
    assert [r["stall_ms"] for r in rows] == [0.0, 0.0, 250.0, 0.0, 0.0]
    assert traffic.audio_s([1] * 28, False, 3) == 1.0 and traffic.audio_s([1] * 7, True, 3) == 7 / 25


class _Stock:
    """A stock tail whose every chunk's waveform is its tokens' sum (seed-independent) and
    whose state counts the chunks since its set-up."""

    def set_stream_cache(self, *prompt):
        self.n = torch.zeros(1)

    def stream(self, tokens, last_chunk=False, return_waveform=False):
        self.n += 1
        self.last_speech = torch.tensor([float(sum(tokens))])

    def state(self):
        return {"n": self.n}


def test_the_check_after_a_paced_run_finds_a_wrong_waveform_and_a_wrong_state():
    """``--pace`` checks stock after the timed run: a chunk whose waveform differs, and a
    turn whose end state differs, are reported (so a paced report cannot pass blindly)."""
    import argparse
    convo = traffic.Conversation(0, 5, [[([1, 2], False), ([3], True)], [([4], True)]])
    rows = [dict(conversation=0, chunk=k, wave=torch.tensor([w])) for k, w in enumerate([3.0, 3.5, 4.0])]
    live = {0: {"prompt": (), "ttfa_ms": 10.0}}
    saved = {0: [{"n": torch.full((1,), 2.0)}, {"n": torch.full((1,), 7.0)}]}  # turn 1 ends at 1 chunk, not 7
    traffic._check_after(argparse.Namespace(seed=0), [convo], _Stock(), torch.device("cpu"), live, rows, saved)
    assert [r["wave_equal"] for r in rows] == [True, False, True]
    assert [r["state_checked"] for r in rows] == [False, True, True]
    assert [r["state_equal"] for r in rows] == [True, True, False] and rows[2]["mismatched"] == ["n"]
    assert all("wave" not in r and r["stock_ms"] >= 0 for r in rows) and len(live[0]["ttfa_ms"]) == 2


def test_paced_traffic_is_exact_and_reports_latency_and_stalls(small, capsys, tmp_path):
    """``--pace``: chunks arrive at the audio rate (on this CPU the small model is slower
    than real time, so chunks are late and the player stalls: counted, not failed); stock
    runs after the timed run on the same seeds, every chunk and every turn's end exact.
    The same traffic as the test above (its programs, built there, are reused here)."""
    code = cli.main(["traffic", "--model", SMALL, "--n-timesteps", "2", "--conversations", "2", "--turns", "2",
                     "--prompt-range", "5,6", "--steady-range", "2,3", "--window-range", "8,10", "--flush-range",
                     "3,5", "--pace", "--stagger-s", "0.5", "--idle", "--json", "--quiet", "--out", str(tmp_path)])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and report["exact"] is True and report["pace"] is True, report
    rows = json.loads((tmp_path / "traffic.json").read_text())["per_chunk"]
    assert len(rows) == report["chunks"] and all(r["wave_equal"] and r["pcm_equal"] and r["state_equal"] for r in rows)
    turns = {(r["conversation"], r["turn"]) for r in rows}
    assert sum(r["state_checked"] for r in rows) == len(turns)  # each turn's end
    assert all(r["latency_ms"] >= 0 and r["ready_s"] >= r["due_s"] and r["stall_ms"] >= 0 for r in rows)
    for c in (0, 1):  # arrivals at the audio rate: a chunk is due when the one before would have played
        mine = [r for r in rows if r["conversation"] == c]
        assert mine[0]["due_s"] == 0.5 * c and mine[0]["turn_start"]
        for a, b in zip(mine, mine[1:]):
            assert b["due_s"] == pytest.approx(a["due_s"] + a["audio_s"], abs=1e-3)
    assert report["stalls"] == sum(r["stall_ms"] > 0 for r in rows)
    assert report["latency_ms_p50"] is not None and report["program_share"] == 1.0
    # before the clock: two voices of adjacent lengths no conversation has (5 and 6 are taken), set up and closed
    assert report["warm_up_tokens"] == [7, 8] and report["warm_up_s"] > 0
    assert report["build_share"] == foreground.DEFAULT_BUILD_SHARE  # the process's, not given
    assert "paced" in (tmp_path / "traffic.md").read_text()


@pytest.mark.parametrize("bad", ["-1", "nan"])
def test_a_bad_stagger_is_refused_by_name_before_anything_is_built(bad):
    with pytest.raises(SystemExit, match="--stagger-s must be a number of seconds >= 0"):
        cli.main(["traffic", "--model", "token2wav", "--pace", "--stagger-s", bad, "--quiet"])


@pytest.mark.parametrize("bad", ["0", "1.5", "x"])
def test_a_bad_build_share_is_refused_by_name_before_anything_is_built(bad, capsys):
    with pytest.raises(SystemExit):
        cli.main(["traffic", "--model", "token2wav", "--background", "--build-share", bad, "--quiet"])
    assert "--build-share" in capsys.readouterr().err
    assert foreground.build_share() == foreground.DEFAULT_BUILD_SHARE


def test_the_markdown_tables_keep_their_columns_when_a_route_names_a_shape():
    """A route names its shape with ``|`` (``replay specialization entry 2 | token (1, 17), ...``):
    the slowest-chunks table escapes it, so each row has its header's columns (the H100 report
    of session forty-three had rows of 13 cells under a header of 10)."""
    import re
    from cadence_fx.tools import traffic_report
    from pathlib import Path
    report = json.loads((Path(__file__).parents[2] / "docs/results/traffic-h100.json").read_text())
    assert any("|" in r["route"] for r in report["per_chunk"] if "work" in r)  # the case this is about
    text = traffic_report.markdown(report)
    cells = lambda row: len(re.findall(r"(?<!\\)\|", row))
    tables, header = 0, None
    for row in text.splitlines():
        if not row.startswith("|"):
            header = None
            continue
        if header is None:
            header, tables = cells(row), tables + 1
        assert cells(row) == header, row
    assert tables == 2 and "entry 2 \\| token" in text


def test_the_report_says_where_prepare_put_the_prompt_lengths_of_another_branch_class():
    """``--prepare``'s ``classes`` in the Markdown: how many lengths run on their class's
    capacity (which), and the ones none serves; nothing when every length is the capacity's."""
    from cadence_fx.tools.traffic_report import _classes
    assert _classes({"classes": {"500 mel frames": {}}}) == "" and _classes({"classes": None}) == ""
    said = _classes({"classes": {"500 mel frames": {"276 mel frames": "on 476 mel frames",
                                                    "226 mel frames": "on 476 mel frames",
                                                    "2 mel frames": "SpecializationRefused: no step"}}})
    assert said == ("; 2 prompt lengths of another branch class on their class's capacity, built and prepared "
                    "there too (476 mel frames); 1 served by none, built for their own length when they come: "
                    "2 mel frames"), said


def test_the_report_says_how_many_prepared_graphs_came_from_disk():
    """``--prepare`` on a program cache that holds some of the capacity graphs (a restarted
    server): the Markdown says how many were loaded, and says nothing where none was."""
    from cadence_fx.tools.traffic_report import _loaded
    assert _loaded({"loaded": 0}) == "" and _loaded({}) == ""
    assert _loaded({"loaded": 47}) == " (47 of them loaded from the program cache on disk)"
