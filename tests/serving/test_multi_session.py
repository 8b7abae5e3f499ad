"""Many sessions on one set of weights, bad input and faults: the library's serving
behaviour under rule S on the CPU, on the mini Token2Wav tail (tests/conftest.py
``t2w_mini``: upstream's classes, fewer blocks; the CUDA tests build the released one).

The oracle is the stock streaming path run alone: each session's stream is first run
by itself on the stock tail (from ``torch.manual_seed(seed_of(session, chunk))``
before every chunk), and the interleaved optimized sessions must reproduce it bit
for bit: ``torch.equal`` on every float waveform, SHA-256 of the bytes of every
carried state tensor after every chunk (stricter than ``torch.equal``), and
``torch.equal`` on every final state tensor.

Cost: the shared ``t2w_mini`` model (2 flow steps; prompt lengths 5 and
7 here: two traces), small prompts, few chunks.  ``OPTIMIZED`` catalog per prompt:
att-cache extents 2P, 2P + 50, 2P + 100 frames.
"""

from __future__ import annotations

import types

import pytest
import torch

import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.pcm import pcm_bytes
from cadence_fx.serving import Replica, ReplicaFull, ReplicaLost, Router, UnknownConversation
from cadence_fx.serving.replica import rank

from helpers.marks import cuda, deterministic_protocol_restored
from helpers.streams import STEPS, assert_chunk_exact, assert_final_exact, reference, seed_of, tokens_of


@pytest.fixture(scope="module")
def t2w(t2w_mini):
    """This file's Token2Wav is the mini one (tests/conftest.py ``t2w_mini``): what it checks
    is mechanism, which the released configuration's own tests do not need to repeat."""
    return t2w_mini


# ---------------------------------------------------------------- multi-session
def interleave_three_streams(opt, tail, device="cpu") -> tuple:
    """Three streams on one set of weights, round robin: two sessions (prompts of 5 and
    7 tokens) and the drop-in single-stream API (5 tokens, the default session); each
    chunk and final state equal to that stream run alone on the stock tail.
    Returns the two sessions (open) for the caller's checks of what they share."""
    prompts = {s: tuple(t.to(device) for t in s2.synthetic_prompt(n, seed=s + 1)) for s, n in ((0, 5), (1, 7), (2, 5))}
    # 3 chunks: catalog entries 0, 1, 2 (warm-up, growth, steady: the caches are trimmed at chunk 2)
    chunks = {0: s2.synthetic_chunks(3, seed=11),
              1: s2.synthetic_chunks(1, seed=12, final_tokens=9),  # and a flush chunk: eager, counted
              2: s2.synthetic_chunks(3, seed=13)}
    refs = {s: reference(tail, prompts[s], chunks[s], s) for s in prompts}

    a = opt.open_session(*prompts[0])
    b = opt.open_session(*prompts[1])
    streams = {0: a, 1: b}

    def step(s: int, k: int) -> None:
        tokens, last = chunks[s][k]
        torch.manual_seed(seed_of(s, k))
        if s == 2:
            opt.stream(tokens, last_chunk=last, return_waveform=True)
            speech, state = opt.last_speech, opt.state()
        else:
            streams[s].stream(tokens, last_chunk=last, return_waveform=True)
            speech, state = streams[s].last_speech, streams[s].state()
        assert_chunk_exact(refs[s], k, speech, state, f"stream {s} chunk {k}")

    step(0, 0)
    step(1, 0)
    opt.set_stream_cache(*prompts[2])  # a stream set up while others are mid-way loses nothing
    done = {0: 1, 1: 1, 2: 0}
    while any(done[s] < len(chunks[s]) for s in chunks):
        for s in chunks:
            if done[s] < len(chunks[s]):
                step(s, done[s])
                done[s] += 1
    assert_final_exact(refs[0], a.state(), "session a")
    assert_final_exact(refs[1], b.state(), "session b")
    assert_final_exact(refs[2], opt.state(), "default session")
    return a, b


