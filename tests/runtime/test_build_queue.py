"""The drop-in's build worker (``runtime.pending.BuildQueue``): one thread, a stream
configuration's build before any off-catalog program's, first come first served within a
rank; a failure is the caller's to read; the thread ends when nothing is queued."""

from __future__ import annotations

import threading

import pytest

from cadence_fx.runtime.pending import CONFIGURATION, OFF_CATALOG, Build, BuildQueue


def _blocked(queue: BuildQueue):
    """A first job that holds the worker until the returned event is set."""
    started, release = threading.Event(), threading.Event()

    def first():
        started.set()
        assert release.wait(10), "the test never released the first job"
        return "first"
    future = queue.submit(first)
    assert started.wait(10)
    return future, release


def test_configurations_run_before_off_catalog_programs_and_each_rank_in_order():
    queue, ran = BuildQueue(), []
    first, release = _blocked(queue)
    futures = [queue.submit_ranked(rank, ran.append, name) for rank, name in
               [(OFF_CATALOG, "window a"), (CONFIGURATION, "voice b"), (OFF_CATALOG, "flush c"),
                (CONFIGURATION, "voice d")]]
    assert queue.queued() == [CONFIGURATION, CONFIGURATION, OFF_CATALOG, OFF_CATALOG]
    release.set()
    assert first.result(10) == "first" and all(f.result(10) is None for f in futures)
    assert ran == ["voice b", "voice d", "window a", "flush c"]
    queue.shutdown()


def test_a_build_keeps_its_rank_and_a_failure_is_read_from_its_handle():
    queue, ran = BuildQueue(), []
    first, release = _blocked(queue)

    def fails():
        ran.append("flush")
        raise RuntimeError("no kernel for this shape")
    window = Build("flush", fails, queue, OFF_CATALOG)
    voice = Build("voice", lambda: ran.append("voice") or "exe", queue)
    assert voice.rank == CONFIGURATION and window.rank == OFF_CATALOG
    window.start()
    voice.start()
    release.set()
    assert voice.wait(10) and window.wait(10)
    assert ran == ["voice", "flush"]
    assert voice.result() == "exe" and voice.error() is None
    assert isinstance(window.error(), RuntimeError) and "no kernel" in str(window.error())
    assert queue.submit(lambda: "still works").result(10) == "still works"  # the worker survived it
    queue.shutdown()


def test_the_thread_ends_when_idle_and_a_later_submit_starts_another_and_shutdown_refuses_more():
    queue = BuildQueue(name="cadence-fx-build-test")
    names = []
    assert queue.submit(lambda: names.append(threading.current_thread().name)).result(10) is None
    for _ in range(1000):  # the thread lets go of itself right after its last job
        if queue._thread is None:
            break
        threading.Event().wait(0.01)
    assert queue._thread is None
    assert queue.submit(lambda: names.append(threading.current_thread().name)).result(10) is None
    assert names == ["cadence-fx-build-test"] * 2 and threading.current_thread().name not in names
    first, release = _blocked(queue)
    waiting = queue.submit(lambda: "never")
    queue.shutdown(wait=False, cancel_futures=True)
    assert waiting.cancelled()
    with pytest.raises(RuntimeError, match="shut down"):
        queue.submit(lambda: None)
    release.set()
    assert first.result(10) == "first"
