"""Misuse and faults never yield a wrong chunk (issue 13): one call at a time per
session, atomic steps or a broken session, snapshot/restore.

For every call: its output equals the stock stream's for the same valid sequence,
or it raised a ``CadenceError`` (or the injected fault) and the state is exactly as
before, or the session refuses every later use with ``SessionBroken`` until
``restore``.  Faults are injected at the n-th aten op of a step by a dispatch mode,
and a second thread acts while a first call is held in flight at a chosen op
(``helpers.faults``): nothing here depends on timing.

* the toy model (milliseconds a step): hypothesis-driven call sequences, rules S
  (arena) and rules R's graphs over stock-managed state (``StockStateSession``);
* Mimi (released config, traced once for the module, ~8 s): fixed sequences, among
  them a fault inside moshi's eager fallback, which updates its state in place;
* Token2Wav through the shared ``t2w`` fixture (2 flow steps, prompt 5 tokens, the
  executable test_serve uses): faults in the graph and the fallback, and the
  drop-in's ``stream``/``submit`` from a second thread;
* CUDA (``-m cuda``): faults during replay and during capture.
"""

from __future__ import annotations

import importlib.util
import types

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cadence_fx import CadenceError, InputError, SessionBroken, SessionBusy, SessionClosed
from cadence_fx.compiler import _compile, compile_executable
from cadence_fx.runtime.snapshot import SessionSnapshot

from helpers.faults import FaultAt, OpCounter, in_flight
from helpers.marks import cuda
from helpers.toy_models import CHANNELS, FRAMES, ToyAdapter, make_toy, toy_prompt

PROMPT, RETAIN = 2, 4
needs_moshi = pytest.mark.skipif(importlib.util.find_spec("moshi") is None, reason="moshi is not installed")


def clone_state(state: dict) -> dict:
    return {k: v.clone() for k, v in state.items()}


def assert_same(got: dict, want: dict, where: str) -> None:
    assert got.keys() == want.keys(), where
    for k, t in want.items():
        assert got[k].shape == t.shape and torch.equal(got[k], t), f"{where}: {k!r} differs"


def assert_broken_by(session, error: BaseException, where: str) -> None:
    """The session refuses every use but stats/restore, naming ``error``."""
    assert session.broken is error, where
    name = type(error).__name__
    for call in (lambda: session.step({"x": torch.zeros(1, CHANNELS, FRAMES)}), session.state, session.snapshot):
        with pytest.raises(SessionBroken, match=name) as info:
            call()
        assert info.value.__cause__ is error, where


# ===================================================================== the toy
@pytest.fixture(scope="module")
def toys():
    """rules -> (adapter, executable): "S" (arena) and "" (graphs over stock-managed state)."""
    out = {}
    for rules in ("S", ""):
        adapter = ToyAdapter(make_toy(RETAIN), PROMPT)
        out[rules] = (adapter, _compile(adapter, rules))
    return out


def toy_x(seed: int, frames: int = FRAMES, device: str = "cpu") -> dict:
    return {"x": torch.randn(1, CHANNELS, frames, generator=torch.Generator().manual_seed(seed)).to(device)}


BAD_INPUTS = {
    "float64": lambda: {"x": torch.zeros(1, CHANNELS, FRAMES, dtype=torch.float64)},
    "int64": lambda: {"x": torch.zeros(1, CHANNELS, FRAMES, dtype=torch.int64)},
    "rank": lambda: {"x": torch.zeros(CHANNELS, FRAMES)},
    "list": lambda: {"x": [[0.0] * FRAMES] * CHANNELS},
    "missing": lambda: {"y": torch.zeros(1, CHANNELS, FRAMES)},
    "meta": lambda: {"x": torch.zeros(1, CHANNELS, FRAMES, device="meta")},
}
ERRORS = {"runtime": lambda: RuntimeError("injected"), "interrupt": KeyboardInterrupt,
          "oom": lambda: torch.OutOfMemoryError("injected out of memory")}


