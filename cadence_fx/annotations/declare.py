"""``@native_clock``: attach a model's clocks and regions to its class or instance.

Three ways to declare, all storing one ``Declaration`` under ``__cadence_declaration__``::

    @native_clock(clocks=[...], regions=[...], step="stream")   # (a) on our own class
    class Tail(nn.Module): ...

    native_clock(clocks=..., regions=...)(UpstreamDecoder)        # (b) on a class we cannot edit
    native_clock(clocks=..., regions=...)(decoder)                # (c) on one instance only

The declaration is validated on the spot, so a bad one fails where it is written.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, TypeVar

from ..errors import DeclarationError
from .clocks import Clock
from .regions import Region

#: The attribute a declaration is stored under (on a class or an instance).
DECLARATION_ATTR = "__cadence_declaration__"

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Declaration:
    """A model's native clocks and the state regions that advance on them.

    Attributes:
        clocks: every clock a region may refer to (clocks without regions are allowed,
            e.g. Token2Wav's token clock).
        regions: the streaming state, in the order the step carries it.
        step: name of the model method that performs one streaming step
            (documentation and introspection only).
        unit: what one step consumes/produces, in words (e.g. "chunk of 25 tokens").
        initial_state: name of the model method that returns the state before the first
            step (the generic path, ``integrations.generic``: ``optimize`` needs no
            adapter when the step method takes its inputs and then one tensor per
            carried region); ``None`` where an adapter sets the stream up.
    """

    clocks: tuple[Clock, ...]
    regions: tuple[Region, ...]
    step: str = "step"
    unit: str | None = None
    initial_state: str | None = None

    def __post_init__(self) -> None:
        clocks = _as_tuple(self.clocks, Clock, "clocks")
        regions = _as_tuple(self.regions, Region, "regions")
        object.__setattr__(self, "clocks", clocks)
        object.__setattr__(self, "regions", regions)

        if not clocks:
            raise DeclarationError("declaration has no clocks; declare at least one Clock(name, hz, stride)")
        if not regions:
            raise DeclarationError(
                "declaration has no regions; declare the streaming state as Region(...)s "
                "(a model without carried state needs no native_clock)")
        _no_duplicates([c.name for c in clocks], "clock")
        _no_duplicates([r.name for r in regions], "region")

        known = {c.name for c in clocks}
        for r in regions:
            if r.clock not in known:
                raise DeclarationError(
                    f"Region {r.name!r} is on clock {r.clock!r}, which is not declared "
                    f"(clocks: {sorted(known)}); add Clock({r.clock!r}, hz, stride) or fix the name")

        owner: dict[str, str] = {}
        for r in regions:
            for path in r.buffers:
                if path in owner:
                    raise DeclarationError(
                        f"buffer {path!r} is bound by both region {owner[path]!r} and region {r.name!r}; "
                        f"a buffer can back one region only")
                owner[path] = r.name

        if not isinstance(self.step, str) or not self.step.isidentifier():
            raise DeclarationError(f"step={self.step!r} must name the model's streaming-step method")
        if self.unit is not None and not isinstance(self.unit, str):
            raise DeclarationError(f"unit={self.unit!r} must be a string or None")
        if self.initial_state is not None and (not isinstance(self.initial_state, str)
                                               or not self.initial_state.isidentifier()):
            raise DeclarationError(f"initial_state={self.initial_state!r} must name the model method that returns "
                                   f"the state before the first step, or be None")

    def clock(self, name: str) -> Clock:
        """The clock called ``name``."""
        for c in self.clocks:
            if c.name == name:
                return c
        raise DeclarationError(f"no clock {name!r} in this declaration (clocks: {[c.name for c in self.clocks]})")

    def region(self, name: str) -> Region:
        """The region called ``name``."""
        for r in self.regions:
            if r.name == name:
                return r
        raise DeclarationError(f"no region {name!r} in this declaration (regions: {[r.name for r in self.regions]})")

    def to_json(self) -> dict[str, Any]:
        return {
            "clocks": [c.to_json() for c in self.clocks],
            "regions": [r.to_json() for r in self.regions],
            "step": self.step,
            "unit": self.unit,
            "initial_state": self.initial_state,
        }


def _as_tuple(items: Iterable[Any], kind: type, field: str) -> tuple:
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise DeclarationError(f"{field} must be a list of {kind.__name__}s, got {items!r}")
    items = tuple(items)
    bad = [x for x in items if not isinstance(x, kind)]
    if bad:
        raise DeclarationError(f"{field} must hold {kind.__name__} objects only; got {bad!r}")
    return items


def _no_duplicates(names: list[str], kind: str) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise DeclarationError(f"{kind} {n!r} is declared twice; give each {kind} a unique name")
        seen.add(n)


def native_clock(*, clocks: Iterable[Clock], regions: Iterable[Region], step: str = "step",
                 unit: str | None = None, initial_state: str | None = None) -> Callable[[T], T]:
    """Declare native clocks and regions; returns a decorator for a class or instance.

    ``step`` names the streaming-step method and ``initial_state`` the method giving the
    state before the first step; with both, a model whose step takes its inputs and then
    one tensor per carried region needs no adapter (``cadence_fx.optimize`` takes it as it is).

    The decorator stores the ``Declaration`` under ``__cadence_declaration__`` on its
    argument and returns the argument itself: on a class it applies to every instance
    (and subclass), on an instance to that instance only.
    """
    declaration = Declaration(clocks=clocks, regions=regions, step=step, unit=unit, initial_state=initial_state)

    def attach(target: T) -> T:
        try:
            setattr(target, DECLARATION_ATTR, declaration)
        except (AttributeError, TypeError) as e:
            raise DeclarationError(
                f"cannot attach a declaration to {_describe(target)} ({e}); decorate its class "
                f"with native_clock(...) instead") from e
        return target

    return attach


def get_declaration(obj: Any) -> Declaration:
    """The declaration of ``obj``: its own (instance) one first, then its class's."""
    own = getattr(obj, "__dict__", None)
    if isinstance(own, dict) and DECLARATION_ATTR in own:
        found = own[DECLARATION_ATTR]
    else:
        cls = obj if isinstance(obj, type) else type(obj)
        found = getattr(cls, DECLARATION_ATTR, None)
    if found is None:
        raise DeclarationError(
            f"{_describe(obj)} has no @native_clock declaration; decorate the class or call "
            f"native_clock(...)(obj)")
    if not isinstance(found, Declaration):
        raise DeclarationError(
            f"{_describe(obj)}.{DECLARATION_ATTR} is a {type(found).__name__}, not a Declaration; "
            f"set it only through native_clock(...)")
    return found


def _describe(obj: Any) -> str:
    if isinstance(obj, type):
        return f"class {obj.__qualname__}"
    return f"{type(obj).__qualname__} instance"
