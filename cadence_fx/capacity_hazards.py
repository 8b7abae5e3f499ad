"""The hazard check of a capacity graph at one stream's length (``capacity_executable``'s).

A capacity graph is proven free of region hazards by ``state_rewrite`` at the capacity;
where a region's extent moves with the length, a stream at another length could read old
state from bytes a write already took.  ``hazards_at`` checks a graph at a stream's dims:
a walk of the region views at that length's host sizes (``aliasing.record_region_accesses``
through the graph's ``WalkPlan``, made once per graph: ``walk_plan``), or where the walk
cannot follow, a run of the graph on zeroed regions.  The walk reads no value: its result
is the graph's at those dims, whoever asks, so a stream checks each graph once and may do
it ahead of the chunk that needs it (``full_run=False``: the walk alone, None where only a
run can tell; ``capacity_executable._StreamBuilder.work_ahead``: in idle time).
"""

from __future__ import annotations

import threading
import weakref
from typing import Mapping

import torch
import torch.fx as fx

from . import step as meta
from .foreground import forked_rng
from .passes import aliasing, capacity_ops
from .passes.capacity_ops import at_dims

#: each checked graph's walk plan (``aliasing.WalkPlan``: what the hazard walk visits, the same at every length)
_PLANS: "weakref.WeakKeyDictionary[fx.GraphModule, aliasing.WalkPlan]" = weakref.WeakKeyDictionary()
_PLANS_LOCK = threading.Lock()


def walk_plan(gm: fx.GraphModule) -> aliasing.WalkPlan:
    """``gm``'s hazard-walk plan, made once (again if the graph changed since)."""
    with _PLANS_LOCK:
        plan = _PLANS.get(gm)
        if plan is None or not plan.fits(gm):
            plan = _PLANS[gm] = aliasing.WalkPlan(gm)
        return plan


def hazards_at(gm: fx.GraphModule, slots: Mapping[str, tuple], device, inputs: "list | None",
               dims: Mapping[str, int], lengths: list, scratch: "dict | None" = None,
               full_run: bool = True) -> "list | None":
    """``state_rewrite``'s region hazards of a rule-S capacity graph at ``dims`` on scratch
    regions (``slots``: region -> (shape, dtype)): reads of old state after a write to the
    same bytes, as ``aliasing.region_hazards`` words them.  From the region views alone at
    the host sizes of ``dims`` (``aliasing.record_region_accesses``: nothing of the step
    runs, so the regions are left unwritten: ``torch.empty``); where that walk cannot follow,
    from running the graph once on zeroed regions on ``inputs`` and ``lengths`` (with
    ``full_run=False``: None instead, undecided; ``inputs`` may then be None).  ``scratch``:
    regions to reuse, by name, shape and dtype (a caller checking several graphs at one
    length: one allocation)."""
    scratch = {} if scratch is None else scratch
    regions = {}
    for n, (shape, dtype) in slots.items():
        key = (n, tuple(shape), dtype)
        if key not in scratch:
            scratch[key] = torch.empty(shape, dtype=dtype, device=device)
        regions[n] = scratch[key]
    plan = walk_plan(gm)
    with at_dims(dims):  # the host sizes the region views take: the walk needs no run of the model
        try:
            return aliasing.region_hazards(aliasing.record_region_accesses(gm, regions, capacity_ops.host_sizes(gm),
                                                                           plan))
        except aliasing.NeedsFullRun:
            if not full_run:
                return None
    if inputs is None:
        raise ValueError("hazards_at: the walk cannot follow this graph and no inputs were given to run it on")
    for r in regions.values():  # the run reads them: defined values (NaN in fresh memory could steer a branch)
        r.zero_()
    args = list(inputs) + list(lengths) + [regions[n] for n in meta.arena_inputs(gm)]
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with at_dims(dims), forked_rng(devices, "the capacity executable's hazard check"), torch.no_grad():
        return aliasing.region_hazards(aliasing.record_accesses(gm, args, regions))


__all__ = ["hazards_at", "walk_plan"]
