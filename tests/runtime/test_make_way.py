"""A background build steps aside while the foreground runs a chunk or a set-up
(``foreground.working`` / ``make_way``): on a GPU host an eager chunk is Python, and a
build beside it took it from 0.2 s to ~1 s (H200, paced traffic, 2026-12-02)."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch

from cadence_fx import foreground


@pytest.fixture(autouse=True)
def _share():
    old = foreground.set_build_share(foreground.DEFAULT_BUILD_SHARE)
    yield
    foreground.set_build_share(old)


def _build_spin(seconds: float, out: dict) -> None:
    """A build's thread: call ``make_way`` for ``seconds`` of its own running time, as a
    build's yield points do, and say how long it paused and how long it took."""
    t0 = time.perf_counter()
    with foreground.background():
        y0 = foreground.yielded_s()
        ran, last = 0.0, time.perf_counter()
        while ran < seconds:
            before = time.perf_counter()
            foreground.make_way()
            after = time.perf_counter()
            ran += before - last
            last = after
        out["yielded"] = foreground.yielded_s() - y0
    out["wall"] = time.perf_counter() - t0


@contextlib.contextmanager
def _foreground_working(seconds: float | None = None):
    """Another thread inside ``foreground.working()`` for ``seconds`` (None: until the block
    ends); the block starts once it is inside, and ends after it has left."""
    started, stop = threading.Event(), threading.Event()

    def work():
        with foreground.working():
            started.set()
            stop.wait(seconds)

    fg = threading.Thread(target=work)
    fg.start()
    started.wait()
    try:
        yield
    finally:
        if seconds is None:
            stop.set()
        fg.join()


def test_a_build_pauses_while_the_foreground_works_and_goes_on_when_it_ends():
    out = {}
    with _foreground_working(0.5):
        t0 = time.perf_counter()
        _build_spin(0.02, out)  # 20 ms of its own work: at share 0.1 it could not be done in 0.18 s
    assert out["yielded"] > 0.1, out
    assert time.perf_counter() - t0 >= 0.18
    # once the foreground is idle, the build runs freely: no pause at all
    out2 = {}
    _build_spin(0.05, out2)
    assert out2["yielded"] == 0.0, out2


def test_a_pause_ends_when_the_foreground_stops_working_and_never_waits_forever():
    foreground.set_build_share(0.01)  # a 2 ms slice then a pause of ~0.2 s or until the work ends
    out = {}
    with _foreground_working(0.3):
        _build_spin(0.01, out)
    assert 0.1 < out["yielded"] < 1.5, out  # it paused, and it went on once the work ended

    # work that never ends: the build still progresses, at about its share
    foreground.set_build_share(0.5)
    out = {}
    with _foreground_working():
        _build_spin(0.05, out)
    assert out["yielded"] > 0.02 and out["wall"] < 2.0, out


def test_make_way_never_pauses_a_foreground_thread_or_a_build_at_share_one():
    with _foreground_working():
        assert foreground.working_count() == 1
        t0 = time.perf_counter()
        for _ in range(20000):
            foreground.make_way()  # this thread runs no build: never paused
        assert time.perf_counter() - t0 < 1.0
        foreground.set_build_share(1.0)  # as before: a build never steps aside
        out = {}
        _build_spin(0.05, out)
        assert out["yielded"] == 0.0, out
    assert foreground.working_count() == 0


def test_a_held_back_build_takes_a_rising_share_so_it_always_lands():
    """Under foreground work that never ends, a build at share 0.1 would take ten times its
    own time; its share doubles per ``HELD_DOUBLING_S`` paused, so it finishes within a
    bound and then no longer pauses (8 voices a second apart starved every build at 0.1)."""
    assert foreground.held_share(0.1, 0.0) == 0.1
    d = foreground.HELD_DOUBLING_S
    assert foreground.held_share(0.1, d) == pytest.approx(0.2)
    assert foreground.held_share(0.1, 3 * d) == pytest.approx(0.8)
    assert foreground.held_share(0.1, 4 * d) == 1.0 and foreground.held_share(1.0, 0.0) == 1.0
    foreground.set_build_share(0.01)
    old = foreground.HELD_DOUBLING_S
    foreground.HELD_DOUBLING_S = 0.05  # the same rule, on a test's clock
    try:
        out = {}
        with _foreground_working():
            _build_spin(0.1, out)
        # at a fixed 0.01, 0.1 s of work is ~10 s of pauses; rising, it needs ~log2(100)*0.05 s
        assert 0.2 < out["yielded"] < 2.0 and out["wall"] < 3.0, out
        # a new build starts again from the share set: it pauses
        out = {}
        with _foreground_working(0.3):
            _build_spin(0.005, out)
        assert out["yielded"] > 0.05, out
    finally:
        foreground.HELD_DOUBLING_S = old


