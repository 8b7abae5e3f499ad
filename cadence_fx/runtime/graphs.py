"""CUDA-graph capture and replay of one capturable region (rule R).

``CapturedRegion`` wraps a ``GraphModule`` piece.  Its arguments are of two kinds:
*bound* tensors (arena regions, and arguments the piece writes into) are captured by
address and must be the very same memory at every replay; *copied* tensors (the
step's inputs, values from an eager island) are copied into static buffers before
each replay.  Outputs are the graph's static tensors: valid until this session's
next replay; the session clones what it hands to the caller.

Fail closed: before every replay ``forward`` compares each argument with what was
captured (shape, stride, dtype, device; the address of bound ones; the value of a
python argument baked into the graph).  On any mismatch it runs the same piece
eagerly instead and counts the reason in ``refusals``, which the session reports.

One graph for a shared step's calls (``SHARE_CALLS``): where an entry's regions are each
one call of the same submodule (``passes/step_share``'s shared step: a flow decoder's
later steps, each call a region of its own, ``Partition(calls_apart=True)``),
``capture_entry`` records the first and every later call replays that graph
(``shared_regions``), reading its own slot of the step caches through a static copy made
before each replay (the same bytes, so the same results; ``runtime/pools.py``: one
buffer a session) while what it writes stays bound.  The calls share the graph's outputs
too, so only where every use of a call's outputs comes before the next call.  The first
call's graph records into a pool apart from the session's other graphs: it replays after
regions recorded later, whose live tensors could sit where its intermediates were.

Random draws (``GraphRng``): a session's graphs are captured with the default CUDA
generator pointed at that session's own generator state, so they read their Philox
seed and offset from device tensors of their own.  Before each replay the session's
state takes the default generator's seed and offset, and after it the default
generator advances by what the graph drew: the draws are those eager would make at
that call, and a replay overlapping another session's (another stream) never reads
that session's offset.  PyTorch before 2.13 keeps one such pair of tensors per
generator state, shared by every graph captured with it (pytorch/pytorch#176752 made
them per capture), so without a state per session overlapped replays could read each
other's offsets.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
from typing import Any, Sequence

import torch

from ..errors import CadenceError
from ..plan import same_layout
from . import collector, pools, streams
from .pools import GraphPool, StaticCopies, copyable, nbytes, recording
from .interpret import drop_graph, run_graph, run_piece  # run_graph: here before


#: record a shared step's call once per entry and replay it at every call (module docstring);
#: ``CADENCE_FX_SHARED_CAPTURE=0`` (read at import) records every call where it stands.
#: docs/architecture.md ("One flow step, not ten") has what it saves and costs.
SHARE_CALLS = os.environ.get("CADENCE_FX_SHARED_CAPTURE", "1") != "0"
#: what ``compact_entry`` keeps in a parent's meta for ``shared_regions`` and ``reserve_copies``
_KEPT_SHARED, _KEPT_COPIED = "cadence_fx.shared_regions", "cadence_fx.copied_bytes"


class CaptureFailed(CadenceError, RuntimeError):
    """Capture of a region failed; the session runs it eagerly instead."""


class GraphRng:
    """One session's CUDA generator state for the random draws of its graphs.

    ``capturing()`` points the device's default generator at this state while a graph
    is captured (``graphsafe_set_state``), so the captured kernels read this state's
    seed/offset tensors; ``replay(graph)`` runs one graph as eager would draw at this
    call: this state takes the default generator's seed and offset, the graph replays
    (PyTorch writes them into the tensors on the current stream, then advances this
    state), and the default generator advances by the same amount.  Callers seed the
    default generator as they would for stock (``torch.manual_seed``) and never see
    this state.  ``for_device`` is None where PyTorch lacks the graph-safe generator
    API (then graphs draw from the default state, as before).
    """

    def __init__(self, device: torch.device):
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.default = torch.cuda.default_generators[index]
        self.own = torch.Generator(device=torch.device("cuda", index))
        self.replays = 0

    @classmethod
    def for_device(cls, device: torch.device) -> "GraphRng | None":
        needed = ("graphsafe_get_state", "graphsafe_set_state", "get_offset", "set_offset")
        if device.type != "cuda" or not all(hasattr(torch.Generator, m) for m in needed):
            return None
        return cls(device)

    @contextlib.contextmanager
    def capturing(self):
        saved = self.default.graphsafe_get_state()
        self.default.graphsafe_set_state(self.own)
        try:
            yield
        finally:
            self.default.graphsafe_set_state(saved)

    def replay(self, graph: "torch.cuda.CUDAGraph") -> None:
        self.own.manual_seed(self.default.initial_seed())
        self.own.set_offset(self.default.get_offset())
        graph.replay()
        self.default.set_offset(self.own.get_offset())
        self.replays += 1


@dataclasses.dataclass(frozen=True)
class ArgSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    data_ptr: int | None  # bound args only

    @classmethod
    def of(cls, t: torch.Tensor, bound: bool) -> "ArgSpec":
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, t.device, t.data_ptr() if bound else None)

    def mismatch(self, t: Any, i: int) -> str | None:
        if not isinstance(t, torch.Tensor):
            return f"arg {i} is {type(t).__name__}, captured a tensor"
        for field, live in (("shape", tuple(t.shape)), ("dtype", t.dtype), ("device", t.device)):
            if live != getattr(self, field):
                return f"arg {i} {field} {live} != captured {getattr(self, field)}"
        if not same_layout(self.shape, tuple(t.stride()), self.stride):
            return f"arg {i} stride {tuple(t.stride())} != captured {self.stride}"
        if self.data_ptr is not None and t.data_ptr() != self.data_ptr:
            return f"arg {i} (bound by address) moved from {self.data_ptr:#x} to {t.data_ptr():#x}"
        return None


def pool_handle(pool: "GraphPool | Any") -> Any:
    """The handle ``torch.cuda.graph`` takes: a ``GraphPool``'s current one, or ``pool`` itself."""
    return pool.handle if isinstance(pool, GraphPool) else pool


