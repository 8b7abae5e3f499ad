"""A new voice never waits for its graphs (issue 15): ``background=True``.

The shared ``t2w_mini`` model (tests/conftest.py: the mini Token2Wav, 2 flow steps, rule S)
with ``background`` switched on: a prompt length it has not seen is built on the
drop-in's worker thread, ``set_stream_cache`` returns once the prompt is set up, the
chunks run the exact eager path until the build is done and the model's programs from
the next chunk on.  Every chunk is compared with stock (waveform, PCM, every state
tensor): before, across and after the switch, through warm-up, growth, trim, steady
state, a flush and a turn reset.  A build that would touch the foreground's random
generators is refused (``cadence_fx.foreground``), and its stream stays eager and exact.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest
import torch

import cadence_fx
from cadence_fx import foreground
from cadence_fx.errors import NeedsForeground
from cadence_fx.integrations import dropin as dropin_module
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.lockstep import compare_streams
from cadence_fx.passes.prune_dead import PruneDead
from cadence_fx.runtime import pending
from cadence_fx.runtime.pending import WAITING, PendingSession
from cadence_fx.runtime.variants import NEEDS_FOREGROUND

from helpers.marks import cuda, deterministic_protocol_restored


@pytest.fixture(scope="module")
def t2w(t2w_mini):
    """This file's Token2Wav is the mini one (tests/conftest.py ``t2w_mini``): what it checks
    is mechanism, which the released configuration's own tests do not need to repeat."""
    return t2w_mini

CPU = torch.device("cpu")
EAGER = f"fallback: {WAITING}"
FLUSH = "fallback: flags last_chunk outside the catalog (eager)"


@pytest.fixture
def background(t2w):
    """The shared model with its symbolic steps traced and ``background`` on (off again after,
    on every executable it holds)."""
    if not len(t2w.opt.programs):
        prompt = s2.synthetic_prompt(5, seed=1)  # the length other files use
        t2w.opt.set_stream_cache(*prompt)
    t2w.opt.set_background(True)
    yield t2w
    assert t2w.opt.wait_for_builds(300)
    t2w.opt.set_background(False)


@pytest.fixture
def gated(monkeypatch):
    """Background builds wait for ``gate.set()`` before they compile."""
    gate = threading.Event()
    real = dropin_module.compile_executable

    def held(*args, **kwargs):
        assert gate.wait(300), "the test never opened the gate"
        return real(*args, **kwargs)

    monkeypatch.setattr(dropin_module, "compile_executable", held)
    yield gate
    gate.set()


def _compare(t2w, chunks, seed: int) -> dict:
    report = compare_streams(t2w.tail, t2w.opt, chunks, CPU, seed=seed)
    assert report["exact"], report["mismatches"]
    assert report["pcm_sha256_stock"] == report["pcm_sha256_optimized"]
    return report


def _cuda_model(first: int, n_timesteps: int, float16: bool = False, **optimize_kw):
    """The released tail on CUDA and its SRc model with background builds, the first voice
    (``first`` tokens) set up on both: compiled in the foreground, where it traces."""
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=n_timesteps, float16=float16)
    opt = cadence_fx.optimize(tail, rules="SRc", background=True, **optimize_kw)
    _cuda_voice(tail, opt, first)
    return tail, opt


def _mismatches(report: dict, opt) -> str:
    """What differed, in full (pytest cuts a long assertion message's repr), and the
    session's capture failures and fallbacks: what a failing GPU run must say."""
    rows = [f"chunk {r['chunk']} ({r['route']}): wave {'=' if r['wave_equal'] else 'DIFFERS'}, pcm "
            f"{'=' if r['pcm_equal'] else 'DIFFERS'}, state {'=' if r['state_equal'] else r['mismatched']}"
            for r in report["mismatches"]]
    stats = opt.stats()
    return "; ".join(rows) + f"; capture failures {getattr(opt.session, 'capture_failures', None)}; " \
        f"fallbacks {stats.get('fallbacks')}"


