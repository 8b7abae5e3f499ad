"""A stream that starts before its executable exists: eager until a background build lands.

A new stream configuration (a speech decoder: a voice prompt of a length not seen yet)
needs an executable: specialize every catalog entry, run the passes, and under
replay capture the graphs, seconds of host work.  With ``background=True`` a
drop-in does not make the stream wait for it:

1. ``Build`` will run the compile on the drop-in's worker thread, inside
   ``foreground.background()`` (it must not touch the random generators the stream
   draws from) and holding ``device_work.LOCK`` (no capture while it touches the
   device).  The plan needs no trace, so
2. ``PendingSession`` is opened at once on an arena of that plan: the prompt's
   set-up runs and is loaded as in any session, and every chunk runs the exact eager
   path (``adapter.fallback`` on the arena's state, counted as ``WAITING``).  The
   build starts once the first chunk is out: the set-up and the first chunk (the
   time to first audio) run as stock's do, without a build beside them.
3. The build hands over each catalog entry's program as soon as it is done
   (``Build.publish``), the steady entry first: by the time a build runs the stream
   is past its warm-up, and every chunk from the third on until a turn's end is the
   steady entry's.  At each chunk boundary the session takes the programs that
   landed: same plan, so the same arena layout, and the state stays where it is.  A
   chunk whose entry has landed runs its program; the others stay eager (counted as
   ``WAITING``) until theirs do.  When the whole build is done the session takes the
   executable (its off-catalog programs too).  Under replay rules each entry's graphs
   are captured on this arena the first time a chunk needs them, between chunks,
   with the live state saved and put back (as an off-catalog specialization's
   capture is); if a build holds the device lock then, that chunk runs eagerly
   and the capture is tried at the next one.
4. A build that fails (``NeedsForeground``: it would have had to run the step for
   real; or any error) leaves the stream eager for its whole life, with the reason
   counted: never a wrong chunk, never a stall.  The drop-in builds that
   configuration in the foreground at its next set-up (and raises there if the
   error is the model's).

The drop-in's worker is a ``BuildQueue``: one build at a time, a stream
configuration's before any off-catalog program's (``runtime.variants``).

``stats()["background"]`` says whether and when the session took its executable,
how long the build queued and ran, and why chunks still run eagerly.

The worker shares the interpreter with the stream.  Every torch op releases the GIL
while it dispatches, and CPython hands it back to a waiting thread only at its switch
interval (5 ms by default): with a build running, each op of the stream's eager
chunks waited up to 5 ms for the worker, so an eager prompt set-up took as long as
the build (measured on the H200, 2026-12-02).  While any build runs the interval is
``SWITCH_INTERVAL_S`` (process-wide, as the interval is; restored when the last build
ends, unless someone else changed it meanwhile).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import heapq
import itertools
import sys
import threading
import time
from typing import Any, Callable, Mapping

import torch

from ..foreground import background, backlog, make_way, yielded_s
from ..plan import CatalogEntry
from . import collector, device_work
from .counters import SetupTimes
from .session import Executable, Session, check_idle_seconds, time_left

#: the counted reason of a chunk that ran before its executable was ready
WAITING = "building in the background (eager until ready)"
#: a ``BuildQueue`` rank: a stream configuration's build (a new voice: every later chunk of it runs its programs)
CONFIGURATION = 0
#: a ``BuildQueue`` rank: one off-catalog chunk shape's program (a window or flush length: rarely seen again)
OFF_CATALOG = 1
#: CPython's thread switch interval while a build runs (see the module docstring)
SWITCH_INTERVAL_S = 2e-5

_SWITCH_LOCK = threading.Lock()
_switch_depth = 0
_switch_saved = 0.005
_switch_ours = SWITCH_INTERVAL_S  # as the interpreter reads it back (microseconds)


@contextlib.contextmanager
def quick_switches() -> "contextlib.AbstractContextManager[None]":
    """``sys.setswitchinterval(SWITCH_INTERVAL_S)`` while any block of these runs."""
    global _switch_depth, _switch_saved, _switch_ours
    with _SWITCH_LOCK:
        if _switch_depth == 0:
            _switch_saved = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL_S)
            _switch_ours = sys.getswitchinterval()
        _switch_depth += 1
    try:
        yield
    finally:
        with _SWITCH_LOCK:
            _switch_depth -= 1
            if _switch_depth == 0 and sys.getswitchinterval() == _switch_ours:
                sys.setswitchinterval(_switch_saved)


class BuildQueue(concurrent.futures.Executor):
    """A drop-in's build worker: one thread that runs the submitted builds one at a time,
    the lowest rank first and, within a rank, in the order they came.

    A stream configuration's build (``CONFIGURATION``) serves every later chunk of its
    streams; an off-catalog program (``OFF_CATALOG``) serves one chunk shape, which real
    traffic rarely sends twice (a turn-end window or a flush of a given length, at a given
    voice).  First come, first served let the latter hold a new voice's build back: on the
    H200, eight voices arriving a second apart queued 36 window and flush builds beside
    their own 8 (paced traffic, 2026-12-02).  An off-catalog build waits while any
    configuration's is queued.  The thread ends when nothing is queued (the next submit
    starts another), and is not a daemon: the interpreter's exit waits for the build
    that runs, as ``concurrent.futures.ThreadPoolExecutor``'s does.  The builds one thread
    runs queued back to back, so they step aside for the foreground on one clock
    (``foreground.backlog``): a build that waited behind held-back builds does not start
    again from the lowest share."""

    def __init__(self, name: str = "cadence-fx-build"):
        self._name = name
        self._cv = threading.Condition()
        self._heap: list[tuple] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._shut = False

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        """``fn(*args, **kwargs)`` at rank ``CONFIGURATION``."""
        return self.submit_ranked(CONFIGURATION, fn, *args, **kwargs)

    def submit_ranked(self, rank: int, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        """``fn(*args, **kwargs)`` after every build queued at a lower rank, or at this rank before it."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._shut:
                raise RuntimeError("this build queue is shut down")
            heapq.heappush(self._heap, (rank, next(self._order), future, fn, args, kwargs))
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self._name)
                self._thread.start()
            self._cv.notify()
        return future

    def queued(self) -> list[int]:
        """The ranks of the builds waiting for the thread, in the order they will run."""
        with self._cv:
            return [item[0] for item in sorted(self._heap, key=lambda item: item[:2])]

    def _work(self) -> None:
        with backlog():  # builds queued back to back share one held-back clock (foreground.py)
            self._drain()

    def _drain(self) -> None:
        while True:
            with self._cv:
                if not self._heap:
                    self._thread = None  # a later submit starts another
                    self._cv.notify_all()
                    return
                _, _, future, fn, args, kwargs = heapq.heappop(self._heap)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:  # as ThreadPoolExecutor's work items: the caller reads it
                future.set_exception(e)
            else:
                future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cv:
            self._shut = True
            if cancel_futures:
                for item in self._heap:
                    item[2].cancel()
                self._heap.clear()
            thread = self._thread
        if wait and thread is not None:
            thread.join()