class ToyStream:
    """One session and its stock reference (the stock step on cloned states, so one
    stock model serves every stream), with the snapshots taken so far."""

    def __init__(self, stock, session, prompt: torch.Tensor):
        self.stock, self.session = stock, session
        with torch.no_grad():
            self.ref = clone_state(stock.setup(prompt))
        self.steps = 0
        self.snaps = [(session.snapshot(), self.ref)]

    @classmethod
    def open(cls, adapter, exe, stock, prompt_seed: int, device: str = "cpu") -> "ToyStream":
        prompt = toy_prompt(PROMPT, seed=prompt_seed).to(device)
        return cls(stock, adapter.open_session(exe, prompt), prompt)

    def expect(self, x: dict, last: bool, seed: int) -> tuple[torch.Tensor, dict]:
        torch.manual_seed(seed)
        with torch.no_grad():
            out, state = self.stock.stream(x, self.ref, PROMPT, last)
        return out["y"].clone(), clone_state(state)

    def advance(self, out: dict, expected: tuple, where: str) -> None:
        assert torch.equal(out["y"], expected[0]), f"{where}: output differs from stock"
        self.ref = expected[1]
        self.steps += 1
        self.check(where)

    def check(self, where: str) -> None:
        assert_same(self.session.state(), self.ref, where)
        assert self.session.stats()["steps"] == self.steps, where

    def frozen(self) -> tuple:
        """Everything a refused call must leave as it was."""
        s = self.session
        held = s.arena.storage.clone() if s.arena is not None else clone_state(s._state)
        return held, dict(s.extents), s.stats()

    def assert_frozen(self, before: tuple, where: str) -> None:
        s = self.session
        if s.arena is not None:
            assert torch.equal(s.arena.storage, before[0]), f"{where}: arena changed"
        else:
            assert_same(s._state, before[0], where)
        assert s.extents == before[1] and s.stats() == before[2], f"{where}: clock or counters changed"

    def runs_graph(self, x: dict, last: bool) -> bool:
        """Whether the gate would run the entry's graph (else the eager fallback)."""
        s = self.session
        entry = s._entry()
        return not last and entry is not None and s._admit(entry, x) is None


valid_step = st.tuples(st.sampled_from([FRAMES, FRAMES, FRAMES, 2, 1, 5]), st.sampled_from([False] * 5 + [True]),
                       st.integers(0, 2 ** 16))
catalog_step = st.tuples(st.just(FRAMES), st.just(False), st.integers(0, 2 ** 16))  # the graph's, once on the catalog
actions = st.one_of(
    st.tuples(st.just("step"), valid_step),
    st.tuples(st.just("step"), catalog_step),
    st.tuples(st.just("bad"), st.sampled_from(sorted(BAD_INPUTS))),
    st.tuples(st.just("fault"), valid_step, st.integers(0, 70), st.sampled_from(sorted(ERRORS)), st.integers(0, 9)),
    st.tuples(st.just("fault"), catalog_step, st.integers(0, 55), st.sampled_from(sorted(ERRORS)), st.integers(0, 9)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("restore"), st.integers(0, 9)),
    st.tuples(st.just("foreign")),
    st.tuples(st.just("busy"), valid_step, st.integers(0, 30), st.sampled_from(["step", "snapshot", "restore",
                                                                                 "load_state"])),
    st.tuples(st.just("overlap"), valid_step, valid_step),
    st.tuples(st.just("close")),
)


