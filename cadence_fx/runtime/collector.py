"""Python's garbage collector held off while CUDA graphs are captured.

A collection that lands inside a capture runs finalizers mid-capture: a CUDA graph
freed there (one of an earlier session's, garbage in a reference cycle) releases its
memory pool and destroys its executable while the allocator is recording into
another pool, and a freed kernel module unloads; the capture is invalidated or the
process aborts.  Serving stacks that capture at start-up hold the collector for the
same reason and for speed (vLLM's ``freeze_gc_for_cudagraph_capture``, SGLang #8577,
ROCm ATOM #1339: "a gen-0 GC firing inside the stream-capture region ... aborting").
A collection also walks every tracked object: with a traced decoder's programs in the
heap a full one takes 0.5-1.7 s on the H200's host (``benchmarks/setup_time.py``
reports them per row).

``held()`` disables automatic collection for its block; nested and concurrent blocks
count (the collector comes back when the last one ends), and a collector the caller
had disabled stays disabled.  Nothing is collected on the way out: the next
allocation past the young generation's threshold starts the usual collections.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_LOCK = threading.Lock()
_depth = 0
_restore = False


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Automatic garbage collection off while the block runs (process-wide, as ``gc`` is)."""
    global _depth, _restore
    with _LOCK:
        if _depth == 0:
            _restore = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _LOCK:
            _depth -= 1
            if _depth == 0 and _restore:
                gc.enable()