def test_interleaved_sessions_each_stream_exactly_as_alone(t2w):
    opt = t2w.opt
    a, b = interleave_three_streams(opt, t2w.tail)
    # weights and executables shared (one per prompt length), arenas and counters per session
    assert sorted(k[0] for k in opt._executables if k[0] in (10, 14)) == [10, 14]
    assert a.session.executable is opt.session.executable is not b.session.executable
    ptrs = {x.arena.storage.data_ptr() for x in (a.session, b.session, opt.session)}
    assert len(ptrs) == 3
    assert a.stats()["graph_runs"] == {"0": 1, "1": 1, "2": 1} and a.stats()["fallback_total"] == 0
    assert b.stats()["fallbacks"] == {"flags last_chunk outside the catalog (eager)": 1}
    assert opt.stats()["graph_runs"] == {"0": 1, "1": 1, "2": 1}
    assert a.prompt_frames == 10 and b.prompt_frames == 14
    a.close()
    b.close()


@cuda
def test_interleaved_sessions_replay_exactly_as_alone_on_cuda(deterministic):
    """The same three streams under rule SRc on the GPU, against the stock tail on the
    GPU (deterministic protocol): every catalog chunk replays its captured graphs."""
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=STEPS)
    opt = cadence_fx.optimize(tail, rules="SRc")
    a, b = interleave_three_streams(opt, tail, "cuda")
    for s in (a, opt):
        assert s.stats()["fallback_total"] == 0 and s.stats()["replays"] == {"0": 1, "1": 1, "2": 1}, s.stats()
    assert b.stats()["fallbacks"] == {"flags last_chunk outside the catalog (eager)": 1}
    assert a.session.executable is opt.session.executable is not b.session.executable
    a.close()
    b.close()


# ------------------------------------------------------------ bad input, faults
@pytest.fixture(scope="module")
def pair(t2w):
    """Two sessions (prompt 5), each one chunk in, exact; with their stock references."""
    prompts = {3: s2.synthetic_prompt(5, seed=4), 4: s2.synthetic_prompt(5, seed=5)}
    x_chunks = [(tokens_of(40, 28), False), (tokens_of(41, 20), False),  # 20 tokens, not last: off the catalog
                (tokens_of(42, 28), False), (tokens_of(43, 28), False)]
    y_chunks = [(tokens_of(50, 28), False), (tokens_of(51, 28), False)]
    refs = {3: reference(t2w.tail, prompts[3], x_chunks, 3), 4: reference(t2w.tail, prompts[4], y_chunks, 4)}
    spk = prompts[3][2].clone()
    x = t2w.opt.open_session(prompts[3][0], prompts[3][1], spk)
    y = t2w.opt.open_session(*prompts[4])
    spk.add_(1.0)  # the caller reuses its speaker tensor: the session holds its own copy
    for s, session, chunks in ((3, x, x_chunks), (4, y, y_chunks)):
        torch.manual_seed(seed_of(s, 0))
        session.stream(chunks[0][0], return_waveform=True)
        assert_chunk_exact(refs[s], 0, session.last_speech, session.state(), f"session {s} chunk 0")
    return types.SimpleNamespace(x=x, y=y, refs=refs, x_chunks=x_chunks, y_chunks=y_chunks, prompts=prompts)


def snapshot(*sessions) -> list:
    return [(s.session.arena.storage.clone(), dict(s.session.extents), s.stats()) for s in sessions]


def assert_unchanged(before: list, sessions) -> None:
    for (storage, extents, stats), s in zip(before, sessions):
        assert torch.equal(s.session.arena.storage, storage), f"{s.name}: arena changed"
        assert s.session.extents == extents and s.stats() == stats, f"{s.name}: clock or counters changed"


def _strided(tokens: list[int], dtype=torch.int16) -> torch.Tensor:
    wide = torch.zeros(len(tokens), 2, dtype=dtype)
    wide[:, 0] = torch.tensor(tokens, dtype=dtype)
    t = wide[:, 0]
    assert not t.is_contiguous()
    return t


BAD_CHUNKS = [
    ([6561] * 28, r"speech tokens must be ints in \[0, 6561\); got \[6561, 6561"),
    ([-1] + [5] * 27, r"ints in \[0, 6561\); got \[-1\]"),
    ([1.0] * 28, "speech tokens must be ints; got float 1.0"),
    ([True] * 28, "speech tokens must be ints; got bool True"),
    ([], "empty token chunk"),
    (torch.ones(28), "speech tokens must be integers; got a torch.float32 tensor"),
    (torch.ones(28, dtype=torch.bool), "must be integers; got a torch.bool tensor"),
    (torch.zeros(28, dtype=torch.int32, device="meta"), "on the meta device"),
    (torch.zeros(2, 14, dtype=torch.int64), r"shape \(n,\) or \(1, n\); got \(2, 14\)"),
    ([7, 7, 7], "a chunk that is not last needs at least 5 tokens .* got 3"),
    ([7] * 500, "would grow the attention caches from 60 to 1054 mel frames; upstream's buffers hold 1000"),
]


