"""The command line through the model registry, on a small model: the shared ``t2w_mini``
Token2Wav (tests/conftest.py: the released architecture with fewer blocks, 2 flow steps,
one optimized model) registered as ``t2w-small``, so explain, verify and demo run here
without building or tracing the released configuration.  The released configuration's
end-to-end runs (verify, the demo) are in test_token2wav.py.
"""

from __future__ import annotations

import dataclasses
import json
import types

import pytest

import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.tools import cli, registry
from cadence_fx.tools.bench import BenchError

SMALL = "t2w-small"


@pytest.fixture(scope="module")
def t2w(t2w_mini):
    return t2w_mini


PROMPT = 5  # tokens: the prompt length the other users of ``t2w`` trace too


@pytest.fixture
def small(t2w):
    """``t2w`` as a registered model: its tail, a seeded prompt, and its optimized model
    for rule S (any other rules go to ``cadence_fx.optimize``)."""
    def build(args):
        if (args.n_timesteps, args.seed, args.checkpoint, args.dtype) != (t2w.steps, 0, None, "float32"):
            raise SystemExit(f"{SMALL} is the shared t2w model: --n-timesteps {t2w.steps}, seed 0, float32")
        return t2w.tail, s2.synthetic_prompt(args.prompt_tokens, args.seed)

    def optimize(stock, rules, progress):
        return t2w.opt if rules == "S" else cadence_fx.optimize(stock, rules=rules, progress=progress)

    registry.register(dataclasses.replace(registry.get("token2wav"), name=SMALL, build=build, optimize=optimize,
                                          bench=None, serve=None))
    yield t2w
    registry.unregister(SMALL)


def run(capsys, *argv: str) -> tuple[int, dict | None, str, str]:
    """``cadence-fx argv``: exit code, the last stdout line as JSON (if it is), stdout, stderr."""
    code = cli.main(list(argv))
    out = capsys.readouterr()
    lines = out.out.strip().splitlines()
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    return code, doc, out.out, out.err


def small_args(*extra: str) -> list[str]:
    return ["--model", SMALL, "--n-timesteps", "2", "--prompt-tokens", str(PROMPT), *extra]


# ---------------------------------------------------------------------------- registry
def test_registry_names_every_model_once_and_refuses_unknown_ones():
    assert registry.names() == ("token2wav", "mimi", "vibevoice")
    assert registry.names(lambda s: s.bench) == ("token2wav", "mimi")
    assert registry.names(lambda s: s.serve) == ("token2wav", "mimi", "vibevoice")
    assert registry.names(lambda s: s.serve and s.serve.load_stock_state) == ("token2wav",)  # soak
    assert registry.get("mimi").dtypes == ("float32",) and registry.get("mimi").unit == "frame"
    assert registry.get("token2wav").flush and not registry.get("vibevoice").flush
    with pytest.raises(registry.UnknownModel, match="unknown model 'x'; choose from token2wav, mimi, vibevoice"):
        registry.get("x")
    with pytest.raises(BenchError, match="unknown model 'vibevoice'; choose from token2wav, mimi"):
        registry.bench_model("vibevoice")


def test_a_registered_model_is_a_choice_of_every_model_option(small, capsys):
    for command in ("explain", "verify", "demo"):
        with pytest.raises(SystemExit) as e:
            cli.main([command, "--help"])
        assert e.value.code == 0 and SMALL in capsys.readouterr().out
    registry.unregister(SMALL)
    with pytest.raises(SystemExit) as e:
        cli.main(["verify", "--model", SMALL])
    assert e.value.code == 2 and f"invalid choice: '{SMALL}'" in capsys.readouterr().err


def test_reused_models_are_keyed_by_their_whole_configuration():
    built = []
    spec = registry.ModelSpec("counted", ("float32",), "chunk", 1.0, 24000,
                              build=lambda args: (built.append(args) or object(), None), explain_adapter=None,
                              chunks=None, start=None, executable=None, describe=None,
                              optimize=lambda stock, rules, progress: types.SimpleNamespace(stock=stock, rules=rules))
    args = dict(seed=0, checkpoint=None, n_timesteps=2, prompt_tokens=5, dtype="float32", device="cpu")
    try:
        registry.reuse_built_models()
        a, _ = registry.build(spec, types.SimpleNamespace(**args))
        assert registry.build(spec, types.SimpleNamespace(**args))[0] is a and len(built) == 1
        for key, other in (("seed", 1), ("checkpoint", "ckpt"), ("n_timesteps", 5), ("prompt_tokens", 50),
                           ("dtype", "float16"), ("device", "cuda")):
            assert registry.build(spec, types.SimpleNamespace(**{**args, key: other}))[0] is not a, key
        assert len(built) == 7
        opt = registry.optimize(spec, a, "S")
        assert registry.optimize(spec, a, "S") is opt and opt.stock is a
        assert registry.optimize(spec, a, "SRc") is not opt
        registry.reuse_built_models(False)  # off: every command builds its own
        assert registry.build(spec, types.SimpleNamespace(**args))[0] is not a and len(built) == 8
        assert registry.optimize(spec, a, "S") is not opt
    finally:
        registry.reuse_built_models(False)


