"""One lock between a background build's device work and CUDA-graph capture.

A background build (``runtime.pending``) runs the compile path on a worker thread,
and that path touches the device: the scratch arena it traces on, constants it
uploads, istft's check on the device.  PyTorch captures CUDA graphs in CUDA's
``global`` mode, where an allocation, a copy or a launch on the legacy stream from
*another* thread during a capture invalidates that capture (or fails the other
thread's call).  So the two never overlap: a build holds ``LOCK`` from its start to
its end, and every capture holds it too.  A capture that is part of a set-up
(``Session.prepare_replay``) waits for a running build; one between two chunks of a
live stream (an entry or an off-catalog program captured mid-stream) does not: it
tries, and if a build holds the lock the chunk runs on the exact eager path and the
capture is tried again at the next chunk (the reason counted).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

LOCK = threading.RLock()

#: the counted reason of a chunk that ran eagerly because a build held the lock
DEFERRED = "capture deferred: a background build is running"


@contextlib.contextmanager
def try_held() -> Iterator[bool]:
    """Holds ``LOCK`` for the block if it is free now; yields whether it does."""
    got = LOCK.acquire(blocking=False)
    try:
        yield got
    finally:
        if got:
            LOCK.release()
