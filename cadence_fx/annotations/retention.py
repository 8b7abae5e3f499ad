"""Retention policies: how much of a region's growth axis stays live.

Every policy answers three questions about a region on a clock advancing
``stride`` frames per streaming step:

* ``catalog_width(stride)``: K, the number of distinct extents the region takes
  (``None``: unbounded, no finite catalog);
* ``extent(step, stride, dims)``: the region's length along its growth axis at the
  *input* of streaming step ``step`` (step 0 = the first step after setup), in frames;
* ``capacity(stride, dims)``: the live extent the arena must hold, in frames; for a
  ``Window`` that is the pre-trim length ``prefix + retain + stride`` (the step
  appends ``stride`` frames before trimming back to ``prefix + retain``).

``dims`` resolves symbolic sizes such as ``prefix="prompt_frames"``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping

from ..errors import DeclarationError, PlanError


def _check_stride(policy: str, stride: int) -> None:
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise PlanError(f"{policy}: stride={stride!r} must be an int >= 1 (frames per streaming step)")


def _check_step(policy: str, step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise PlanError(f"{policy}: step={step!r} must be an int >= 0 (0 = first streaming step)")


@dataclasses.dataclass(frozen=True)
class Retention:
    """Base of the retention policies; not used directly."""

    #: False for policies with no finite catalog (the region's verdict is "out").
    bounded: ClassVar[bool] = True
    #: False for policies without a growth axis (the region's axis must be None).
    has_axis: ClassVar[bool] = True

    def catalog_width(self, stride: int) -> int | None:
        """K: how many distinct extents the region takes over a session (None: unbounded)."""
        raise NotImplementedError

    def extent(self, step: int, stride: int, dims: Mapping[str, int]) -> int:
        """Frames along the growth axis at the input of streaming step ``step``."""
        raise NotImplementedError

    def capacity(self, stride: int, dims: Mapping[str, int]) -> int:
        """Frames along the growth axis the arena must hold (the largest live extent)."""
        raise NotImplementedError

    def symbols(self) -> tuple[str, ...]:
        """Names this policy reads from ``dims``."""
        return ()

    def describe(self) -> str:
        """Compact constructor-like text, e.g. ``Window(retain=100, prefix=prompt_frames)``;
        parameters left at their defaults are omitted (``Window(retain=8)``)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        fields = ", ".join(f"{k}={v}" for k, v in self._params().items()
                           if defaults.get(k, dataclasses.MISSING) != v)
        return f"{type(self).__name__}({fields})"

    def to_json(self) -> dict[str, Any]:
        return {"policy": type(self).__name__, **self._params()}

    def _params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True)
class Fixed(Retention):
    """Constant shape, no growth axis (a conv carry of fixed width). K = 1."""

    has_axis: ClassVar[bool] = False

    def catalog_width(self, stride: int) -> int:
        return 1

    def extent(self, step: int, stride: int, dims: Mapping[str, int]) -> int:
        raise PlanError("Fixed() has no growth axis, so no extent; use the region's full declared shape")

    def capacity(self, stride: int, dims: Mapping[str, int]) -> int:
        raise PlanError("Fixed() has no growth axis, so no capacity; use the region's full declared shape")


@dataclasses.dataclass(frozen=True, init=False, repr=False)
class Ring(Retention):
    """A fixed-capacity ring written in place (Moshi's temporal KV). K = 1.

    Constructed as ``Ring(capacity)``; the frame count is stored as ``frames``
    because ``capacity`` is the policy method every retention shares.
    """

    frames: int

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise DeclarationError(f"Ring(capacity={capacity!r}): capacity must be an int >= 1 (frames)")
        object.__setattr__(self, "frames", capacity)

    def __repr__(self) -> str:
        return f"Ring(capacity={self.frames})"

    def catalog_width(self, stride: int) -> int:
        return 1

    def extent(self, step: int, stride: int, dims: Mapping[str, int]) -> int:
        _check_step(repr(self), step)
        return self.frames

    def capacity(self, stride: int, dims: Mapping[str, int]) -> int:
        return self.frames

    def _params(self) -> dict[str, Any]:
        return {"capacity": self.frames}


