"""The lock between a background build's device work and captures (runtime/device_work.py):
a capture that finds it taken is let in at the build's next yield point."""

from __future__ import annotations

import threading
import time

from cadence_fx.runtime import device_work


def _build_thread(events: dict, log: list, timeout: float):
    """Holds the lock (re-entered once, as a build's nested device work may), waits to be told,
    then reaches a yield point."""
    def run():
        with device_work.LOCK, device_work.LOCK:
            events["holding"].set()
            events["go"].wait(10)
            log.append(("yielded", device_work.yield_to_captures(timeout)))
            log.append(("build goes on", device_work.LOCK.acquire(blocking=False)))
            device_work.LOCK.release()
    t = threading.Thread(target=run)
    t.start()
    assert events["holding"].wait(10)
    return t


def test_a_capture_that_found_the_lock_taken_runs_at_the_builds_next_yield_point():
    events, log = {"holding": threading.Event(), "go": threading.Event()}, []
    build = _build_thread(events, log, timeout=10)
    with device_work.try_held() as free:
        assert not free  # the build holds it: this chunk runs eagerly, and the capture is wanted
    events["go"].set()
    deadline = time.monotonic() + 10
    while True:  # the next chunks try again; one gets in while the build waits
        with device_work.try_held() as free:
            if free:
                log.append(("captured", True))
                break
        assert time.monotonic() < deadline, log
        time.sleep(0.001)
    build.join(10)
    assert log == [("captured", True), ("yielded", True), ("build goes on", True)]


def test_a_build_does_not_wait_when_no_capture_wants_the_lock_and_not_forever_when_one_never_comes():
    events, log = {"holding": threading.Event(), "go": threading.Event()}, []
    build = _build_thread(events, log, timeout=0.05)
    events["go"].set()
    build.join(10)
    assert log == [("yielded", False), ("build goes on", True)]

    events, log = {"holding": threading.Event(), "go": threading.Event()}, []
    build = _build_thread(events, log, timeout=0.05)
    with device_work.try_held() as free:
        assert not free  # wanted, but this stream never comes back
    t0 = time.monotonic()
    events["go"].set()
    build.join(10)
    assert log == [("yielded", True), ("build goes on", True)] and time.monotonic() - t0 < 5
    assert not device_work._wanted.is_set()  # the next yield point does not wait for it again


def test_a_set_up_capture_waits_for_one_entry_of_a_build_not_the_whole_of_it():
    events, log = {"holding": threading.Event(), "go": threading.Event()}, []
    build = _build_thread(events, log, timeout=10)
    got = threading.Event()

    def set_up():
        with device_work.held():
            log.append(("set-up captured", True))
        got.set()
    waiter = threading.Thread(target=set_up)
    waiter.start()
    deadline = time.monotonic() + 10
    while not device_work._wanted.is_set():  # the set-up found the lock taken and waits for it
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert not got.is_set()  # the build holds the lock
    events["go"].set()  # it reaches a yield point
    assert got.wait(10)
    build.join(10)
    waiter.join(10)
    assert log == [("set-up captured", True), ("yielded", True), ("build goes on", True)]


def test_a_builds_host_only_work_lets_captures_in_and_takes_every_level_back_after():
    """``host_only`` (a build's symbolic trace: fake tensors, nothing on the device):
    another thread's capture gets the lock meanwhile; after it, the build holds the lock
    at every level it held before, once the capture that runs then has let go."""
    got, capturing, release = [], threading.Event(), threading.Event()

    def capture():
        with device_work.try_held() as free:
            got.append(free)
            if free:
                capturing.set()
                release.wait(10)

    with device_work.host_only():  # not held here: nothing to release, nothing taken
        assert not device_work.LOCK._is_owned()
    log = []

    def build():
        with device_work.LOCK, device_work.LOCK:
            with device_work.host_only():
                assert not device_work.LOCK._is_owned()
                other = threading.Thread(target=capture)
                other.start()
                assert capturing.wait(10)  # the capture runs while the build traces
            log.append("back")  # only after the capture let go
            log.append(device_work.LOCK._is_owned())
        log.append(device_work.LOCK._is_owned())  # two levels released by the two withs
        other.join(10)

    t = threading.Thread(target=build)
    t.start()
    assert capturing.wait(10) and got == [True]
    time.sleep(0.2)
    assert log == []  # the build waits for the running capture
    release.set()
    t.join(10)
    assert log == ["back", True, False]
    with device_work.try_held() as free:
        assert free  # nobody holds it now


def test_the_control_keeps_the_lock_through_host_only_work(monkeypatch):
    """``CADENCE_FX_TRACE_HOLDS_DEVICE=1``: a build holds the lock through its traces (what a
    paired measurement compares against)."""
    monkeypatch.setenv("CADENCE_FX_TRACE_HOLDS_DEVICE", "1")
    got = []

    def capture():
        with device_work.try_held() as free:
            got.append(free)

    with device_work.LOCK, device_work.host_only():
        other = threading.Thread(target=capture)
        other.start(), other.join(10)
        assert device_work.LOCK._is_owned()
    assert got == [False]
