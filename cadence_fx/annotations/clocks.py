"""Clocks: the named counters a model's streaming state advances on.

A streaming step advances every clock of a declaration once, each by its own
``stride`` (frames of that clock per step).  The Step-Audio2 Token2Wav tail runs
three clocks per chunk: ``Clock("token", 25, 25)``, ``Clock("mel", 50, 50)`` and
``Clock("sample", 24000, 24000)``; Mimi's decoder ``Clock("frame", 12.5, 1)``,
``Clock("latent", 25, 2)`` and ``Clock("sample", 24000, 1920)``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..errors import DeclarationError


@dataclasses.dataclass(frozen=True)
class Clock:
    """A named counter advancing ``stride`` frames per streaming step.

    Attributes:
        name: identifier the regions refer to (``Region(clock="mel")``).
        hz: frames of this clock per second of audio (Hz); informational, the
            plan only needs ``stride``.
        stride: frames this clock advances per streaming step (>= 1).
        max_stride: the most frames one step may advance (>= stride; default: stride):
            a step off the catalog, such as a flush longer than the usual chunk, may
            advance more, and the arena holds it (``Window`` capacity: prefix + retain +
            max_stride) so that such a step can run a program of its own
            (``runtime.variants``) instead of the eager path.
    """

    name: str
    hz: float
    stride: int
    max_stride: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise DeclarationError(
                f"Clock name {self.name!r} is not an identifier; name clocks like 'mel' or 'token'")
        if (isinstance(self.hz, bool) or not isinstance(self.hz, (int, float))
                or not math.isfinite(self.hz) or self.hz <= 0):
            raise DeclarationError(
                f"Clock {self.name!r}: hz={self.hz!r} must be a finite rate > 0 (frames per second)")
        if isinstance(self.stride, bool) or not isinstance(self.stride, int) or self.stride < 1:
            raise DeclarationError(
                f"Clock {self.name!r}: stride={self.stride!r} must be an int >= 1 "
                f"(frames this clock advances per streaming step)")
        if self.max_stride is not None and (isinstance(self.max_stride, bool) or not isinstance(self.max_stride, int)
                                            or self.max_stride < self.stride):
            raise DeclarationError(
                f"Clock {self.name!r}: max_stride={self.max_stride!r} must be an int >= stride ({self.stride}): "
                f"the most frames one step may advance")
        # One representation for equal rates: Clock("mel", 50, 50) == Clock("mel", 50.0, 50).
        object.__setattr__(self, "hz", float(self.hz))
        if self.max_stride == self.stride:
            object.__setattr__(self, "max_stride", None)

    @property
    def most(self) -> int:
        """The most frames one step may advance (``max_stride``, else ``stride``)."""
        return self.stride if self.max_stride is None else self.max_stride

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "hz": self.hz, "stride": self.stride}
        if self.max_stride is not None:
            out["max_stride"] = self.max_stride
        return out
