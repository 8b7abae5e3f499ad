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

The compiler holds it too, through a whole build (a trace, a specialization, the
passes, a program's compaction): a build allocates a few hundred thousand objects and
keeps a few, and left to itself the collector walks them in hundreds of young
collections and promotes what is alive at each to the oldest generation, the graphs
the passes are still rewriting among them.  CPython counts every object promoted
there since the last full collection, and once they pass a quarter of the objects
it keeps, the next collection of the oldest generation walks the whole heap
(0.5-1 s): one build in two or three paid it (``benchmarks/setup_time.py``'s ``gc``).
Held, the build's garbage is gone before anything is promoted, and only what it
keeps (a compacted program: a few objects a piece) counts toward the next.

``held()`` disables automatic collection for its block; nested and concurrent blocks
count (the collector comes back when the last one ends), and a collector the caller
had disabled stays disabled.  When the last block ends, one collection of the young
generations (``gc.collect(1)``: the objects allocated while it was held, tens of
milliseconds) runs before the collector comes back, so that walk is paid by the
held work and not by whatever runs next (a chunk); other threads entering ``held()``
wait for it.  Where the caller had the collector disabled, nothing is collected.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_LOCK = threading.RLock()  # a finalizer run by the young collection may hold it again
_depth = 0
_restore = False


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Automatic garbage collection off while the block runs (process-wide, as ``gc`` is);
    the young generations collected once when the last block ends (see the module)."""
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
                gc.collect(1)  # its finalizers may enter (and leave) held() on this thread: an RLock
                gc.enable()