@dataclasses.dataclass(frozen=True)
class Window(Retention):
    """Keep a prefix and the last ``retain`` frames (the Token2Wav attention carry).

    extent(k) = prefix + min(k * stride, retain) frames; capacity = prefix + retain +
    stride frames (the pre-trim length); K = ceil(retain / stride) + 1.

    Attributes:
        retain: frames kept after the prefix (>= 0).
        prefix: frames kept at the front (a prompt), an int or a symbol resolved
            from ``dims`` when planning (e.g. ``"prompt_frames"``).
    """

    retain: int
    prefix: int | str = 0

    def __post_init__(self) -> None:
        if isinstance(self.retain, bool) or not isinstance(self.retain, int) or self.retain < 0:
            raise DeclarationError(f"Window(retain={self.retain!r}): retain must be an int >= 0 (frames)")
        p = self.prefix
        if isinstance(p, str):
            if not p.isidentifier():
                raise DeclarationError(
                    f"Window(prefix={p!r}): a symbolic prefix must be an identifier such as "
                    f"'prompt_frames' (resolved from dims when planning)")
        elif isinstance(p, bool) or not isinstance(p, int) or p < 0:
            raise DeclarationError(
                f"Window(prefix={p!r}): prefix must be an int >= 0 (frames) or a symbol name")

    def catalog_width(self, stride: int) -> int:
        _check_stride(self.describe(), stride)
        return math.ceil(self.retain / stride) + 1

    def extent(self, step: int, stride: int, dims: Mapping[str, int]) -> int:
        _check_step(self.describe(), step)
        _check_stride(self.describe(), stride)
        return self.resolve_prefix(dims) + min(step * stride, self.retain)

    def capacity(self, stride: int, dims: Mapping[str, int]) -> int:
        _check_stride(self.describe(), stride)
        return self.resolve_prefix(dims) + self.retain + stride

    def symbols(self) -> tuple[str, ...]:
        return (self.prefix,) if isinstance(self.prefix, str) else ()

    def resolve_prefix(self, dims: Mapping[str, int]) -> int:
        """The prefix in frames (looked up in ``dims`` when symbolic)."""
        if not isinstance(self.prefix, str):
            return self.prefix
        if self.prefix not in dims:
            raise PlanError(
                f"{self.describe()}: prefix symbol {self.prefix!r} is not in dims "
                f"(has {sorted(dims)}); pass dims[{self.prefix!r}] in frames")
        value = dims[self.prefix]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PlanError(f"{self.describe()}: dims[{self.prefix!r}]={value!r} must be an int >= 0 (frames)")
        return value


@dataclasses.dataclass(frozen=True)
class ChunkPad(Retention):
    """A codec window: each step decodes ``chunk`` new frames and carries ``pad``
    frames of left context (Freeze-Omni: chunk 40 + pad 10).

    Behaves as ``Window(retain=pad, prefix=0)`` on a clock advancing ``chunk`` frames
    per step, whatever the clock's stride: extent(0) = 0, then ``pad``; capacity =
    pad + chunk; K = ceil(pad / chunk) + 1 (2 when 0 < pad < chunk).
    """

    chunk: int
    pad: int

    def __post_init__(self) -> None:
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise DeclarationError(f"ChunkPad(chunk={self.chunk!r}): chunk must be an int >= 1 (frames)")
        if isinstance(self.pad, bool) or not isinstance(self.pad, int) or self.pad < 0:
            raise DeclarationError(f"ChunkPad(pad={self.pad!r}): pad must be an int >= 0 (frames)")
        if self.pad >= self.chunk:
            raise DeclarationError(
                f"ChunkPad(chunk={self.chunk}, pad={self.pad}): pad must be < chunk; "
                f"for longer left context declare Window(retain={self.pad}) instead")

    def _as_window(self) -> Window:
        return Window(retain=self.pad, prefix=0)

    # The chunk, not the clock's stride, is what one step decodes.
    def catalog_width(self, stride: int) -> int:
        return self._as_window().catalog_width(self.chunk)

    def extent(self, step: int, stride: int, dims: Mapping[str, int]) -> int:
        return self._as_window().extent(step, self.chunk, dims)

    def capacity(self, stride: int, dims: Mapping[str, int]) -> int:
        return self._as_window().capacity(self.chunk, dims)


@dataclasses.dataclass(frozen=True)
class Unbounded(Retention):
    """Grows without bound (a cache that is never trimmed).  K = None: the region is
    out of scope and its callables run eagerly."""

    bounded: ClassVar[bool] = False

    def catalog_width(self, stride: int) -> None:
        return None

    def extent(self, step: int, stride: int, dims: Mapping[str, int]) -> int:
        _check_step("Unbounded()", step)
        _check_stride("Unbounded()", stride)
        return step * stride

    def capacity(self, stride: int, dims: Mapping[str, int]) -> int:
        raise PlanError("Unbounded() has no finite capacity; the region is out of scope and stays eager")
