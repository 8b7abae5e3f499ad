"""Faults and in-flight steps on demand, through ``TorchDispatchMode``s (no sleeps).

A dispatch mode sees every aten op the thread that entered it runs (modes are
thread-local), in a fixed order for a given step, so "the n-th op" names one point
of a step deterministically:

* ``FaultAt(n, error)`` raises ``error`` instead of running op ``n`` (0-based): an
  out-of-memory, a ``KeyboardInterrupt``, ... part-way through a step.
* ``OpCounter`` counts the ops (and where the random draws are).
* ``in_flight(fn, hold_at)`` runs ``fn`` in a second thread that stops before its
  op ``hold_at`` (or right after its last random draw, ``hold_at="after_draws"``
  with the draw count) until the caller's ``with`` block ends: the main thread
  then acts while that call is certainly in flight.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: how long a held call or its caller waits before the test fails (never hangs CI)
WAIT_S = 300.0


def is_random(func) -> bool:
    """An op that draws from a generator (``aten.rand``, ``normal_``, ...)."""
    return torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())


class FaultAt(TorchDispatchMode):
    """Raise ``error`` in place of the ``n``-th op; ``fired`` says whether it did, ``func`` which op."""

    def __init__(self, n: int, error: BaseException):
        super().__init__()
        self.n, self.error, self.seen, self.fired = n, error, 0, False
        self.func = None  # the op it refused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        i, self.seen = self.seen, self.seen + 1
        if i == self.n:
            self.fired, self.func = True, func
            raise self.error
        return func(*args, **(kwargs or {}))


class OpCounter(TorchDispatchMode):
    """``ops``: how many ops ran; ``draws``: the indices of the random ones."""

    def __init__(self):
        super().__init__()
        self.ops, self.draws = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if is_random(func):
            self.draws.append(self.ops)
        self.ops += 1
        return func(*args, **(kwargs or {}))


class _Hold(TorchDispatchMode):
    """Stop before op ``n`` (or after the ``draws``-th random draw) until ``release`` is set."""

    def __init__(self, n: int | None, draws: int | None):
        super().__init__()
        self.n, self.draws, self.seen, self.drawn = n, draws, 0, 0
        self.reached, self.release = threading.Event(), threading.Event()
        self.held = False

    def _wait(self) -> None:
        self.held = True
        self.reached.set()
        if not self.release.wait(WAIT_S):
            raise TimeoutError("held step never released")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.n is not None and self.seen == self.n and not self.reached.is_set():
            self._wait()
        self.seen += 1
        out = func(*args, **(kwargs or {}))
        if is_random(func):
            self.drawn += 1
            if self.draws is not None and self.drawn == self.draws:
                self._wait()
        return out


class InFlight:
    """The held call's outcome, once the ``with`` block of ``in_flight`` has ended."""

    result: Any = None
    error: BaseException | None = None

    def get(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


@contextlib.contextmanager
def in_flight(fn: Callable[[], Any], hold_at: int | None = None, after_draws: int | None = None,
              setup: Callable[[], None] | None = None) -> Iterator[InFlight]:
    """Run ``fn()`` in a thread held before its op ``hold_at`` (or after its
    ``after_draws``-th random draw) while the ``with`` body runs; then let it finish.

    ``setup`` runs in the thread first (e.g. ``torch.manual_seed``: the generator
    is process-wide, so the main thread must not reseed until the draws are done).
    """
    hold = _Hold(hold_at, after_draws)
    box = InFlight()

    def run():
        try:
            if setup is not None:
                setup()
            with hold:
                box.result = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test through ``get``
            box.error = e
        finally:
            hold.reached.set()  # a call that ended before its hold point frees the caller too

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert hold.reached.wait(WAIT_S), "the call never reached its hold point"
        assert hold.held, f"the call finished before its hold point ({hold.seen} ops): {box.error!r}"
        yield box
    finally:
        hold.release.set()
        thread.join(WAIT_S)
    assert not thread.is_alive(), "the held call did not finish"