@pytest.mark.parametrize("tokens, message", BAD_CHUNKS, ids=[m[:30] for _, m in BAD_CHUNKS])
def test_bad_chunk_is_rejected_before_launch_and_changes_no_session(pair, tokens, message):
    before = snapshot(pair.x, pair.y)
    with pytest.raises(cadence_fx.InputError, match=message):
        pair.x.stream(tokens)
    assert_unchanged(before, (pair.x, pair.y))


def test_bad_prompt_opens_nothing_and_changes_no_session(t2w, pair):
    pt, pm, spk = pair.prompts[3]
    before = snapshot(pair.x, pair.y)
    for bad, message in [((pt, pm.clone().index_fill_(1, torch.tensor([3]), float("nan")), spk), "prompt_mels holds NaN"),
                         ((pt, pm, torch.full_like(spk, float("inf"))), "spk holds NaN or inf"),
                         ((pt, pm.to("meta"), spk), "prompt_mels is on meta"),
                         ((pt.float(), pm, spk), "prompt_tokens must be int32/int64"),
                         ((pt + s2.VOCAB, pm, spk), r"prompt_tokens must be ids in \[0, 6561\)")]:
        with pytest.raises(cadence_fx.InputError, match=message):
            t2w.opt.open_session(*bad)
    assert_unchanged(before, (pair.x, pair.y))


def test_odd_inputs_stream_exactly_and_off_catalog_chunks_are_counted(pair):
    """A 20-token chunk that is not last is outside the catalog: it runs eagerly, bit
    exact, counted; the next chunk (caches off the catalog) too; then the trim brings
    the caches back onto the steady entry.  A strided int16 token tensor is read out
    (a copy), as a list would be; the speaker tensor changed by the caller after
    ``open_session`` does not reach the session."""
    x, ref = pair.x, pair.refs[3]
    inputs = {1: pair.x_chunks[1][0], 2: _strided(pair.x_chunks[2][0]), 3: torch.tensor([pair.x_chunks[3][0]])}
    for k in (1, 2, 3):
        torch.manual_seed(seed_of(3, k))
        x.stream(inputs[k], return_waveform=True)
        assert_chunk_exact(ref, k, x.last_speech, x.state(), f"session x chunk {k}")
    assert_final_exact(ref, x.state(), "session x")
    assert x.stats()["fallbacks"] == {"input 'token' shape (1, 20) != catalog (1, 28)": 1,
                                      "state extents outside the catalog": 1}
    assert x.stats()["graph_runs"] == {"0": 1, "2": 1}
    # the other session was not touched by any of it
    torch.manual_seed(seed_of(4, 1))
    pair.y.stream(pair.y_chunks[1][0], return_waveform=True)
    assert_chunk_exact(pair.refs[4], 1, pair.y.last_speech, pair.y.state(), "session y chunk 1")


def test_closed_session_names_itself_and_others_go_on(t2w, pair):
    s = t2w.opt.open_session(*pair.prompts[4])
    s.close()
    s.close()  # idempotent
    for call in (lambda: s.stream(pair.y_chunks[0][0]), lambda: s.submit([1] * 28), s.state):
        with pytest.raises(cadence_fx.SessionClosed, match=rf"{s.name} is closed \(close\(\) was called\).*open_session"):
            call()
    assert s.stats()["steps"] == 0 and s.arena_bytes == 0 and s.session is None  # arena released
    assert "closed=True" in repr(s)
    # the drop-in API's stream, closed
    t2w.opt.set_stream_cache(*pair.prompts[4])
    t2w.opt.close()
    with pytest.raises(cadence_fx.SessionClosed, match=r"the stream is closed .*set_stream_cache"):
        t2w.opt.stream(pair.y_chunks[0][0])


