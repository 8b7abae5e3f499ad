"""One executable for every prompt length up to a capacity (architecture item 4, rule S, CPU-tested).

``capacity_executable(adapter_at_capacity, steps)`` builds each catalog entry once: its
symbolic step rewritten by ``passes.capacity.capacity_form`` at the adapter's dims (the
capacity), its buffers bound to a scratch arena laid out by the plan at the capacity,
then the compiler's own rule-S passes (``StateRewrite`` puts the state in the arena).
``at_length(executable, adapter)`` is that executable for a stream at another length: an
``Executable`` whose plan is the one at the stream's length (its catalog and extents: what
the session's state, snapshots and comparisons read) laid out as the capacity's arena, and
whose programs are the shared graphs, called with the stream's length (``AtDims``: the host
dims in ``capacity_ops.at_dims``, the device lengths as the graphs' extra inputs).
``check_dims`` refuses a length the graphs do not serve (past the capacity, another branch
class).  A chunk the catalog does not hold (a window, a flush) runs the eager fallback
(no ``Variants`` yet); rules R (capture) and the program cache come next.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch
import torch.fx as fx

from . import step as meta
from .errors import PassError
from .foreground import forked_rng
from .passes import aliasing
from .compiler import build_plan, region_bindings, region_buffers, rewrite_pipeline
from .passes.capacity import at_dims, capacity_form, check_dims
from .passes.capacity_plan import CapacityPlan
from .passes.trace_symbolic import SymbolicStep
from .runtime.arena import Arena
from .runtime.session import EntryProgram, Executable
from .step import Rules


@dataclasses.dataclass
class CapacityExecutable:
    """Each catalog entry's capacity-form graph (after the rule-S passes), at ``dims``."""

    plan: Any  # the plan at the capacity (its arena layout is every stream's)
    graphs: dict  # entry index -> (GraphModule, CapacityPlan, SymbolicStep)
    signature: meta.StepSignature
    dims: dict  # the capacity
    device: torch.device


class AtDims:
    """A capacity graph called for one stream: its host dims set, its device lengths inserted
    after the step's inputs (``n_inputs`` of them)."""

    def __init__(self, gm: fx.GraphModule, dims: Mapping[str, int], lengths: list, n_inputs: int):
        self.gm, self.dims, self.lengths, self.n_inputs = gm, dict(dims), lengths, n_inputs

    def __call__(self, *args):
        with at_dims(self.dims):
            return self.gm(*args[:self.n_inputs], *self.lengths, *args[self.n_inputs:])


def capacity_executable(adapter, steps: Mapping[int, SymbolicStep], masked_attention=False) -> CapacityExecutable:
    """Every catalog entry of ``adapter`` (made at the capacity: its symbolic dims' values)
    from ``steps`` (entry index -> its symbolic step), rule S."""
    device = torch.device(adapter.device)
    plan = build_plan(adapter)
    dims = {d: int(adapter.dims()[d]) for d in adapter.symbolic_dims()}
    scratch = Arena(plan.layout, device)
    by_region = region_buffers(adapter.declaration, scratch)
    graphs = {}
    for entry in plan.catalog:
        sym = steps[entry.index]
        gm, cplan = capacity_form(sym, dims, masked_attention, buffers=by_region,
                                  keep_values=True)  # what the passes read of each node
        gm.meta[meta.EXAMPLE_INPUTS] = (list(adapter.example_inputs().values())
                                        + [torch.tensor(dims[d], device=device) for d in sym.dims])
        with at_dims(dims):  # EarlyWriteback's check runs the graph, at the capacity
            gm, _ = rewrite_pipeline(region_bindings(plan, entry), "S", device.type)(gm)
        graphs[entry.index] = (gm, cplan, sym)
    return CapacityExecutable(plan, graphs, adapter.signature, dims, device)


def at_length(cexe: CapacityExecutable, adapter, check_hazards: bool = True) -> Executable:
    """``cexe`` for streams of ``adapter`` (the same model at another length of its symbolic
    dims); ``SpecializationRefused`` where a graph does not serve that length.  With
    ``check_hazards`` each entry runs once on a scratch arena at this length and every read
    of old state after a write to the same bytes is refused (``PassError``): the rule-S
    passes proved it at the capacity only, and where a read and a write fall moves with
    the length (one eager run per entry and length, as a per-length build's check costs)."""
    plan_here = build_plan(adapter)
    dims = {d: int(adapter.dims()[d]) for d in cexe.dims}
    if [e.index for e in plan_here.catalog] != sorted(cexe.graphs):
        raise ValueError(f"the catalog at {dims} has entries {[e.index for e in plan_here.catalog]}, "
                         f"the capacity's {sorted(cexe.graphs)}")
    programs = {}
    for entry in plan_here.catalog:
        gm, cplan, sym = cexe.graphs[entry.index]
        check_dims(cplan, sym, dims)
        lengths = [torch.tensor(dims[d], device=cexe.device) for d in sym.dims]
        if check_hazards:
            problems = _hazards(gm, cexe, adapter, dims, lengths)
            if problems:
                raise PassError(f"entry {entry.index} at {dims}: the arena's state is overwritten before it is "
                                f"read: {problems[0]}")
        nxt = {b.name: b.extent_out for b in region_bindings(plan_here, entry) if b.carried}
        programs[entry.index] = EntryProgram(entry, AtDims(gm, dims, lengths, len(cexe.signature.inputs)),
                                             meta.arena_inputs(gm), nxt, "graph")
    sig = cexe.signature
    plan = dataclasses.replace(plan_here, layout=cexe.plan.layout)  # the capacity's arena, this length's extents
    return Executable(plan, programs, sig.inputs, sig.outputs, tuple(sig.regions), Rules.parse("S"),
                      {"capacity": dict(cexe.dims), "at": dims})


def _hazards(gm: fx.GraphModule, cexe: CapacityExecutable, adapter, dims: Mapping[str, int], lengths: list) -> list:
    slots = {n: (cexe.plan.layout.slot(n).shape, getattr(torch, cexe.plan.layout.slot(n).dtype))
             for n in meta.arena_inputs(gm)}
    return hazards_at(gm, slots, cexe.device, list(adapter.example_inputs().values()), dims, lengths)


def hazards_at(gm: fx.GraphModule, slots: Mapping[str, tuple], device, inputs: list, dims: Mapping[str, int],
               lengths: list) -> list:
    """``state_rewrite``'s region hazards of a rule-S capacity graph run once at ``dims`` on
    zeroed scratch regions (``slots``: region -> (shape, dtype)): reads of old state after a
    write to the same bytes, as ``aliasing.region_hazards`` words them."""
    regions = {n: torch.zeros(shape, dtype=dtype, device=device) for n, (shape, dtype) in slots.items()}
    args = list(inputs) + list(lengths) + [regions[n] for n in meta.arena_inputs(gm)]
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with at_dims(dims), forked_rng(devices, "the capacity executable's hazard check"), torch.no_grad():
        return aliasing.region_hazards(aliasing.record_accesses(gm, args, regions))


__all__ = ["AtDims", "CapacityExecutable", "CapacityPlan", "at_length", "capacity_executable", "hazards_at"]