def _cuda_voice(tail, opt, tokens: int) -> None:
    """A voice of ``tokens`` prompt tokens (seed ``tokens``) set up on stock and optimized."""
    prompt = s2.synthetic_prompt(tokens, seed=tokens, device="cuda")
    tail.set_stream_cache(*prompt)
    opt.set_stream_cache(*prompt)


def test_a_new_length_streams_eagerly_until_its_build_lands_then_runs_its_programs(background, gated):
    t2w = background
    switch = sys.getswitchinterval()
    prompt = s2.synthetic_prompt(37, seed=37)  # a length no other test uses
    t2w.tail.set_stream_cache(*prompt)
    t2w.opt.set_stream_cache(*prompt)  # returns with the build waiting at the gate
    assert isinstance(t2w.opt.session, PendingSession)
    build = t2w.opt.session.build
    assert build.submitted is None  # the set-up and the first chunk run without a build beside them
    chunks = s2.synthetic_chunks(5, seed=37, final_tokens=11)  # warm-up, growth, trim, steady, flush
    before = _compare(t2w, chunks[:1], seed=371)
    assert build.submitted is not None  # the first chunk is out: the build started
    while build.started is None:  # the worker holds it at the gate, inside the build
        time.sleep(0.01)
    assert sys.getswitchinterval() == pytest.approx(pending.SWITCH_INTERVAL_S)  # the stream's ops wait less
    second = _compare(t2w, chunks[1:2], seed=370)
    assert [c["route"] for c in before["per_chunk"] + second["per_chunk"]] == [EAGER] * 2
    assert t2w.opt.stats()["fallbacks"] == {WAITING: 2}
    assert t2w.opt.stats()["background"]["taken"] is False
    assert t2w.opt.idle() == []  # nothing landed (the build waits at the gate): idle never waits for it

    gated.set()
    assert t2w.opt.wait_for_builds(300)
    assert t2w.opt.idle() == []  # rule S on the CPU: nothing to capture
    assert t2w.opt.stats()["background"]["captured_idle"] == []
    assert sys.getswitchinterval() == switch  # the last build ended
    after = _compare(t2w, chunks[2:], seed=372)  # the switch happens at this call's first chunk
    routes = [c["route"] for c in after["per_chunk"]]
    assert routes == ["graph entry 2"] * 3 + [FLUSH], routes  # trim and steady state, then the flush
    stats = t2w.opt.stats()
    assert stats["fallbacks"] == {WAITING: 2, "flags last_chunk outside the catalog (eager)": 1}
    assert stats["background"]["taken"] and stats["background"]["taken_at_step"] == 2
    assert stats["background"]["build_s"] > 0 and stats["setup_s"]["compiled"]
    assert stats["setup_s"]["how"] == {"0": "specialized", "1": "specialized", "2": "specialized"}

    # a second stream of this length finds the executable: no build, no eager chunk
    t2w.tail.set_stream_cache(*prompt)
    t2w.opt.set_stream_cache(*prompt)
    assert not isinstance(t2w.opt.session, PendingSession)
    again = _compare(t2w, chunks[:1], seed=373)
    assert [c["route"] for c in again["per_chunk"]] == ["graph entry 0"]


