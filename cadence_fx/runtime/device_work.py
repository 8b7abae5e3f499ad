"""One lock between a background build's device work and CUDA-graph capture.

A background build (``runtime.pending``) runs the compile path on a worker thread,
and that path touches the device: the scratch arena it traces on, constants it
uploads, istft's check on the device.  PyTorch captures CUDA graphs in CUDA's
``global`` mode, where an allocation, a copy or a launch on the legacy stream from
*another* thread during a capture invalidates that capture (or fails the other
thread's call).  So the two never overlap: a build holds ``LOCK`` from its start to
its end (but for its symbolic traces, below), and every capture holds it too.  A
capture that is part of a set-up (``Session.prepare_replay``) waits for a running
build; one between two chunks of a live stream (an entry or an off-catalog program
captured mid-stream) does not: it tries, and if a build holds the lock the chunk runs
on the exact eager path and the capture is tried again at the next chunk (the reason
counted).

A build's symbolic trace runs on fake tensors and touches nothing on the device; it may
take many seconds (a new window length's program, traced mid-traffic), so the build lets
go of the lock for it (``host_only``: every level released, taken back after) and the
streams' captures run meanwhile.

A build lets a capture in between its catalog entries: a capture that found the lock
taken (``try_held``) or waits for it (``held``) marks itself wanted, and the build, at
the end of each entry (``yield_to_captures``), releases the lock until a capture has
run (at most ``YIELD_S``): a stream's entry handed over early is captured at one of
its next chunks, and a set-up waits for one entry of a build, not the whole of it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

LOCK = threading.RLock()
_TURN = threading.Condition(LOCK)  # a build waits on it, the lock released, for a capture to run
_wanted = threading.Event()  # a capture found the lock taken, or waits for it

#: the counted reason of a chunk that ran eagerly because a build held the lock
DEFERRED = "capture deferred: a background build is running"
#: the longest a build waits at one of its yield points for a capture that wants the lock
YIELD_S = 1.0


@contextlib.contextmanager
def try_held() -> Iterator[bool]:
    """Holds ``LOCK`` for the block if it is free now; yields whether it does (if not,
    the capture is marked wanted: a build lets it in at its next yield point)."""
    got = LOCK.acquire(blocking=False)
    if not got:
        _wanted.set()
    try:
        yield got
    finally:
        if got:
            _done_with()


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Holds ``LOCK`` for the block, waiting for it (a build lets the caller in at its
    next yield point)."""
    if not LOCK.acquire(blocking=False):
        _wanted.set()
        LOCK.acquire()
    try:
        yield
    finally:
        _done_with()


def _done_with() -> None:
    """Release ``LOCK`` after a capture: no capture is wanted now, and a build waiting at a
    yield point goes on."""
    _wanted.clear()
    with _TURN:
        _TURN.notify_all()
    LOCK.release()


def yield_to_captures(timeout: float = YIELD_S) -> bool:
    """(A build's thread, holding ``LOCK``.)  If a capture wants the lock, release it
    until one has run, or ``timeout`` seconds; returns whether it yielded."""
    if not _wanted.is_set():
        return False
    with _TURN:  # re-entered; wait() releases every level of it, and takes them back after
        if not _TURN.wait_for(lambda: not _wanted.is_set(), timeout):
            _wanted.clear()  # nobody came (the stream ended): do not wait at the next point too
    return True


@contextlib.contextmanager
def host_only() -> Iterator[None]:
    """A block that touches nothing on the device (a symbolic trace, on fake tensors): if this
    thread holds ``LOCK`` (a build), every level of it is released for the block, so a
    stream's capture may run meanwhile, and taken back after (waiting for a capture that
    runs then).  Elsewhere it does nothing; and with ``CADENCE_FX_TRACE_HOLDS_DEVICE=1`` (the
    control: a build holds the lock through its traces, as before)."""
    if not LOCK._is_owned() or os.environ.get("CADENCE_FX_TRACE_HOLDS_DEVICE") == "1":
        yield
        return
    saved = LOCK._release_save()  # as threading.Condition.wait does: every level of the RLock
    try:
        yield
    finally:
        LOCK._acquire_restore(saved)