@pytest.mark.parametrize("rules", ["S", ""], ids=["S", "stock-state"])
@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(program=st.lists(actions, min_size=1, max_size=16))
def test_toy_call_sequences_never_yield_a_wrong_step(toys, rules, program):
    adapter, exe = toys[rules]
    stock = make_toy(RETAIN)
    a = ToyStream.open(adapter, exe, stock, prompt_seed=1)
    # rules R/Rc share the model's buffers as scratch: their sessions must not overlap (documented)
    b = ToyStream.open(adapter, exe, stock, prompt_seed=3) if rules == "S" else None
    other_rules = toys["" if rules == "S" else "S"]
    for k, action in enumerate(program):
        where = f"call {k} {action}"
        kind = action[0]
        if a.session.closed:
            break
        event(kind)
        if kind == "step":
            frames, last, seed = action[1]
            x = toy_x(seed, frames)
            expected = a.expect(x, last, seed)
            torch.manual_seed(seed)
            a.advance(a.session.step(x, last=last), expected, where)
        elif kind == "bad":
            before = a.frozen()
            with pytest.raises(InputError):
                a.session.step(BAD_INPUTS[action[1]]())
            a.assert_frozen(before, where)
        elif kind == "fault":
            (frames, last, seed), n, error_kind, pick = action[1:]
            x = toy_x(seed, frames)
            expected = a.expect(x, last, seed)
            graph, before, error = a.runs_graph(x, last), a.frozen(), ERRORS[error_kind]()
            fault, raised = FaultAt(n, error), None
            torch.manual_seed(seed)
            try:
                with fault:
                    out = a.session.step(x, last=last)
            except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt is one of the faults
                raised = e
            if not fault.fired:  # op n was past the step's last op
                event("fault: past the step's last op")
                assert raised is None, where
                a.advance(out, expected, where + " (the step ended before op n)")
                continue
            assert raised is error, where
            # the fallback computes on private copies: only an interruption while it
            # copies its result back into the arena can leave part of it written
            writing_back = not graph and a.session.arena is not None and fault.func is torch.ops.aten.copy_.default
            event(f"fault: {'graph' if graph else 'fallback'}, {'broken' if a.session.broken else 'intact'}")
            if graph or (writing_back and a.session.broken is not None):  # broken until restored
                assert_broken_by(a.session, error, where)
                assert a.session.stats() == before[2], f"{where}: a failed step was counted"
                snap, ref = a.snaps[pick % len(a.snaps)]
                a.session.restore(snap)
                a.ref = ref
                assert a.session.broken is None
            else:  # nothing changed
                assert a.session.broken is None, where
                a.assert_frozen(before, where)
            a.check(where + " after")
        elif kind == "snapshot":
            before = a.frozen()
            a.snaps.append((a.session.snapshot(), a.ref))
            a.assert_frozen(before, where)
        elif kind == "restore":
            snap, a.ref = a.snaps[action[1] % len(a.snaps)]
            a.session.restore(snap)
            a.check(where)
        elif kind == "foreign":
            before = a.frozen()
            foreign = other_rules[0].open_session(other_rules[1], toy_prompt(PROMPT)).snapshot()
            for bad in (foreign, "not a snapshot"):
                with pytest.raises(InputError, match="snapshot"):
                    a.session.restore(bad)
            a.assert_frozen(before, where)
        elif kind == "busy":
            (frames, last, seed), hold, other = action[1:]
            x = toy_x(seed, frames)
            expected = a.expect(x, last, seed)
            calls = {"step": lambda: a.session.step(toy_x(0)), "snapshot": a.session.snapshot,
                     "restore": lambda: a.session.restore(a.snaps[0][0]),
                     "load_state": lambda: a.session.load_state(a.snaps[0][0].state)}
            with in_flight(lambda: a.session.step(x, last=last), hold_at=hold,
                           setup=lambda: torch.manual_seed(seed)) as first:
                with pytest.raises(SessionBusy, match="one step at a time"):
                    calls[other]()
                a.session.stats()  # counters answer while a step runs
            a.advance(first.get(), expected, where)
        elif kind == "overlap" and b is not None:
            (fa, la, sa), (fb, lb, sb) = action[1:]
            xa, xb = toy_x(sa, fa), toy_x(sb, fb)
            expect_a = a.expect(xa, la, sa)
            # a holds after its random draw (the generator is process-wide) while b steps
            with in_flight(lambda: a.session.step(xa, last=la), after_draws=1,
                           setup=lambda: torch.manual_seed(sa)) as first:
                expect_b = b.expect(xb, lb, sb)
                torch.manual_seed(sb)
                b.advance(b.session.step(xb, last=lb), expect_b, where + " b")
            a.advance(first.get(), expect_a, where + " a")
        elif kind == "close":
            a.session.close()
    if a.session.closed:  # every call refused, stats still answer
        with pytest.raises(SessionClosed):
            a.session.step(toy_x(0))
        for call in (a.session.snapshot, lambda: a.session.restore(a.snaps[0][0])):
            with pytest.raises(SessionClosed):
                call()
        assert a.session.stats()["steps"] == a.steps
        return
    x = toy_x(99)  # the stream goes on, exact
    expected = a.expect(x, False, 99)
    torch.manual_seed(99)
    a.advance(a.session.step(x), expected, "final step")


