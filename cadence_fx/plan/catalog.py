"""The shape catalog: one exact signature per clock phase (rule R).

Regions on the declared clocks advance together, one step at a time, so the shapes
a streaming step sees are a function of the step index k alone.  Enumerating k = 0,
1, 2, ... until no region's extent changes gives the catalog: one ``CatalogEntry``
per phase, the last one steady.  Each entry records every in-scope region as the
*arena view* it will be at that step (capacity layout narrowed along the growth
axis, so strides never change) plus the step's inputs.

Pure Python: no torch import.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from ..annotations import DTYPE_ITEMSIZE, MODEL_DTYPE, Clock, Declaration, Region, dtype_name
from ..errors import PlanError

#: Most entries a catalog may have; past this a region's retention is too wide to
#: capture one graph per phase.
MAX_CATALOG_ENTRIES = 64


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides in elements, as torch computes them (a size-0 dim counts as 1)."""
    strides, running = [], 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


def same_layout(shape: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Strides ``a`` and ``b`` address the same elements of a tensor of ``shape``: equal on
    every dim of size > 1 (a size-1 dim's stride never moves an address, and a tensor
    with a size-0 dim has no elements).  ``torch.zeros(28, 1).t()`` (strides (1, 1)) has
    the layout of a fresh ``[1, 28]`` tensor (strides (28, 1)); ``x[:, 1:2].t()`` of a
    ``[28, 4]`` tensor (strides (1, 4)) does not."""
    if len(a) != len(shape) or len(b) != len(shape):
        return False
    if 0 in shape:
        return True
    return all(sa == sb for n, sa, sb in zip(shape, a, b) if n > 1)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape, dtype, strides (elements) and device of one tensor of a signature."""

    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...]
    device: str

    def __post_init__(self) -> None:
        shape, stride = tuple(self.shape), tuple(self.stride)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in shape):
            raise PlanError(f"TensorSpec shape {shape!r} must hold ints >= 0")
        if len(stride) != len(shape) or not all(isinstance(v, int) and not isinstance(v, bool) for v in stride):
            raise PlanError(f"TensorSpec stride {stride!r} must hold one int per dim of shape {shape!r}")
        dtype = dtype_name(self.dtype)
        if dtype not in DTYPE_ITEMSIZE:
            raise PlanError(f"TensorSpec of shape {shape!r}: unknown dtype {self.dtype!r}; "
                            f"use one of {sorted(DTYPE_ITEMSIZE)}")
        if not isinstance(self.device, str) or not self.device:
            raise PlanError(f"TensorSpec of shape {shape!r}: device {self.device!r} must be a name like 'cuda:0'")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "stride", stride)
        object.__setattr__(self, "dtype", dtype)

    @classmethod
    def contiguous(cls, shape: tuple[int, ...], dtype: str, device: str) -> "TensorSpec":
        """A spec with row-major strides for ``shape``."""
        shape = tuple(shape)
        return cls(shape, dtype, contiguous_strides(shape), device)

    @classmethod
    def of(cls, tensor: Any) -> "TensorSpec":
        """The spec of a live tensor (duck-typed: anything with shape, dtype, stride(), device)."""
        return cls(tuple(tensor.shape), dtype_name(tensor.dtype), tuple(tensor.stride()), str(tensor.device))

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "stride": list(self.stride), "device": self.device}


@dataclasses.dataclass(frozen=True)
class CatalogEntry:
    """One clock phase of the shape catalog.

    Attributes:
        index: position in the catalog.
        phase: the step index k this entry was derived at.
        steps: the streaming steps it serves: ``(k,)``, or ``"k+"`` for the steady entry.
        regions: region name -> its arena view at the input of those steps.
        inputs: input name -> the step's input spec.
    """

    index: int
    phase: int
    steps: tuple[int, ...] | str
    regions: Mapping[str, TensorSpec]
    inputs: Mapping[str, TensorSpec]

    @property
    def steady(self) -> bool:
        return isinstance(self.steps, str)

    def serves(self, step: int) -> bool:
        """Whether streaming step ``step`` maps to this entry."""
        if isinstance(self.steps, str):
            return step >= int(self.steps.rstrip("+"))
        return step in self.steps

    def key(self) -> tuple:
        """Hashable signature: every region and input spec, by name."""
        return (tuple(sorted(self.regions.items())), tuple(sorted(self.inputs.items())))

    def __hash__(self) -> int:  # the Mapping fields are dicts; hash the signature instead
        return hash((self.index, self.phase, self.steps, self.key()))

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "phase": self.phase,
            "steps": self.steps if isinstance(self.steps, str) else list(self.steps),
            "regions": {n: s.to_json() for n, s in self.regions.items()},
            "inputs": {n: s.to_json() for n, s in self.inputs.items()},
        }


