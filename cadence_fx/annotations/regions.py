"""Regions: the pieces of streaming state a model declares.

A region is one tensor of carried state (a KV cache, a conv carry, a vocoder tail)
or of per-step scratch that replaces an over-provisioned module buffer.  Its shape
is a template of ints and symbols resolved from the plan's ``dims``; the entry at
``axis`` is the growth axis, sized by the retention policy instead (write ``"T"``
there by convention).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import DeclarationError
from .retention import Fixed, Retention

#: Bytes per element of every dtype a region may use, by torch dtype name.  Kept as
#: data so planning needs no torch import.
DTYPE_ITEMSIZE: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
    "complex128": 16, "complex64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}

#: The dtype placeholder for "whatever dtype the model runs in" (resolved when planning).
MODEL_DTYPE = "model"


def dtype_name(dtype: Any) -> str:
    """Canonical dtype name: ``torch.float16`` and ``"torch.float16"`` -> ``"float16"``.

    Unknown names come back unchanged (callers check against ``DTYPE_ITEMSIZE``).
    """
    name = str(dtype)
    return name[len("torch."):] if name.startswith("torch.") else name


def _is_shape_entry(v: Any) -> bool:
    if isinstance(v, str):
        return v.isidentifier()
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _is_buffer_path(path: Any) -> bool:
    # Dotted module path; numeric parts index ModuleLists ("blocks.0.attn.cache").
    return (isinstance(path, str) and bool(path)
            and all(p.isidentifier() or p.isdigit() for p in path.split(".")))


@dataclasses.dataclass(frozen=True)
class Region:
    """One piece of streaming state, declared against a clock.

    Attributes:
        name: identifier of the region (the key of the step's state dict).
        clock: name of the ``Clock`` the region advances on (a ``Clock`` is accepted
            and reduced to its name).
        shape: template of ints and symbol names, e.g.
            ``("n_timesteps", 16, 2, 8, "T", 128)``; the entry at ``axis`` is ignored.
        dtype: torch dtype name (``"float32"``, ``"int64"``...) or ``"model"`` for the
            model's dtype.
        axis: index of the growth axis (frames of ``clock``); None for ``Fixed``.
        retention: how much of the growth axis stays live.
        buffers: module-buffer paths (``"decoder.att_cache_buffer"``) this region
            replaces; each path may be bound by one region only.
        carried: True for state carried from step to step (returned by the step);
            False for per-step scratch that only replaces a module buffer.
        doc: one line on what the state is.
    """

    name: str
    clock: str
    shape: tuple[int | str, ...]
    dtype: str = MODEL_DTYPE
    axis: int | None = None
    retention: Retention = Fixed()
    buffers: tuple[str, ...] = ()
    carried: bool = True
    doc: str = ""

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name.isidentifier():
            raise DeclarationError(f"Region name {name!r} is not an identifier; name regions like 'att_cache'")
        where = f"Region {name!r}"

        clock = getattr(self.clock, "name", self.clock)  # a Clock reduces to its name
        if not isinstance(clock, str) or not clock.isidentifier():
            raise DeclarationError(f"{where}: clock={self.clock!r} must be a clock name such as 'mel'")
        object.__setattr__(self, "clock", clock)

        if isinstance(self.shape, (str, bytes)) or not hasattr(self.shape, "__iter__"):
            raise DeclarationError(f"{where}: shape={self.shape!r} must be a tuple of ints and symbol names")
        shape = tuple(self.shape)
        bad = [v for v in shape if not _is_shape_entry(v)]
        if bad:
            raise DeclarationError(
                f"{where}: shape entries {bad!r} in {shape!r} must be ints >= 1 or symbol names "
                f"(identifiers resolved from dims, e.g. 'n_timesteps')")
        object.__setattr__(self, "shape", shape)

        dtype = dtype_name(self.dtype)
        if dtype != MODEL_DTYPE and dtype not in DTYPE_ITEMSIZE:
            raise DeclarationError(
                f"{where}: unknown dtype {self.dtype!r}; use 'model' or one of {sorted(DTYPE_ITEMSIZE)}")
        object.__setattr__(self, "dtype", dtype)

        if not isinstance(self.retention, Retention) or type(self.retention) is Retention:
            raise DeclarationError(
                f"{where}: retention={self.retention!r} must be Fixed(), Ring(...), Window(...), "
                f"ChunkPad(...) or Unbounded()")
        policy = self.retention.describe()
        if not self.retention.has_axis:
            if self.axis is not None:
                raise DeclarationError(
                    f"{where}: {policy} has no growth axis but axis={self.axis!r}; drop axis or "
                    f"declare Window/Ring/ChunkPad retention")
        elif self.axis is None:
            if self.retention.bounded:
                raise DeclarationError(
                    f"{where}: {policy} needs axis=<index of the growth axis in shape {shape!r}>")
        else:
            if isinstance(self.axis, bool) or not isinstance(self.axis, int):
                raise DeclarationError(f"{where}: axis={self.axis!r} must be an int index into shape {shape!r}")
            if not -len(shape) <= self.axis < len(shape):
                raise DeclarationError(
                    f"{where}: axis={self.axis} is out of range for shape {shape!r} "
                    f"({len(shape)} dims); point it at the growth axis (conventionally 'T')")
            object.__setattr__(self, "axis", self.axis % len(shape))

        if isinstance(self.buffers, str):
            # A bare string would otherwise be split into characters.
            raise DeclarationError(f"{where}: buffers must be a tuple of paths, e.g. ({self.buffers!r},)")
        buffers = tuple(self.buffers)
        bad = [b for b in buffers if not _is_buffer_path(b)]
        if bad:
            raise DeclarationError(
                f"{where}: buffer paths {bad!r} must be dotted module paths such as 'decoder.att_cache_buffer'")
        dup = sorted({b for b in buffers if buffers.count(b) > 1})
        if dup:
            raise DeclarationError(f"{where}: buffer paths {dup} are listed twice; list each once")
        object.__setattr__(self, "buffers", buffers)

        if not isinstance(self.carried, bool):
            raise DeclarationError(f"{where}: carried={self.carried!r} must be True or False")
        if not isinstance(self.doc, str):
            raise DeclarationError(f"{where}: doc must be a string")

    def symbols(self) -> tuple[str, ...]:
        """Names this region reads from ``dims`` (shape symbols off the growth axis,
        then the retention's), in order of first use."""
        names = [v for i, v in enumerate(self.shape) if isinstance(v, str) and i != self.axis]
        names += self.retention.symbols()
        return tuple(dict.fromkeys(names))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "clock": self.clock,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "axis": self.axis,
            "retention": self.retention.to_json(),
            "buffers": list(self.buffers),
            "carried": self.carried,
            "doc": self.doc,
        }