def test_load_state_clears_the_broken_mark_and_a_failed_step_is_not_counted(toys):
    adapter, exe = toys["S"]
    stock = make_toy(RETAIN)
    a = ToyStream.open(adapter, exe, stock, prompt_seed=5)
    x = toy_x(1)
    error = RuntimeError("injected")
    with pytest.raises(RuntimeError), FaultAt(10, error):
        a.session.step(x)
    assert_broken_by(a.session, error, "graph fault")
    # setup_s: test_setup_times.py; specializations: the executable's (tests/runtime/test_variants.py)
    counts = {k: v for k, v in a.session.stats().items() if k not in ("setup_s", "specializations")}
    assert counts == {"steps": 0, "graph_runs": {}, "replays": {}, "fallbacks": {}, "fallback_total": 0}
    assert a.session.stats()["specializations"]["captured_here_s"] == {}
    a.session.load_state(a.snaps[0][0].state)
    assert a.session.broken is None
    expected = a.expect(x, False, 7)
    torch.manual_seed(7)
    a.advance(a.session.step(x), expected, "after load_state")
    # an eager step that fails is not counted as a fallback either
    with pytest.raises(RuntimeError), FaultAt(10, RuntimeError("injected")):
        a.session.step(toy_x(2), last=True)
    assert a.session.stats()["fallback_total"] == 0 and a.session.broken is None


def test_snapshot_is_opaque_and_restores_into_another_session(toys):
    adapter, exe = toys["S"]
    stock = make_toy(RETAIN)
    a, b = ToyStream.open(adapter, exe, stock, prompt_seed=1), ToyStream.open(adapter, exe, stock, prompt_seed=2)
    for k in range(4):
        x = toy_x(k)
        expected = a.expect(x, False, k)
        torch.manual_seed(k)
        a.advance(a.session.step(x), expected, f"a step {k}")
    snap = a.session.snapshot()
    assert isinstance(snap, SessionSnapshot) and "bytes" in repr(snap)
    assert snap.nbytes == sum(t.nbytes for t in a.session.state().values())
    b.session.restore(snap)  # a fork of a's conversation: b continues from a's state, exactly
    b.ref, b.steps = a.ref, 0
    b.check("b after restore")
    for k in range(4, 8):
        x = toy_x(k)
        expected = b.expect(x, False, k)
        torch.manual_seed(k)
        b.advance(b.session.step(x), expected, f"b step {k}")
    a.check("a untouched by b")


# ======================================================================= Mimi
@pytest.fixture(scope="module")
def mimi():
    from cadence_fx.integrations import moshi as mm
    import cadence_fx
    stock = mm.MimiDecoder(mm.build_mimi(seed=0))
    return types.SimpleNamespace(mm=mm, stock=stock, opt=cadence_fx.optimize(stock, rules="S"))


def mimi_frames(mimi, n: int, seed: int) -> list:
    return [codes for codes, _ in mimi.mm.synthetic_codes(n, seed=seed)]


def assert_mimi_exact(mimi, codes, where: str, tensor=None) -> None:
    """One frame on stock and optimized (``tensor``: the optimized side's codes
    tensor, stepped through the session): waveform and every state tensor equal."""
    stock_wave = torch.from_numpy(mimi.stock.stream(codes, return_waveform=True))
    if tensor is None:
        wave = torch.from_numpy(mimi.opt.stream(codes, return_waveform=True))
    else:
        wave = mimi.opt.session.step({"codes": tensor})["pcm"]
    assert torch.equal(wave, stock_wave), f"{where}: waveform differs from stock"
    stock_state = mimi.stock.state()
    for k, t in mimi.opt.state().items():
        assert torch.equal(t, stock_state[k]), f"{where}: state {k!r} differs from stock"


def fresh_mimi_stream(mimi, n: int, seed: int, exact_first: int = 1) -> list:
    """Both decoders on a new stream, ``n`` frames of it, the first ``exact_first`` streamed and checked."""
    mimi.stock.reset()
    mimi.opt.reset()
    frames = mimi_frames(mimi, n, seed=seed)
    for k in range(exact_first):
        assert_mimi_exact(mimi, frames[k], f"frame {k}")
    return frames