# ------------------------------------------------ out of memory while capturing
def test_out_of_memory_while_capturing_leaves_that_entry_eager_and_counted(monkeypatch):
    """``Session.prepare_replay`` on the CPU (the lowest level that runs without CUDA):
    the toy compiled for per-chunk replay (its regions lowered to ``CapturedRegion``),
    ``capture_entry`` faked to run into the arena, draw from the generator, and fail
    with out of memory on entry 1.  The failure is recorded, the generators and the
    arena are as before, and the stream is exact (uncaptured regions run eagerly,
    each run counted: on the CPU nothing is ever captured, so every entry's are)."""
    from cadence_fx import compiler
    from cadence_fx.runtime import graphs
    from cadence_fx.runtime.graphs import CapturedRegion
    from helpers.toy_models import ToyAdapter, assert_lockstep_exact, make_toy, toy_inputs, toy_prompt

    monkeypatch.setattr(compiler, "check_rules", lambda rules, device: rules)  # lower for replay on the CPU
    adapter = ToyAdapter(make_toy(4), 2)
    exe = compiler.compile_executable(adapter, "SRc")
    assert all(p.kind == "cudagraph" for p in exe.programs.values())
    assert all(any(isinstance(m, CapturedRegion) for m in p.run.children()) for p in exe.programs.values())

    calls, warm = [], []

    def capture_entry(parent, args, pool, arena_ptr, stream, warm_up=True):
        calls.append(pool)
        warm.append(warm_up)
        for a in args:
            if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == arena_ptr:
                a.fill_(3.0)  # the warm-up run writes into the arena
        torch.rand(5)  # and draws
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {}

    monkeypatch.setattr(graphs, "capture_entry", capture_entry)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    rng = torch.random.get_rng_state()
    prompt = toy_prompt(2)
    session = adapter.open_session(exe, prompt)
    assert torch.equal(torch.random.get_rng_state(), rng), "capture moved the generator"
    # one pool for the session (the OOM came from outside a capture: no capture failed), every entry attempted
    assert len(calls) == 3 and all(c is calls[0] for c in calls) and graphs.pool_handle(calls[0]) == "pool"
    assert warm == [True, False, False]  # the first entry warms the session's capture stream up
    assert session.capture_failures == {0: {}, 1: {"*": "out of memory while capturing: CUDA out of memory. "
                                                         "Tried to allocate 2.00 GiB"}, 2: {}}
    stock = make_toy(4)
    with torch.no_grad():
        stock_state = stock.setup(prompt)
    assert_lockstep_exact(stock, stock_state, session, toy_inputs(5, seed=3), 2)
    fallbacks = session.stats()["fallbacks"]
    assert fallbacks and all(r.startswith("region refused replay: submod_") and r.endswith(": not captured")
                             for r in fallbacks)
    assert session.stats()["replays"] == {}
    # a refused region walks its piece's graph, as capture does: no code generated mid-stream
    from cadence_fx.runtime.interpret import has_code
    pieces = [m.piece for p in session._programs.values() for m in p.run.children()
              if isinstance(m, CapturedRegion) and not m.trivial]
    assert pieces and not any(has_code(p) for p in pieces)


@pytest.fixture
def deterministic():
    """The protocol stock eager needs to be bit-reproducible on a GPU; restored after."""
    with deterministic_protocol_restored():
        yield


