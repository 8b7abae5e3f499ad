"""Sizes of a catalog entry's tensors as affine functions of the symbolic dims.

The plan is pure: built at ``v``, ``v + 1`` and ``v + 2`` of one dim (the others
fixed) it gives each size at three points; a size is ``a * dim + b`` when the three
agree, and static when ``a == 0``.  A size that is not affine, or that moves with two
dims, is ``NotAffine``: the compiler then traces that configuration concretely.
"""

from __future__ import annotations

from typing import Callable, Mapping

from ..errors import CadenceError
from ..plan import Plan


class NotAffine(CadenceError, ValueError):
    """A size is not ``a * dim + b`` in one symbolic dim (the entry is traced concretely)."""


def _affine(sizes: list[tuple[int, ...]], v: int, dim: str, what: str) -> list:
    s0, s1, s2 = sizes
    if not len(s0) == len(s1) == len(s2):
        raise NotAffine(f"{what}: its rank changes with {dim}")
    out = []
    for x0, x1, x2 in zip(s0, s1, s2):
        a = x1 - x0
        if x2 - x1 != a:
            raise NotAffine(f"{what}: size {x0}, {x1}, {x2} at {dim} = {v}, {v + 1}, {v + 2} is not affine")
        out.append(x0 if a == 0 else (dim, a, x0 - a * v))
    return out


def symbolic_shapes(plan_at: Callable[[Mapping[str, int]], Plan], dims: Mapping[str, int],
                    symbolic: tuple[str, ...], entry_index: int, regions: tuple[str, ...],
                    buffer_regions: tuple[str, ...]) -> tuple[dict, dict]:
    """``({region: state shape}, {region: arena slot shape})`` of one catalog entry, sizes affine.

    ``plan_at(dims)`` builds the plan at other dim values.
    """
    base = plan_at(dims)

    def state(plan: Plan, r: str) -> tuple[int, ...]:
        if entry_index >= len(plan.catalog):
            raise NotAffine(f"catalog entry {entry_index} does not exist at {dict(plan.dims)}")
        return tuple(plan.catalog[entry_index].regions[r].shape)

    def slot(plan: Plan, r: str) -> tuple[int, ...]:
        return tuple(plan.layout.slot(r).shape)

    out_state = {r: list(state(base, r)) for r in regions}
    out_slot = {r: list(slot(base, r)) for r in buffer_regions}
    for d in symbolic:
        v = int(dims[d])
        plans = [base] + [plan_at({**dims, d: v + k}) for k in (1, 2)]
        if any(p.catalog[entry_index].steps != base.catalog[entry_index].steps for p in plans[1:]
               if entry_index < len(p.catalog)):
            raise NotAffine(f"catalog entry {entry_index} covers other steps at {d} = {v + 1}, {v + 2}")
        for table, get in ((out_state, state), (out_slot, slot)):
            for r in table:
                aff = _affine([get(p, r) for p in plans], v, d, f"{r} in entry {entry_index}")
                for i, s in enumerate(aff):
                    if isinstance(s, tuple):
                        if isinstance(table[r][i], tuple):
                            raise NotAffine(f"{r} in entry {entry_index}: axis {i} moves with two dims")
                        table[r][i] = s
    return ({r: tuple(s) for r, s in out_state.items()}, {r: tuple(s) for r, s in out_slot.items()})