@pytest.mark.parametrize("bad", [0, -0.5, 1.5, True, "0.1", None, float("nan")])
def test_a_bad_share_is_refused_by_name_and_keeps_the_old_one(bad):
    old = foreground.build_share()
    with pytest.raises(ValueError, match="build share"):
        foreground.set_build_share(bad)
    assert foreground.build_share() == old
    assert foreground.set_build_share(0.25) == old and foreground.build_share() == 0.25


def test_a_sessions_step_and_a_set_up_run_as_foreground_work():
    """Every step (replayed or eager) and the model's set-up are inside ``working()``."""
    from cadence_fx.compiler import compile_executable, open_session
    from helpers.toy_models import ToyAdapter, make_toy, toy_prompt

    seen = []
    model = make_toy(4)
    adapter = ToyAdapter(model, 5)
    exe = compile_executable(adapter, "S")
    real_setup, real_fallback = adapter.setup, adapter.fallback

    def setup(*a, **k):
        seen.append(("setup", foreground.working_count()))
        return real_setup(*a, **k)

    adapter.setup = setup
    session = open_session(exe, adapter, toy_prompt(5))
    session.fallback = lambda *a, **k: (seen.append(("eager", foreground.working_count())), real_fallback(*a, **k))[1]
    inputs = adapter.example_inputs()
    session.step(inputs)
    session.step(inputs, last=True)  # a flag: the eager path
    assert seen == [("setup", 1), ("eager", 1)], seen
    assert foreground.working_count() == 0
    assert torch.is_tensor(next(iter(session.state().values())))


def test_builds_queued_back_to_back_share_one_held_back_clock_until_the_queue_empties():
    """A ``BuildQueue`` thread's builds count their pauses together (``foreground.backlog``):
    the second of two builds queued under foreground work that never lets up starts at the
    share the first reached, not at the lowest again; a build queued after the queue
    emptied starts from the lowest share."""
    from cadence_fx.runtime.pending import BuildQueue
    foreground.set_build_share(0.01)
    old = foreground.HELD_DOUBLING_S
    foreground.HELD_DOUBLING_S = 0.05
    queue = BuildQueue("test-backlog")
    try:
        first, second, alone = {}, {}, {}
        with _foreground_working():
            a = queue.submit(_build_spin, 0.1, first)  # held back: its share rises to the whole host
            b = queue.submit(_build_spin, 0.02, second)  # queued behind it: starts where it ended
            a.result(), b.result()
            assert 0.2 < first["yielded"] < 2.0, first
            assert second["yielded"] < 0.02, second  # at 0.01 from scratch: >= 0.05 s (below)
            queue.shutdown()  # the thread has ended: the backlog with it
            queue = BuildQueue("test-backlog")
            queue.submit(_build_spin, 0.005, alone).result()
        assert alone["yielded"] > 0.05, alone
    finally:
        queue.shutdown()
        foreground.HELD_DOUBLING_S = old


def test_a_build_that_starts_while_the_foreground_works_pauses_for_its_own_slice_only():
    """A build's first slice runs from its own start: one that began long after the
    foreground's block did is not charged that block's age (which paused it for ~9x the
    age at share 0.1, a starvation under load that never lets up)."""
    with _foreground_working():
        time.sleep(0.4)  # the block is old when the build starts
        out = {}
        _build_spin(0.004, out)  # ~2 slices: pauses of ~18 ms each at 0.1
        assert out["wall"] < 1.0 and out["yielded"] < 0.5, out  # charged the block's age: >= 3.6 s
