"""StockStateSession: rules R/Rc, replay over stock-managed state (no arena).

Split from ``session.py`` (one session kind per file); everything it does not
override is ``Session``'s: the gate, the fallback's private copies, snapshots,
the broken mark.
"""

from __future__ import annotations

from typing import Mapping

import torch

from ..plan import CatalogEntry
from .arena import zeros_of
from .gate import StockStateGate
from .session import EntryProgram, Executable, FallbackFn, Session


class StockStateSession(Session):
    """Rules R / Rc: replay over stock-managed state, without the arena (no rule S).

    The step's graphs were traced over the model's own (stock-sized) buffers, as
    the stock runtime runs, with the carried state as plain inputs and outputs.
    Each step passes the state in (a replay copies it into the graph's static
    inputs), takes the next state out of the graph's outputs and keeps a private
    contiguous copy: the copy-in/copy-out traffic and the stock buffers are what
    rule S removes.  A failed graph step marks the session broken here too (a graph
    may write its state inputs in place).  The model's buffers are scratch shared by every session of it:
    its sessions must not run concurrently.
    """

    def __init__(self, executable: Executable, fallback: FallbackFn, device: torch.device | str):
        super().__init__(executable, None, fallback, {}, device=device)
        self.stock_gate = StockStateGate()
        self._state: dict[str, torch.Tensor] = {}

    def state(self) -> dict[str, torch.Tensor]:
        """The carried state (this session's own tensors); ``SessionBroken`` if a step broke it."""
        return super().state()

    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """As ``Session.load_state``; a floating-point region whose set-up dtype is narrower
        than entry 0's program takes is widened to it (exact), as rule S's arena region
        holds it (a model whose half-precision set-up leaves a carry its declaration keeps in
        float32, because its first step promotes it)."""
        specs = self.executable.programs[0].state_specs if 0 in self.executable.programs else None
        if specs and isinstance(state, Mapping):
            state = {r: _widened(t, specs[r].dtype) if r in specs else t for r, t in state.items()}
        super().load_state(state)

    def _live_state(self) -> dict[str, torch.Tensor]:
        return dict(self._state)

    def _private_state(self) -> dict[str, torch.Tensor]:
        return {r: t.clone() for r, t in self._state.items()}

    @property
    def state_bytes(self) -> int:
        return sum(t.nbytes for t in self._state.values())

    def _gate_check(self, entry: CatalogEntry, inputs: Mapping[str, torch.Tensor]) -> str | None:
        return self.stock_gate.check(entry, inputs, self._state, self.executable.programs[entry.index].state_specs)

    def _state_args(self, program: EntryProgram) -> list[torch.Tensor]:
        return [self._state[r] for r in self.executable.carried]

    def _capture_state_args(self, program: EntryProgram) -> list[torch.Tensor]:
        return [zeros_of(program.state_specs[r], self._expect_device) for r in self.executable.carried]

    def _bound_storage(self) -> int | None:
        return None  # nothing is bound by address but what the graphs write in place

    def _reset_state(self) -> None:
        self._state = {}

    def _commit(self, program: EntryProgram, result: tuple) -> dict[str, torch.Tensor]:
        n = len(self.executable.outputs)
        new = dict(zip(self.executable.carried, result[n:]))
        self._write_state(new, self.extents_of(new))
        return dict(zip(self.executable.outputs, result[:n]))

    def _write_state(self, state: Mapping[str, torch.Tensor], extents: Mapping[str, int | None]) -> None:
        # the next state may be a view of the model's scratch buffers: keep a private copy
        new = {r: state[r].clone(memory_format=torch.contiguous_format) for r in self.executable.carried}
        try:
            self._state = new
            self.extents.update(extents)
        except BaseException as e:  # interrupted between the two
            self._break(e)
            raise


def _widened(t, dtype: str):
    """``t`` in ``dtype`` where that is an exact widening of its floating-point dtype, else ``t``."""
    want = getattr(torch, dtype, None)
    if (not isinstance(t, torch.Tensor) or not isinstance(want, torch.dtype) or t.dtype == want
            or not t.is_floating_point() or not want.is_floating_point or torch.promote_types(t.dtype, want) != want):
        return t
    return t.to(want)
