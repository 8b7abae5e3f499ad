"""What the compiler hands the runtime: an ``Executable`` (one ``EntryProgram`` per catalog entry).

``runtime.session`` runs it; the compiler (and ``capacity_executable``) build it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable, Mapping, Sequence

import torch

from ..plan import CatalogEntry, Plan, TensorSpec
from ..step import Rules
from .arena import Arena
from .variants import Variants


@dataclasses.dataclass
class EntryProgram:
    """What runs for one catalog entry: ``run(*inputs, *extra_inputs, *arena_regions) -> outputs``,
    inside ``context()`` where it has one."""

    entry: CatalogEntry
    run: Callable[..., tuple]
    arena_inputs: tuple[str, ...]
    next_extents: Mapping[str, int | None]
    kind: str = "graph"  # "graph" (rewritten aten graph, eager kernels) or "cudagraph" (replay)
    #: rules R/Rc: the carried state as the program takes it (stock-managed state may be
    #: larger than the declared region off its growth axis, e.g. a buffer of 16 step slots)
    state_specs: Mapping[str, TensorSpec] | None = None
    #: tensors ``run`` takes after the step's inputs, before the state (a capacity graph's
    #: device lengths: ``capacity_executable.at_length``); the same objects at every call
    extra_inputs: tuple = ()
    #: entered around every run and capture of ``run`` (a capacity graph's host sizes:
    #: ``capacity_ops.at_dims``); None: nothing
    context: Callable[[], Any] | None = None

    def arguments(self, inputs: Mapping[str, torch.Tensor], names: Sequence[str], state: list) -> list:
        """``run``'s arguments: the step's ``inputs`` (in the order ``names``), ``extra_inputs``, ``state``."""
        return [inputs[n] for n in names] + list(self.extra_inputs) + list(state)

    def entered(self):
        """``context()``, or a context that does nothing."""
        return self.context() if self.context is not None else contextlib.nullcontext()


@dataclasses.dataclass
class Executable:
    plan: Plan
    programs: dict[int, EntryProgram]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    carried: tuple[str, ...]
    rules: Rules
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)  # timings, pass records
    #: rule S: the arena the entries were traced on, handed (zeroed) to the first session
    spare_arena: Arena | None = dataclasses.field(default=None, repr=False, compare=False)
    _spare_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)
    #: rules with S: programs for the chunks the catalog does not hold (``runtime.variants``)
    variants: Variants | None = dataclasses.field(default=None, repr=False, compare=False)
    _compile_claimed: bool = dataclasses.field(default=False, repr=False, compare=False)
    #: where its sessions run their programs, if not on their own arenas: a capacity's
    #: ``runtime.working.WorkingArena`` (its graphs captured once for every session)
    working: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def stable_state(self) -> bool:
        """Rule S: state in an arena at stable addresses; else stock-managed state."""
        return self.rules.stable_state

    def take_arena(self, device: torch.device | str) -> Arena:
        """An arena for a new session: the trace's own (zero-filled again) the first
        time, a fresh one after.  One session on an executable then holds one arena's
        memory, not two (on CUDA the trace's arena stays allocated after compiling)."""
        with self._spare_lock:  # sessions may be opened from several threads: one taker only
            arena, self.spare_arena = self.spare_arena, None
        if arena is None or arena.device != torch.device(device):
            return Arena(self.plan.layout, device)
        return arena.clear()

    def drop_spare_arena(self) -> None:
        """Free the trace's arena if no session took it (a session that started before the
        executable existed has its own: ``runtime.pending``)."""
        with self._spare_lock:
            self.spare_arena = None

    def claim_compile(self) -> dict[str, Any] | None:
        """The compile's notes the first time, ``None`` after (under ``_spare_lock``): only the
        first session opened on an executable, whose opening compiled it, reports the compile."""
        with self._spare_lock:
            claimed, self._compile_claimed = self._compile_claimed, True
        return None if claimed else self.notes