#: graphs that PyTorch 2.11 cannot free safely, kept for the process's life (``keep_if_unsafe``)
_KEPT: list = []


def keep_if_unsafe(graph: "torch.cuda.CUDAGraph", began: bool, ended: bool) -> None:
    """Keep ``graph`` for the process's life where freeing it is unsafe (PyTorch 2.11).

    * Its capture raised before it began (``began`` False).  ``capture_begin`` names the
      default generator's state in the graph, then registers the graph with that state,
      which allocates the state's graph tensors when it has no graph yet: an error there
      (out of memory; a test's injected fault) leaves a graph whose destructor raises
      "The graph should be registered to the state", and a destructor that raises
      aborts the process (GPU suite, 2026-12-02, ``test_misuse``).
    * Its capture was invalidated (``ended`` False): the allocator keeps a recording
      entry with a filter that reads this graph object at every later allocation of the
      process; freed, the filter would read freed memory.
    One small object per such fault; other graphs are freed as usual.  Kept past the
    interpreter's shutdown too (a reference nothing releases): freed there, they aborted
    processes whose tests had all passed (GPU suite, 2026-12-02)."""
    if not began or not ended:
        _KEPT.append(graph)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(graph))  # never freed, not even at exit


class CapturedRegion(torch.nn.Module):
    """One CUDA graph for one piece of one catalog entry."""

    def __init__(self, piece: torch.nn.Module, bound: Sequence[bool], name: str = "region", trivial: bool = False,
                 rng: GraphRng | None = None):
        super().__init__()
        self.rng = rng  # the session's generator state its graph draws from (None: the default one)
        self.piece = piece
        self.bound = tuple(bound)  # args written in place; capture adds those that alias the arena
        self.name = name
        self.graph: torch.cuda.CUDAGraph | None = None
        self.specs: tuple[ArgSpec | tuple, ...] = ()
        self.static_in: list[torch.Tensor | None] = []
        self.static_out: Any = None
        self.replays = 0
        self.refusals: dict[str, int] = {}
        self.trivial = trivial  # views only (lowering decides): nothing to capture, the piece runs as is
        self.unwarmed_failure: str | None = None  # why a capture without warm-up failed (then retried warm)
        self.leader: "CapturedRegion | None" = None  # a call of a shared step: the region whose graph it replays
        self.copy_reads = False  # a shared call's leader: arena memory it only reads is copied in, not bound
        # the graphs of failed captures, kept as long as the region (see ``capture``)
        self.failed_graphs: list[torch.cuda.CUDAGraph] = []

    def capture(self, args: Sequence[Any], pool, stream: torch.cuda.Stream, arena_ptr: int | None = None,
                copies: StaticCopies | None = None) -> None:
        """Capture on ``stream`` into ``pool`` (a ``GraphPool``, renewed if this capture
        fails, or a pool handle); the caller has warmed the piece up.  ``copies``: where
        the static copies go (a session's buffer, ``runtime/pools.py``; None: clones).

        An argument that aliases the arena (``arena_ptr``: its storage's address) is
        bound by address: a static copy of it would take the graph's writes away
        from the arena.
        """
        if len(args) != len(self.bound):
            raise CaptureFailed(f"{self.name}: {len(args)} args, expected {len(self.bound)}")
        if arena_ptr is not None:
            written = [a for a, b in zip(args, self.bound) if b and isinstance(a, torch.Tensor)] \
                if self.copy_reads else None  # None: every arena argument bound
            self.bound = tuple(b or (isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == arena_ptr
                                     and not (written is not None and copyable(a, written)))
                               for a, b in zip(args, self.bound))
        for i, a in enumerate(args):
            if isinstance(a, (list, tuple, dict)):
                # a container's tensors would be neither copied nor checked: refuse
                raise CaptureFailed(f"{self.name}: arg {i} is a {type(a).__name__}; a captured region takes tensors")
        self.specs = tuple(ArgSpec.of(a, b) if isinstance(a, torch.Tensor) else ("value", a)
                           for a, b in zip(args, self.bound))
        mark = copies.cursor if copies is not None else 0
        self.static_in = [None if (b or not isinstance(a, torch.Tensor)) else
                          copies.copy_of(a) if copies is not None else a.clone() for a, b in zip(args, self.bound)]
        call_args = [s if s is not None else a for a, s in zip(args, self.static_in)]
        graph = torch.cuda.CUDAGraph()
        began = False
        with self.rng.capturing() if self.rng is not None else contextlib.nullcontext():
            try:
                with recording(graph, pool_handle(pool), stream):
                    began = True
                    out = run_piece(self.piece, call_args)
            except Exception as e:
                # A failed capture's graph still counts as a user of the pool.  Kept here, it
                # is freed with its region's other graphs, never by a garbage collection in
                # whatever runs later; and the pool keeps a user for the retry and the next
                # regions' captures (PyTorch asserts when a capture joins a pool that every
                # graph has released while its memory is still held).
                self.failed_graphs.append(graph)
                if copies is not None:
                    copies.cursor = mark  # the retry lays its copies out where these were
                released, _ = _release_generator(pool_handle(pool), stream)  # the generator state this capture used
                # an invalidated capture (its pool left recording: the empty capture could not
                # begin) or one that failed as it began is kept for the process's life
                keep_if_unsafe(graph, began, ended=released)
                if not released:
                    if isinstance(pool, GraphPool):
                        # this session's later captures go to a fresh pool, whose first user,
                        # kept here, is the empty capture that resets the generator
                        pool.renew()
                        self.failed_graphs.append(_release_generator(pool_handle(pool), stream)[1])
                raise CaptureFailed(f"{self.name}: capture failed: {type(e).__name__}: {e}") from e
        self.graph, self.static_out = graph, out

    def check(self, args: Sequence[Any]) -> str | None:
        if self.leader is not None:
            return self.leader.check(args)
        if self.graph is None:
            return f"{self.name}: not captured"
        if len(args) != len(self.specs):
            return f"{self.name}: {len(args)} args, captured {len(self.specs)}"
        for i, (a, spec) in enumerate(zip(args, self.specs)):
            if isinstance(spec, tuple):  # a python value baked into the graph at capture
                if isinstance(a, torch.Tensor) or a != spec[1]:
                    return f"{self.name}: arg {i} is {a!r}, captured the value {spec[1]!r}"
                continue
            why = spec.mismatch(a, i)
            if why:
                return f"{self.name}: {why}"
        return None

    def forward(self, *args):
        if self.leader is not None:  # a later call of a shared step: the first call's graph
            return self.leader(*args)
        if self.trivial:
            return self.piece(*args)
        why = self.check(args)
        if why is not None:
            # fail closed: the same piece, eagerly (walked as at capture: no code generated
            # mid-stream); the reason is counted
            self.refusals[why] = self.refusals.get(why, 0) + 1
            return run_piece(self.piece, args)
        for s, a in zip(self.static_in, args):
            if s is not None:
                s.copy_(a)
        self.launch()
        self.replays += 1
        return self.static_out

    def launch(self) -> None:
        """Replay the graph on its static buffers (drawing from ``rng``'s state if set)."""
        if self.rng is not None:
            self.rng.replay(self.graph)
        else:
            self.graph.replay()