# ---------------------------------------------------------------------------- explain
def test_explain_plans_the_small_model_without_building_it(small, capsys):
    code, plan, _, _ = run(capsys, "explain", *small_args("--json"))
    assert code == 0
    assert len(plan["catalog"]) == 3 and plan["arena_bytes"] < plan["stock_state_bytes"]
    est = next(r for r in plan["regions"] if r["name"] == "estimator_att_cache")
    assert est["bytes"] == 2 * 16 * 2 * 8 * (2 * PROMPT + 100 + 56) * 128 * 4  # 2 live flow steps; room for a flush of 28
    assert plan["setup"] == {"symbolic_dims": ["prompt_frames"], "max_executables": 32}
    code, _, text, _ = run(capsys, "explain", *small_args())
    assert code == 0 and "estimator_att_cache" in text
    assert "each catalog entry is traced once for every prompt_frames and specialized per stream" in text
    with pytest.raises(SystemExit, match=f"--model {SMALL} runs float32 or float16, not --dtype bfloat16"):
        cli.main(["explain", *small_args("--dtype", "bfloat16")])


def test_explain_trace_previews_the_partition_of_the_traced_graphs(small, capsys):
    code, doc, _, _ = run(capsys, "explain", *small_args("--trace", "--json"))
    assert code == 0
    assert sorted(doc["partition"]) == ["0", "1", "2"]
    for entry in doc["partition"].values():
        assert set(entry) == {"chunk", "step"}
        for part in entry.values():
            assert part["regions"] and all(set(r) == {"name", "capturable", "nodes"} for r in part["regions"])
            assert all(set(v) == {"node", "reason"} for v in part["eager"])
        # per step (SR) cuts the chunk's graph at every DiT call: more regions than per chunk (SRc)
        assert len(entry["step"]["regions"]) > len(entry["chunk"]["regions"])
    code, _, text, _ = run(capsys, "explain", *small_args("--trace"))
    assert code == 0 and "Partition preview" in text and "entry 2 (SR):" in text


# ---------------------------------------------------------------------------- verify
VERIFY_FIELDS = {"exact", "chunks", "mismatches", "pcm_sha256_stock", "pcm_sha256_optimized", "per_chunk", "model",
                 "rules", "device", "dtype", "n_timesteps", "prompt_tokens", "seed", "fallbacks", "fallback_reasons",
                 "stats", "arena_bytes", "state_bytes", "stock_state_bytes", "compile_s", "torch",
                 "setup_s", "setups", "per_prompt"}
SETUP_KEYS = {"trace_s", "specialize_s", "passes_s", "waited_s", "capture_s", "total_s", "compiled", "how"}
CHUNK_FIELDS = {"chunk", "last", "route", "samples", "wave_equal", "pcm_equal", "state_equal", "mismatched",
                "pcm_sha256", "stock_ms", "opt_ms"}