@cuda
def test_out_of_memory_while_capturing_on_cuda_replays_the_other_entries(monkeypatch, deterministic):
    """The real capture for entries 0 and 2, out of memory for entry 1: entry 1's steps
    run eagerly (counted), the others replay; every step bit-exact against stock."""
    from cadence_fx.compiler import compile_executable
    from cadence_fx.runtime import graphs
    from helpers.toy_models import ToyAdapter, assert_lockstep_exact, make_toy, toy_inputs, toy_prompt

    dev = torch.device("cuda")
    adapter = ToyAdapter(make_toy(4).to(dev), 2)
    exe = compile_executable(adapter, "SRc")
    real, calls = graphs.capture_entry, []

    def capture_entry(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(*args, **kw)

    monkeypatch.setattr(graphs, "capture_entry", capture_entry)
    session = adapter.open_session(exe, toy_prompt(2).to(dev))
    monkeypatch.undo()
    assert session.capture_failures == {0: {}, 1: {"*": "out of memory while capturing: CUDA out of memory (injected)"},
                                        2: {}}
    stock = make_toy(4).to(dev)
    with torch.no_grad():
        stock_state = stock.setup(toy_prompt(2).to(dev))
    inputs = [{k: v.to(dev) for k, v in x.items()} for x in toy_inputs(6, seed=3)]
    assert_lockstep_exact(stock, stock_state, session, inputs, 2)
    stats = session.stats()
    assert stats["replays"].get("0") == 1 and stats["replays"].get("2", 0) >= 1 and "1" not in stats["replays"]
    assert stats["fallbacks"] and all(r.endswith("not captured") for r in stats["fallbacks"])


@cuda
def test_sessions_overlapped_on_their_own_streams_replay_exactly_as_alone_on_cuda(deterministic):
    """Four SRc sessions, each on its own CUDA stream: every tick submits all four
    chunks (seeded just before each submit) and only then reads them, so their graphs
    run concurrently; HiFT draws its noise late in the chunk, long after the next
    session's replay has written its seed.  Each chunk's waveform and state equals the
    stream alone on stock, because each session's graphs draw from their own generator
    state (``graph_rng``)."""
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=STEPS)
    opt = cadence_fx.optimize(tail, rules="SRc")
    n, chunks = 4, 4  # catalog entries 0, 1, 2, 2
    prompts = {s: tuple(t.cuda() for t in s2.synthetic_prompt(5, seed=40 + s)) for s in range(n)}
    streams = {s: s2.synthetic_chunks(chunks, seed=50 + s) for s in range(n)}
    refs = {s: reference(tail, prompts[s], streams[s], s) for s in range(n)}
    pooled = {torch.cuda.Stream().cuda_stream for _ in range(64)}  # PyTorch's pool wrapped: 32 streams
    sessions = [opt.open_session(*prompts[s], stream=torch.cuda.Stream()) for s in range(n)]
    captured_on = {session.session._capture_stream.cuda_stream for session in sessions}
    assert len(captured_on) == n and not captured_on & pooled  # each its own: one cuBLAS workspace each
    for k in range(chunks):
        pending = []
        for s, session in enumerate(sessions):
            torch.manual_seed(seed_of(s, k))
            pending.append(session.submit(streams[s][k][0]))
        for p in pending:
            p.result()
        for s, session in enumerate(sessions):
            assert_chunk_exact(refs[s], k, session.last_speech, session.state(), f"session {s} chunk {k}")
    for s, session in enumerate(sessions):
        assert_final_exact(refs[s], session.state(), f"session {s}")
        st = session.stats()
        assert st["fallback_total"] == 0 and st["replays"] == {"0": 1, "1": 1, "2": 2}, st
        assert st["graph_rng"] == "session" and st["capture_streams"]["made"] >= n
        session.close()


def test_run_tick_launches_every_chunk_then_collects_and_a_refused_one_loses_nothing(t2w):
    """``serving.run_tick``: each chunk exact against its stream alone on stock; a chunk
    refused at submit (bad tokens) leaves its session as it was, the others still run
    and are returned in ``TickError.results``."""
    import numpy as np

    from cadence_fx.serving import SessionPool, TickError, run_tick
    prompts = {5: s2.synthetic_prompt(5, seed=6), 6: s2.synthetic_prompt(5, seed=7)}
    chunks = {s: s2.synthetic_chunks(2, seed=60 + s) for s in prompts}
    refs = {s: reference(t2w.tail, prompts[s], chunks[s], s) for s in prompts}
    sessions = {s: t2w.opt.open_session(*prompts[s]) for s in prompts}
    order = [5, 6]
    out = run_tick([(sessions[s], chunks[s][0][0]) for s in order], return_waveform=True,
                   before_submit=lambda n: torch.manual_seed(seed_of(order[n], 0)))
    for s, wave in zip(order, out):
        assert_chunk_exact(refs[s], 0, sessions[s].last_speech, sessions[s].state(), f"session {s} chunk 0")
        assert np.array_equal(wave, sessions[s].last_speech.numpy())
    before = snapshot(sessions[5])
    pool = SessionPool([t2w.opt])
    with pytest.raises(TickError, match=r"1 of 2 chunks .* chunk 0: InputError: speech tokens must be ints") as e:
        pool.tick([(sessions[5], [6561] * 28), (sessions[6], chunks[6][1][0], False)],
                  before_submit=lambda n: torch.manual_seed(seed_of(6, 1)))
    assert list(e.value.errors) == [0] and isinstance(e.value.errors[0], cadence_fx.InputError)
    assert e.value.results[0] is None and isinstance(e.value.results[1], bytes)
    assert_chunk_exact(refs[6], 1, sessions[6].last_speech, sessions[6].state(), "session 6 chunk 1")
    assert_unchanged(before, [sessions[5]])
    for s in sessions.values():
        s.close()


