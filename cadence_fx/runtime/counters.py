"""Per-session counters: what ran, why anything ran eagerly, and what setting it up cost."""

from __future__ import annotations

import collections
import dataclasses
from typing import Mapping, Sequence

#: the compile's seconds (per entry in ``Executable.notes["setup"]``, totals in ``notes["setup_s"]``)
COMPILE_KEYS = ("trace_s", "specialize_s", "passes_s", "waited_s")


@dataclasses.dataclass
class SetupTimes:
    """Seconds (wall) it took to make a session ready to step.

    An executable is compiled once and serves many sessions: the session whose opening
    compiled it (``compiled``, the first opened on it) carries the compile's
    ``trace_s``/``specialize_s``/``passes_s`` and how each entry got its graph
    (``how``: entry -> "traced", "traced symbolic, specialized" or "specialized");
    every later session reports 0 for them.  ``waited_s``: the compile's wait for another
    process that shared the disk cache and was tracing a program it needed (then loaded,
    not traced).  ``capture_s`` is this session's own CUDA-graph
    capture (0 without replay).  The stream's setup from its prompt is not counted.
    """

    compiled: bool = False
    trace_s: float = 0.0
    specialize_s: float = 0.0
    passes_s: float = 0.0
    waited_s: float = 0.0
    capture_s: float = 0.0
    how: Mapping[int, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_compile(cls, notes: Mapping | None) -> "SetupTimes":
        """The compile's share from an executable's ``notes`` (``None``: compiled for an earlier session)."""
        if notes is None:
            return cls()
        totals = notes.get("setup_s", {})
        how = {int(k): e.get("how", "?") for k, e in notes.get("setup", {}).items()}
        return cls(True, *(float(totals.get(k, 0.0)) for k in COMPILE_KEYS), how=how)

    def to_json(self) -> dict:
        split = {k: round(getattr(self, k), 3) for k in (*COMPILE_KEYS, "capture_s")}
        return {**split, "total_s": round(sum(split.values()), 3), "compiled": self.compiled,
                "how": {str(k): v for k, v in sorted(self.how.items())}}


def sum_setup(splits: Sequence[dict | None]) -> dict:
    """Several sessions' ``setup_s`` added up (a compile counts once: only the session
    whose opening compiled an executable carries it); ``None`` entries are skipped."""
    keys = (*COMPILE_KEYS, "capture_s", "total_s")
    return {k: round(sum(s[k] for s in splits if s), 3) for k in keys}


@dataclasses.dataclass
class SessionStats:
    steps: int = 0
    graph_runs: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # entry -> n
    replays: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # entry -> n
    fallbacks: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # reason -> n
    setup: SetupTimes = dataclasses.field(default_factory=SetupTimes)

    def count_fallback(self, reason: str) -> None:
        self.fallbacks[reason] += 1

    def to_json(self) -> dict:
        return {
            "steps": self.steps,
            "graph_runs": {str(k): v for k, v in sorted(self.graph_runs.items(), key=_entries_first)},
            "replays": {str(k): v for k, v in sorted(self.replays.items(), key=_entries_first)},
            "fallbacks": dict(self.fallbacks),
            "fallback_total": sum(self.fallbacks.values()),
            "setup_s": self.setup.to_json(),
        }


def _entries_first(item: tuple) -> tuple:
    """Catalog entries (ints) in order, then specializations (labels) by name."""
    k = item[0]
    return (0, k, "") if isinstance(k, int) else (1, 0, str(k))
