"""A working arena: the one arena a capacity's graphs are captured on, shared by its sessions.

A CUDA graph binds the arena it was captured on by address, so under replay each session
of an executable captures its own graphs on its own arena: at set-up, and each window or
flush shape the first time it sends it.  The sessions of a capacity executable
(``capacity_executable``: one set of graphs for every prompt length up to a capacity) run
the same graphs at different lengths; with a ``WorkingArena`` each graph is captured once
per process instead, on the working arena, and every session runs its chunks there:

* a ``WorkingSession``'s state is *parked* in an arena of its own (its ``arena``, laid
  out as the working one).  Before a program runs for it, its parked arena is copied onto
  the working arena (one storage copy); after the program, the working arena is copied
  back.  Between chunks the parked arena is the session's state: ``snapshot``,
  ``restore``, ``load_state``, ``state()`` and the eager fallback read and write it as a
  ``Session`` does its own arena.
* one chunk at a time on a working arena: its ``turn()`` is a lock (a session waits while
  another session's chunk or a capture runs there: sessions given CUDA streams of their own
  to overlap, ``open_session(stream=)``, do not overlap on it), and on CUDA an event orders
  each turn's device work after the previous turn's, whatever stream either runs on.
* its graphs are length-free (``Partition(length_free=True)``, lowered so by
  ``capacity_executable(..., shared_captures=True)``): what depends on the stream's length
  runs in eager islands between the replays, and what a stream differs in (its inputs, its
  device lengths, the islands' values) is copied into the graphs' static buffers before
  each replay.  A replay whose arguments differ from the capture's in what a graph bakes
  (a shape, a host value) is refused and runs that piece eagerly, counted under
  ``stats()["fallbacks"]`` as for any session: exact, never a wrong chunk.
* a capture runs on a zeroed working arena (what ``Session.prepare_replay`` captures
  on), never on a parked one; what it leaves there is overwritten by the next turn's copy.
  It runs outside inference mode whatever its caller's mode (the drop-ins set up in
  inference mode): its static buffers are normal tensors, which a session stepping in
  either mode may write.  Where a capture raises, or runs out of memory, the pieces it did
  not capture run eagerly (counted) for that caller and the graph is not kept: the next
  session or chunk that needs it tries again; one whose regions failed otherwise is kept.
  A capture holds the turn: a first window or flush captured mid-stream makes every voice
  of the capacity wait for it (``prepare_capacity`` captures them before the first voice).

The copies cost two storage copies a chunk (the arena at the capacity: by the H200's
bandwidth well under a millisecond for a few hundred MiB; not measured yet), and one
chunk at a time; what they buy is a capture per graph per process, not per session, and
the graphs' memory pool held once, their static inputs in one copy buffer (the largest
graph's, not one clone per graph: ``GraphPool(every_input=True)``, ``runtime/pools.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import weakref
from typing import Any, Iterator, Mapping, Sequence

import torch

from ..errors import CadenceError
from ..plan import ArenaLayout
from . import device_work, streams
from .arena import Arena
from .executable import EntryProgram, Executable
from .midstream import cut_by_memory
from .session import FallbackFn, Session


def static_inputs(parents) -> dict:
    """What captured entries' static inputs (what their regions read from outside the arena:
    the eager islands' values, the step's inputs) take, in bytes: ``summed`` entry by entry,
    the ``largest`` entry's, ``held`` (the storages they lie in, each once: a pool's copy
    buffers, or each region's clones) and how many ``storages``.  ``parents``: entries' graph
    modules (``capture_entry``'s)."""
    from .graphs import CapturedRegion
    storages, summed, largest = {}, 0, 0
    for parent in parents:
        mine = 0
        for t in (t for r in parent.modules() if isinstance(r, CapturedRegion) for t in r.static_in):
            if t is not None:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                mine += t.numel() * t.element_size()
        summed, largest = summed + mine, max(largest, mine)
    return {"summed": summed, "largest": largest, "held": sum(storages.values()), "storages": len(storages)}


class WorkingArena:
    """The arena one capacity's graphs are captured on, and its captures (see the module doc)."""

    def __init__(self, layout: ArenaLayout, device: "torch.device | str"):
        self.layout = layout
        self.device = torch.device(device)
        with torch.inference_mode(False):  # a normal tensor: written in place in and out of inference mode
            self.arena = Arena(layout, self.device)
        self._lock = threading.Lock()
        self._done = None  # CUDA: an event recorded after the last turn's device work
        #: a program's graph -> (its captured copy, regions whose capture failed, error or None)
        self._captured: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self.pool = None  # one graph pool for every capture on this arena (graphs.GraphPool)
        self.rng = None  # one generator state for its graphs (graphs.GraphRng): one turn at a time
        self._stream = None  # its capture stream (runtime/streams.py), for the process's life
        self._warmed = False  # a CPU fake's first capture warms up (CUDA asks streams.is_warm)
        self.turns = self.waited = self.captures = self.copies = self.failed = 0
        self.capture_s = 0.0

    # ------------------------------------------------------------ one turn
    @contextlib.contextmanager
    def turn(self) -> Iterator["WorkingArena"]:
        """The working arena, one holder at a time (the caller waits for another holder's
        turn to end); on CUDA its device work is ordered after the previous turn's."""
        if not self._lock.acquire(blocking=False):
            self._lock.acquire()
            self.waited += 1
        try:
            if self._done is not None:
                torch.cuda.current_stream(self.device).wait_event(self._done)
            self.turns += 1
            try:
                yield self
            finally:
                if self.device.type == "cuda":
                    self._done = torch.cuda.Event()
                    self._done.record(torch.cuda.current_stream(self.device))
        finally:
            self._lock.release()

    def load(self, parked: Arena) -> None:
        """``parked``'s bytes onto the working arena (inside a turn)."""
        self._copy(self.arena, parked)

    def park(self, parked: Arena) -> None:
        """The working arena's bytes back into ``parked`` (inside a turn)."""
        self._copy(parked, self.arena)

    def _copy(self, dst: Arena, src: Arena) -> None:
        if dst.nbytes != src.nbytes:  # (WorkingSession checked the layouts once)
            raise CadenceError(f"a parked arena of {src.nbytes} bytes, its working arena's {dst.nbytes}")
        with torch.inference_mode(dst.storage.is_inference()):  # an inference arena takes writes only there
            dst.storage.copy_(src.storage)
        self.copies += 1

    # ------------------------------------------------------------- capture
    def capture(self, program: EntryProgram, inputs: Mapping[str, torch.Tensor],
                names: Sequence[str]) -> tuple[Any, dict[str, str], str | None]:
        """``program``'s graph captured on the working arena (once per graph: later calls get
        the same copy), on ``inputs`` (by ``names``) inside the program's context (the first
        stream's length: the pieces serve every length): ``(parent, failed regions, error)``,
        as ``graphs.capture_variant`` returns them; where it raised (``error``) or ran out of
        memory the pieces it did not capture run eagerly, counted, and the next call tries
        again.  The caller holds ``device_work`` (no capture beside a build's device work)."""
        from .graphs import GraphPool, GraphRng, capture_variant, reserve_copies
        hit = self._captured.get(program.run)
        if hit is not None:  # held: no turn taken
            return hit
        with self.turn():
            hit = self._captured.get(program.run)  # captured while this one waited?
            if hit is not None:
                return hit
            t0 = time.perf_counter()
            cuda = self.device.type == "cuda"
            if self.pool is None:  # one pool for every capture here, their static inputs in one buffer (pools.py)
                # (a CPU fake, tests: no generator state, no stream of its own)
                self.pool, self.rng = GraphPool(every_input=True), GraphRng.for_device(self.device) if cuda else None
                if cuda:
                    self._stream = streams.take(self.device)  # never given back: the graphs replay for the process
            stream = self._stream
            warm_up = streams.needs_warm_up(stream, cuda, self._warmed)
            self.arena.storage.zero_()  # what a session's set-up captures on
            args = program.arguments(inputs, names, [self.arena.full(n) for n in program.arena_inputs])
            reserve_copies(self.pool, [program.run], self.device)
            with torch.inference_mode(False), torch.no_grad(), program.entered():  # normal static buffers
                got = capture_variant(program.run, args, self.pool, self.arena.storage.data_ptr(), stream,
                                      self.device, self.rng, warm_up=warm_up)
            if got[2] is None:  # it ran: the stream is warm now
                self._warmed = True
                if cuda:
                    streams.warmed(stream)
            self.capture_s += time.perf_counter() - t0
            if got[2] is not None or cut_by_memory(got[1]):
                self.failed += 1  # not kept: the next call tries again
            else:
                self._captured[program.run] = got
                self.captures += 1
            return got

    def holds(self, program: EntryProgram) -> bool:
        """Whether ``program``'s graph is captured here."""
        return program.run in self._captured

    def held(self) -> int:
        """Graphs captured on this arena and still used (a graph no executable holds goes)."""
        return len(self._captured)

    def static_inputs(self) -> dict:
        """Its captured graphs' static inputs (what they read from the eager islands), in
        bytes: ``summed`` graph by graph, the ``largest`` graph's, and ``held``, the storages
        they lie in (the pool's copy buffers: ``runtime/pools.py``)."""
        return static_inputs(parent for parent, _, _ in list(self._captured.values()))

    def stats(self) -> dict:
        """Its bytes, turns (and how many waited for another's), storage copies, captures kept
        and failed (tried again later), their seconds, graphs held; on CUDA its graph pool's
        renewals and static copies (every session's on it: not per session)."""
        out = {"bytes": self.arena.nbytes, "turns": self.turns, "waited": self.waited, "copies": self.copies,
               "captures": self.captures, "failed_captures": self.failed, "capture_s": round(self.capture_s, 3),
               "graphs_held": self.held()}
        if self.pool is not None and self.device.type == "cuda":
            copies = self.pool.copies
            out["graph_pools_renewed"] = self.pool.renewed
            out["static_copies"] = {"bytes": copies.held_bytes, "grown": copies.grown}
        return out


class WorkingSession(Session):
    """A session whose programs run on a ``WorkingArena`` (module doc): its own arena is
    where its state is parked between chunks; its graphs are the working arena's."""

    def __init__(self, executable: Executable, arena: Arena, fallback: FallbackFn,
                 extents: Mapping[str, int | None], working: WorkingArena):
        if arena.layout != working.layout or arena.device != working.device:
            raise CadenceError("a working session's arena is laid out as its working arena, on its device")
        super().__init__(executable, arena, fallback, extents)
        self.working = working

    @torch.no_grad()
    def prepare_replay(self, example_inputs: Mapping[str, torch.Tensor]) -> dict[int, dict[str, str]]:
        """Every entry's graphs from the working arena, captured there now where no session
        did before (on zeros, never on this session's state).  Returns per entry the regions
        whose capture failed (they run eagerly, counted); a capture that raised is every
        region's failure (``"*"``), not a crash.  ``stats()["setup_s"]["capture_s"]``: this
        session's wait for them (none where they were held)."""
        failed: dict[int, dict[str, str]] = {}
        if not any(p.kind == "cudagraph" for p in self.executable.programs.values()):
            return failed
        t0 = time.perf_counter()
        with self._exclusive("prepare_replay"), device_work.held():  # never beside a build's device work
            programs = {}
            for idx, program in sorted(self.executable.programs.items()):
                parent, regions, error = self.working.capture(program, example_inputs, self.executable.inputs)
                failed[idx] = {"*": error} if error is not None else dict(regions)
                self._recaptures.note(idx, failed[idx])  # out of memory: captured there again later
                programs[idx] = dataclasses.replace(program, run=parent)
            self._pool, self._rng = self.working.pool, self.working.rng
            self._programs = programs
            self._example_inputs = example_inputs  # idle() captures an entry again on them (runtime/midstream.py)
            self.capture_failures = {i: f for i, f in failed.items() if f}
            self._stats.setup.capture_s = time.perf_counter() - t0
            return failed

    def stats(self) -> dict:
        """``Session.stats()`` and ``working_arena``: its ``WorkingArena.stats()`` (the graph
        pool's renewals and static copies are the working arena's, every session's, so they
        are there, not at this session's level)."""
        out = super().stats()
        out.pop("graph_pools_renewed", None)
        out.pop("static_copies", None)
        return {**out, "working_arena": self.working.stats()}

    def _run_program(self, program: EntryProgram, label: "int | str",
                     inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``program`` on the working arena: this session's parked state copied in, the
        program run (``Session._run_program``: a failure part-way breaks the session, its
        parked state untouched), the working arena copied back (a failure there breaks it)."""
        with self.working.turn() as w:
            w.load(self.arena)
            outputs = super()._run_program(program, label, inputs)
            try:
                w.park(self.arena)
            except BaseException as e:
                self._break(e)
                raise
        return outputs

    def _capture_mid_stream(self, program: EntryProgram,
                            inputs: Mapping[str, torch.Tensor]) -> tuple[Any, dict[str, str], str | None]:
        """An off-catalog program's graph from the working arena (captured there on the first
        stream's chunk that needs it); this session's parked state is not touched."""
        return self.working.capture(program, inputs, self.executable.inputs)

    def _state_args(self, program: EntryProgram) -> list[torch.Tensor]:
        return [self.working.arena.full(n) for n in program.arena_inputs]

    _capture_state_args = _state_args

    def _bound_storage(self) -> int | None:
        return self.working.arena.storage.data_ptr()


__all__ = ["WorkingArena", "WorkingSession"]