# ------------------------------------------- conversations by id (issue 18's core)
# serving.Replica and serving.Router: conversations by id on an optimized model,
# admission control, sticky routing, a lost replica; every chunk against stock alone.
def conversation(n: int):
    """Conversation ``n``: a 5-token prompt (seed 90 + n) and 2 steady chunks."""
    return s2.synthetic_prompt(5, seed=90 + n), s2.synthetic_chunks(2, seed=90 + n)


def test_a_replica_serves_conversations_by_id_and_refuses_when_full(t2w):
    convs = {n: conversation(n) for n in (1, 2)}
    refs = {1: reference(t2w.tail, *convs[1], 1), 2: reference(t2w.tail, convs[2][0], convs[2][1][:1], 2)}
    replica = Replica(t2w.opt, max_conversations=2, name="gpu0")
    for n, (prompt, _) in convs.items():
        replica.open(f"c{n}", *prompt)
    with pytest.raises(ReplicaFull, match=r"gpu0 holds 2 conversations, its maximum .*refused rather than served late"):
        replica.open("c3", *convs[1][0])
    with pytest.raises(cadence_fx.InputError, match="'c1' is already open on gpu0"):
        replica.open("c1", *convs[1][0])
    with pytest.raises(UnknownConversation, match="no conversation 'c9' is open on gpu0"):
        replica.send("c9", convs[1][1][0][0])
    for call in (lambda: replica.open(["c9"], *convs[1][0]), lambda: replica.send(["c1"], convs[1][1][0][0]),
                 lambda: Router([replica]).open({"id": 1}, *convs[1][0])):
        with pytest.raises(cadence_fx.InputError, match="a conversation id must be hashable; got (list|dict)"):
            call()
    assert replica.load() == {"replica": "gpu0", "conversations": 2, "max": 2}

    torch.manual_seed(seed_of(1, 0))
    pcm = replica.send("c1", convs[1][1][0][0], return_waveform=True)
    assert_chunk_exact(refs[1], 0, replica._sessions["c1"].last_speech, replica._sessions["c1"].state(), "c1 chunk 0")
    assert pcm.shape == refs[1]["waves"][0].shape
    # a tick: c2's first chunk and c1's second, launched together; each seeded as stock was for it
    seeds = {"c2": seed_of(2, 0), "c1": seed_of(1, 1)}
    out = replica.tick({"c2": convs[2][1][0][0], "c1": convs[1][1][1][0]},
                       before_submit=lambda c: torch.manual_seed(seeds[c]))
    assert_chunk_exact(refs[2], 0, replica._sessions["c2"].last_speech, replica._sessions["c2"].state(), "c2 chunk 0")
    assert_chunk_exact(refs[1], 1, replica._sessions["c1"].last_speech, replica._sessions["c1"].state(), "c1 chunk 1")
    assert list(out) == ["c2", "c1"] and out["c2"] == pcm_bytes(refs[2]["waves"][0].numpy())
    assert replica.idle() == {}  # set up in the foreground: nothing to capture between ticks

    # a bad chunk: refused with the library's error, the conversation unchanged
    before = snapshot(replica._sessions["c2"])
    with pytest.raises(cadence_fx.InputError, match="speech tokens must be ints"):
        replica.send("c2", [6561] * 28)
    assert_unchanged(before, [replica._sessions["c2"]])
    stats = replica.close("c1")
    assert stats["steps"] == 2 and replica.conversations() == ["c2"] and replica.load()["conversations"] == 1
    with pytest.raises(UnknownConversation, match="no conversation 'c1' is open on gpu0"):
        replica.reset("c1")  # closed
    replica.close("c2")
    with pytest.raises(cadence_fx.InputError, match="max_conversations must be an int >= 1"):
        Replica(t2w.opt, 0)