def test_verify_reports_every_chunk_of_the_small_model(small, capsys):
    code, report, _, err = run(capsys, "verify", *small_args("--chunks", "2", "--final-tokens", "9", "--json"))
    assert code == 0 and set(report) == VERIFY_FIELDS
    assert report["exact"] is True and report["mismatches"] == [] and report["chunks"] == 3
    assert (report["model"], report["rules"], report["device"], report["dtype"]) == (SMALL, "S", "cpu", "float32")
    assert (report["n_timesteps"], report["prompt_tokens"], report["seed"]) == (2, PROMPT, 0)
    assert all(set(c) == CHUNK_FIELDS for c in report["per_chunk"])
    routes = [c["route"] for c in report["per_chunk"]]
    assert routes == ["graph entry 0", "graph entry 1", "fallback: flags last_chunk outside the catalog (eager)"]
    assert report["fallbacks"] == 1 and report["per_chunk"][-1]["last"] is True
    assert report["pcm_sha256_stock"] == report["pcm_sha256_optimized"]
    assert 0 < report["arena_bytes"] < report["stock_state_bytes"]
    assert "chunk 1/3: graph entry 0, wave equal, state equal" in err  # progress, in words
    assert set(report["setup_s"]) == SETUP_KEYS and report["setup_s"] == report["stats"]["setup_s"]
    (row,) = report["setups"]  # one prompt length: one row, the same comparison as the report's
    assert row["prompt_tokens"] == PROMPT and row["split"] == report["setup_s"]
    assert report["per_prompt"] == [{"prompt_tokens": PROMPT, "exact": True, "chunks": 3, "mismatches": [],
                                     "pcm_sha256_stock": report["pcm_sha256_stock"],
                                     "pcm_sha256_optimized": report["pcm_sha256_optimized"], "fallbacks": 1,
                                     "arena_bytes": report["arena_bytes"]}]
    # the table and the summary without --json
    code, _, text, _ = run(capsys, "verify", *small_args("--chunks", "1", "--quiet"))
    assert code == 0 and "exact: True  chunks: 1  fallbacks: 0" in text and text.splitlines()[0].startswith("chunk")


def test_verify_arguments_are_checked_before_anything_is_built(small, capsys):
    with pytest.raises(SystemExit, match="--final-tokens does not apply to --model mimi: it has no flush frame"):
        cli.main(["verify", "--model", "mimi", "--final-tokens", "3"])
    with pytest.raises(SystemExit, match="--model mimi runs float32, not --dtype float16"):
        cli.main(["verify", "--model", "mimi", "--dtype", "float16"])
    with pytest.raises(SystemExit, match="--n-timesteps must be in 1..16"):
        cli.main(["verify", "--n-timesteps", "17"])
    with pytest.raises(SystemExit, match="--prompt-tokens must be >= 1"):
        cli.main(["verify", "--prompt-tokens", "0"])
    with pytest.raises(SystemExit, match=r"--prompt-tokens must be >= 1 \(got 0\)"):
        cli.main(["verify", "--prompt-tokens", "23,0"])
    with pytest.raises(SystemExit) as e:
        cli.main(["verify", "--prompt-tokens", "23,x"])
    assert e.value.code == 2 and "argument --prompt-tokens: '23,x' is not a prompt length in tokens or a comma " \
                                 "list of them (e.g. 23 or 23,41)" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--prompt-tokens 23,41: --model mimi streams take no prompt"):
        cli.main(["verify", "--model", "mimi", "--prompt-tokens", "23,41"])
    with pytest.raises(SystemExit) as e:
        cli.main(["verify", *small_args("--chunks", "0")])
    assert e.value.code == 2 and "--chunks must be >= 1" in capsys.readouterr().err
    # a library error is one line naming its type, exit 2
    code, doc, _, err = run(capsys, "verify", *small_args("--rules", "SRc", "--quiet"))
    assert code == 2 and err.startswith("cadence-fx: RulesError: ") and doc is None
    # with --json its last stdout line is still one JSON object: the error, not a verdict
    code, doc, _, err = run(capsys, "verify", *small_args("--rules", "SRc", "--quiet", "--json"))
    assert code == 2 and err.startswith("cadence-fx: RulesError: ")
    assert doc == {"command": "verify", "error": err.strip()[len("cadence-fx: RulesError: "):],
                   "error_type": "RulesError", "exit_code": 2}