def test_the_steady_entry_lands_first_and_runs_while_the_others_are_built(background, monkeypatch):
    """A build hands each entry over as it is done, the steady one first: a stream past its
    warm-up runs it before the build is over; the chunks whose entry has not landed stay
    eager, and after the build a turn reset runs every entry."""
    t2w = background
    landed, hold = threading.Event(), threading.Event()
    real = dropin_module.compile_executable

    def pausing(*args, on_entry=None, **kwargs):
        def publish(index, program):
            on_entry(index, program)
            landed.set()
            assert hold.wait(300), "the test never let the build go on"
        return real(*args, on_entry=publish, **kwargs)

    monkeypatch.setattr(dropin_module, "compile_executable", pausing)
    prompt = s2.synthetic_prompt(59, seed=59)  # a length no other test uses
    t2w.tail.set_stream_cache(*prompt)
    session = t2w.opt.open_session(*prompt)
    chunks = s2.synthetic_chunks(4, seed=59, final_tokens=6)
    try:
        first = compare_streams(t2w.tail, session, chunks[:1], CPU, seed=591)  # starts the build
        assert landed.wait(300)  # the build stops after handing over its first entry
        assert sorted(session.session.build.landed()) == [2], "the steady entry comes first"
        rest = compare_streams(t2w.tail, session, chunks[1:4], CPU, seed=592)
    finally:
        hold.set()
    for report in (first, rest):
        assert report["exact"], report["mismatches"]
    routes = [c["route"] for c in first["per_chunk"] + rest["per_chunk"]]
    # warm-up (entries 0, 1: not landed) eager; the steady entry's growth and trim chunks run it
    assert routes == [EAGER, EAGER, "graph entry 2", "graph entry 2"], routes
    stats = session.stats()
    assert stats["fallbacks"] == {WAITING: 2} and stats["graph_runs"] == {"2": 2}, stats
    bg = stats["background"]
    assert (bg["taken"], bg["first_program_at_step"], bg["entries_landed"]) == (False, 1, [2]), bg
    assert t2w.opt.wait_for_builds(300)
    flush = compare_streams(t2w.tail, session, chunks[4:], CPU, seed=593)  # takes the whole executable
    assert flush["exact"] and [c["route"] for c in flush["per_chunk"]] == [FLUSH]
    assert session.stats()["background"]["taken"] and session.stats()["background"]["entries_landed"] == [0, 1, 2]
    session.reset()
    t2w.tail.set_stream_cache(*prompt)
    turn = compare_streams(t2w.tail, session, s2.synthetic_chunks(3, seed=594), CPU, seed=594)
    assert turn["exact"], turn["mismatches"]
    assert [c["route"] for c in turn["per_chunk"]] == ["graph entry 0", "graph entry 1", "graph entry 2"]
    session.close()


def test_a_turn_reset_after_the_switch_restores_the_state_set_up_before_it(background, gated):
    t2w = background
    prompt = s2.synthetic_prompt(43, seed=43)
    session = t2w.opt.open_session(*prompt)  # the sessions API: the same pending path
    t2w.tail.set_stream_cache(*prompt)
    first = compare_streams(t2w.tail, session, s2.synthetic_chunks(1, seed=44), CPU, seed=44)
    assert first["exact"], first["mismatches"]
    gated.set()
    assert t2w.opt.wait_for_builds(300)
    session.reset()  # the post-prompt snapshot was taken on the plan-only executable
    t2w.tail.set_stream_cache(*prompt)
    report = compare_streams(t2w.tail, session, s2.synthetic_chunks(3, seed=45, final_tokens=9), CPU, seed=45)
    assert report["exact"], report["mismatches"]
    assert [c["route"] for c in report["per_chunk"]] == \
        ["graph entry 0", "graph entry 1", "graph entry 2", FLUSH]
    session.close()


def test_chunks_that_run_while_the_build_runs_stay_exact(background):
    """No gate: the worker specializes and runs the passes while the chunks (which draw
    noise from the global generator every chunk) run; whichever chunk takes the build."""
    t2w = background
    prompt = s2.synthetic_prompt(29, seed=29)
    t2w.tail.set_stream_cache(*prompt)
    t2w.opt.set_stream_cache(*prompt)
    report = _compare(t2w, s2.synthetic_chunks(3, seed=29, final_tokens=5), seed=291)
    routes = [c["route"] for c in report["per_chunk"]]
    assert routes[-1] == FLUSH
    assert t2w.opt.wait_for_builds(300)
    background = t2w.opt.stats()["background"]
    first, taken = background["first_program_at_step"], background["taken_at_step"]
    assert first is None or all(r == EAGER for r in routes[:first]), routes  # nothing had landed
    # entries land one by one (the steady one first): each chunk in between ran its entry's
    # program if that had landed, else eagerly, never anything else
    assert all(r == EAGER or r.startswith("graph entry") for r in routes[:-1][:taken]), routes
    if taken is not None:  # the build was taken mid-stream: every chunk after it ran the programs
        assert all(r.startswith("graph entry") for r in routes[taken:-1]), routes