def test_the_router_keeps_each_conversation_on_its_replica_and_a_lost_one_fails_only_its_own(t2w):
    names = ["gpu0", "gpu1"]
    ids = [f"conv-{i}" for i in range(12)]
    homes = {c: names[rank(c, names)[0]] for c in ids}
    assert set(homes.values()) == set(names)  # the hash spreads ids over both
    assert all(rank(c, names) == rank(c, names) for c in ids)  # and is stable
    # a third replica takes some conversations and moves no other (rendezvous hashing)
    three = names + ["gpu2"]
    assert all(three[rank(c, three)[0]] in (homes[c], "gpu2") for c in ids)

    router = Router([Replica(t2w.opt, 1, "gpu0"), Replica(t2w.opt, 1, "gpu1")])
    a, b = (c for c in ids if homes[c] == "gpu0"), (c for c in ids if homes[c] == "gpu1")
    on0, on1 = next(a), next(b)
    (p0, chunks0), (p1, chunks1) = conversation(4), conversation(5)
    refs = {on0: reference(t2w.tail, p0, chunks0, 4), on1: reference(t2w.tail, p1, chunks1, 5)}
    assert router.open(on0, *p0) == "gpu0" and router.open(on1, *p1) == "gpu1"
    with pytest.raises(ReplicaFull, match="every live replica is full \\(gpu"):
        router.open(next(a), *conversation(6)[0])
    torch.manual_seed(seed_of(4, 0))
    router.send(on0, chunks0[0][0])
    torch.manual_seed(seed_of(5, 0))
    router.send(on1, chunks1[0][0])
    for c, n in ((on0, 0), (on1, 1)):
        s = router.replicas[n]._sessions[c]
        assert_chunk_exact(refs[c], 0, s.last_speech, s.state(), f"{c} chunk 0")
    assert router.placement() == {on0: "gpu0", on1: "gpu1"}

    assert router.mark_lost("gpu0", "dead (its process exited)") == [on0]
    with pytest.raises(ReplicaLost, match=f"'{on0}' was on gpu0, which is dead \\(its process exited\\)"):
        router.send(on0, chunks0[1][0])
    out = router.tick({on0: chunks0[1][0], on1: chunks1[1][0], "nobody": chunks1[1][0]})
    assert isinstance(out[on0], ReplicaLost) and isinstance(out["nobody"], UnknownConversation)
    assert isinstance(out[on1], bytes)  # the other conversation streamed on (its seed: whatever stands)
    with pytest.raises(ReplicaFull, match="every live replica is full \\(gpu1\\)"):
        router.open("new", *conversation(7)[0])  # gpu0 is lost, gpu1 full
    router.close(on1)
    assert router.open("new", *conversation(7)[0]) == "gpu1"
    with pytest.raises(cadence_fx.InputError, match="replica names must be distinct"):
        Router([Replica(t2w.opt, 1, "x"), Replica(t2w.opt, 1, "x")])
    for r in router.replicas:
        for c in r.conversations():
            r.close(c)


def test_replica_and_router_idle_give_each_session_the_time_left():
    """``Replica.idle`` gives each conversation's session ``idle()`` in turn with what is
    left of ``seconds`` and stops when none is; ``Router.idle`` does so over its live
    replicas.  Only conversations that captured something are reported."""
    import time

    class Session:
        def __init__(self, captures, cost=0.0):
            self.captures, self.cost, self.calls = captures, cost, []

        def idle(self, seconds=None):
            self.calls.append(seconds)
            time.sleep(self.cost)
            return list(self.captures)

    a, b, c = Session([0, 1], cost=0.05), Session([]), Session([2])
    first, second = Replica(object(), 4, "r0"), Replica(object(), 4, "r1")
    first._sessions.update({"a": a, "b": b})
    second._sessions.update({"c": c})
    assert first.idle() == {"a": [0, 1]} and a.calls == [None] and b.calls == [None]
    assert first.idle(0.01) == {"a": [0, 1]}  # a's idle used the time up: b gets none
    assert a.calls[-1] == pytest.approx(0.01, abs=0.01) and b.calls == [None]
    class Broken:
        def idle(self, seconds=None):
            raise cadence_fx.errors.SessionBroken("idle() refused: a step of this session failed part-way")

    first._sessions["z"] = Broken()  # left for its own next call to report; the others still get their time
    assert first.idle() == {"a": [0, 1]} and len(b.calls) == 2
    del first._sessions["z"]
    router = Router([first, second])
    for call in (lambda: first.idle("soon"), lambda: router.idle(-1.0)):  # before any session is called
        with pytest.raises(cadence_fx.InputError, match="takes None .* or a number of seconds >= 0"):
            call()
    assert len(b.calls) == 2 and len(c.calls) == 0
    assert router.idle() == {"a": [0, 1], "c": [2]}
    router.mark_lost("r1")
    assert router.idle() == {"a": [0, 1]} and len(c.calls) == 1  # a lost replica is left alone
