"""A session's captures between two chunks, and again after an out of memory.

Under replay a session captures its graphs on its own arena.  Set-up captures the
catalog entries (``Session.prepare_replay``); everything else is captured mid-stream,
between two chunks, with the live state copied out first and written back after
(capture runs the step):

* an entry a background build handed over (``PendingSession``: the first chunk that
  needs it, or ``idle``);
* an off-catalog specialization (``Variants``: the first chunk that needs it, or the
  work ahead in ``idle``).

Never a crash mid-stream, never a wrong chunk:

* a capture that raises (anything but out of memory) sends that entry or
  specialization to the eager path for the session's life, with the reason;
* a capture that runs out of memory (before a region's capture, or inside one) keeps
  what it captured: the regions left uncaptured run their pieces eagerly, exact and
  counted (``region refused replay: ...: not captured``).  Memory comes back (another
  session closes, a collection runs), so it is captured whole again once
  ``OOM_RETRY_S`` have passed (``Recaptures``): by the first chunk that needs it then,
  or by ``idle``.  An entry set-up could not capture for memory is captured again the
  same way (with shared captures, on the working arena, which kept nothing of the failed
  capture: ``runtime/working.py``).  ``stats()["captured_again"]`` counts those captures,
  per entry or label.

Only while no build holds the device (``device_work.try_held``): else the chunk runs
as it would have (eagerly, counted ``device_work.DEFERRED``, or on what it captured
before) and the capture is tried at the next one.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Hashable, Mapping

import torch

from . import device_work
from .executable import EntryProgram
from .variants import OOM_RETRY_S, VariantKey

_now = time.monotonic  # (tests move this clock)


def cut_by_memory(failed: Mapping[str, str]) -> bool:
    """Whether a capture's failed regions (``graphs.capture_entry``'s, or ``{"*": why}``) ran out of memory."""
    return any("out of memory" in why.lower() or "OutOfMemoryError" in why for why in failed.values())


class Recaptures:
    """Entries and specializations (by index or ``VariantKey``) whose capture ran out of memory:
    when each is captured again (``OOM_RETRY_S`` after), and how often that was done."""

    def __init__(self) -> None:
        self._at: dict[Hashable, float] = {}
        self.done: dict[str, int] = {}

    def note(self, key: Hashable, failed: Mapping[str, str]) -> None:
        """After a capture of ``key``: due again ``OOM_RETRY_S`` from now if memory cut it short."""
        if cut_by_memory(failed):
            self._at[key] = _now() + OOM_RETRY_S
        else:
            self._at.pop(key, None)

    def due(self, key: Hashable) -> bool:
        at = self._at.get(key)
        return at is not None and _now() >= at

    def keeps(self, key: Hashable, held: Mapping) -> bool:
        """Whether ``held``'s capture of ``key`` (entries or specializations by key) is kept as it
        is: held, and not due to be captured again."""
        return key in held and not self.due(key)

    def captured(self, key: Hashable, again: bool, failed: Mapping[str, str] | None) -> None:
        """After a capture of ``key`` (``again``: of one memory had cut short; ``failed``: its failed
        regions, None where it raised): counted, and due again if memory cut it short."""
        if again:
            label = key.label() if isinstance(key, VariantKey) else str(key)
            self.done[label] = self.done.get(label, 0) + 1
        self.note(key, failed or {})

    def pending(self) -> list[Hashable]:
        """The keys still to capture again (due or not)."""
        return list(self._at)


class MidStreamCapture:
    """``Session``'s captures between chunks (module docstring).  Uses the session's arena
    state, pool, generator state and capture stream; ``_entry_failures``, ``_recaptures``."""

    def _try_capture(self, index: int, inputs: Mapping[str, torch.Tensor]) -> str | None:
        """Capture entry ``index`` now (not captured here yet, or captured part-way for memory and
        due again) unless a build holds the device (``device_work.DEFERRED``: never wait for it) or
        its capture raised before (that reason); None once captured (whole or part-way)."""
        if index in self._entry_failures:
            return self._entry_failures[index]
        with device_work.try_held() as free:
            return self._capture_entry(index, inputs) if free else device_work.DEFERRED

    def _entry_ready(self, index: int, inputs: Mapping[str, torch.Tensor]) -> str | None:
        """Before a chunk of entry ``index`` (it passed the gate): None to run this session's
        program of it, captured now where it is not yet (or where memory cut its capture short
        ``OOM_RETRY_S`` ago: deferred by a build, the part-way capture runs meanwhile, exact);
        else why the chunk runs eagerly."""
        if index in self._entry_failures:
            return self._entry_failures[index]
        if self._recaptures.keeps(index, self._programs):
            return None
        why = self._try_capture(index, inputs)
        return None if why == device_work.DEFERRED and index in self._programs else why

    def _capture_idle(self, seconds: float | None, t0: float) -> list[int]:
        """``idle``'s captures of entries: each one not captured here yet, or due again after an out
        of memory, on the set-up's example inputs; stops when a build holds the device or
        ``seconds`` from ``t0`` have passed (checked between entries).  Returns those captured."""
        done: list[int] = []
        if self._programs is None or self._example_inputs is None:
            return done
        for index in sorted(self.executable.programs):
            if index in self._entry_failures or self._recaptures.keeps(index, self._programs):
                continue
            if seconds is not None and time.perf_counter() - t0 >= seconds:
                break
            why = self._try_capture(index, self._example_inputs)
            if why == device_work.DEFERRED:
                break
            if why is None:
                done.append(index)
        return done

    def _capture_entry(self, index: int, inputs: Mapping[str, torch.Tensor]) -> str | None:
        """Capture entry ``index``'s graphs on this arena now (the live state saved and put back),
        on this session's own capture stream (warmed up first where it is cold: ``_must_warm_up``)."""
        t0 = time.perf_counter()
        self._own_capture_stream()  # no other live session's (runtime/streams.py)
        program = self.executable.programs[index]
        again = self._programs.pop(index, None) is not None  # a part-way capture's graphs go first
        try:
            parent, failed, error = self._capture_mid_stream(program, inputs)
        finally:
            self._stats.setup.capture_s += time.perf_counter() - t0
        self._recaptures.captured(index, again, None if error is not None else failed)
        if error is not None:  # never a crash mid-stream: this entry runs eagerly in this session
            self.capture_failures[index] = {"*": error}
            self._entry_failures[index] = f"entry {index} not captured: {error}"
            return self._entry_failures[index]
        self.capture_failures[index] = failed  # {} where every region captured (as prepare_replay records)
        self._programs[index] = dataclasses.replace(program, run=parent)
        return None

    def _session_variant(self, key: VariantKey, program: EntryProgram,
                         inputs: Mapping[str, torch.Tensor]) -> tuple[EntryProgram | None, str | None]:
        """This session's copy of a specialization: under replay, captured on its arena now.
        ``(None, why)`` where the capture raised (the chunk runs eagerly; not tried again); one
        that memory cut short runs as captured and is captured again when due."""
        held = self.executable.variants
        for gone in [k for k in self._variant_programs if not held.holds(k)]:  # evicted: free its graphs
            del self._variant_programs[gone]
        if program.kind != "cudagraph":
            return program, None
        mine = self._variant_programs.get(key)
        if isinstance(mine, str):
            return None, mine
        if self._recaptures.keeps(key, self._variant_programs):
            return mine, None
        with device_work.try_held() as free:  # mid-stream: never wait for a background build
            if free:
                return self._capture_variant(key, program, inputs)
        return (mine, None) if mine is not None else (None, device_work.DEFERRED)

    def _capture_mid_stream(self, program: EntryProgram,
                            inputs: Mapping[str, torch.Tensor]) -> tuple[Any, dict[str, str], str | None]:
        """``graphs.capture_variant`` of ``program`` on this session's arena now, between two
        chunks (the live state copied out first and written back after: capture runs the
        step), into this session's pool with its generator state: ``(parent, failed, error)``."""
        from .graphs import GraphPool, GraphRng, capture_variant
        saved = {r: t.clone() for r, t in self._live_state().items()}
        extents = dict(self.extents)
        args = program.arguments(inputs, self.executable.inputs, self._capture_state_args(program))
        if self._pool is None and self._expect_device.type == "cuda":
            self._pool, self._rng = GraphPool(), GraphRng.for_device(self._expect_device)
        stream = self._own_capture_stream() if self._expect_device.type == "cuda" else self._capture_stream
        try:
            with program.entered():
                captured = capture_variant(program.run, args, self._pool, self._bound_storage(), stream,
                                           self._expect_device, self._rng, warm_up=self._must_warm_up(stream))
            if captured[2] is None:  # it ran (warmed up, or captured unwarmed): the stream is warm now
                self._warmed_up(stream)
            return captured
        finally:  # capture ran the step on the arena: put the live state back (a failure here breaks it)
            self._write_state(saved, extents)

    def _capture_variant(self, key: VariantKey, program: EntryProgram,
                         inputs: Mapping[str, torch.Tensor]) -> tuple[EntryProgram | None, str | None]:
        t0 = time.perf_counter()
        again = self._variant_programs.pop(key, None) is not None  # a part-way capture's graphs go first
        parent, failed, error = self._capture_mid_stream(program, inputs)
        self._recaptures.captured(key, again, None if error is not None else failed)
        if error is not None:  # never a crash mid-stream: this key runs eagerly in this session
            self.capture_failures[key.label()] = {"*": error}
            self._variant_programs[key] = error
            return None, error
        self.capture_failures.pop(key.label(), None)
        if failed:
            self.capture_failures[key.label()] = failed
        mine = dataclasses.replace(program, run=parent)
        self._variant_programs[key] = mine
        self._variant_capture_s[key.label()] = round(time.perf_counter() - t0, 3)
        return mine, None