def test_verify_streams_each_prompt_length_on_one_model(small, capsys):
    """``--prompt-tokens 5,12,5``: one optimized model (a fresh one, as a restarted process
    would build), each length against its own stock stream.  ``t2w`` has traced its symbolic
    steps and the program cache on disk (tests/conftest.py: one directory per test run) holds
    them: the fresh model loads them for the first length instead of tracing, specializes the
    second from them, and the repeat reuses the executable compiled for the first.  (Tracing
    then specializing on one model: tests/integrations/test_prompt_lengths.py.)"""
    small.opt.set_stream_cache(*s2.synthetic_prompt(PROMPT))  # the programs are on disk now
    made = []
    registry.register(dataclasses.replace(registry.get(SMALL), optimize=lambda stock, rules, progress:
                                          made.append(cadence_fx.optimize(stock, rules=rules, progress=progress))
                                          or made[-1]))
    code, report, _, err = run(capsys, "verify", "--model", SMALL, "--n-timesteps", "2", "--prompt-tokens", "5,12,5",
                               "--chunks", "1", "--json")
    assert code == 0 and set(report) == VERIFY_FIELDS and report["exact"] is True
    assert report["prompt_tokens"] == 5 and report["setup_s"] == report["setups"][0]["split"]
    first, second, again = report["setups"]
    assert [r["prompt_tokens"] for r in report["setups"]] == [5, 12, 5]
    entries = {str(i) for i in range(3)}
    assert first["traced"] is False and first["split"]["compiled"] is True and first["split"]["trace_s"] == 0
    assert first["split"]["how"] == dict.fromkeys(entries, "specialized")
    assert [e["program"] for e in made[0].session.executable.notes["setup"].values()] == ["disk"] * 3
    assert second["traced"] is False and second["split"]["compiled"] is True
    assert second["split"]["how"] == dict.fromkeys(entries, "specialized") and second["split"]["trace_s"] == 0
    # no timing ratio: on a loaded 2-core machine the passes (which run each entry's step once
    # for the hazard check) take most of either set-up, so how each was made is what is checked
    assert second["split"]["specialize_s"] > 0
    assert again["traced"] is False and again["split"]["compiled"] is False and again["split"]["how"] == {}
    results = report["per_prompt"]
    assert [r["prompt_tokens"] for r in results] == [5, 12, 5] and all(r["exact"] for r in results)
    assert all(r["pcm_sha256_stock"] == r["pcm_sha256_optimized"] for r in results)
    assert results[0]["pcm_sha256_stock"] == report["pcm_sha256_stock"] == results[2]["pcm_sha256_stock"]
    assert results[1]["pcm_sha256_stock"] != results[0]["pcm_sha256_stock"]  # another prompt, other audio
    assert "setup, prompt 12 tokens: " in err and "specialized (3 entries)" in err
    assert "compiled earlier" in err.split("setup, prompt 5 tokens: ")[-1]
    # the model's plan printout ends with what its ProgramStore holds: one symbolic step per entry
    text = made[0].explain(2 * 7)
    assert "Setup (how each catalog entry gets its graph)" in text and "programs held: 3" in text
    assert text.count("symbolic in ['prompt_frames']") == 3


# ---------------------------------------------------------------------------- demo
def test_demo_is_reproducible_and_says_what_matched(small, tmp_path, capsys):
    """Two runs give the same WAV bytes, whatever the process's generators did in between
    (every chunk is seeded as verify seeds it); stock and optimized match within a run."""
    import torch
    hashes = []
    for k in range(2):
        torch.manual_seed(1234 + k)  # where the generators stand must not matter
        torch.rand(k + 1)
        code, doc, text, err = run(capsys, "demo", *small_args("--chunks", "2", "--out", str(tmp_path / str(k)),
                                                              "--json"))
        assert code == 0 and doc["exact"] is True and doc["rules"] == "S" and doc["chunks"] == 2
        assert set(doc) == {"exact", "chunks", "rules", "device", "stock_ms_p50", "optimized_ms_p50", "compile_s",
                            "arena_bytes", "stock_state_bytes", "wav", "setup_s", "stats"}
        assert set(doc["setup_s"]) == SETUP_KEYS and doc["setup_s"] == doc["stats"]["setup_s"]
        wavs = {name: (tmp_path / str(k) / f"{SMALL}-{name}.wav").read_bytes() for name in ("stock", "optimized")}
        assert wavs["stock"] == wavs["optimized"] and len(wavs["stock"]) > 44 + 2 * 20160
        assert doc["wav"]["stock"]["sha256"] == doc["wav"]["optimized"]["sha256"]
        hashes.append(doc["wav"]["stock"]["sha256"])
        assert "chunk 1/2: graph entry 0, wave equal, state equal" in err
        assert "chunk 2/2: graph entry 1, wave equal, state equal" in err
        assert "needs a GPU" in err and "same PCM bytes: True" in text
        assert "streaming 2 chunks (~2 s of audio)" in err
    assert hashes[0] == hashes[1]


def test_progress_lines_say_the_seconds_since_the_command_began(capsys, monkeypatch):
    """Each progress line carries the seconds since ``progress`` was made (a long run's log says
    where its time went); ``quiet`` prints nothing."""
    import re
    from cadence_fx.tools import options
    clock = iter([100.0, 100.5, 163.25])
    monkeypatch.setattr(options.time, "perf_counter", lambda: next(clock))
    say = options.progress(False)
    say("tracing")
    say("prepared")
    lines = capsys.readouterr().err.splitlines()
    assert [re.sub(r" +", " ", line) for line in lines] == ["[cadence-fx 0.5 s] tracing",
                                                           "[cadence-fx 63.2 s] prepared"], lines
    assert options.progress(True) is None