def capture_entry(parent: torch.fx.GraphModule, args: Sequence[Any], pool, arena_ptr: int,
                  stream: torch.cuda.Stream | None = None, warm_up: bool = True) -> dict[str, str]:
    """Capture every ``CapturedRegion`` of one entry's graph, in order.

    Runs the entry once on the side ``stream`` (if None, one of its own from
    ``streams.take``, given back when ``parent`` is collected), capturing each
    region on its live arguments and launching its graph once: a graph's first launch
    uploads it to the device (for a graph of thousands of kernels, milliseconds; a
    sweep that opened 16 sessions at once paid it in the next two timed ticks), and
    its outputs are what the next regions take.  This mutates the arena and draws from
    the generators: the caller forks the generators and resets the arena.  Returns
    ``{region: reason}`` for regions whose capture failed (they stay eager).

    ``warm_up``: run each region eagerly before capturing it, so that what the
    libraries initialize on first use (cuBLAS handles and workspaces, which are per
    stream) happens outside capture.  A stream that already captured an entry is
    warm: its later entries (and a session's mid-stream captures) pass False and
    skip that run, a Python run of every op, and so does a session's first entry on a
    stream an earlier session warmed on this thread, or one primed for it
    (``streams.is_warm``, ``streams.prime``).  A capture that fails unwarmed (an
    initialization capture cannot take; ``torch.cuda.graph`` is in its strict mode)
    is retried after the warm-up, and only a second failure leaves the region eager.

    The library workspaces the captured kernels use (cuBLAS: 32 MiB per stream under
    the deterministic protocol's ``:4096:8``) belong to the capture stream and stay
    allocated for the graphs' lifetime: a session captures all its entries on one
    stream, so it holds one set (its entries never replay concurrently; two sessions,
    which may, keep their own).
    """
    failed: dict[str, str] = {}
    if stream is None:  # one of its own, never another graph's (runtime/streams.py), given back with these graphs
        stream = streams.take(torch.device("cuda"))
        streams.held(parent, stream.device, stream)
    torch.cuda.synchronize()  # what torch.cuda.graph does before each capture, once an entry (pools.recording)
    torch.cuda.empty_cache()
    stream.wait_stream(torch.cuda.current_stream())
    follows = shared_regions(parent) if SHARE_CALLS else {}
    for name in set(follows.values()):
        parent.get_submodule(name).copy_reads = True
    session = pool if isinstance(pool, GraphPool) else None
    if session is not None:
        session.copies.start_entry()

    def pool_for(mod: CapturedRegion):
        # A shared call's first graph replays again after regions captured later: in the
        # session's pool, those may hold live tensors (the flow's x between steps) where its
        # intermediates were, and its replay would overwrite them.  It records into a pool
        # apart, which only the session's other entries' first graphs share (an entry's
        # graphs run in its chunk; what they leave is consumed before the next chunk).
        if not mod.copy_reads:
            return pool
        return session.leaders if session is not None else torch.cuda.graph_pool_handle()

    def capture(mod: CapturedRegion, args_) -> None:
        copied = session is not None and (mod.copy_reads or session.every_input)  # else: clones of its own
        mod.capture(args_, pool_for(mod), stream, arena_ptr, session.copies if copied else None)

    def call_module(mod, args_):
        if isinstance(mod, CapturedRegion) and mod.trivial:
            return mod.piece(*args_)  # views only (lowering said so): an empty capture would be useless
        leader = parent.get_submodule(follows[mod.name]) if isinstance(mod, CapturedRegion) and mod.name in follows \
            else None
        if leader is not None and leader.graph is not None and leader.check(args_) is None:
            mod.leader = leader  # replays the first call's graph (refused: its piece, eagerly, counted there)
            out = mod(*args_)
            if pools.SYNC_EACH_CAPTURE:
                torch.cuda.synchronize()
            return out
        if isinstance(mod, CapturedRegion):
            # warm-up and capture walk the piece's graph (interpret.py): its code is never generated
            if not warm_up:
                try:
                    capture(mod, args_)
                except CaptureFailed as e:  # perhaps a first-use initialization: warm up, then again
                    mod.unwarmed_failure = str(e)
                else:
                    mod.launch()  # runs the region: its outputs are the ones the next regions take
                    if pools.SYNC_EACH_CAPTURE:
                        torch.cuda.synchronize()
                    return mod.static_out
            # warm-up: lazy inits (cuBLAS handles, workspaces) outside capture
            out = run_piece(mod.piece, args_)
            torch.cuda.synchronize()
            try:
                capture(mod, args_)
                mod.launch()  # the first launch uploads the graph: here, not in the session's first chunks
            except CaptureFailed as e:  # mod.graph stays None: every call runs the piece, counted
                failed[mod.name] = str(e)
            torch.cuda.synchronize()
            return out
        return mod(*args_)

    try:
        with torch.cuda.stream(stream):
            run_graph(parent, args, call_module)
    finally:  # also on an error (e.g. out of memory): the caller zeroes the arena next
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
    return failed


