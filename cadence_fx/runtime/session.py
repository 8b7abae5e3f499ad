"""Session: admission gate -> graph (or eager fallback) -> state stays in the arena.

The runtime executes what ``cadence_fx.compiler`` produced (an ``Executable``: one
program per catalog entry) and never reaches back into the passes.

Misuse and faults never yield a wrong chunk:

* one call at a time per session: a ``step`` (or ``snapshot``, ``restore``,
  ``load_state``, ``prepare_replay``) while another is running on the same session,
  from another thread, raises ``SessionBusy`` at once; it neither waits nor
  interleaves.  Sessions are independent of each other (rule S: each has its arena;
  each captures on a stream of its own, ``runtime/streams.py``), except the sessions of
  one working arena (``runtime/working.py``: a capacity's captures shared by its voices),
  whose chunks take turns on it: a step there waits while another's chunk runs.
* a step that raises part-way (any exception, ``KeyboardInterrupt`` included) never
  leaves a half-written state in use.  The eager fallback runs on private copies of
  the live state and writes back only after it returned and its state was checked:
  its failure leaves the state as it was.  A graph writes the arena in place as it
  goes: its failure marks the session broken, and every later step raises
  ``SessionBroken`` naming the original error until ``restore(snapshot)`` or
  ``load_state(...)``.  (Snapshotting before every graph step would copy the live state
  each step and hold a second copy: docs/serving.md.)  Nothing is counted for a step that did not finish.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable, Iterator, Mapping

import torch

from ..errors import CadenceError, InputError, SessionBroken, SessionBusy, SessionClosed
from ..foreground import working
from ..plan import CatalogEntry
from . import collector, device_work, streams
from .arena import Arena, copy_strided
from .counters import SessionStats, SetupTimes
from .executable import EntryProgram, Executable
from .gate import AdmissionGate, input_mismatch, validate_inputs
from .midstream import MidStreamCapture, Recaptures
from .snapshot import SessionSnapshot
from .variants import VariantKey, VariantRefused


FallbackFn = Callable[..., tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]


def check_idle_seconds(seconds: Any) -> None:
    """``idle(seconds)`` takes None (no bound) or a number of seconds >= 0."""
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or not seconds >= 0):
        raise InputError(f"idle(seconds=...) takes None (no bound) or a number of seconds >= 0; got {seconds!r}")


def time_left(seconds: float | None, since: float) -> float | None:
    """What is left of an ``idle(seconds)`` budget started at ``since`` (``perf_counter``; None: no bound)."""
    return None if seconds is None else seconds - (time.perf_counter() - since)


class Session(MidStreamCapture):
    """One stream: its arena, its clock position and its counters.

    ``step(inputs, **flags)`` returns the step's outputs (fresh tensors the caller
    owns).  Any flag set (e.g. ``last_chunk=True``), any input outside the entry's
    signature, or state extents outside the catalog run ``fallback`` eagerly on a
    private copy of the state; the reason is counted in ``stats()``.  One call at a
    time (``SessionBusy``); a step that failed part-way in a graph leaves the session
    ``broken`` (``SessionBroken``) until ``restore`` or ``load_state``.
    """

    def __init__(self, executable: Executable, arena: Arena | None, fallback: FallbackFn,
                 extents: Mapping[str, int | None], device: torch.device | str | None = None):
        self.executable = executable
        self.arena = arena
        self.layout = executable.plan.layout
        self.gate = AdmissionGate(arena) if arena is not None else None
        self.fallback = fallback
        self.extents = dict(extents)
        self._stats = SessionStats(setup=SetupTimes.from_compile(executable.claim_compile()))
        self.closed = False
        self._expect_device = arena.device if arena is not None else torch.device(device)
        # set by prepare_replay: this session's own captured programs (graphs bind its arena)
        self._programs: dict[int, EntryProgram] | None = None
        self.capture_failures: dict[int | str, dict[str, str]] = {}  # entry or specialization label
        self._busy = threading.Lock()  # held by the one call running on this session
        self._broken: BaseException | None = None  # what a step failed with, part-way
        # off-catalog specializations it runs (under replay: captured on its arena)
        self._variant_programs: dict[VariantKey, EntryProgram | str] = {}  # str: why its capture failed
        self._variant_capture_s: dict[str, float] = {}
        self._pool = None  # prepare_replay's graph pool and capture stream, for later captures
        self._capture_stream, self._give_stream = None, None  # its own (runtime/streams.py), given back at close
        self._warmed = False  # a capture of this session ran (``_must_warm_up``: a CPU fake has no stream to ask)
        self._rng = None  # prepare_replay's GraphRng: the generator state this session's graphs draw from
        self._example_inputs: Mapping[str, torch.Tensor] | None = None  # what idle() captures an entry on
        self._entry_failures: dict[int, str] = {}  # entry -> why its capture raised (eager from then on)
        self._recaptures = Recaptures()  # captures memory cut short: captured again later (runtime/midstream.py)

    # ------------------------------------------------------------------ public
    @torch.no_grad()
    def prepare_replay(self, example_inputs: Mapping[str, torch.Tensor]) -> dict[int, dict[str, str]]:
        """Capture every entry's graphs on this session's memory (before its state is set up).

        Capture runs each entry once for real: the generators are forked so the caller's random
        stream is untouched, and the state is reset afterwards (``load_state`` sets it up).  Returns
        per entry the regions whose capture failed (they run eagerly; an entry out of memory cut short
        is captured again later, ``runtime/midstream.py``).  If capture raises (anything but out of
        memory, which is recorded), the session keeps no graphs and is marked broken.
        Its wall time is ``stats()["setup_s"]["capture_s"]``.
        """
        from .graphs import GraphPool, GraphRng, capture_entry, fresh_regions, reserve_copies
        failed: dict[int, dict[str, str]] = {}
        if not any(p.kind == "cudagraph" for p in self.executable.programs.values()):
            return failed
        t0 = time.perf_counter()
        with self._exclusive("prepare_replay"), device_work.held():  # never beside a build's device work
            pool = GraphPool()  # one pool for all this session's graphs (a fresh one after a failed capture)
            # and one capture stream, no other live session's: one set of library workspaces
            stream = self._own_capture_stream() if self._expect_device.type == "cuda" else None  # (a CPU fake)
            self._pool = pool  # specializations captured later use it and the stream too
            self._rng = GraphRng.for_device(self._expect_device)  # its graphs' own generator state
            programs: dict[int, EntryProgram] = {}
            devices = [self._expect_device] if self._expect_device.type == "cuda" else []  # the CPU generator always forks
            try:
                with collector.held(), torch.random.fork_rng(devices=devices):  # no finalizer mid-capture
                    parents = {idx: fresh_regions(p.run, self._rng) for idx, p in self.executable.programs.items()}
                    reserve_copies(pool, list(parents.values()), self._expect_device)  # one buffer: the largest entry's
                    for idx, program in sorted(self.executable.programs.items()):
                        parent = parents[idx]
                        args = program.arguments(example_inputs, self.executable.inputs,
                                                 self._capture_state_args(program))
                        try:  # a cold stream's first capture warms it up; the later ones capture unwarmed
                            with program.entered():
                                failed[idx] = capture_entry(parent, args, pool, self._bound_storage(), stream,
                                                            warm_up=self._must_warm_up(stream))
                            self._warmed_up(stream)
                        except torch.OutOfMemoryError as e:  # capture must never crash a stream: the
                            # entry's uncaptured regions run eagerly, each step counted ("not captured")
                            failed[idx] = {"*": f"out of memory while capturing: {e}"}
                        self._recaptures.note(idx, failed[idx])
                        programs[idx] = dataclasses.replace(program, run=parent)
                self._reset_state()
            except BaseException as e:  # capture ran the entries on the arena: its bytes are undefined
                self._programs = None
                self._break(e)
                raise
            self._programs = programs
            self.capture_failures = failed
            self._example_inputs = example_inputs
            self._stats.setup.capture_s = time.perf_counter() - t0  # stats(): capture_s
            return failed

    @torch.no_grad()
    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Set the stream's state (e.g. from the model's prompt setup); it must fit catalog entry 0.

        Clears a broken mark (``SessionBroken``) once the whole state is written."""
        with self._exclusive("load_state"):
            self._check_complete(state, "setup")
            extents = self.extents_of(state)
            entry0 = self.executable.plan.catalog[0]
            for r, spec in entry0.regions.items():
                axis = self.layout.slot(r).axis
                if r in extents and axis is not None and extents[r] != spec.shape[axis]:
                    raise CadenceError(f"setup left {r} at {extents[r]} along axis {axis}; "
                                       f"catalog entry 0 expects {spec.shape[axis]}")
            self._write_state(state, extents)
            self._broken = None

    @torch.no_grad()  # streaming state never records autograd history; grad mode is restored after
    def step(self, inputs: Mapping[str, torch.Tensor], **flags: Any) -> dict[str, torch.Tensor]:
        """One streaming step: ``inputs`` by name -> the outputs by name (fresh tensors).

        Runs the catalog entry's program (graph or replay) on the state in place when the
        inputs and state fit its signature; otherwise, or with any flag set, the adapter's
        eager ``fallback`` on private copies (the reason counted in ``stats()``).
        ``InputError`` for a missing, non-tensor, misplaced, mistyped or misranked input
        (the state untouched)."""
        with self._exclusive("step"), working():  # a background build steps aside meanwhile
            self._check_usable("step")
            validate_inputs(self.executable.plan.inputs, self.executable.inputs, inputs, self._expect_device)
            self._before_step()
            entry = self._entry()
            if any(flags.values()):
                reason = "flags " + ",".join(k for k, v in flags.items() if v) + " outside the catalog (eager)"
            elif entry is None:
                reason = "state extents outside the catalog"
            else:
                reason = self._admit(entry, inputs)
            if reason is None:
                return self._step_program(entry, inputs)
            variant, why = self._variant(entry, inputs, flags)
            if variant is not None:
                return self._run_program(variant[1], variant[0].label(), inputs)
            return self._step_fallback(inputs, flags, reason if why is None else f"{reason} (not specialized: {why})")

    @torch.no_grad()
    def snapshot(self) -> SessionSnapshot:
        """A copy of the carried state (live extents) and the clock position, for ``restore``."""
        with self._exclusive("snapshot"):
            self._check_usable("snapshot")
            state = {r: t.clone() for r, t in self._live_state().items()}
            return SessionSnapshot(self.executable.plan, self.executable.stable_state, state,
                                   {r: self.extents.get(r) for r in self.executable.carried})

    @torch.no_grad()
    def restore(self, snapshot: SessionSnapshot) -> None:
        """Put a snapshot's state and clock position back (in place: addresses and graphs
        stay valid); the snapshot stays usable.  Clears a broken mark (``SessionBroken``).

        ``snapshot`` must come from a session of this executable (the same plan and
        state placement), this one or another."""
        with self._exclusive("restore"):
            if self.closed:
                raise SessionClosed("this session is closed (close() was called); restore() needs an open session")
            if not isinstance(snapshot, SessionSnapshot):
                raise InputError(f"restore() takes what snapshot() returned, got {type(snapshot).__name__}")
            why = snapshot.mismatch(self.executable.plan, self.executable.stable_state, self.executable.carried,
                                    self._expect_device)
            if why is not None:
                raise InputError(f"this snapshot does not belong to this session's executable: {why}; restore it "
                                 f"into a session of the same model, stream configuration and rules")
            self._write_state(snapshot.state, snapshot.extents)
            self._broken = None

    @property
    def broken(self) -> BaseException | None:
        """The error a step failed with part-way (the state is undefined), else ``None``."""
        return self._broken

    def state(self) -> dict[str, torch.Tensor]:
        """Live views of the carried regions (no copies); ``SessionBroken`` if a step broke them."""
        self._check_usable("state", closed_ok=True)
        return self._live_state()

    def adopt_setup(self, unused: "Session") -> None:
        """Take ``unused``'s compile seconds if it never stepped and this session compiled
        nothing (a drop-in's first stream, replaced by ``reset()``, paid for this one)."""
        mine, theirs = self._stats.setup, unused._stats.setup
        if unused._stats.steps or not theirs.compiled or mine.compiled:
            return
        self._stats.setup = dataclasses.replace(theirs, capture_s=mine.capture_s)
        unused._stats.setup = dataclasses.replace(SetupTimes(), capture_s=theirs.capture_s)

    def stats(self) -> dict:
        """Steps, graph and replay runs per entry (and per specialization, by its label), fallbacks
        by reason, ``setup_s`` (``SetupTimes``) and, where the executable keeps specializations,
        ``specializations``: its policy, bounds, what it holds and refused, and what this session
        captured (seconds per label).  Under replay, ``graph_rng``: ``"session"`` (its graphs draw from
        a generator state of their own) or ``"default"`` (this PyTorch lacks the graph-safe generator
        API); ``capture_retried``; ``captured_again`` (per entry or label: captures an out of memory cut
        short, made again, ``runtime/midstream.py``); ``graph_pools_renewed`` (fresh pools taken after failed captures,
        ``graphs.GraphPool``); ``static_copies``: the bytes its shared calls' copy buffers hold and how
        often one grew; ``capture_streams``: the process's (``runtime/streams.py``: made, free per device)."""
        out = self._stats.to_json()
        if self._programs is not None and self._expect_device.type == "cuda":
            out["graph_rng"] = "session" if self._rng is not None else "default"
            from .graphs import retried_regions
            out["capture_retried"] = retried_regions(self._programs, self._variant_programs)
            out["captured_again"] = dict(self._recaptures.done)
            out["graph_pools_renewed"] = getattr(self._pool, "renewed", 0)
            copies = getattr(self._pool, "copies", None)
            out["static_copies"] = {"bytes": copies.held_bytes, "grown": copies.grown} if copies else {}
            out["capture_streams"] = streams.stats()
        if self.executable.variants is not None:
            out["specializations"] = {**self.executable.variants.stats(),
                                      "captured_here_s": dict(self._variant_capture_s)}
        return out

    @property
    def state_bytes(self) -> int:
        """Device memory this session holds for its state."""
        return self.arena.nbytes

    def idle(self, seconds: float | None = None) -> list[int]:
        """Use time between chunks for work a chunk would otherwise pay (``PendingSession``:
        capturing the entries its build handed over; here and there, the executable's work
        ahead, ``Variants.work_ahead``: a capacity stream's checks of the shared window and
        flush graphs held, at its length, and its own programs of shapes of another branch
        class, captured here under replay; then a full garbage collection that is due,
        ``collector.collect_if_due``).  ``seconds``: None (no bound) or the time to use,
        checked between items (one item may run past it).  Returns the entries captured: here
        only those memory cut short at set-up, once due again (``runtime/midstream.py``)."""
        check_idle_seconds(seconds)
        t0 = time.perf_counter()
        with self._exclusive("idle"):
            self._check_usable("idle")
            done = self._capture_idle(seconds, t0)
            self._work_ahead(time_left(seconds, t0))
        collector.collect_if_due(time_left(seconds, t0))
        return done

    def _work_ahead(self, seconds: float | None) -> int:
        """(Inside ``_exclusive``.)  The executable's work ahead of later chunks (``Variants.work_ahead``),
        then, under replay, this session's capture of each program built there (``Variants.built_ahead``:
        as its first chunk would capture it, ``_session_variant``), ``seconds`` at most (looked at
        between items).  Returns the items done."""
        variants = self.executable.variants
        if variants is None:
            return 0
        t0 = time.perf_counter()
        done = variants.work_ahead(seconds)
        for key, program, inputs in variants.built_ahead() if self.gate is not None else ():
            if program.kind != "cudagraph" or self._recaptures.keeps(key, self._variant_programs):
                continue
            if seconds is not None and time.perf_counter() - t0 >= seconds:
                break
            mine, why = self._session_variant(key, program, inputs)
            if why == device_work.DEFERRED:  # a build's device work: a later idle's
                break
            done += mine is not None
        return done

    def close(self) -> None:
        """Refuse every later step (``SessionClosed``); a step already running finishes.  With
        none running, its capture stream goes back (``runtime/streams.py``; else when collected)."""
        self.closed = True
        if self._give_stream is not None and self._busy.acquire(blocking=False):
            self._give_stream()  # (a list append: nothing to fail between acquire and release)
            self._capture_stream = self._give_stream = False  # another session's now: never captured on here
            self._busy.release()

    def _own_capture_stream(self):
        """This session's capture stream, taken on first need: no other live session's (``runtime/streams.py``)."""
        if self._capture_stream is False:
            raise SessionClosed("this session is closed and its capture stream went back for other sessions; open a "
                                "new session to capture")
        if self._capture_stream is None:
            self._capture_stream = streams.take(self._expect_device)
            self._give_stream = streams.held(self, self._expect_device, self._capture_stream)
        return self._capture_stream

    def _must_warm_up(self, stream) -> bool:
        """Whether a capture on this session's ``stream`` runs its regions eagerly first (both
        capture paths ask here): not where this thread warmed it (``streams.is_warm``) or primes it."""
        return streams.needs_warm_up(stream, self._expect_device.type == "cuda", self._warmed)

    def _warmed_up(self, stream) -> None:
        self._warmed = True
        if self._expect_device.type == "cuda":  # and for later sessions on this thread
            streams.warmed(stream)

    # ------------------------------------------------------------- one step
    def _before_step(self) -> None:
        """Runs at the start of every step, inside its exclusive section (a hook:
        ``runtime.pending`` takes its executable here, at a chunk boundary)."""

    def _step_program(self, entry: CatalogEntry, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The entry's graph (or replay) on the state in place; a failure part-way breaks the session."""
        return self._run_program(self._program(entry.index), entry.index, inputs)

    def _run_program(self, program: EntryProgram, label: "int | str",
                     inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``program`` on the state in place, counted under ``label`` (an entry, or a specialization)."""
        args = program.arguments(inputs, self.executable.inputs, self._state_args(program))
        try:
            if program.kind == "cudagraph":
                from .graphs import region_stats
                before = region_stats(program.run)
                with program.entered():
                    result = tuple(t.clone() for t in program.run(*args))  # static outputs: copy before the next replay
                after = region_stats(program.run)
            else:
                with program.entered():
                    result = program.run(*args)
            outputs = self._commit(program, result)
        except BaseException as e:
            self._break(e)
            raise
        if program.kind == "cudagraph":  # counted once the step is done
            for why, n in after[1].items():
                for _ in range(n - before[1].get(why, 0)):
                    self._stats.count_fallback(f"region refused replay: {why}")
            counter = self._stats.replays if after[0] > before[0] else self._stats.graph_runs
            counter[label] += 1
        else:
            self._stats.graph_runs[label] += 1
        self._stats.steps += 1
        return outputs

    def _variant(self, entry: CatalogEntry | None, inputs: Mapping[str, torch.Tensor],
                 flags: Mapping[str, Any]) -> tuple[tuple[VariantKey, EntryProgram] | None, str | None]:
        """A specialization for a chunk the catalog does not hold (flags set, other input
        shapes, or state off the catalog): ``((key, program), None)``, or ``(None, why not)``
        (``why`` None where the chunk is not an off-catalog one, e.g. the arena moved)."""
        variants = self.executable.variants
        if variants is None or self.gate is None:
            return None, None
        off = any(flags.values()) or entry is None or input_mismatch(entry, inputs) is not None
        if not off:
            return None, None
        try:
            key = VariantKey.of(None if entry is None else entry.index, self.extents, self.executable.carried,
                                inputs, self.executable.inputs, flags)
        except VariantRefused as e:
            return None, str(e)
        program, why = variants.get(key, inputs)
        if program is None:
            return None, None if variants.policy == "eager" else why
        why = self.gate.check(program.entry, inputs, self.extents)
        if why is not None:
            return None, why
        mine, why = self._session_variant(key, program, inputs)
        return (None, why) if mine is None else ((key, mine), None)

    def _step_fallback(self, inputs: Mapping[str, torch.Tensor], flags: Mapping[str, Any],
                       reason: str) -> dict[str, torch.Tensor]:
        """``fallback`` on private copies of the live state: if it raises, or returns a
        state that does not fit, the session's state is as it was."""
        outputs, new_state = self.fallback(inputs, self._private_state(), **flags)
        self._check_complete(new_state, "eager step")
        self._write_state(new_state, self.extents_of(new_state))
        self._stats.count_fallback(reason)
        self._stats.steps += 1
        return outputs

    @contextlib.contextmanager
    def _exclusive(self, what: str) -> Iterator[None]:
        if not self._busy.acquire(blocking=False):
            raise SessionBusy(f"{what}() was called while another call is running on this session (another "
                              f"thread?): a session runs one step at a time and never waits; wait for the "
                              f"running call to return, or give each concurrent stream its own session")
        try:
            yield
        finally:
            self._busy.release()

    def _check_usable(self, what: str, closed_ok: bool = False) -> None:
        if self.closed and not closed_ok:
            raise SessionClosed("this session is closed (close() was called); open a new session to stream again")
        if self._broken is not None:
            e = self._broken
            raise SessionBroken(f"{what}() refused: a step of this session failed part-way with "
                                f"{type(e).__name__}: {e}, so its state is undefined; restore(snapshot) or "
                                f"load_state(state) before using it again, or open a new session") from e

    def _break(self, error: BaseException) -> None:
        self._broken = error

    def _check_complete(self, state: Mapping[str, torch.Tensor], what: str) -> None:
        missing = [r for r in self.executable.carried if r not in state]
        if missing:
            raise CadenceError(f"{what} returned no state for region {missing[0]!r}")

    # ------------------------------------------- where the state lives (arena here)
    def _live_state(self) -> dict[str, torch.Tensor]:
        return {r: self.arena.view(r, self.extents.get(r)) for r in self.executable.carried}

    def _private_state(self) -> dict[str, torch.Tensor]:
        """Copies of the live views with their strides (the fallback sees the arena's layouts: the same kernels)."""
        return {r: copy_strided(view) for r, view in self._live_state().items()}

    def _admit(self, entry: CatalogEntry, inputs: Mapping[str, torch.Tensor]) -> str | None:
        why = self._gate_check(entry, inputs)
        return why if why is not None or self._programs is None else self._entry_ready(entry.index, inputs)

    def _gate_check(self, entry: CatalogEntry, inputs: Mapping[str, torch.Tensor]) -> str | None:
        return self.gate.check(entry, inputs, self.extents)

    def _state_args(self, program: EntryProgram) -> list[torch.Tensor]:
        return [self.arena.full(n) for n in program.arena_inputs]

    _capture_state_args = _state_args

    def _bound_storage(self) -> int | None:
        """Address of the storage whose views replays bind by address (the arena)."""
        return self.arena.storage.data_ptr()

    def _reset_state(self) -> None:
        self.arena.storage.zero_()

    def _commit(self, program: EntryProgram, result: tuple) -> dict[str, torch.Tensor]:
        """The program already wrote the next state into the arena."""
        self.extents.update(program.next_extents)
        return dict(zip(self.executable.outputs, result))

    def _write_state(self, state: Mapping[str, torch.Tensor], extents: Mapping[str, int | None]) -> None:
        # Check every region fits before writing any, so a bad step loses no state.
        writes = {}
        for r in self.executable.carried:
            t = state[r]
            full = self.arena.full(r)
            axis = self.layout.slot(r).axis
            want = list(full.shape)
            if axis is not None:
                if t.shape[axis] > full.shape[axis]:
                    raise CadenceError(f"eager step grew region {r!r} to {t.shape[axis]} along axis {axis}, past "
                                       f"its arena capacity {full.shape[axis]}; the declared retention is too small")
                want[axis] = t.shape[axis]
            if list(t.shape) != want:
                raise CadenceError(f"eager step returned region {r!r} of shape {tuple(t.shape)}; "
                                   f"the arena holds {tuple(want)}")
            view = self.arena.view(r, extents[r])
            if view.data_ptr() == t.data_ptr() and view.stride() == t.stride():
                continue  # already written in place (e.g. setup on arena-bound buffers)
            if t.untyped_storage().data_ptr() == full.untyped_storage().data_ptr():
                t = t.clone()  # written from its own memory: read it out first
            writes[r] = view, t
        # an arena made under inference mode (the drop-ins set streams up in it) takes in-place
        # writes only there; restore()/load_state() may be called from outside it
        inference = self.arena.storage.is_inference()
        try:  # from here on only the copies: the one window in which a failure leaves part written
            with torch.inference_mode(inference):
                for view, t in writes.values():
                    view.copy_(t)
            self.extents.update(extents)
        except BaseException as e:  # interrupted part-way (e.g. KeyboardInterrupt): some regions written
            self._break(e)
            raise

    # ----------------------------------------------------------------- private
    def _program(self, index: int) -> EntryProgram:
        if self._programs is not None:
            return self._programs[index]
        program = self.executable.programs[index]
        if program.kind == "cudagraph":
            raise CadenceError("replay programs need prepare_replay() on the session first")
        return program

    def _entry(self) -> CatalogEntry | None:
        for entry in self.executable.plan.catalog:
            if all(self.extents.get(r) is None or
                   spec.shape[self.layout.slot(r).axis] == self.extents[r]
                   for r, spec in entry.regions.items() if self.layout.slot(r).axis is not None):
                return entry
        return None

    def extents_of(self, state: Mapping[str, torch.Tensor]) -> dict[str, int | None]:
        """Each carried region's extent along its growth axis in ``state`` (None for fixed-shape
        regions): the clock position a ``SessionSnapshot`` of that state records."""
        axes = {r: self.layout.slot(r).axis for r in self.executable.carried}
        return {r: None if axis is None else state[r].shape[axis] for r, axis in axes.items()}