def test_a_build_that_would_draw_random_numbers_is_refused_and_its_stream_stays_exact(background, monkeypatch):
    t2w = background
    real = PruneDead.call

    def drawing(self, gm):
        torch.rand(1)  # from the default generator: only the foreground may
        return real(self, gm)

    monkeypatch.setattr(PruneDead, "call", drawing)
    prompt = s2.synthetic_prompt(47, seed=47)
    t2w.tail.set_stream_cache(*prompt)
    t2w.opt.set_stream_cache(*prompt)
    assert t2w.opt.wait_for_builds(300)
    report = _compare(t2w, s2.synthetic_chunks(2, seed=47), seed=471)
    [(reason, n)] = t2w.opt.stats()["fallbacks"].items()
    assert n == 2 and reason.startswith("background build failed: ") and "default random generator" in reason, reason
    assert [c["route"] for c in report["per_chunk"]] == [f"fallback: {reason}"] * 2
    key = t2w.opt._key(94, prompt[2])
    assert "default random generator" in t2w.opt.foreground_only[key]

    monkeypatch.setattr(PruneDead, "call", real)  # the next set-up of this length builds in the foreground
    t2w.tail.set_stream_cache(*prompt)
    t2w.opt.set_stream_cache(*prompt)
    assert not isinstance(t2w.opt.session, PendingSession)
    again = _compare(t2w, s2.synthetic_chunks(1, seed=48), seed=481)
    assert [c["route"] for c in again["per_chunk"]] == ["graph entry 0"]


def test_an_off_catalog_chunk_never_waits_for_its_program_in_the_background(background):
    """Under ``off_catalog="specialize"`` a window's program goes to the worker while that
    chunk (and the ones keyed after it) run eagerly; the next turn's window runs it.  A shape
    whose build needs a trace (it runs the step for real: only the foreground may; whether
    it does depends on the symbolic steps other tests left in memory or on disk) is never
    built on a chunk while builds are in the background: the next turn runs it eagerly
    again, counted; with ``background`` off the turn after builds it on its chunk."""
    t2w = background
    policy = t2w.opt.off_catalog
    t2w.opt.set_background(False)
    prompt = s2.synthetic_prompt(53, seed=53)
    session = t2w.opt.open_session(*prompt)  # compiled at set-up: this test is about the window
    t2w.opt.set_off_catalog("specialize")
    t2w.opt.set_background(True)  # for the executables held too
    try:
        window = (s2.synthetic_chunks(1, seed=54)[0][0][:14], False)  # 11 new tokens + 3 lookahead
        turn = s2.synthetic_chunks(3, seed=53) + [window, (s2.synthetic_chunks(1, seed=55)[0][0][:7], True)]
        t2w.tail.set_stream_cache(*prompt)
        first = compare_streams(t2w.tail, session, turn, CPU, seed=531)
        assert first["exact"], first["mismatches"]
        routes = [c["route"] for c in first["per_chunk"]]
        assert routes[:3] == ["graph entry 0", "graph entry 1", "graph entry 2"], routes
        assert routes[3].startswith("fallback:") and "building in the background" in routes[3], routes
        # the window's and the flush's programs queue behind any new voice's build (BuildQueue)
        handles = session.session.executable.variants.pending()
        assert len(handles) == 2 and all(h.rank == pending.OFF_CATALOG for h in handles), handles
        assert t2w.opt.wait_for_builds(300)
        session.reset()
        t2w.tail.set_stream_cache(*prompt)
        second = compare_streams(t2w.tail, session, turn, CPU, seed=532)
        assert second["exact"], second["mismatches"]
        assert second["pcm_sha256_stock"] == second["pcm_sha256_optimized"]
        routes = [c["route"] for c in second["per_chunk"]]
        assert routes[:3] == ["graph entry 0", "graph entry 1", "graph entry 2"], routes
        # each shape was either built on the worker (its symbolic step in memory or on disk,
        # from another test) or needed a trace: then its chunk runs eagerly again, not a stall
        spec = session.session.stats()["specializations"]
        window, flush = "entry 2 | token (1, 14), spk (1, 192)", "entry 2 | token (1, 7), spk (1, 192) | last_chunk"
        for label, route in ((window, routes[3]), (flush, routes[4])):
            assert (label in spec["held"]) != (label in spec["foreground_only"]), (label, spec)
            if label in spec["foreground_only"]:
                assert NEEDS_FOREGROUND in route and "only the foreground may" in spec["foreground_only"][label]
            else:
                assert route == f"graph specialization {label}", route
        t2w.opt.set_background(False)
        session.reset()
        t2w.tail.set_stream_cache(*prompt)
        third = compare_streams(t2w.tail, session, turn, CPU, seed=533)
        assert third["exact"], third["mismatches"]
        routes = [c["route"] for c in third["per_chunk"]]
        assert all(r.startswith("graph specialization") for r in routes[3:]), routes  # built here, on the chunk
    finally:
        session.close()
        t2w.opt.set_off_catalog(*policy)