def _lone_call(piece: torch.nn.Module) -> tuple | None:
    """A piece that is one call of a submodule and what goes with it (the items it
    returns; dispatcher state a piece sets again at its start, such as the autocast a
    flow runs under on CUDA): (the submodule, the piece's structure: every node's op,
    target and arguments); None for a piece that reads a constant or calls no submodule."""
    graph = getattr(piece, "graph", None)
    if graph is None:
        return None
    index, shape, called = {}, [], None
    for i, n in enumerate(graph.nodes):
        index[n] = i
        args = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: ("node", index[a]))
        if n.op == "call_module":
            if called is not None:
                return None
            called = piece.get_submodule(n.target)
            shape.append((n.op, None, repr(args)))
        elif n.op == "get_attr":
            return None
        else:
            shape.append((n.op, n.target if n.op != "placeholder" else None, repr(args)))
    return None if called is None else (id(called), tuple(shape))


def shared_regions(parent: torch.fx.GraphModule) -> dict[str, str]:
    """``{region: the region whose graph it replays}``: of an entry's regions that are each
    one call of the same submodule, alike (``_lone_call``), every one after the first,
    where every use of each call's outputs comes before the next call.  A use is followed
    through what may alias the outputs: items, eager pieces' results, and the results of a
    region that writes into them; a region that takes them as a copied input ends it.
    An executable's entry answers from what ``compact_entry`` kept (its pieces' graphs gone)."""
    kept = parent.meta.get(_KEPT_SHARED)
    if kept is not None:
        return dict(kept)
    nodes = list(parent.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    groups: dict[tuple, list[torch.fx.Node]] = {}
    for n in nodes:
        if n.op != "call_module":
            continue
        mod = parent.get_submodule(n.target)
        key = _lone_call(mod.piece) if isinstance(mod, CapturedRegion) and not mod.trivial else None
        if key is not None:
            groups.setdefault(key, []).append(n)

    def dead_before(call: torch.fx.Node, nxt: torch.fx.Node) -> bool:
        seen, todo = set(), [call]
        while todo:
            n = todo.pop()
            for u in n.users:
                if u in seen:
                    continue
                seen.add(u)
                if u.op == "output" or pos[u] >= pos[nxt]:
                    return False
                if u.op == "call_module":
                    mod = parent.get_submodule(u.target)
                    if isinstance(mod, CapturedRegion) and not mod.trivial and not any(
                            b for a, b in zip(u.args, mod.bound) if a is n):
                        continue  # copied into that region's own buffer
                todo.append(u)
        return True

    follows: dict[str, str] = {}
    for calls in groups.values():
        if len(calls) > 1 and all(dead_before(c, d) for c, d in zip(calls, calls[1:])):
            follows.update({c.target: calls[0].target for c in calls[1:]})
    return follows


def _copied(parent: torch.fx.GraphModule, call: torch.fx.Node) -> list:
    """The traced values of what region ``call`` may copy: its unbound tensor inputs (the
    piece's input as traced, or a constant the parent passes it)."""
    mod = parent.get_submodule(call.target)
    inputs = [n for n in mod.piece.graph.nodes if n.op == "placeholder"]
    vals = [n.meta.get("val") if n.meta.get("val") is not None else
            getattr(parent, a.target) if isinstance(a, torch.fx.Node) and a.op == "get_attr" else None
            for n, a in zip(inputs, call.args)]
    return [v for v, b in zip(vals, mod.bound) if not b and isinstance(v, torch.Tensor)]


def reserve_copies(pool, parents: Sequence[torch.fx.GraphModule], device: torch.device) -> None:
    """Size a session's copy buffer (``GraphPool.copies``) for the shared calls' first
    graphs of its entries ``parents``, from their pieces' traced inputs (a capture that
    needs more takes a larger buffer, counted in ``grown``)."""
    if not SHARE_CALLS or not isinstance(pool, GraphPool):
        return
    sizes = [_copied_bytes(p) for p in parents]
    try:
        pool.copies.reserve(max(map(sum, sizes), default=0), device) if any(sizes) else None
    except torch.OutOfMemoryError:  # each copy then allocates at its capture (an entry's OOM: eager)
        pass


def compact_entry(parent: torch.fx.GraphModule) -> int:
    """Let an executable entry's pieces' graphs go, keeping what sessions read from them:
    each piece's step list (``interpret.drop_graph``: what capture and a refused replay
    walk), ``shared_regions`` and the bytes its first calls copy (``reserve_copies``): a
    few objects a piece for the collector, not several a node (docs/architecture.md,
    "Fewer objects for the collector to walk").  A trivial piece and one with generated
    code keep theirs.  A submodule the dropped pieces call (a call piece's shared step:
    ~1.7k nodes an entry at 10 flow steps) lets its graph go too, walked by its own step
    list, unless a piece that keeps its code calls it.  Returns the pieces dropped."""
    parent.meta[_KEPT_SHARED] = shared_regions(parent)
    parent.meta[_KEPT_COPIED] = _copied_bytes(parent)  # from the shared regions just kept
    dropped, called, kept = 0, {}, set()
    for mod in (m for m in parent.children() if isinstance(m, CapturedRegion)):
        subs = {id(s): s for s in map(mod.piece.get_submodule, _called(mod.piece))}
        if not mod.trivial and drop_graph(mod.piece):
            dropped += 1
            called.update(subs)
        else:  # its generated code calls them
            kept.update(subs.keys())
    for sub in (sub for key, sub in called.items() if key not in kept):
        drop_graph(sub)
    return dropped


def _called(gm: torch.nn.Module) -> list[str]:
    return [n.target for n in gm.graph.nodes if n.op == "call_module"] if isinstance(gm, torch.fx.GraphModule) else []


def _copied_bytes(parent: torch.fx.GraphModule) -> list[int]:
    """The buffer bytes of each static copy ``parent``'s first shared calls make (kept by ``compact_entry``)."""
    if _KEPT_COPIED in parent.meta:
        return parent.meta[_KEPT_COPIED]
    firsts = set(shared_regions(parent).values())
    return [nbytes(t) for n in parent.graph.nodes if n.op == "call_module" and n.target in firsts
            for t in _copied(parent, n)]


def _release_generator(pool, stream) -> "tuple[bool, torch.cuda.CUDAGraph]":
    """Leave the CUDA generator usable after a capture that raised.

    A capture invalidated mid-way (e.g. a kernel that syncs the host) exits without
    the generator's capture epilogue, and every later eager random draw then fails
    ("Offset increment outside graph capture").  An empty capture runs prologue and
    epilogue once and clears that state.  Returns whether it ran (it cannot where the
    invalidated capture left ``pool`` recording) and its graph, a user of ``pool``
    where it ran (``CapturedRegion.capture`` keeps it when ``pool`` is a fresh one).
    """
    import warnings
    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                pass
        except Exception:  # noqa: BLE001 - best effort; the failure itself is already recorded
            keep_if_unsafe(graph, began=False, ended=False)  # it raised as it began (see there)
            return False, graph
    return True, graph


def capture_variant(program: torch.fx.GraphModule, args: Sequence[Any], pool, arena_ptr: int | None,
                    stream, device: torch.device, rng: GraphRng | None = None,
                    warm_up: bool | None = None) -> tuple[torch.fx.GraphModule, dict[str, str], str | None]:
    """A session's own copy of a program (an off-catalog one, or an entry's in a session
    that started before its executable existed), captured mid-stream (generators
    forked; the caller puts its live state back).  ``(parent, failed regions, error)``:
    out of memory is a failure of every region (they run eagerly, counted), any other
    exception the ``error`` (the caller runs the chunk eagerly instead).  ``warm_up``:
    see ``capture_entry`` (default: only on a new stream, ``stream`` None)."""
    parent = fresh_regions(program, rng)
    devices = [device] if device.type == "cuda" else []
    try:
        with collector.held(), torch.random.fork_rng(devices=devices):  # no finalizer mid-capture
            try:
                # a stream that captured the session's entries is warm (None: a new stream)
                warm = stream is None if warm_up is None else warm_up
                return parent, capture_entry(parent, args, pool, arena_ptr, stream, warm_up=warm), None
            except torch.OutOfMemoryError as e:
                return parent, {"*": f"out of memory while capturing: {e}"}, None
    except Exception as e:
        return parent, {}, f"capture failed: {type(e).__name__}: {e}"


def fresh_regions(parent: torch.fx.GraphModule, rng: GraphRng | None = None) -> torch.fx.GraphModule:
    """A per-session copy of an entry's graph: same pieces, new (uncaptured) regions
    that draw from the session's generator state ``rng``.

    Graphs bind one arena by address, so each session captures its own.
    """
    import copy
    gm = copy.copy(parent)
    gm._modules = dict(parent._modules)
    for name, mod in parent._modules.items():
        if isinstance(mod, CapturedRegion):
            gm._modules[name] = CapturedRegion(mod.piece, mod.bound, name=mod.name, trivial=mod.trivial, rng=rng)
    return gm


def region_stats(parent: torch.fx.GraphModule) -> tuple[int, dict[str, int]]:
    """(replays, refusal reasons) summed over an entry's regions."""
    replays, refusals = 0, {}
    for mod in parent.children():
        if isinstance(mod, CapturedRegion):
            replays += mod.replays
            for k, v in mod.refusals.items():
                refusals[k] = refusals.get(k, 0) + v
    return replays, refusals


def retried_regions(programs: dict, variant_programs: dict) -> dict[str, str]:
    """A session's ``stats()["capture_retried"]``: ``"<entry or specialization>/<region>":
    why`` for each region of its programs (entry index -> ``EntryProgram``) and captured
    specializations (``VariantKey`` -> ``EntryProgram``, or why its capture failed) whose
    capture without warm-up failed and that was warmed up and captured again (normally none)."""
    held = [(str(i), p.run) for i, p in (programs or {}).items()]
    held += [(k.label(), p.run) for k, p in variant_programs.items() if not isinstance(p, str)]
    return {f"{label}/{m.name}": m.unwarmed_failure for label, parent in held for m in parent.children()
            if isinstance(m, CapturedRegion) and m.unwarmed_failure is not None}
