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

What builds keep still adds up, and CPython's next full collection then lands
wherever the next automatic collection does: in a chunk, if nothing else allocates.
``collect_if_due(seconds)`` runs it where time is free instead (a session's ``idle``):
this module counts what its young collections promote (the objects they found alive),
and once that passes an eighth of what the last full collection kept (half of
CPython's own quarter: it also counts what its automatic collections promote, which
is not seen here), it collects everything, if ``seconds`` allow as long as the last
full collection took.  A full collection anywhere (CPython's own too, seen through
``gc.callbacks``) starts the count again.  ``stats()`` says where it stands.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from typing import Iterator

_LOCK = threading.RLock()  # a finalizer run by the young collection may hold it again
_depth = 0
_restore = False
_promoted = 0  # objects this module's young collections found alive since the last full collection
_kept: "int | None" = None  # tracked objects after the last full collection (None: not counted yet)
_full_s: "float | None" = None  # how long the last full collection took
_idle_collections = 0
_full_started = 0.0


def _on_collection(phase: str, info: dict) -> None:
    """``gc.callbacks``: a full collection, anyone's, starts the count again."""
    global _promoted, _kept, _full_s, _full_started
    if info.get("generation") != 2:
        return
    if phase == "start":
        _full_started = time.perf_counter()
    else:
        _promoted, _kept, _full_s = 0, None, time.perf_counter() - _full_started


gc.callbacks.append(_on_collection)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Automatic garbage collection off while the block runs (process-wide, as ``gc`` is);
    the young generations collected once when the last block ends (see the module)."""
    global _depth, _restore, _promoted
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
                young = len(gc.get_objects(0)) + len(gc.get_objects(1))
                found = gc.collect(1)  # its finalizers may enter (and leave) held() on this thread: an RLock
                _promoted += max(0, young - found)  # what it found alive: promoted
                gc.enable()


def _due() -> bool:
    global _kept
    if _promoted < 10_000:  # not worth a full walk yet (and not worth counting the heap for)
        return False
    if _kept is None:
        _kept = max(0, len(gc.get_objects()) - _promoted)
    return _promoted * 8 > _kept


def collect_if_due(seconds: "float | None" = None) -> bool:
    """One full collection now, if one is due (see the module) and ``seconds`` (None: no
    bound) are at least what the last one took (before any has been timed: a
    microsecond a tracked object); not while a block holds the collector, nor where the
    caller disabled it.  Returns whether it collected."""
    global _idle_collections
    with _LOCK:
        if _depth or not gc.isenabled() or not _due():
            return False
        cost = _full_s if _full_s is not None else 1e-6 * (_kept or 0)
        if seconds is not None and seconds < cost:
            return False
        gc.collect()
        _idle_collections += 1
        return True


def stats() -> dict:
    """``promoted`` (by held blocks' young collections since the last full collection),
    ``kept`` (tracked after it; None until counted), ``full_s`` (what the last took),
    ``full_collections`` (the process's so far, anyone's) and ``idle_collections`` (those
    ``collect_if_due`` ran)."""
    return {"promoted": _promoted, "kept": _kept, "full_s": None if _full_s is None else round(_full_s, 3),
            "full_collections": gc.get_stats()[2]["collections"], "idle_collections": _idle_collections}
