"""Plan: shape catalog, arena layout and scope verdicts, derived from a declaration.

Pure Python (no torch, no CUDA): a plan can be built, printed (``Plan.explain()``)
and serialised (``Plan.to_json()``) before anything runs on a GPU.
"""

from .catalog import (MAX_CATALOG_ENTRIES, CatalogEntry, TensorSpec, build_catalog, catalog_width,
                      entry_for_step, same_layout)
from .layout import ARENA_ALGORITHMS, ArenaLayout, RegionSlot, plan_arena, verify_layout
from .plan import Plan, make_plan
from .verdicts import ScopeVerdict, region_verdicts

__all__ = [
    "catalog_width", "TensorSpec", "CatalogEntry", "build_catalog", "entry_for_step", "MAX_CATALOG_ENTRIES", "same_layout",
    "RegionSlot", "ArenaLayout", "plan_arena", "verify_layout", "ARENA_ALGORITHMS",
    "ScopeVerdict", "region_verdicts",
    "Plan", "make_plan",
]
