"""A session's memory for its CUDA graphs: the pool they record into (``GraphPool``), the
pool apart that its shared calls' first graphs record into, and the buffer their static
copies take (``StaticCopies``).

The static copies (``graphs.SHARE_CALLS``): every later call of a shared step replays the
first call's graph, each reading its own cache slot through a static copy made before the
replay.  On a working arena (``runtime/working.py``) every region's static inputs are such
copies too (``GraphPool(every_input=True)``): a capacity's graphs (one per window and flush
shape, ~100 for issue 15's traffic) each held clones of their own of what they read from
the eager islands, 200-380 MB a graph for the released speech tail at capacity 500 and 2
flow steps (CPU, capture faked; the traffic ran an H100 out of memory, session fifty-one),
where one chunk at a time on the arena needs only the largest graph's.  Two rules place
those copies:

* One entry's copies lie apart from each other: its graphs replay one after another in
  one chunk, and a graph's output may be a view of what it read.
* Different entries' copies may share memory: a session runs one chunk at a time and
  each chunk is one entry (a catalog entry or a specialization), whose outputs are
  consumed or copied out before the next chunk.  So a session keeps ONE buffer and lays
  each entry's copies out in it from its start: the memory is the largest entry's
  copies, not their sum (the released speech tail at 10 flow steps, 250 prompt tokens:
  217 MB summed over three entries, docs/results/h200-2026-12-03-session27).

A capture writes the buffer too (it lays out and fills its entry's copies, mid-stream
for a specialization or an entry a background build handed over): it runs on the
session's capture stream, which waits for the session's stream first and which the
session's stream waits for after (``graphs.capture_entry``), so no capture writes under a
replay still in flight.

``reserve`` sizes the buffer before a session captures its entries (``need``, from the
pieces' traced shapes); a copy that does not fit (a specialization captured later with
larger caches) takes a larger buffer, and the graphs captured on the old one keep it
(``grown`` counts this, ``held_bytes`` says what the buffers hold).  Where every input is
copied (the traced shapes do not say which inputs a capture binds to the arena) a larger
buffer is at least twice the last: a few buffers, together under four times the largest
graph's copies (the last under twice, the ones before under it), not one per graph.

Each copy has what ``Tensor.clone()`` would give: the same shape and strides (a dense
tensor's own, else contiguous) at an address aligned as a fresh allocation's (512 bytes,
the CUDA caching allocator's block), so the graph's kernels read the same bytes at the
same alignment as from a clone.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterable, Iterator, Sequence

import torch

from ..step import byte_interval

#: record every region as ``torch.cuda.graph`` does, after a device synchronize and an emptied
#: cache each (``CADENCE_FX_CAPTURE_SYNC=1``: the control ``recording`` was measured against)
SYNC_EACH_CAPTURE = os.environ.get("CADENCE_FX_CAPTURE_SYNC") == "1"

#: alignment of every copy: a CUDA caching-allocator block's (a fresh clone's alignment)
ALIGN = 512


def nbytes(t: torch.Tensor) -> int:
    """Bytes a copy of ``t`` (real or fake) takes in the buffer: a clone is dense, so its
    elements, aligned."""
    return -(-t.numel() * t.element_size() // ALIGN) * ALIGN


def need(entries: Iterable[Iterable[torch.Tensor]]) -> int:
    """Bytes a buffer needs for entries whose copies are ``entries`` (per entry: the
    tensors it copies, real or fake): the largest entry's sum."""
    return max((sum(nbytes(t) for t in entry) for entry in entries), default=0)


class StaticCopies:
    """A session's buffer for its shared calls' static copies (module docstring)."""

    def __init__(self, doubling: bool = False):
        self.doubling = doubling  # a larger buffer is at least twice the last (every input copied)
        self.buffer: torch.Tensor | None = None
        self.cursor = 0  # bytes of the buffer the entry being captured has taken
        self.grown = 0  # buffers replaced by a larger one
        self.held_bytes = 0  # bytes of every buffer allocated (an old one lives on in its graphs)

    def reserve(self, size: int, device: torch.device) -> None:
        """A buffer of at least ``size`` bytes on ``device`` (a new one if the current is smaller)."""
        if self.buffer is not None and self.buffer.numel() >= size and self.buffer.device == torch.device(device):
            return
        if self.buffer is not None:
            self.grown += 1
        self.buffer = torch.empty(size, dtype=torch.uint8, device=device)
        self.held_bytes += size
        self.cursor = 0  # the old buffer keeps what was laid out in it: nothing here overlaps it

    def start_entry(self) -> None:
        """The next copies belong to a new entry: from the buffer's start."""
        self.cursor = 0

    def copy_of(self, t: torch.Tensor) -> torch.Tensor:
        """A static copy of ``t`` (its values), apart from this entry's earlier copies."""
        size = nbytes(t)
        if self.buffer is None or self.cursor + size > self.buffer.numel() or self.buffer.device != t.device:
            # a larger buffer (this entry's earlier copies stay in the old one: apart)
            held = self.buffer.numel() if self.buffer is not None else 0
            self.reserve(max(self.cursor + size, 2 * held if self.doubling else held), t.device)
        if not t.numel():
            return t.clone()
        like = torch.empty_like(t, device="meta")  # clone()'s layout: a dense tensor's strides, else contiguous
        copy = self.buffer[self.cursor:self.cursor + size].view(t.dtype).as_strided(like.shape, like.stride())
        self.cursor += size
        return copy.copy_(t)