class Build:
    """One executable compiled on a worker thread: ``run()`` under the foreground fence,
    with the caller's grad and inference modes, holding the device lock.

    It is submitted to the worker by ``start()`` (idempotent), which a ``PendingSession``
    calls once its first chunk is out: the prompt's set-up and the first chunk, what
    the time to first audio is made of, never share the interpreter with a build of
    their own.  ``wait`` starts it too."""

    def __init__(self, label: str, run: Callable[[], Executable], executor: concurrent.futures.Executor,
                 rank: int = CONFIGURATION):
        self.label = label
        self.rank = rank  # its place in a ``BuildQueue`` (another executor runs builds as they come)
        self._landed: dict[int, Any] = {}  # entry index -> its program, as the build hands them over
        self.submitted: float | None = None
        self.started: float | None = None
        self.finished: float | None = None
        self.yielded: float | None = None  # seconds it stepped aside for chunks (``foreground.make_way``)
        self._grad, self._inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
        self._pending: tuple | None = (run, executor)
        self._future: concurrent.futures.Future = concurrent.futures.Future()
        self._start_lock = threading.Lock()

    def start(self) -> None:
        """Submit the build to the worker (once; later calls do nothing)."""
        with self._start_lock:
            if self._pending is None:
                return
            (run, executor), self._pending = self._pending, None
            self.submitted = time.perf_counter()
            if isinstance(executor, BuildQueue):
                self._future = executor.submit_ranked(self.rank, self._run, run, self._grad, self._inference)
            else:
                self._future = executor.submit(self._run, run, self._grad, self._inference)

    def _run(self, run: Callable[[], Executable], grad: bool, inference: bool) -> Executable:
        with device_work.LOCK, quick_switches():  # no capture while the build touches the device
            self.started, yielded = time.perf_counter(), yielded_s()
            try:
                with background(), torch.inference_mode(inference), torch.set_grad_enabled(grad):
                    return run()
            finally:
                self.finished, self.yielded = time.perf_counter(), yielded_s() - yielded

    def done(self) -> bool:
        return self._future.done()

    def publish(self, index: int, program: Any) -> None:
        """(The build's thread.)  Entry ``index``'s program is done: streams may run it now."""
        self._landed = {**self._landed, index: program}  # one reference swap: readers see old or new
        device_work.yield_to_captures()  # a stream may capture what landed before the build goes on
        make_way()

    def landed(self) -> dict[int, Any]:
        """The entries' programs handed over so far (index -> program)."""
        return self._landed

    def wait(self, timeout: float | None = None) -> bool:
        """Start the build if no chunk did yet, and block until it is done (or ``timeout``
        seconds); returns whether it is."""
        self.start()
        with self._start_lock:
            future = self._future
        concurrent.futures.wait([future], timeout)
        return self._future.done()

    def error(self) -> BaseException | None:
        """What the build raised (``None`` while it runs, or when it succeeded)."""
        return self._future.exception() if self._future.done() else None

    def result(self) -> Executable:
        return self._future.result()

    def times(self) -> dict[str, float | None]:
        """Seconds it waited for the worker (``queued_s``), ran (``build_s``) and, of those,
        stepped aside for the foreground's chunks and set-ups (``yielded_s``); None until known."""
        queued = None if self.started is None or self.submitted is None else round(self.started - self.submitted, 3)
        ran = None if self.finished is None or self.started is None else round(self.finished - self.started, 3)
        return {"queued_s": queued, "build_s": ran,
                "yielded_s": None if self.yielded is None else round(self.yielded, 3)}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


