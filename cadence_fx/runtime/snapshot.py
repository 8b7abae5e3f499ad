"""SessionSnapshot: a session's carried state and clock position, copied out.

``Session.snapshot()`` makes one; ``Session.restore(snapshot)`` puts it back, in
place (the arena's addresses, and so its captured graphs, stay valid).  A snapshot
holds each carried region at its live extent only (what the next step reads: the
soak check copies the same tensors into a stock model and stays exact), plus the
extents, which pick the next catalog entry.  Counters are history and stay out.

Uses: restore the post-prompt state at every turn of a duplex conversation without
running the prompt setup again, fork a conversation into a second session of the
same executable, or bring back a session that a failed step marked broken.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import torch

from ..plan import Plan


@dataclasses.dataclass(frozen=True, eq=False)
class SessionSnapshot:
    """Opaque to callers: restore it into a session of the same executable (plan and
    state placement); ``nbytes`` is what it holds."""

    plan: Plan
    stable_state: bool  # rule S (arena) or stock-managed state (R/Rc): other state shapes
    state: Mapping[str, torch.Tensor]  # region -> private copy at its live extent
    extents: Mapping[str, int | None]  # region -> extent along its growth axis (the clock position)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.state.values())

    def mismatch(self, plan: Plan, stable_state: bool, carried: tuple[str, ...], device: torch.device) -> str | None:
        """``None`` if this snapshot fits a session with these properties, else why not."""
        if stable_state != self.stable_state:
            return (f"it holds {'arena' if self.stable_state else 'stock-managed'} state; this session keeps "
                    f"{'arena' if stable_state else 'stock-managed'} state (other rules)")
        if plan is not self.plan and plan != self.plan:
            return "it was taken from a session of another plan (model, stream configuration or device)"
        if tuple(self.state) != carried:
            return f"it holds regions {list(self.state)}; this session carries {list(carried)}"
        for r, t in self.state.items():
            if t.device != device:
                return f"its region {r!r} is on {t.device}; this session runs on {device}"
        return None

    def __repr__(self) -> str:
        extents = ", ".join(f"{r}={e}" for r, e in self.extents.items() if e is not None)
        return f"SessionSnapshot({len(self.state)} regions, {self.nbytes} bytes, extents: {extents or 'fixed'})"
