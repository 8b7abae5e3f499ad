"""What a background build must leave to the foreground thread: the random generators,
and most of the host while a chunk runs.

A drop-in with ``background=True`` builds a new stream configuration's executable on
a worker thread while the stream already runs the exact eager path
(``runtime.pending``).  The build must not touch anything the foreground's chunks
depend on, and the one such thing the compile path touches is the global random
generators: every place that runs the step for real (a concrete trace, the hazard
check's full run, a table the model moves on first use) forks them
(``torch.random.fork_rng``), saving their states and putting them back at its end.
On a worker thread that put-back would rewind the foreground's generator between two
of its draws (a vocoder that draws noise every chunk), and its next chunk would
repeat numbers: a wrong chunk.

- ``forked_rng(devices, what)``: ``torch.random.fork_rng`` in the foreground;
  ``NeedsForeground`` on a thread inside ``background()``.
- ``background()``: marks the worker's block, and refuses (a dispatch mode on that
  thread only) any random op that would draw from a default generator; an op given
  its own ``generator=`` draws from that one, which is allowed, and so is one on fake
  or meta tensors (a symbolic trace's), which runs no kernel and draws nothing.

A refused build costs nothing but speed: its stream stays on the eager path (the
reason counted) and the configuration's next set-up builds in the foreground.

The host.  A build is Python (tracing, specializing, the passes) and shares the
interpreter lock with the stream's chunks; an eager chunk on a GPU is Python too (its
kernels take a fraction of its time), and every op it dispatches hands the lock over.
On the H200 an eager Token2Wav chunk took 0.86-1.13 s beside a build against 0.2 s
alone (paced traffic, 2026-12-02): four voices a second apart then queued seconds of
chunks behind each other.  So a build steps aside:

- ``working()``: the foreground runs a chunk or a set-up (``Session.step``, the
  model's set-up); the count of such blocks is process-wide.
- ``make_way()``: a build's yield point (each op the build dispatches, each pass, each
  entry).  While any foreground block runs, a build that has run for ``SLICE_S`` since
  the block began, since the build began, or since its last pause pauses, until no block runs or for
  ``ran * (1 - share) / share`` seconds: it takes at most ``share`` of the host's time
  while chunks run (``set_build_share``; 1.0: never pauses, as before 2026-12-03), and
  all of it between chunks.  Never a deadlock: a pause always ends.  Between two yield
  points a build cannot pause (one recompile of a large graph: a few hundred ms).
- A build is never starved: its share doubles for every ``HELD_DOUBLING_S`` it has paused
  (``held_share``), so under load that never lets up it reaches the whole host after
  ``log2(1 / share) * HELD_DOUBLING_S`` of pauses (~6.6 s at 0.1) and lands.  On the H200,
  8 voices a second apart at a fixed share 0.1 kept every build paused for the whole run
  (replayed share 0.155, every chunk eager); at 1.0, every chunk beside a build slowed
  (session twenty-three, ``docs/results``).
- ``backlog()``: builds that queue back to back (a ``BuildQueue`` thread's life: it ends
  when nothing is queued) count their pauses together, so a build that waited behind
  held-back builds does not start again from ``share``.  Each build restarting at 0.1 kept
  8 paced voices on the H200 starved at a rising share that never rose far (replayed 0.17,
  session thirty-two): the load that held the first build back still holds.  Once the
  queue empties the next build starts from ``share`` again.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .errors import NeedsForeground

_LOCAL = threading.local()


def in_background() -> bool:
    """Whether this thread is running a background build."""
    return getattr(_LOCAL, "depth", 0) > 0


def forked_rng(devices: Sequence, what: str):
    """``torch.random.fork_rng(devices=devices)``; in a background build, ``NeedsForeground``
    naming ``what`` (the work that would run the step for real)."""
    if in_background():
        raise NeedsForeground(f"{what} runs the step for real, which forks the global random generators: "
                              f"only the foreground may")
    return torch.random.fork_rng(devices=list(devices))


def fenced(devices: Sequence, what: str, runs_for_real: bool = True):
    """What guards the global generators around compile work: ``forked_rng`` where the work
    runs the step for real (a concrete trace: ``NeedsForeground`` in a build).  Work that
    runs nothing for real (the passes on a specialized graph; a symbolic trace, whose ops
    all run on fake tensors) is not forked in a build, where the fork's restore would
    rewind the stream's generator: the build's own fence (``background()``) refuses any
    real draw there.  In the foreground it is forked all the same (whatever the step's
    Python might do to the generators is undone)."""
    if not runs_for_real and in_background():
        return contextlib.nullcontext()
    return forked_rng(devices, what)


def _own_generator(args, kwargs) -> bool:
    return kwargs.get("generator") is not None or any(isinstance(a, torch.Generator) for a in args)


def _runs_for_real(args, kwargs) -> bool:
    """Whether an op on these arguments runs a real kernel.  Not under a fake-tensor mode
    (a symbolic trace's: it runs every op, a random one too, on meta tensors, and never
    propagates a random op's constants), nor on fake or meta tensors: those draw nothing."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    if any(isinstance(m, FakeTensorMode) for m in _get_current_dispatch_mode_stack()):
        return False
    tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
    if tensors:
        return any(not isinstance(t, FakeTensor) and t.device.type != "meta" for t in tensors)
    device = kwargs.get("device")
    return device is None or torch.device(device).type != "meta"


class _NoDefaultDraws(TorchDispatchMode):
    """Refuses, on the thread it is entered on, every random op that has no generator of
    its own and would run for real (on fake or meta tensors it draws nothing)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        make_way()
        if torch.Tag.nondeterministic_seeded in func.tags and not _own_generator(args, kwargs) \
                and _runs_for_real(args, kwargs):
            raise NeedsForeground(f"{func} would draw from a default random generator")
        return func(*args, **kwargs)


@contextlib.contextmanager
def background() -> Iterator[None]:
    """This thread runs a background build for the block (see the module docstring)."""
    if not in_background():
        _LOCAL.ran_since = time.perf_counter()  # a new build has run for nothing yet (make_way's slice)
        if not getattr(_LOCAL, "backlog", False):
            _LOCAL.build_yielded_from = yielded_s()  # a new build: held back for nothing yet
    _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
    try:
        with _NoDefaultDraws():
            yield
    finally:
        _LOCAL.depth -= 1


@contextlib.contextmanager
def backlog() -> Iterator[None]:
    """The builds this thread runs in the block queue back to back: their pauses count
    together for ``held_share`` (see the module docstring), from the block's start."""
    outer = getattr(_LOCAL, "backlog", False)
    if not outer:
        _LOCAL.build_yielded_from = yielded_s()
    _LOCAL.backlog = True
    try:
        yield
    finally:
        _LOCAL.backlog = outer


#: the share of the host's time a background build takes while a foreground chunk or set-up runs
DEFAULT_BUILD_SHARE = 0.1
#: how long a build runs, while the foreground works, before ``make_way`` pauses it
SLICE_S = 0.002
#: a build's share doubles for every this many seconds it has paused (``held_share``)
HELD_DOUBLING_S = 2.0

_share = DEFAULT_BUILD_SHARE
_working = 0  # foreground blocks running now (every thread's)
_working_since = 0.0  # when the count last went from 0 to 1
_WORK = threading.Condition()


def check_build_share(share) -> float:
    """``share`` as a float in (0, 1]; ``ValueError`` naming it otherwise."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ValueError(f"build share {share!r} must be a number in (0, 1]: the share of the host's time a "
                         f"background build takes while a chunk runs (1: it never steps aside)")
    return float(share)


def set_build_share(share: float) -> float:
    """Process-wide (the interpreter lock is): the share of the host's time a background
    build takes while a chunk or set-up runs.  Returns the share it replaces."""
    global _share
    share = check_build_share(share)
    with _WORK:
        old, _share = _share, share
    return old


def build_share() -> float:
    """The share ``set_build_share`` set (``DEFAULT_BUILD_SHARE`` until then)."""
    return _share


@contextlib.contextmanager
def working() -> Iterator[None]:
    """(A foreground thread.)  A chunk or a set-up runs for the block: builds step aside."""
    global _working, _working_since
    with _WORK:
        if _working == 0:
            _working_since = time.perf_counter()
        _working += 1
    try:
        yield
    finally:
        with _WORK:
            _working -= 1
            if _working == 0:
                _WORK.notify_all()


def working_count() -> int:
    """How many foreground blocks (``working``) run now, on every thread."""
    return _working


def held_share(share: float, held_s: float) -> float:
    """The share of a build that has paused ``held_s`` seconds so far: ``share`` doubled for
    every ``HELD_DOUBLING_S`` of it, at most 1 (pure; the module docstring says why)."""
    doublings = held_s / HELD_DOUBLING_S
    return 1.0 if doublings >= 64 else min(1.0, share * 2.0 ** doublings)


def make_way() -> None:
    """A build's yield point; nothing on any other thread, or while no foreground block runs
    (see the module docstring)."""
    if not _working or _share >= 1.0 or not in_background():
        return
    now = time.perf_counter()
    ran = now - max(getattr(_LOCAL, "ran_since", 0.0), _working_since)
    if ran < SLICE_S:
        return
    share = held_share(_share, yielded_s() - _LOCAL.build_yielded_from)
    if share >= 1.0:
        return
    with _WORK:
        _WORK.wait_for(lambda: not _working, ran * (1.0 - share) / share)
    _LOCAL.ran_since = time.perf_counter()
    _LOCAL.yielded_s = yielded_s() + _LOCAL.ran_since - now


def yielded_s() -> float:
    """Seconds this thread's builds have paused in ``make_way`` so far."""
    return getattr(_LOCAL, "yielded_s", 0.0)
