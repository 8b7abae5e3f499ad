"""``TailReplica``'s idle time, without a Ray cluster: whenever the replica's model
thread has nothing queued, its conversations get ``Replica.idle`` (which captures what
a background build handed over); a call that arrives first is never held behind it;
a failing idle is counted in ``load()``, never raised.  The deployed app's tests are
``test_ray.py``."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

pytest.importorskip("ray")
pytest.importorskip("fastapi")

from cadence_fx.serving.ray import TailReplica  # noqa: E402


class _Session:
    """A conversation's session: logs its calls on the shared log; ``idle`` hands over
    the entries left to capture (once), as ``PendingSession.idle`` does."""

    def __init__(self, log: list, gate: threading.Event | None):
        self.log, self.gate, self.to_capture = log, gate, [0, 1, 2]
        self.idle_fault: BaseException | None = None

    def reset(self) -> None:
        if self.gate is not None:
            assert self.gate.wait(30)
        self.log.append("reset")

    def idle(self, seconds=None) -> list[int]:
        self.log.append("idle")
        if self.idle_fault is not None:
            raise self.idle_fault
        got, self.to_capture = self.to_capture, []
        return got

    def close(self) -> None:
        pass

    def stats(self) -> dict:
        return {}


class _Model:
    device = torch.device("cpu")

    def __init__(self, gate: threading.Event | None = None):
        self.log: list = []
        self.gate = gate
        self.sessions: list[_Session] = []

    def open_session(self, *prompt, stream=None) -> _Session:
        self.log.append("open")
        self.sessions.append(_Session(self.log, self.gate))
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
    assert model.log == ["open", "idle"]  # the set-up, then idle time once the thread was quiet
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
        del model.log[:]
        gate.clear()
        calls = [asyncio.ensure_future(rep.reset(rep.incarnation, "a")) for _ in range(3)]
        await asyncio.sleep(0.2)  # all three are queued while the first waits at the gate
        assert model.log == [] and rep._queued == 3
        gate.set()
        await asyncio.gather(*calls)

    asyncio.run(go())
    _drain(rep)
    assert model.log == ["reset", "reset", "reset", "idle"]
    assert rep.idle_time["idle_runs"] == 2  # after the open, and after the three calls


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
    assert rep.idle_time["idle_errors"] == 2
    assert rep.idle_time["idle_last_error"] == "RuntimeError: capture exploded"
    assert model.log.count("reset") == 2


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