def copyable(a: torch.Tensor, written: Sequence[torch.Tensor]) -> bool:
    """May a region read arena tensor ``a`` through a static copy?  Not where it overlaps
    memory the region writes (the copy would miss the write), nor where it is less aligned
    than a fresh allocation (a library may pick another kernel by alignment: a copy is
    512-byte aligned, as a fresh CUDA allocation; 64 bytes suffice on the CPU)."""
    if a.data_ptr() % (256 if a.is_cuda else 64):
        return False
    lo, hi = byte_interval(a)  # in its storage: compared with writes into the same storage only
    same = [w for w in written if w.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()]
    return not any(w_lo < hi and lo < w_hi for w_lo, w_hi in map(byte_interval, same))


class GraphPool:
    """The CUDA-graph memory pool a session captures into, renewed after a failed capture.

    A capture the device invalidates (a host sync inside it) ends before PyTorch's
    allocator stops recording into its pool: every later capture into that pool then
    raises "beginAllocateToPool: already recording to mempool_id", and
    ``torch._C._cuda_endAllocateToPool`` does not clear it (PyTorch 2.11,
    ``benchmarks/capture_fault_probe.py``).  So after a failed capture that left its pool
    so (``CapturedRegion.capture`` finds out by the empty capture it runs next) the
    session's later captures, the failed region's retry among them, go to a fresh pool
    (``renew``): one fault leaves one region eager, not every capture after it.  A
    capture that raised without invalidating keeps the pool.  Graphs captured before
    keep the memory of the pool they were captured into; ``renewed`` counts the fresh
    pools (``Session.stats()["graph_pools_renewed"]``)."""

    def __init__(self, parent: "GraphPool | None" = None, every_input: bool = False):
        self.handle = torch.cuda.graph_pool_handle()
        self.renewed = 0
        self._parent = parent  # the session's pool, which counts this one's renewals too
        self._leaders: GraphPool | None = None
        #: every region's static inputs are copies in ``copies`` (a working arena's pool), not
        #: only the shared calls' (module doc)
        self.every_input = every_input
        self.copies = StaticCopies(doubling=every_input)  # the static copies (above)

    def renew(self) -> None:
        self.handle = torch.cuda.graph_pool_handle()
        self.renewed += 1
        if self._parent is not None:
            self._parent.renewed += 1

    @property
    def leaders(self) -> "GraphPool":
        """The pool this session's shared calls' first graphs record into: apart from its
        other graphs (``capture_entry``), one for all its entries (they never run at once)."""
        if self._leaders is None:
            self._leaders = GraphPool(parent=self)
        return self._leaders


@contextlib.contextmanager
def recording(graph: torch.cuda.CUDAGraph, pool, stream: torch.cuda.Stream) -> Iterator[None]:
    """``torch.cuda.graph(graph, pool=pool, stream=stream)`` less what it does before each
    capture: a device synchronize, then the allocator's and the pinned host cache emptied.

    An entry records one region after another, launching each graph once as it goes (its
    outputs are the next region's inputs): with a synchronize before every capture, the
    host waited for the last region's kernels before it recorded the next, and emptied a
    cache that holds little by then.  ``capture_entry`` synchronizes and empties the cache
    once, before its first region; what a capture records is the same either way (stream
    capture records launches, it runs nothing), and the launches keep their stream's order.
    """
    if SYNC_EACH_CAPTURE or stream is None:  # (None: torch.cuda.graph's own side stream)
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            yield
        return
    with torch.cuda.stream(stream):
        graph.capture_begin(*(() if pool is None else (pool,)))
        try:
            yield
        except BaseException:  # the capture ends however the body left, as in torch.cuda.graph
            try:
                graph.capture_end()
            except Exception:  # noqa: BLE001 - an invalidated capture cannot end: the body's error says why
                pass
            raise
        graph.capture_end()