def strided_codes(codes) -> torch.Tensor:
    """The frame as a [1, 8, 1] tensor of other strides: the gate sends it to moshi's eager decode."""
    return torch.tensor(codes).repeat_interleave(2).reshape(1, 16, 1)[:, ::2]


@needs_moshi
def test_mimi_graph_fault_breaks_the_session_until_restore(mimi):
    frames = fresh_mimi_stream(mimi, 5, seed=21, exact_first=2)
    snap = mimi.opt.session.snapshot()
    error = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as info, FaultAt(100, error):
        mimi.opt.stream(frames[2])
    assert info.value is error and mimi.opt.session.broken is error
    with pytest.raises(SessionBroken, match="KeyboardInterrupt"):
        mimi.opt.stream(frames[2])  # the drop-in refuses too
    with pytest.raises(SessionBroken):
        mimi.opt.state()
    assert mimi.opt.stats()["steps"] == 2 and mimi.opt.stats()["graph_runs"] == {"0": 2}
    mimi.opt.session.restore(snap)
    for k in range(2, 5):
        assert_mimi_exact(mimi, frames[k], f"frame {k} after restore")


@needs_moshi
def test_mimi_fallback_fault_leaves_the_state_as_it_was(mimi):
    """moshi's eager decode updates its state in place: the session hands it private copies."""
    frames = fresh_mimi_stream(mimi, 4, seed=22)
    session = mimi.opt.session
    snap = session.snapshot()
    with OpCounter() as count:
        session.step({"codes": strided_codes(frames[1])})
    session.restore(snap)
    last_compute = count.ops - len(session.executable.carried) - 1  # then one copy back per region
    assert last_compute > 100
    for n in (1, last_compute // 3, 2 * last_compute // 3, last_compute):
        before = session.arena.storage.clone(), dict(session.extents), session.stats()
        error = RuntimeError(f"injected at op {n}")
        with pytest.raises(RuntimeError, match="injected") as info, FaultAt(n, error):
            session.step({"codes": strided_codes(frames[1])})
        assert info.value is error and session.broken is None, f"op {n}"
        assert torch.equal(session.arena.storage, before[0]), f"op {n}: the arena changed"
        assert session.extents == before[1] and session.stats() == before[2], f"op {n}"
    assert_mimi_exact(mimi, frames[1], "frame 1, eager", tensor=strided_codes(frames[1]))
    for k in (2, 3):
        assert_mimi_exact(mimi, frames[k], f"frame {k}")
    assert mimi.opt.stats()["fallback_total"] == 2  # the run that counted the ops, and frame 1


@needs_moshi
def test_mimi_second_thread_is_refused_while_a_frame_decodes(mimi):
    frames = fresh_mimi_stream(mimi, 3, seed=23)
    stock_wave = torch.from_numpy(mimi.stock.stream(frames[1], return_waveform=True))
    with in_flight(lambda: mimi.opt.stream(frames[1], return_waveform=True), hold_at=300) as first:
        with pytest.raises(SessionBusy):
            mimi.opt.stream(frames[2])
        with pytest.raises(SessionBusy):
            mimi.opt.session.snapshot()
    assert torch.equal(torch.from_numpy(first.get()), stock_wave)
    stock_state = mimi.stock.state()
    assert all(torch.equal(t, stock_state[k]) for k, t in mimi.opt.state().items())
    assert_mimi_exact(mimi, frames[2], "frame 2")
    assert mimi.opt.stats()["steps"] == 3


@needs_moshi
def test_mimi_restore_replays_a_turn_from_the_post_setup_state(mimi):
    """A duplex server's turn: restore the state after setup instead of setting up again."""
    mimi.opt.reset()
    start = mimi.opt.session.snapshot()
    frames = mimi_frames(mimi, 3, seed=24)
    first = [mimi.opt.stream(c) for c in frames]
    mimi.opt.reset()  # another session of the executable takes the snapshot too
    mimi.opt.session.restore(start)
    mimi.stock.reset()
    for k, c in enumerate(frames):
        assert mimi.opt.stream(c) == first[k] == mimi.stock.stream(c), f"frame {k}"


# ================================================================== Token2Wav
def tokens_of(seed: int, n: int) -> list[int]:
    from cadence_fx.integrations import stepaudio2 as s2
    return torch.randint(0, s2.VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def t2w_run(t2w):
    """A prompt of 5 tokens (test_serve's executable), three chunks (28, 20: off the
    catalog, eager; 28) and the stock tail's waveform and live state after each."""
    from cadence_fx.integrations import stepaudio2 as s2
    prompt = s2.synthetic_prompt(5, seed=60)
    chunks = [tokens_of(61, 28), tokens_of(62, 20), tokens_of(63, 28)]
    seeds = [6100 + k for k in range(len(chunks))]
    t2w.tail.set_stream_cache(*prompt)
    waves, states = [], []
    for tokens, seed in zip(chunks, seeds):
        torch.manual_seed(seed)
        t2w.tail.stream(tokens, return_waveform=True)
        waves.append(t2w.tail.last_speech.clone())
        # upstream keeps 16 step slots; the live ones are the first n_timesteps
        states.append({k: (v[:t2w.steps] if k.startswith("estimator_") else v).clone()
                       for k, v in t2w.tail.state().items()})
    return types.SimpleNamespace(prompt=prompt, chunks=chunks, seeds=seeds, waves=waves, states=states)


def assert_t2w_exact(run, k: int, speech: torch.Tensor, state: dict, where: str) -> None:
    assert torch.equal(speech, run.waves[k]), f"{where}: waveform differs from stock"
    assert_same(state, run.states[k], where)


def test_token2wav_faults_in_the_graph_and_the_fallback(t2w, t2w_run):
    s = t2w.opt.open_session(*t2w_run.prompt)
    start = s.session.snapshot()
    # a fault part-way through the traced step (op 382 of 3,829): broken until restored
    error = torch.OutOfMemoryError("injected out of memory")
    torch.manual_seed(t2w_run.seeds[0])
    with pytest.raises(torch.OutOfMemoryError) as info, FaultAt(382, error):
        s.stream(t2w_run.chunks[0])
    assert info.value is error and s.session.broken is error
    for call in (lambda: s.stream(t2w_run.chunks[0]), s.state):
        with pytest.raises(SessionBroken, match="OutOfMemoryError: injected out of memory"):
            call()
    assert s.stats()["steps"] == 0 and s.stats()["graph_runs"] == {}
    s.session.restore(start)
    torch.manual_seed(t2w_run.seeds[0])
    s.stream(t2w_run.chunks[0])
    assert_t2w_exact(t2w_run, 0, s.last_speech, s.state(), "chunk 0 after restore")
    # a KeyboardInterrupt inside the eager fallback (20 tokens): the state is as it was
    before = s.session.arena.storage.clone(), dict(s.session.extents), s.stats()
    interrupt = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as info, FaultAt(382, interrupt) as fault:
        s.stream(t2w_run.chunks[1])
    assert fault.fired and info.value is interrupt and s.session.broken is None
    assert torch.equal(s.session.arena.storage, before[0]) and s.session.extents == before[1]
    assert s.stats() == before[2], "a fallback that never finished was counted"
    for k in (1, 2):
        torch.manual_seed(t2w_run.seeds[k])
        s.stream(t2w_run.chunks[k])
        assert_t2w_exact(t2w_run, k, s.last_speech, s.state(), f"chunk {k}")
    assert s.stats()["fallbacks"]["input 'token' shape (1, 20) != catalog (1, 28)"] == 1
    s.close()


def test_token2wav_second_thread_is_refused_and_the_first_chunk_is_exact(t2w, t2w_run):
    opt, chunk, seed = t2w.opt, t2w_run.chunks[0], t2w_run.seeds[0]
    # the drop-in's default session
    opt.set_stream_cache(*t2w_run.prompt)
    with in_flight(lambda: opt.stream(chunk), hold_at=382, setup=lambda: torch.manual_seed(seed)) as first:
        with pytest.raises(SessionBusy, match="one step at a time"):
            opt.stream(chunk)
    first.get()
    assert_t2w_exact(t2w_run, 0, opt.last_speech, opt.state(), "drop-in stream held in flight")
    assert opt.stats()["steps"] == 1
    # a session's submit and stream
    s = opt.open_session(*t2w_run.prompt)
    with in_flight(lambda: s.submit(chunk).result(), hold_at=382, setup=lambda: torch.manual_seed(seed)) as first:
        for call in (lambda: s.submit(chunk), lambda: s.stream(chunk)):
            with pytest.raises(SessionBusy):
                call()
    first.get()
    assert_t2w_exact(t2w_run, 0, s.last_speech, s.state(), "submit held in flight")
    assert s.stats()["steps"] == 1
    s.close()


# ======================================================================= CUDA
@pytest.fixture(scope="module")
def cuda_toy():
    """The toy under rules SRc on the GPU, with the deterministic protocol on (restored after)."""
    from cadence_fx.lockstep import deterministic_protocol
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    deterministic_protocol()
    adapter = ToyAdapter(make_toy(RETAIN).to("cuda"), PROMPT)
    yield adapter, compile_executable(adapter, "SRc")
    torch.use_deterministic_algorithms(was, warn_only=warn_only)


def cuda_x(seed: int) -> dict:
    return toy_x(seed, device="cuda")


@cuda
def test_replay_fault_at_every_op_breaks_then_restore_is_exact(cuda_toy):
    adapter, exe = cuda_toy
    a = ToyStream.open(adapter, exe, make_toy(RETAIN).to("cuda"), prompt_seed=1, device="cuda")
    for k in range(4):  # to the steady entry
        expected = a.expect(cuda_x(k), False, k)
        torch.manual_seed(k)
        a.advance(a.session.step(cuda_x(k)), expected, f"step {k}")
    snap, ref = a.session.snapshot(), a.ref
    stats = a.session.stats()
    x = cuda_x(50)
    with OpCounter() as count:
        torch.manual_seed(50)
        a.session.step(x)
    a.session.restore(snap)
    for n in range(count.ops):
        error = RuntimeError(f"injected at op {n}")
        torch.manual_seed(50)
        with pytest.raises(RuntimeError, match="injected") as info, FaultAt(n, error):
            a.session.step(x)
        assert info.value is error
        assert_broken_by(a.session, error, f"op {n}")
        a.session.restore(snap)
    assert a.session.stats()["replays"] == {**stats["replays"], "2": stats["replays"]["2"] + 1}
    a.ref, a.steps = ref, a.session.stats()["steps"]
    expected = a.expect(x, False, 50)
    torch.manual_seed(50)
    a.advance(a.session.step(x), expected, "after the faults")
    assert a.session.stats()["fallback_total"] == 0


@cuda
def test_capture_fault_never_yields_a_wrong_step(cuda_toy):
    """A fault while a session captures its graphs: open_session raises it, or the
    session it returns (regions whose capture failed run eagerly, counted) is exact."""
    adapter, exe = cuda_toy
    prompt = toy_prompt(PROMPT, seed=1).to("cuda")
    with OpCounter() as count:
        adapter.open_session(exe, prompt)
    for n in sorted({1, count.ops // 4, count.ops // 2, 3 * count.ops // 4, count.ops - 1}):
        error = RuntimeError(f"injected at op {n}")
        try:
            with FaultAt(n, error):
                session = adapter.open_session(exe, prompt)
        except RuntimeError as e:
            assert e is error, f"op {n}"
            continue
        stream = ToyStream(make_toy(RETAIN).to("cuda"), session, prompt)
        for k in range(5):
            expected = stream.expect(cuda_x(k), False, k)
            torch.manual_seed(k)
            stream.advance(session.step(cuda_x(k)), expected, f"op {n}: step {k}")
    torch.rand(4, device="cuda")  # the generator was not left mid-capture
    fresh = ToyStream.open(adapter, exe, make_toy(RETAIN).to("cuda"), prompt_seed=1, device="cuda")
    assert fresh.session.capture_failures == {i: {} for i in exe.programs}
    for k in range(5):
        expected = fresh.expect(cuda_x(k), False, k)
        torch.manual_seed(k)
        fresh.advance(fresh.session.step(cuda_x(k)), expected, f"fresh step {k}")