def test_the_first_length_and_rules_without_an_arena_build_in_the_foreground(t2w):
    tail = t2w.tail
    opt = cadence_fx.optimize(tail, cache=False, background=True)  # nothing traced yet
    calls = []
    opt._executable = lambda key, adapter: calls.append(key) or "compiled here"
    _, mels, spk = s2.synthetic_prompt(5)
    key, adapter = opt._key(int(mels.shape[1]), spk), opt.adapter_for(int(mels.shape[1]), spk)
    assert opt._executable_or_build(key, adapter) == ("compiled here", None) and calls == [key]
    assert not opt._builds
    with pytest.raises(cadence_fx.CadenceError, match="background=.*True or False"):
        cadence_fx.optimize(tail, cache=False, background="yes")


def test_the_fence_refuses_what_only_the_foreground_may_do():
    gen = torch.Generator().manual_seed(0)
    with foreground.background():
        assert foreground.in_background()
        torch.rand(2, generator=gen)  # its own generator: allowed
        torch.zeros(2).normal_(generator=gen)
        with pytest.raises(NeedsForeground, match="default random generator"):
            torch.rand(2)
        with pytest.raises(NeedsForeground, match="default random generator"):
            torch.zeros(2).bernoulli_(0.5)
        with pytest.raises(NeedsForeground, match="the hazard check's full run"):
            foreground.forked_rng([], "the hazard check's full run")
    assert not foreground.in_background()
    with foreground.forked_rng([], "a trace"):  # the foreground forks as before
        torch.rand(1)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(foreground.in_background()))
    with foreground.background():
        worker.start()
        worker.join()
    assert seen == [False]  # per thread: the foreground of another thread is not fenced


