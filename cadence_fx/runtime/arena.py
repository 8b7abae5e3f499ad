"""Arena: one allocation per session, every region a view at a fixed offset.

Addresses never move while the session lives; state is written back in place.
"""

from __future__ import annotations

from typing import Mapping

import torch

from ..errors import CadenceError
from ..plan import ArenaLayout


def empty_of(spec, device: "torch.device | str | None" = None) -> torch.Tensor:
    """A contiguous tensor of a ``TensorSpec``'s shape and dtype, on ``device`` (default:
    the spec's), not filled: one only its shape, dtype and device are read from (a
    specialization's placeholders)."""
    return torch.empty(spec.shape, dtype=getattr(torch, spec.dtype),
                       device=device if device is not None else spec.device)


def zeros_of(spec, device: "torch.device | str | None" = None) -> torch.Tensor:
    """``empty_of`` filled with zeros (what ``torch.zeros`` does): the example state a
    trace or a capture runs on."""
    return empty_of(spec, device).zero_()


def copy_strided(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with its strides (a program is exact for the layout it was traced at,
    and the eager path sees the layouts it would see on the arena: the same kernels run)."""
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device).copy_(t)


class ArenaMoved(CadenceError, RuntimeError):
    """A region's data pointer changed: something replaced arena memory."""


class Arena:
    def __init__(self, layout: ArenaLayout, device: torch.device | str):
        self.layout = layout
        self.device = torch.device(device)
        # zero-filled so a region's never-written tail is deterministic, as in the
        # stock buffers (which upstream creates with torch.zeros)
        self.storage = torch.zeros(layout.total_bytes, dtype=torch.uint8, device=self.device)
        self.regions: dict[str, torch.Tensor] = {}
        for slot in layout.slots:
            flat = self.storage[slot.offset: slot.offset + slot.nbytes]
            self.regions[slot.name] = flat.view(getattr(torch, slot.dtype)).view(slot.shape)
        self._ptrs = {n: t.data_ptr() for n, t in self.regions.items()}

    def clear(self) -> "Arena":
        """Every byte back to zero, as a new arena is (addresses unchanged)."""
        self.storage.zero_()
        return self

    @property
    def nbytes(self) -> int:
        return self.storage.numel()

    def full(self, name: str) -> torch.Tensor:
        """The region at capacity (what a rebound module buffer is)."""
        try:
            return self.regions[name]
        except KeyError:
            raise CadenceError(f"arena has no region {name!r}; regions: {sorted(self.regions)}") from None

    def view(self, name: str, extent: int | None) -> torch.Tensor:
        """The region narrowed to ``extent`` along its growth axis (the live state)."""
        slot = self.layout.slot(name)
        full = self.full(name)
        if slot.axis is None or extent is None:
            return full
        if not 0 <= extent <= full.shape[slot.axis]:
            raise CadenceError(f"region {name!r}: extent {extent} is outside its capacity "
                               f"{full.shape[slot.axis]} along axis {slot.axis}")
        return full.narrow(slot.axis, 0, extent)

    def assert_stable(self) -> None:
        for name, t in self.regions.items():
            if t.data_ptr() != self._ptrs[name] or self.storage.data_ptr() + self.layout.slot(name).offset != self._ptrs[name]:
                raise ArenaMoved(f"region {name!r} moved from {self._ptrs[name]:#x} to {t.data_ptr():#x}")

    def data_ptrs(self) -> Mapping[str, int]:
        return dict(self._ptrs)
