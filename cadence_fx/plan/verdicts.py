"""Scope verdicts: per region (and, from later stages, per callable) ``in`` or ``out``.

Out-of-scope work runs eagerly; it is never approximated.  A region is out when its
retention has no finite catalog (``Unbounded``).  Verdicts on callables (variable
query length, host sync, data-dependent shape...) come from the passes and are
added to the plan through ``make_plan(extra_verdicts=...)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..annotations import Declaration
from ..errors import PlanError
from .catalog import model_dtype_name, resolve_region

KINDS = ("region", "callable")
VERDICTS = ("in", "out")

UNBOUNDED_REASON = "unbounded growth: no finite catalog"


@dataclasses.dataclass(frozen=True)
class ScopeVerdict:
    """Whether ``subject`` is captured (``in``) or runs eagerly (``out``), and why.

    Attributes:
        subject: a region name or a callable's qualified name.
        kind: "region" or "callable".
        verdict: "in" or "out".
        reason: one line a reader can act on.
    """

    subject: str
    kind: str
    verdict: str
    reason: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise PlanError(f"verdict on {self.subject!r}: kind={self.kind!r} must be one of {KINDS}")
        if self.verdict not in VERDICTS:
            raise PlanError(f"verdict on {self.subject!r}: verdict={self.verdict!r} must be one of {VERDICTS}")
        if not self.reason:
            raise PlanError(f"verdict on {self.subject!r}: give a reason")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def region_verdicts(declaration: Declaration, dims: Mapping[str, int],
                    dtype: str = "float32") -> tuple[ScopeVerdict, ...]:
    """One verdict per declared region, in declaration order.

    ``dims`` resolves the capacity quoted in the reason; ``dtype`` only matters for
    regions of dtype "model" and does not change the text.
    """
    model_dtype = model_dtype_name(dtype)
    out = []
    for region in declaration.regions:
        clock = declaration.clock(region.clock)
        policy = region.retention.describe()
        if not region.retention.bounded:
            out.append(ScopeVerdict(region.name, "region", "out", UNBOUNDED_REASON))
            continue
        resolved = resolve_region(region, clock, dims, model_dtype)
        if resolved.capacity is None:
            detail = f"constant shape {resolved.shape}"
        else:
            detail = f"capacity {resolved.capacity} frames"
        reason = f"{policy} on clock {clock.name}, stride {clock.stride}: K={resolved.catalog_width}, {detail}"
        out.append(ScopeVerdict(region.name, "region", "in", reason))
    return tuple(out)
