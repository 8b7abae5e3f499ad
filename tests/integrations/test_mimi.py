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
from cadence_fx.lockstep import compare_streams, live_extent

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
def test_sessions_on_one_model_each_stream_exactly_as_alone(mm, optimized):
    """``open_session()``: two more streams on the optimized model's weights, interleaved
    frame by frame, each exact (waveform, PCM, every state tensor) against a stock
    decoder streaming it alone; ``reset()`` starts a session over; bad use is refused."""
    from cadence_fx.errors import InputError, SessionClosed
    from cadence_fx.lockstep import compare_streams
    stock, opt = optimized
    other = mm.MimiDecoder(mm.build_mimi(seed=0))
    stock.reset()
    a, b = opt.open_session(), opt.open_session()
    codes = {0: mm.synthetic_codes(5, seed=71), 1: mm.synthetic_codes(5, seed=72)}
    pairs = {0: (stock, a), 1: (other, b)}
    cpu = torch.device("cpu")
    for k in range(5):
        for s in (0, 1):
            report = compare_streams(*pairs[s], codes[s][k:k + 1], cpu)
            assert report["exact"], (s, k, report["mismatches"])
    assert a.session.arena.storage.data_ptr() != b.session.arena.storage.data_ptr() != opt.session.arena.storage.data_ptr()
    assert a.stats()["steps"] == 5 and a.stats()["fallback_total"] == 0
    a.reset()
    stock.reset()
    assert compare_streams(stock, a, codes[0][:2], cpu)["exact"]
    with pytest.raises(InputError, match="no flush step"):
        a.submit(codes[0][0][0], last_chunk=True)
    a.close()
    a.close()
    with pytest.raises(SessionClosed, match="session .* is closed"):
        a.stream(codes[0][0][0])
    assert a.stats()["steps"] == 7 and b.stats()["steps"] == 5
    b.close()


@needs_moshi
def test_a_replica_serves_mimi_conversations_by_id(mm, optimized):
    """``serving.Replica`` on a frame codec: conversations open with no prompt, a tick
    sends one frame each, every frame exact against a stock decoder streaming it alone."""
    from cadence_fx.serving import Replica, ReplicaFull
    stock, opt = optimized
    replica = Replica(opt, max_conversations=2, name="mimi0")
    replica.open("a")
    replica.open("b")
    with pytest.raises(ReplicaFull, match="mimi0 holds 2 conversations"):
        replica.open("c")
    codes = {c: mm.synthetic_codes(3, seed=s) for c, s in (("a", 91), ("b", 92))}
    want = {}
    for c in codes:
        stock.reset()
        want[c] = [stock.stream(f) for f, _ in codes[c]]
    for k in range(3):
        assert replica.tick({c: codes[c][k][0] for c in codes}) == {c: want[c][k] for c in codes}
    replica.reset("a")
    assert replica.send("a", codes["a"][0][0]) == want["a"][0]
    for c in replica.conversations():
        replica.close(c)