@dataclasses.dataclass(frozen=True)
class ResolvedRegion:
    """A region with its symbols resolved for one plan.

    Attributes:
        region: the declared region.
        stride: frames its clock advances per step.
        shape: the capacity (arena) shape; for ``Fixed`` the full shape.
        dtype: concrete dtype name ("model" resolved).
        capacity: frames along the growth axis (None for ``Fixed``).
        catalog_width: K.
    """

    region: Region
    stride: int
    shape: tuple[int, ...]
    dtype: str
    capacity: int | None
    catalog_width: int

    @property
    def name(self) -> str:
        return self.region.name

    @property
    def axis(self) -> int | None:
        return self.region.axis

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_ITEMSIZE[self.dtype]

    def extent(self, step: int, dims: Mapping[str, int]) -> int | None:
        """Frames along the growth axis at the input of ``step`` (None for ``Fixed``)."""
        if self.axis is None:
            return None
        return self.region.retention.extent(step, self.stride, dims)

    def view(self, step: int, dims: Mapping[str, int], device: str) -> TensorSpec:
        """The arena view at the input of ``step``: capacity strides, narrowed shape."""
        shape = list(self.shape)
        if self.axis is not None:
            shape[self.axis] = self.extent(step, dims)
        return TensorSpec(tuple(shape), self.dtype, contiguous_strides(self.shape), device)


def model_dtype_name(dtype: Any) -> str:
    """Canonical name of the model dtype the plan resolves "model" regions to."""
    name = dtype_name(dtype)
    if name not in DTYPE_ITEMSIZE:
        raise PlanError(f"model dtype {dtype!r} is not a known dtype; use one of {sorted(DTYPE_ITEMSIZE)}")
    return name


def _dim(region: Region, symbol: str, dims: Mapping[str, int], *, minimum: int, use: str) -> int:
    if symbol not in dims:
        raise PlanError(
            f"region {region.name!r} needs dims[{symbol!r}] ({use}) but dims has only {sorted(dims)}; "
            f"pass {symbol}=<int> in dims")
    value = dims[symbol]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PlanError(f"region {region.name!r}: dims[{symbol!r}]={value!r} must be an int >= {minimum} ({use})")
    return value


def resolve_region(region: Region, clock: Clock, dims: Mapping[str, int], model_dtype: str) -> ResolvedRegion:
    """Resolve ``region``'s symbols, dtype and capacity; PlanError names the region
    and the missing or bad symbol.  Only for in-scope (bounded) regions."""
    if region.clock != clock.name:
        raise PlanError(f"region {region.name!r} is on clock {region.clock!r}, not {clock.name!r}")
    retention = region.retention
    if not retention.bounded:
        raise PlanError(f"region {region.name!r} has {retention.describe()} retention: no finite capacity, "
                        f"so it has no arena slot or catalog shape (it runs eagerly)")
    # Check the retention's symbols here, where the region's name is known.
    for symbol in retention.symbols():
        _dim(region, symbol, dims, minimum=0, use=f"a symbol of {retention.describe()}")
    shape: list[int] = []
    for i, v in enumerate(region.shape):
        if i == region.axis:
            shape.append(-1)  # sized by the retention below
        elif isinstance(v, str):
            shape.append(_dim(region, v, dims, minimum=1, use=f"a symbol of shape {region.shape!r}"))
        else:
            shape.append(v)
    capacity = None
    if region.axis is not None:
        capacity = retention.capacity(clock.most, dims)  # room for the longest step (max_stride)
        shape[region.axis] = capacity
    dtype = model_dtype if region.dtype == MODEL_DTYPE else region.dtype
    return ResolvedRegion(region, clock.stride, tuple(shape), dtype, capacity,
                          retention.catalog_width(clock.stride))


