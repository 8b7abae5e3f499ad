"""``TailReplica``'s idle time, without a Ray cluster: whenever the replica's model
thread has nothing queued, its conversations get ``Replica.idle`` (which captures what
a background build handed over); a call that arrives first is never held behind it;
a failing idle is counted in ``load()``, never raised.  The deployed app's tests are
``test_ray.py``."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

pytest.importorskip("ray")
pytest.importorskip("fastapi")

from cadence_fx.serving.ray import TailReplica  # noqa: E402


class _Session:
    """A conversation's session: logs its calls on the shared log; ``idle`` captures the
    next landed entry, as ``PendingSession.idle`` does within a slice shorter than one
    capture (logged as ``idle N``, or ``idle -`` when nothing is left)."""

    def __init__(self, log: list, gate: threading.Event | None):
        self.log, self.gate, self.to_capture = log, gate, [0, 1, 2]
        self.idle_fault: BaseException | None = None
        self.capture_gate: threading.Event | None = None  # set: the next capture waits for it
        self.capturing = threading.Event()

    def reset(self) -> None:
        if self.gate is not None:
            assert self.gate.wait(30)
        self.log.append("reset")

    def idle(self, seconds=None) -> list[int]:
        assert seconds is not None and 0 < seconds < 0.5  # a slice: about one capture
        if self.idle_fault is not None:
            self.log.append("idle !")
            raise self.idle_fault
        if not self.to_capture:
            self.log.append("idle -")
            return []
        if self.capture_gate is not None:
            self.capturing.set()
            assert self.capture_gate.wait(30)
            self.capture_gate = None
        entry = self.to_capture.pop(0)
        self.log.append(f"idle {entry}")
        return [entry]

    def close(self) -> None:
        pass

    def stats(self) -> dict:
        return {}


class _Model:
    device = torch.device("cpu")

    def __init__(self, gate: threading.Event | None = None, capture_gate: threading.Event | None = None):
        self.log: list = []
        self.gate, self.capture_gate = gate, capture_gate
        self.sessions: list[_Session] = []

    def open_session(self, *prompt, stream=None) -> _Session:
        self.log.append("open")
        self.sessions.append(_Session(self.log, self.gate))
        self.sessions[-1].capture_gate = self.capture_gate
        return self.sessions[-1]


def _drain(rep: TailReplica) -> None:
    """Wait until the model thread ran everything queued so far (an idle job among it)."""
    for _ in range(2):  # an idle job queued by the last call runs before this second no-op
        rep._work.submit(lambda: None).result(30)


def _replica(model: _Model, **kw) -> TailReplica:
    return TailReplica(lambda: model, max_conversations=4, name="tail-test", **kw)


def test_a_quiet_model_thread_gives_the_conversations_idle_time():
    model = _Model()
    rep = _replica(model)

    async def go():
        return await rep.open("a")

    assert asyncio.run(go()) == rep.incarnation
    _drain(rep)
    # the set-up, then idle time once the thread was quiet: a slice per entry, until none is left
    assert model.log == ["open", "idle 0", "idle 1", "idle 2", "idle -"]
    load = asyncio.run(rep.load())  # what GET /load answers
    assert load["idle_runs"] == 1 and load["idle_captured"] == 3 and load["idle_errors"] == 0
    assert load["idle_s"] >= 0 and load["idle_last_error"] is None


def test_idle_time_never_runs_ahead_of_a_queued_call():
    """Three calls queued behind a slow one: all run before the one idle job after them."""
    gate = threading.Event()
    model = _Model(gate)
    rep = _replica(model)

    async def go():
        gate.set()
        await rep.open("a")
        _drain(rep)
        model.sessions[0].to_capture = [3]  # a build hands one more entry over
        del model.log[:]
        gate.clear()
        calls = [asyncio.ensure_future(rep.reset(rep.incarnation, "a")) for _ in range(3)]
        await asyncio.sleep(0.2)  # all three are queued while the first waits at the gate
        assert model.log == [] and rep._queued == 3
        gate.set()
        await asyncio.gather(*calls)

    asyncio.run(go())
    _drain(rep)
    assert model.log == ["reset", "reset", "reset", "idle 3", "idle -"]
    assert rep.idle_time["idle_runs"] == 2  # after the open, and after the three calls


def test_a_call_that_arrives_during_idle_time_waits_for_one_capture_not_all():
    """Idle time runs in slices of about one capture: a call queued while entry 0 is being
    captured runs right after it, before entries 1 and 2 (captured after that call)."""
    capture_gate = threading.Event()
    model = _Model(capture_gate=capture_gate)
    rep = _replica(model)

    async def go():
        await rep.open("a")  # the quiet model thread starts capturing entry 0, which waits
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, model.sessions[0].capturing.wait, 30)
        call = asyncio.ensure_future(rep.reset(rep.incarnation, "a"))
        await asyncio.sleep(0.2)
        assert rep._queued == 1 and model.log == ["open"]  # queued behind the capture under way
        capture_gate.set()
        await call

    asyncio.run(go())
    _drain(rep)
    assert model.log == ["open", "idle 0", "reset", "idle 1", "idle 2", "idle -"]


def test_while_a_build_runs_the_replica_looks_again_without_a_call(monkeypatch):
    """A quiet time that ends with a background build still running re-arms itself: the
    entry that lands later is captured then, though no call came (not on the next chunk)."""
    from cadence_fx.serving import ray as cray
    monkeypatch.setattr(cray, "IDLE_REARM_S", 0.05)
    building = threading.Event()
    building.set()
    model = _Model()
    model.wait_for_builds = lambda timeout=None: not building.is_set()
    rep = _replica(model)
    asyncio.run(rep.open("a"))
    _drain(rep)
    session = model.sessions[0]
    session.to_capture = []  # nothing landed yet; the build runs
    time.sleep(0.3)  # the replica looks again, finds nothing, and re-arms while the build runs
    looked = model.log.count("idle -")
    assert looked >= 2
    session.to_capture = [5]  # the build lands
    building.clear()
    for _ in range(100):
        if "idle 5" in model.log:
            break
        time.sleep(0.02)
    _drain(rep)
    assert "idle 5" in model.log and model.log.count("reset") == 0  # captured with no call in between
    time.sleep(0.2)
    settled = len(model.log)
    time.sleep(0.2)
    assert len(model.log) == settled  # builds done: it stops looking


def test_no_idle_time_when_turned_off():
    model = _Model()
    rep = _replica(model, idle=False)
    asyncio.run(rep.open("a"))
    _drain(rep)
    assert model.log == ["open"] and rep.idle_time["idle_runs"] == 0


def test_a_failing_idle_is_counted_and_the_next_call_runs():
    model = _Model()
    rep = _replica(model)

    async def go():
        await rep.open("a")
        _drain(rep)
        model.sessions[0].idle_fault = RuntimeError("capture exploded")
        await rep.reset(rep.incarnation, "a")
        _drain(rep)
        await rep.reset(rep.incarnation, "a")  # the replica still serves

    asyncio.run(go())
    _drain(rep)
    assert rep.idle_time["idle_errors"] == 2  # one per quiet time: a failing slice ends it
    assert rep.idle_time["idle_last_error"] == "RuntimeError: capture exploded"
    assert model.log.count("reset") == 2 and model.log.count("idle !") == 2


def test_build_optimized_turns_background_builds_on_when_asked(monkeypatch):
    """A replica's model builds a new voice's programs in the background with
    ``background=True`` (so a set-up never holds the other conversations for a build);
    a model that cannot is refused by name; the default leaves it off."""
    from cadence_fx.errors import InputError
    from cadence_fx.tools import registry

    class Opt:
        background = False

        def set_background(self, on: bool) -> None:
            self.background = on

    spec = registry.get("token2wav")
    monkeypatch.setattr(registry, "build_from_options",
                        lambda options: (spec, type("A", (), {"rules": options["rules"]})(), object()))
    made = []
    monkeypatch.setattr(registry, "optimize", lambda spec_, stock, rules: made.append(Opt()) or made[-1])
    assert registry.build_optimized({"rules": "S", "background": True}).background is True
    assert registry.build_optimized({"rules": "S"}).background is False
    monkeypatch.setattr(registry, "optimize", lambda spec_, stock, rules: object())
    with pytest.raises(InputError, match="does not build in the background"):
        registry.build_optimized({"rules": "S", "background": True})
