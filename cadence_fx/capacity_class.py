"""The capacity of a stream's own branch class (``class_capacity``): for a voice whose length
a capacity's graphs refuse (another branch class of the model's code, e.g. Token2Wav's prompt
frames + 99 that a chunk's new-token count divides), the largest length up to that capacity
at which its own class's symbolic steps hold; the drop-in builds that capacity's graphs once
(``capacity_executable``) and serves every voice of the class on them."""

from __future__ import annotations

from typing import Callable

import torch

from .compiler import build_plan, region_buffers
from .errors import SpecializationRefused
from .passes.specialize import check_guards
from .passes.trace_symbolic import SymbolicStep
from .programs.entry import symbolic_entry
from .runtime.arena import Arena


def class_capacity(adapter, programs, upto: int, say: Callable[[str], None] | None = None) -> tuple:
    """For a stream of ``adapter`` (at its length ``s`` of its one symbolic dim) that a
    capacity's graphs refuse for another branch class of the model's code: ``(c, steps)``,
    each catalog entry's symbolic step of ``s``'s class (looked up in ``programs``, or traced
    at ``s``) and ``c``, the largest length in ``s..upto`` at which every one of them holds:
    ``capacity_executable(adapter at c, steps)`` then serves ``s`` and every length of its
    class up to ``c``.  ``SpecializationRefused`` where no symbolic step serves ``s``."""
    (d,) = adapter.symbolic_dims()
    s = int(adapter.dims()[d])
    plan = build_plan(adapter)
    by_region = region_buffers(adapter.declaration, Arena(plan.layout, torch.device(adapter.device)))
    steps = {}
    for entry in plan.catalog:
        setup: dict = {}

        def use(sym: SymbolicStep, at: dict) -> SymbolicStep:
            check_guards(sym, {d: s})
            return sym
        sym = symbolic_entry(adapter, lambda x: build_plan(adapter, x), plan, entry, by_region, programs, setup,
                             say or (lambda msg: None), use)
        if sym is None:
            raise SpecializationRefused(f"no symbolic step of entry {entry.index} serves {d}={s}: {setup.get('reason')}")
        steps[entry.index] = sym
    for c in range(int(upto), s - 1, -1):
        try:
            for sym in steps.values():
                check_guards(sym, {d: c})
        except SpecializationRefused:
            continue
        return c, steps
    return s, steps  # (s itself: its steps' guards hold there)


__all__ = ["class_capacity"]