def resolve_regions(declaration: Declaration, dims: Mapping[str, int], dtype: str) -> tuple[ResolvedRegion, ...]:
    """Every in-scope region of ``declaration`` resolved, in declaration order."""
    model_dtype = model_dtype_name(dtype)
    return tuple(resolve_region(r, declaration.clock(r.clock), dims, model_dtype)
                 for r in declaration.regions if r.retention.bounded)


def catalog_width(region: Region, clock: Clock) -> int | None:
    """K for ``region`` on ``clock`` (None: unbounded, out of scope)."""
    if region.clock != clock.name:
        raise PlanError(f"region {region.name!r} is on clock {region.clock!r}; pass that clock, not {clock.name!r}")
    return region.retention.catalog_width(clock.stride)


def _check_inputs(inputs: Mapping[str, TensorSpec]) -> dict[str, TensorSpec]:
    if not isinstance(inputs, Mapping):
        raise PlanError(f"inputs must map input name -> TensorSpec, got {type(inputs).__name__}")
    bad = [n for n, s in inputs.items() if not isinstance(n, str) or not isinstance(s, TensorSpec)]
    if bad:
        raise PlanError(f"inputs {bad!r} must be name -> TensorSpec (use TensorSpec.contiguous(shape, dtype, device))")
    return dict(inputs)


def build_catalog(declaration: Declaration, dims: Mapping[str, int], inputs: Mapping[str, TensorSpec],
                  dtype: str, device: str, *, max_entries: int = MAX_CATALOG_ENTRIES) -> tuple[CatalogEntry, ...]:
    """Enumerate the clock phases of ``declaration`` under ``dims``.

    Steps k = 0, 1, 2, ... are visited until the extents of every in-scope region
    repeat those of step k-1; each visited step is one entry and the last serves all
    later steps (``steps == "k+"``).  ``Unbounded`` regions are left out (out of scope).

    Args:
        dims: values of the shape and prefix symbols (frames or sizes).
        inputs: the step's inputs, the same at every phase.
        dtype: the model dtype that ``"model"`` regions take.
        device: the device of every region view.
    """
    resolved = resolve_regions(declaration, dims, dtype)
    inputs = _check_inputs(inputs)
    growing = [r for r in resolved if r.axis is not None]

    phases: list[tuple[int, ...]] = []
    step = 0
    while True:
        extents = tuple(r.extent(step, dims) for r in growing)
        if phases and extents == phases[-1]:
            break
        if len(phases) == max_entries:
            still = [f"{r.name!r} ({r.region.retention.describe()} on clock {r.region.clock}, "
                     f"stride {r.stride}: K={r.catalog_width})"
                     for r, a, b in zip(growing, phases[-1], extents) if a != b]
            who = ("region " if len(still) == 1 else "regions ") + ", ".join(still)
            raise PlanError(
                f"shape catalog exceeds {max_entries} entries: {who} "
                f"{'keeps' if len(still) == 1 else 'keep'} growing; "
                f"retain fewer frames, advance more per step, or declare it Unbounded() to run it eagerly")
        phases.append(extents)
        step += 1

    last = len(phases) - 1
    return tuple(
        CatalogEntry(
            index=k, phase=k,
            steps=f"{k}+" if k == last else (k,),
            regions={r.name: r.view(k, dims, device) for r in resolved},
            inputs=dict(inputs),
        )
        for k in range(len(phases))
    )


def entry_for_step(catalog: tuple[CatalogEntry, ...], step: int) -> CatalogEntry:
    """The entry serving streaming step ``step`` (the steady entry past the last phase)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise PlanError(f"step={step!r} must be an int >= 0 (0 = first streaming step)")
    if not catalog:
        raise PlanError("the catalog is empty; build it with build_catalog(...)")
    for entry in catalog:
        if entry.serves(step):
            return entry
    raise PlanError(f"no catalog entry serves step {step} (steps: {[e.steps for e in catalog]}); "
                    f"the last entry must be the steady one ('k+')")
