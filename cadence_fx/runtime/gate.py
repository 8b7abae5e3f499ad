"""Admission gates: a program runs only on the exact signature it was traced for.

``AdmissionGate`` checks a live call against a catalog entry (inputs' shape, dtype,
stride and device; the regions' extents; the arena's addresses); ``StockStateGate``
does the same for rules R/Rc, whose state is passed in as plain tensors.  Each
returns ``None`` to admit, else the reason (one line) the session counts as it runs
the step eagerly instead.
"""

from __future__ import annotations

from typing import Mapping

import torch

from ..errors import InputError
from ..plan import CatalogEntry, TensorSpec, same_layout
from .arena import Arena


def validate_inputs(specs: Mapping[str, TensorSpec], names, inputs: Mapping[str, torch.Tensor],
                    device: torch.device) -> None:
    """Raise ``InputError`` naming the first input of a step call that is missing, not a
    tensor, or of another device, dtype or rank than the model takes (before any gate)."""
    for name in names:
        if name not in inputs:
            raise InputError(f"missing input {name!r}; the step takes {list(names)}")
        t = inputs[name]
        if not isinstance(t, torch.Tensor):
            raise InputError(f"input {name!r} must be a tensor, got {type(t).__name__}")
        if t.device != device:
            raise InputError(f"input {name!r} is on {t.device}; this session runs on {device}")
        want = specs[name].dtype
        if str(t.dtype).removeprefix("torch.") != want:
            raise InputError(f"input {name!r} has dtype {t.dtype}; the model takes {want}")
        if t.dim() != len(specs[name].shape):
            raise InputError(f"input {name!r} has {t.dim()} dims {tuple(t.shape)}; "
                             f"the model takes {len(specs[name].shape)} ({tuple(specs[name].shape)})")


def tensor_mismatch(what: str, t: torch.Tensor, spec: TensorSpec) -> str | None:
    """``None`` if ``t`` has ``spec``'s shape, dtype and layout, else the first difference."""
    if tuple(t.shape) != tuple(spec.shape):
        return f"{what} shape {tuple(t.shape)} != catalog {tuple(spec.shape)}"
    if str(t.dtype).removeprefix("torch.") != spec.dtype:
        return f"{what} dtype {t.dtype} != catalog {spec.dtype}"
    if not same_layout(spec.shape, tuple(t.stride()), tuple(spec.stride)):
        return f"{what} stride {tuple(t.stride())} != catalog {tuple(spec.stride)}"
    return None


def input_mismatch(entry: CatalogEntry, inputs: Mapping[str, torch.Tensor]) -> str | None:
    """``None`` if every input has the entry's exact signature, else the first difference."""
    for name, spec in entry.inputs.items():
        t = inputs.get(name)
        if t is None:
            return f"input {name!r} missing"
        why = tensor_mismatch(f"input {name!r}", t, spec)
        if why is not None:
            return why
        if t.device != torch.device(spec.device):
            return f"input {name!r} device {t.device} != catalog {spec.device}"
    return None


class AdmissionGate:
    """Fail closed: a program runs only on the exact signature it was built for."""

    def __init__(self, arena: Arena):
        self.arena = arena

    def check(self, entry: CatalogEntry, inputs: Mapping[str, torch.Tensor],
              extents: Mapping[str, int | None]) -> str | None:
        """``None`` to admit, else the reason (one line) to run eagerly."""
        why = input_mismatch(entry, inputs)
        if why is not None:
            return why
        for name, spec in entry.regions.items():
            slot = self.arena.layout.slot(name)
            if slot.axis is not None and extents.get(name) is not None and extents[name] != spec.shape[slot.axis]:
                return f"region {name!r} extent {extents[name]} != catalog {spec.shape[slot.axis]}"
        ptrs = self.arena.data_ptrs()
        for name, t in self.arena.regions.items():
            if t.data_ptr() != ptrs[name]:
                return f"region {name!r} moved"
        return None


class StockStateGate:
    """The gate for ``StockStateSession``: inputs and state exactly as the entry was traced."""

    def check(self, entry: CatalogEntry, inputs: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor],
              specs: Mapping[str, TensorSpec]) -> str | None:
        why = input_mismatch(entry, inputs)
        if why is not None:
            return why
        for name, spec in specs.items():
            why = tensor_mismatch(f"state {name!r}", state[name], spec)
            if why is not None:
                return why
        return None