def test_the_fence_lets_a_symbolic_trace_through_and_its_random_ops_draw_nothing():
    """A symbolic trace runs the step on fake tensors, random ops too: on a build's thread it
    is neither refused nor forks (a fork's restore would rewind the stream's generator), and
    the global generator is where it was.  A real draw in the same block is still refused."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(x):
        noise = torch.rand(x.shape[0], 3, device=x.device)  # upstream's vocoder draws like this
        return torch.nn.functional.dropout(x, 0.1, False) + noise + torch.randn_like(x)

    before = torch.random.get_rng_state()
    with foreground.background():
        with foreground.fenced([], "a symbolic trace", runs_for_real=False):  # nothing to fork on the worker
            gm = make_fx(step, pre_dispatch=True, tracing_mode="symbolic")(torch.ones(4, 3))
        with pytest.raises(NeedsForeground, match="default random generator"):
            torch.rand(2)
    assert torch.equal(torch.random.get_rng_state(), before)
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert {"aten.rand.default", "aten.randn_like.default"} <= targets, targets
    assert not foreground.in_background()
    assert isinstance(foreground.fenced([], "a symbolic trace", runs_for_real=False),
                      type(torch.random.fork_rng([])))  # the foreground forks


def _cuda_to_the_capture_chunk(dtype: str, monkeypatch):
    """The released tail under SRc with background builds (a 23-token first voice), then a
    61-token voice whose build is held: chunk 0 runs eagerly (exact), the build lands, chunk 1
    runs eagerly with its capture deferred (a build holds the device), exact.  Returns
    ``(tail, opt, chunks, dev)``: chunk 2 captures entry 2 mid-stream."""
    from cadence_fx.runtime import device_work
    dev = torch.device("cuda")
    tail, opt = _cuda_model(23, n_timesteps=5, float16=dtype == "float16")
    assert not isinstance(opt.session, PendingSession)
    gate = threading.Event()
    real = dropin_module.compile_executable
    monkeypatch.setattr(dropin_module, "compile_executable", lambda *a, **k: gate.wait(300) and real(*a, **k))
    _cuda_voice(tail, opt, 61)
    assert isinstance(opt.session, PendingSession)
    chunks = s2.synthetic_chunks(6, seed=61, final_tokens=13)
    before = compare_streams(tail, opt, chunks[:1], dev, seed=611)
    assert before["exact"], before["mismatches"]
    gate.set()
    assert opt.wait_for_builds(300)
    deferred = []
    with device_work.LOCK:  # as if another voice's build were running: the capture waits a chunk
        held = threading.Thread(target=lambda: deferred.append(
            compare_streams(tail, opt, chunks[1:2], dev, seed=612)))
        held.start()
        held.join()
    assert deferred and deferred[0]["exact"], deferred
    assert [c["route"] for c in deferred[0]["per_chunk"]] == [f"fallback: {device_work.DEFERRED}"]
    return tail, opt, chunks, dev


@cuda
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_on_cuda_each_entry_is_captured_when_a_chunk_first_needs_it_and_replays_exactly(dtype, monkeypatch):
    """Rules SRc: after the switch each catalog entry is captured on the session's arena
    between two chunks (the live state saved and put back); from then on it replays.  A
    chunk whose capture a running build holds off runs eagerly, counted, and the capture
    is tried again at the next chunk."""
    from cadence_fx.runtime import device_work
    with deterministic_protocol_restored():
        tail, opt, chunks, dev = _cuda_to_the_capture_chunk(dtype, monkeypatch)
        report = compare_streams(tail, opt, chunks[2:], dev, seed=613)
        assert report["exact"], _mismatches(report, opt)
        assert report["pcm_sha256_stock"] == report["pcm_sha256_optimized"]
        routes = [c["route"] for c in report["per_chunk"]]
        assert routes == ["replay entry 2"] * 4 + ["fallback: flags last_chunk outside the catalog (eager)"], routes
        stats = opt.stats()
        assert stats["fallbacks"][WAITING] == 1 and stats["fallbacks"][device_work.DEFERRED] == 1, stats
        assert stats["background"]["taken_at_step"] == 1 and stats["setup_s"]["capture_s"] > 0
        assert sorted(opt.session._programs) == [2] and opt.session.capture_failures == {2: {}}


@cuda
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("how,at", [("escapes", 0), ("escapes", 2), ("in_capture", 0), ("in_capture", 2)])
def test_on_cuda_a_mid_stream_capture_cut_by_out_of_memory_leaves_every_chunk_exact(dtype, how, at, monkeypatch):
    """Session 48's GPU suite ran the card out of memory, and the first chunk after entry 2's
    mid-stream capture (its route: "region refused replay: submod_0: not captured") was not
    exact in float16.  Here the out of memory is injected at the ``at``-th region capture of
    that chunk: ``escapes`` raises it before the capture (as a static copy's allocation would:
    the entry's capture stops there, the regions before it captured, the rest eager);
    ``in_capture`` raises it inside the capture (as an allocation in the graph's pool would:
    that region's capture fails, is warmed up and fails again, the later regions capture).
    That chunk and every later one (steady chunks, the flush) must be exact against stock, the
    failure recorded and counted, never a crash; the next chunk runs as captured (part-way), and
    once ``OOM_RETRY_S`` have passed the next one captures entry 2 whole and replays it."""
    from cadence_fx.runtime import graphs, midstream
    from cadence_fx.runtime.variants import OOM_RETRY_S
    with deterministic_protocol_restored():
        tail, opt, chunks, dev = _cuda_to_the_capture_chunk(dtype, monkeypatch)  # as in session 48's run
        real_capture, real_run = graphs.CapturedRegion.capture, graphs.run_piece
        captures, target, failing, injected = [], [], [False], []

        def capture(self, *args, **kwargs):
            captures.append(self.name)
            if len(captures) - 1 == at:
                target.append(self.name)
                if how == "escapes":
                    injected.append(self.name)
                    raise torch.OutOfMemoryError("CUDA out of memory (injected before a region's capture)")
            failing[0] = how == "in_capture" and self.name in target  # its warm retry fails too
            return real_capture(self, *args, **kwargs)

        def run_piece(piece, args):
            if failing[0] and torch.cuda.is_current_stream_capturing():
                injected.append("in capture")
                raise torch.OutOfMemoryError("CUDA out of memory (injected inside a region's capture)")
            return real_run(piece, args)

        monkeypatch.setattr(graphs.CapturedRegion, "capture", capture)
        monkeypatch.setattr(graphs, "run_piece", run_piece)
        first = compare_streams(tail, opt, chunks[2:3], dev, seed=613)  # entry 2 is captured in this chunk
        monkeypatch.setattr(graphs.CapturedRegion, "capture", real_capture)
        monkeypatch.setattr(graphs, "run_piece", real_run)
        assert len(captures) > at and injected, (captures, injected)
        assert first["exact"], _mismatches(first, opt)
        failures = opt.session.capture_failures[2]
        assert failures and all("out of memory" in why.lower() for why in failures.values()), failures
        part_way = compare_streams(tail, opt, chunks[3:4], dev, seed=614)  # before OOM_RETRY_S: as captured
        assert part_way["exact"], _mismatches(part_way, opt)
        assert part_way["per_chunk"][0]["route"].startswith("fallback: region refused replay")
        refused = [r for r in opt.stats()["fallbacks"] if r.startswith("region refused replay")]
        assert refused, opt.stats()["fallbacks"]  # the regions left eager are counted, never hidden
        now = time.monotonic() + OOM_RETRY_S  # memory came back: the next chunk captures entry 2 whole
        monkeypatch.setattr(midstream, "_now", lambda: now)
        report = compare_streams(tail, opt, chunks[4:], dev, seed=615)
        assert report["exact"], _mismatches(report, opt)
        assert report["pcm_sha256_stock"] == report["pcm_sha256_optimized"]
        routes = [c["route"] for c in report["per_chunk"]]
        assert routes == ["replay entry 2"] * 2 + ["fallback: flags last_chunk outside the catalog (eager)"], routes
        assert opt.session.capture_failures[2] == {} and opt.stats()["captured_again"] == {"2": 1}


@cuda
def test_on_cuda_a_voice_of_another_branch_class_is_traced_on_the_worker_and_replays_exactly():
    """The first voice (13 tokens: 26 + 49 frames divide by 25) traces the rarer branch class;
    the next voice's length (23 tokens) is outside that trace's guards, so its background
    build traces a second symbolic variant on the worker (fake tensors: the fence lets its
    random ops through) while the stream runs eagerly; then its chunks replay.  Every chunk
    exact against stock.  (On the H200, 2026-12-02, such builds failed as needing the
    foreground, and the failure refused the entries' symbolic keys for the process.)"""
    with deterministic_protocol_restored():
        dev = torch.device("cuda")
        tail, opt = _cuda_model(13, n_timesteps=2, cache=False)  # no other test's programs
        assert [e["variant"] for e in opt.session.executable.notes["setup"].values()] == [0, 0, 0]
        _cuda_voice(tail, opt, 23)
        assert isinstance(opt.session, PendingSession)
        chunks = s2.synthetic_chunks(5, seed=23, final_tokens=9)
        before = compare_streams(tail, opt, chunks[:1], dev, seed=231)
        assert before["exact"], before["mismatches"]
        assert opt.wait_for_builds(300)
        report = compare_streams(tail, opt, chunks[1:], dev, seed=232)
        assert report["exact"], report["mismatches"]
        assert report["pcm_sha256_stock"] == report["pcm_sha256_optimized"]
        routes = [c["route"] for c in report["per_chunk"]]
        assert routes == ["replay entry 1"] + ["replay entry 2"] * 3 + [
            "fallback: flags last_chunk outside the catalog (eager)"], routes  # 5 chunks and a flush: chunks[1:]
        setup = opt.session.executable.notes["setup"]
        assert [(e["how"], e["variant"]) for e in setup.values()] == [("traced symbolic, specialized", 1)] * 3, setup
        assert opt.stats()["background"]["taken"] and not any("failed" in r for r in opt.stats()["fallbacks"])


@cuda
def test_on_cuda_idle_time_captures_the_landed_entries_so_no_chunk_pays_a_capture():
    """``idle()`` between two chunks captures every entry the build handed over, on the
    session's arena (the live state saved and put back): the chunks after it replay at
    once, none captures, every one exact against stock.  While another build holds the
    device, ``idle()`` returns at once and captures nothing."""
    from cadence_fx.runtime import device_work
    with deterministic_protocol_restored():
        dev = torch.device("cuda")
        tail, opt = _cuda_model(23, n_timesteps=5)
        _cuda_voice(tail, opt, 47)
        assert isinstance(opt.session, PendingSession)
        chunks = s2.synthetic_chunks(6, seed=47, final_tokens=13)
        before = compare_streams(tail, opt, chunks[:1], dev, seed=471)  # eager; the build starts after it
        assert before["exact"], before["mismatches"]
        assert opt.wait_for_builds(300)
        held = []
        with device_work.LOCK:  # as if another voice's build held the device: idle() does not wait
            worker = threading.Thread(target=lambda: held.append((opt.idle(), time.perf_counter())))
            t0 = time.perf_counter()
            worker.start()
            worker.join(60)
        assert held and held[0][0] == [] and held[0][1] - t0 < 5.0, held
        assert torch.is_grad_enabled()  # as on a server's thread: idle() captures without autograd
        assert opt.idle() == [0, 1, 2]  # every entry, captured between two chunks
        capture_s = opt.session._stats.setup.capture_s
        assert opt.idle() == []  # nothing left
        report = compare_streams(tail, opt, chunks[1:], dev, seed=472)
        assert report["exact"], report["mismatches"]
        assert report["pcm_sha256_stock"] == report["pcm_sha256_optimized"]
        routes = [c["route"] for c in report["per_chunk"]]
        assert routes == ["replay entry 1"] + ["replay entry 2"] * 4 + [FLUSH], routes  # chunks[1:]: 5 steady, the flush
        assert opt.session._stats.setup.capture_s == capture_s  # no chunk captured anything
        stats = opt.stats()
        assert stats["fallbacks"] == {WAITING: 1, "flags last_chunk outside the catalog (eager)": 1}, stats
        assert stats["background"]["captured_idle"] == [0, 1, 2] and stats["background"]["idle_s"] > 0
        assert opt.session.capture_failures == {0: {}, 1: {}, 2: {}}