@needs_moshi
def test_serve_sim_runs_mimi_sessions_each_exact_against_its_own_stock_decoder(mm, capsys):
    """``serve-sim --model mimi``: a tick is one 80 ms frame per session; N optimized
    sessions on one model against one stock decoder per session, PCM equal per session;
    a sweep checks every session at every N against a stock decoder streaming it alone."""
    code = cli.main(["serve-sim", "--model", "mimi", "--sessions", "2", "--seconds", "2", "--warmup-ticks", "0",
                     "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and report["exact"] is True and report["exact_sessions"] == [True, True]
    assert report["budget_ms"] == 80.0 and report["unit"] == "frame" and "prompt_tokens" not in report
    opt = report["modes"]["optimized"]
    assert opt["chunks"] == 4 and opt["fallbacks"] == {} and [s["steps"] for s in opt["stats"]] == [2, 2]
    assert opt["weights_bytes"] > opt["arena_bytes_per_session"] > 0
    code = cli.main(["serve-sim", "--model", "mimi", "--modes", "optimized", "--sweep", "--sweep-points", "1,3",
                     "--max-sessions", "3", "--seconds", "1", "--warmup-ticks", "0", "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    points = report["sweep"]["optimized"]
    assert code == 0 and report["exact"] is True and all(p["exact"] for p in points if "exact" in p)
    assert points[0]["chunks_per_session"] == [1]


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


@needs_moshi
@cuda
def test_sessions_overlapped_on_their_own_streams_are_exact_on_cuda(mm):
    """Four SRc Mimi sessions, each on its own CUDA stream, every frame submitted for all
    four before any is read: each waveform and state equals a stock decoder streaming
    that session alone (deterministic protocol)."""
    import cadence_fx
    from cadence_fx.lockstep import deterministic_protocol
    deterministic_protocol()
    stock = mm.MimiDecoder(mm.build_mimi(seed=0).cuda())
    opt = cadence_fx.optimize(stock, rules="SRc")
    n, frames = 4, 6
    codes = {s: mm.synthetic_codes(frames, seed=80 + s) for s in range(n)}
    want = {}
    for s in range(n):
        stock.reset()
        want[s] = []
        for c, _ in codes[s]:
            stock.stream(c)
            want[s].append((stock.last_speech.clone(), {k: v.clone() for k, v in stock.state().items()}))
    sessions = [opt.open_session(stream=torch.cuda.Stream()) for _ in range(n)]
    for k in range(frames):
        pending = [sess.submit(codes[s][k][0]) for s, sess in enumerate(sessions)]
        for p in pending:
            p.result()
        for s, sess in enumerate(sessions):
            speech, state = want[s][k]
            assert torch.equal(sess.last_speech, speech), f"session {s} frame {k}: waveform differs from stock"
            live = sess.state()
            for name, t in state.items():
                assert torch.equal(live_extent(t, live[name]), live[name]), f"session {s} frame {k}: state {name}"
    for sess in sessions:
        assert sess.stats()["fallback_total"] == 0 and sess.stats()["replays"] == {"0": frames}, sess.stats()
        sess.close()


@needs_moshi
@cuda
def test_a_frame_sent_to_a_busy_session_is_read_as_sent_not_as_the_next_one(mm):
    """The frame's device copy must live until the session's stream has read it.  The
    session's stream is kept busy (``torch.cuda._sleep``) so its read of the frame comes
    late; right after ``submit`` returns, the caller's stream makes another frame of the
    same size (another session's, say) and drops it.  Had the sent frame been made on the
    caller's stream and freed at the return, that frame would take its memory and the
    session would decode the wrong codes (a wrong chunk, or a device-side assert for codes
    out of range: the overlapped test above, on the H200, 2026-12-02)."""
    import cadence_fx
    from cadence_fx.integrations.moshi.inputs import codes_tensor
    from cadence_fx.lockstep import deterministic_protocol
    deterministic_protocol()
    stock = mm.MimiDecoder(mm.build_mimi(seed=0).cuda())
    opt = cadence_fx.optimize(stock, rules="SRc")
    codes = mm.synthetic_codes(3, seed=90)
    others = mm.synthetic_codes(3, seed=91)
    want = []
    stock.reset()
    for c, _ in codes:
        stock.stream(c)
        want.append((stock.last_speech.clone(), {k: v.clone() for k, v in stock.state().items()}))
    session = opt.open_session(stream=torch.cuda.Stream())
    for k, (c, _) in enumerate(codes):
        with torch.cuda.stream(session.cuda_stream):
            torch.cuda._sleep(200_000_000)  # ~0.1 s of the session's stream before it reads the frame
        pending = session.submit(c)
        for _ in range(4):  # the caller's stream makes frames of the same size and lets them go
            codes_tensor(others[k][0], torch.device("cuda"))
        pending.result()
        speech, state = want[k]
        assert torch.equal(session.last_speech, speech), f"frame {k}: the session decoded other codes"
        live = session.state()
        for name, t in state.items():
            assert torch.equal(live_extent(t, live[name]), live[name]), f"frame {k}: state {name}"
    assert session.stats()["replays"] == {"0": len(codes)}, session.stats()
    session.close()