class PendingSession(Session):
    """A ``Session`` on a plan-only executable (``shell``: no programs) that takes
    ``build``'s executable at the first step after it is done (module docstring)."""

    def __init__(self, shell: Executable, arena, fallback, build: Build,
                 example_inputs: Mapping[str, torch.Tensor] | None = None):
        super().__init__(shell, arena, fallback, {})
        self.build = build
        self._example_inputs = example_inputs  # what ``idle`` captures an entry on (as prepare_replay does)
        self._idle_captured: list[int] = []
        self._idle_s = 0.0
        self._eager_reason: str | None = WAITING  # None once the programs may run
        self._taken_at_step: int | None = None
        self._first_program_at_step: int | None = None  # when the first landed entry was taken

    def step(self, inputs: Mapping[str, torch.Tensor], **flags: Any) -> dict[str, torch.Tensor]:
        try:
            return super().step(inputs, **flags)
        finally:  # the first chunk is out (or refused): the build may share the interpreter now
            self.build.start()

    def _before_step(self) -> None:
        if self._eager_reason != WAITING:
            return
        if not self.build.done():
            self._take_landed()
            return
        error = self.build.error()
        if error is not None:
            self._eager_reason = f"background build failed: {_first_line(error)}"
            return
        exe = self.build.result()
        if exe.plan != self.executable.plan or exe.carried != self.executable.carried:
            self._eager_reason = "background build made another plan than the session's (not taken)"
            return
        # what was captured here of a program handed over early is kept: the executable holds
        # the same program (each capture was made of the shell's program at its index)
        kept = {i: p for i, p in (self._programs or {}).items()
                if exe.programs.get(i) is self.executable.programs.get(i)}
        self.executable = exe
        exe.drop_spare_arena()  # this session streams on its own arena; a later one makes its own
        self._stats.setup = dataclasses.replace(SetupTimes.from_compile(exe.claim_compile()),
                                                capture_s=self._stats.setup.capture_s)
        if any(p.kind == "cudagraph" for p in exe.programs.values()):
            self._programs = kept  # the others captured on this arena when a chunk first needs them
        self._taken_at_step = self._stats.steps
        if self._first_program_at_step is None:
            self._first_program_at_step = self._stats.steps
        self._eager_reason = None

    def _take_landed(self) -> None:
        """Put the entries' programs handed over so far on this session's plan-only executable."""
        landed = self.build.landed()
        if len(landed) == len(self.executable.programs):
            return
        for index, program in landed.items():
            if index not in self.executable.programs and program.entry == self.executable.plan.catalog[index]:
                self.executable.programs[index] = program
                if program.kind == "cudagraph" and self._programs is None:
                    self._programs = {}
        if self._first_program_at_step is None and self.executable.programs:
            self._first_program_at_step = self._stats.steps

    def _admit(self, entry: CatalogEntry, inputs: Mapping[str, torch.Tensor]) -> str | None:
        if entry.index not in self.executable.programs:  # not handed over yet
            return self._eager_reason or WAITING
        if self._eager_reason not in (None, WAITING):  # the build failed or was not taken
            return self._eager_reason
        return super()._admit(entry, inputs)  # captured here first where it is not yet (runtime/midstream.py)

    @torch.no_grad()  # as prepare_replay; the family wrappers (StreamSession.idle) add inference mode, as their steps
    def idle(self, seconds: float | None = None) -> list[int]:
        """Between chunks, on the caller's thread: take what the build handed over, and
        capture on this arena each landed entry this session has not captured yet, so that
        no later chunk pays that capture (a chunk that needs an uncaptured entry still
        captures it itself).  Never waits: it stops when a build holds the device (that
        build lets a capture in after its next entry), when ``seconds`` have passed
        (checked between entries: one capture may run past it), or when nothing is left;
        then the executable's work ahead (``Session.idle``) in the time left; then a full
        garbage collection that is due, if the time left allows
        (``collector.collect_if_due``).  Returns the entries captured;
        ``stats()["background"]`` sums them up (``captured_idle``, ``idle_s``)."""
        check_idle_seconds(seconds)
        t0 = time.perf_counter()
        done: list[int] = []
        with self._exclusive("idle"):
            self._check_usable("idle")
            self._before_step()
            if self._eager_reason not in (None, WAITING):
                return done
            done = self._capture_idle(seconds, t0)
            self._idle_captured.extend(done)
            self._work_ahead(time_left(seconds, t0))  # then the executable's work ahead of later chunks
            self._idle_s += time.perf_counter() - t0
        collector.collect_if_due(time_left(seconds, t0))  # a due full collection, where the budget allows
        return done

    def stats(self) -> dict[str, Any]:
        """``Session.stats()`` plus ``background``: ``taken`` (the executable is this
        session's now), ``taken_at_step`` (chunks that ran before it), ``queued_s`` and
        ``build_s`` (the worker's), ``eager_reason`` (why chunks run eagerly now, if they do),
        ``captured_idle`` (the entries ``idle`` captured) and ``idle_s`` (its seconds)."""
        out = super().stats()
        out["background"] = {"taken": self._eager_reason is None, "taken_at_step": self._taken_at_step,
                             "first_program_at_step": self._first_program_at_step,
                             "entries_landed": sorted(self.executable.programs),
                             "captured_idle": sorted(self._idle_captured), "idle_s": round(self._idle_s, 3),
                             **self.build.times(), "eager_reason": self._eager_reason}
        return out
