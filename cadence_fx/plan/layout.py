"""Arena layout: every in-scope region at a fixed byte offset of one allocation (rule S).

Lifetimes are declared, not inferred: every region lives as long as the session, so
a layout is just non-overlapping offsets.  The placing algorithm is pluggable
(``ARENA_ALGORITHMS``); ``verify_layout`` checks any layout independently of the
algorithm that made it, as ExecuTorch's memory planner is followed by a verifier.

Pure Python: no torch import.  Sizes and offsets are in bytes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

from ..annotations import DTYPE_ITEMSIZE, Declaration
from ..errors import PlanError
from .catalog import resolve_regions

#: An arena algorithm: ``(name, nbytes)`` per region, in declaration order, and the
#: alignment in bytes -> one byte offset per region.
ArenaAlgorithm = Callable[[Sequence[tuple[str, int]], int], Sequence[int]]


@dataclasses.dataclass(frozen=True)
class RegionSlot:
    """One region's place in the arena.

    Attributes:
        name: the region.
        offset: byte offset from the arena's base.
        shape: the capacity shape (elements); the full shape for ``Fixed``.
        dtype: concrete dtype name.
        nbytes: bytes the slot spans (prod(shape) * itemsize).
        axis: the growth axis (None for ``Fixed``).
        capacity: frames along the growth axis (None for ``Fixed``).
    """

    name: str
    offset: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    axis: int | None
    capacity: int | None

    @property
    def end(self) -> int:
        """First byte past the slot."""
        return self.offset + self.nbytes

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "offset": self.offset, "shape": list(self.shape), "dtype": self.dtype,
                "nbytes": self.nbytes, "axis": self.axis, "capacity": self.capacity}


@dataclasses.dataclass(frozen=True)
class ArenaLayout:
    """Where every in-scope region lives in the session's one allocation.

    Attributes:
        slots: one per in-scope region, in declaration order.
        total_bytes: size of the allocation (bytes), a multiple of ``alignment``.
        alignment: byte alignment of every slot's offset.
    """

    slots: tuple[RegionSlot, ...]
    total_bytes: int
    alignment: int

    def slot(self, name: str) -> RegionSlot:
        for s in self.slots:
            if s.name == name:
                return s
        raise PlanError(f"region {name!r} has no arena slot (slots: {[s.name for s in self.slots]}); "
                        f"out-of-scope regions are not in the arena")

    def to_json(self) -> dict[str, Any]:
        return {"slots": [s.to_json() for s in self.slots], "total_bytes": self.total_bytes,
                "alignment": self.alignment}


def _align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def sequential_offsets(sizes: Sequence[tuple[str, int]], alignment: int) -> list[int]:
    """Pack regions one after another in the given order, each offset aligned."""
    offsets, cursor = [], 0
    for _, nbytes in sizes:
        cursor = _align_up(cursor, alignment)
        offsets.append(cursor)
        cursor += nbytes
    return offsets


#: Arena placing algorithms by name (``plan_arena(algorithm=...)``).
ARENA_ALGORITHMS: dict[str, ArenaAlgorithm] = {"sequential": sequential_offsets}


def plan_arena(declaration: Declaration, dims: Mapping[str, int], dtype: str,
               algorithm: str | ArenaAlgorithm = "sequential", alignment: int = 512) -> ArenaLayout:
    """Place every in-scope region of ``declaration`` at its capacity.

    Args:
        dims: values of the shape and prefix symbols.
        dtype: the model dtype that ``"model"`` regions take.
        algorithm: a name in ``ARENA_ALGORITHMS`` or an ``ArenaAlgorithm``.
        alignment: byte alignment of every offset (a power of two).
    """
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1 \
            or alignment & (alignment - 1):
        raise PlanError(f"arena alignment={alignment!r} must be a power of two (bytes), e.g. 512")
    if isinstance(algorithm, str):
        if algorithm not in ARENA_ALGORITHMS:
            raise PlanError(f"unknown arena algorithm {algorithm!r}; use one of {sorted(ARENA_ALGORITHMS)} "
                            f"or register one in ARENA_ALGORITHMS")
        place, algo_name = ARENA_ALGORITHMS[algorithm], algorithm
    else:
        place, algo_name = algorithm, getattr(algorithm, "__name__", repr(algorithm))

    regions = resolve_regions(declaration, dims, dtype)
    offsets = list(place([(r.name, r.nbytes) for r in regions], alignment))
    if len(offsets) != len(regions):
        raise PlanError(f"arena algorithm {algo_name!r} returned {len(offsets)} offsets for "
                        f"{len(regions)} regions; it must return one offset per region")
    slots = tuple(RegionSlot(r.name, off, r.shape, r.dtype, r.nbytes, r.axis, r.capacity)
                  for r, off in zip(regions, offsets))
    total = _align_up(max((s.end for s in slots), default=0), alignment)
    return ArenaLayout(slots, total, alignment)


def verify_layout(layout: ArenaLayout) -> None:
    """Check ``layout``: aligned offsets, sizes matching shapes, every slot inside
    ``total_bytes``, and no two slots sharing a byte.  Raises PlanError naming the slot(s)."""
    a = layout.alignment
    if a < 1 or a & (a - 1):
        raise PlanError(f"arena alignment {a} is not a power of two")
    for s in layout.slots:
        if not isinstance(s.offset, int) or s.offset < 0 or s.offset % a:
            raise PlanError(f"region {s.name!r}: arena offset {s.offset} is not a non-negative multiple "
                            f"of the alignment {a} bytes; fix the arena algorithm")
        if s.dtype not in DTYPE_ITEMSIZE:
            raise PlanError(f"region {s.name!r}: unknown dtype {s.dtype!r} in its arena slot")
        expected = math.prod(s.shape) * DTYPE_ITEMSIZE[s.dtype]
        if s.nbytes != expected:
            raise PlanError(f"region {s.name!r}: slot spans {s.nbytes} bytes but shape {s.shape} of "
                            f"{s.dtype} needs {expected}")
        if s.end > layout.total_bytes:
            raise PlanError(f"region {s.name!r}: slot [{s.offset}, {s.end}) runs past the arena's "
                            f"{layout.total_bytes} bytes")
    names = [s.name for s in layout.slots]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise PlanError(f"regions {dup} have more than one arena slot; each region gets exactly one")
    # Sorted by offset, a slot overlaps an earlier one iff it starts before the
    # furthest end seen so far (this also catches a slot nested inside another).
    furthest = None
    for s in sorted(layout.slots, key=lambda s: (s.offset, s.end)):
        if s.nbytes == 0:
            continue
        if furthest is not None and s.offset < furthest.end:
            raise PlanError(f"regions {furthest.name!r} [{furthest.offset}, {furthest.end}) and {s.name!r} "
                            f"[{s.offset}, {s.end}) overlap in the arena; their writes would clobber "
                            f"each other, fix the arena algorithm")
        if furthest is None or s.end > furthest.end:
            furthest = s
