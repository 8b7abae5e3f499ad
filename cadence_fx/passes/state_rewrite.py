"""state_rewrite: carried state and over-provisioned buffers -> arena views (rule S).

Before (traced at one catalog entry)::

    state_att: [.., T_in, ..]                      # placeholder, a fresh tensor per call
    buf = self._tensor_constant3                   # stock buffer, 16 x .. x 1000 x ..
    copy_(slice(select(buf, 0, s), 3, 0, T_out), new_kv)
    return (speech, slice(buf, 4, 0, T_out))       # next state: a view of the buffer

After::

    arena_att: [.., capacity, ..]                  # placeholder bound to the session arena
    state_att = slice(arena_att, 4, 0, T_in)       # the old state, in place
    copy_(slice(select(arena_att, 0, s), 3, 0, T_out), new_kv)
    return (speech,)                               # next state already sits in arena_att

A carried region's next state that is not already the arena view at the next
phase's extent (e.g. upstream's trim, a ``cat`` of two slices, or a fresh
``clone``) is written back with one ``copy_`` into that view as the graph's last
ops, after every read.  A step that updates the state it was given in place and
returns it as given (a ring KV written by ``scatter_``, ``carry[:] = ...``) needs
no write-back: its state view *is* the arena view.  The rewritten graph allocates
no state: every region keeps one address for the session and the graph returns
only the step's outputs.

requires: a graph from ``trace_step`` (its signature in ``gm.meta``); a carried binding
for every region the step returns, traced at the entry's extent, returned in the
declared dtype.
ensures: no ``state_*`` placeholder and no region-bound ``get_attr`` remain; the
graph returns no region memory; every write-back has the shape of the view it
fills; and (``aliasing.region_hazards``) no op reads old state from memory the
buffer already overwrote.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import torch
import torch.fx as fx

from .. import step as meta
from ..errors import PassError
from ..foreground import forked_rng
from ..step import Role
from . import aliasing, capacity_ops
from .base import CadencePass, PassResult, returns_written, view_root, whole_slice

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class RegionBinding:
    """One region as the rewrite sees it at one catalog entry (plain data from the plan)."""

    name: str
    shape: tuple[int, ...]  # arena (capacity) shape
    dtype: str
    axis: int | None  # growth axis; None for fixed-shape regions
    extent_in: int | None  # along axis, at this step's input
    extent_out: int | None  # along axis, at the next step's input
    carried: bool


@dataclasses.dataclass(frozen=True)
class RewriteRecord:
    arena_inputs: tuple[str, ...]
    in_place: tuple[str, ...]  # next state already in the arena view: nothing to write
    written_back: tuple[str, ...]  # next state copied into the arena view at the end
    buffers_rebound: int

    def __str__(self) -> str:
        return (f"arena inputs {list(self.arena_inputs)}; in place {list(self.in_place)}; "
                f"written back {list(self.written_back)}; buffer reads/writes rebound: {self.buffers_rebound}")


def _narrowed_shape(b: RegionBinding, extent: int | None) -> tuple[int, ...]:
    shape = list(b.shape)
    if b.axis is not None:
        shape[b.axis] = extent
    return tuple(shape)


class StateRewrite(CadencePass):
    name = "state_rewrite"

    def __init__(self, bindings: Sequence[RegionBinding], check_hazards: bool = True):
        self.bindings = {b.name: b for b in bindings}
        self.check_hazards = check_hazards

    # ------------------------------------------------------------------ requires
    def requires(self, gm: fx.GraphModule) -> None:
        sig = meta.signature(gm)
        if sig is None:
            raise PassError("state_rewrite needs a graph from trace_step (no cadence_signature in gm.meta)")
        for r in sig.regions:
            b = self.bindings.get(r)
            if b is None:
                raise PassError(f"state_rewrite: carried state {r!r} has no region binding in the plan")
            if not b.carried:
                raise PassError(f"state_rewrite: {r!r} is returned by the step but declared carried=False")
        for node in gm.graph.nodes:
            if meta.role(node) is Role.STATE:
                b = self.bindings[meta.region(node)]
                want = _narrowed_shape(b, b.extent_in)
                got = tuple(node.meta["val"].shape)
                if got != want:
                    raise PassError(f"state_rewrite: region {b.name!r} was traced with shape {got} but the "
                                    f"catalog entry's arena view is {want}; trace at the entry's shapes")
        out = next(n for n in gm.graph.nodes if n.op == "output")
        for name, value in zip(sig.regions, list(out.args[0])[len(sig.outputs):]):
            b = self.bindings[name]
            val = value.meta.get("val") if isinstance(value, fx.Node) else None
            got = str(val.dtype).removeprefix("torch.") if val is not None else None
            if got is not None and got != b.dtype:
                raise PassError(f"state_rewrite: the step returns region {name!r} as {got} but it is declared "
                                f"{b.dtype}; storing it would round it. Declare dtype={got!r} on the Region")

    # ---------------------------------------------------------------------- call
    def call(self, gm: fx.GraphModule) -> PassResult:
        graph = gm.graph
        sig = meta.signature(gm)
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        used = [b for b in self.bindings.values()
                if any(meta.role(n) is Role.STATE and meta.region(n) == b.name for n in placeholders)
                or any(meta.role(n) is Role.BUFFER and meta.region(n) == b.name
                       for n in graph.nodes if n.op == "get_attr")]

        arena: dict[str, fx.Node] = {}
        with graph.inserting_after(placeholders[-1]):
            for b in reversed(used):
                node = graph.placeholder(f"arena_{b.name}")
                meta.tag(node, Role.ARENA, region=b.name)
                arena[b.name] = node
        first_compute = next(n for n in graph.nodes if n.op != "placeholder")

        rebound = 0
        for node in list(graph.nodes):
            role = meta.role(node)
            if node.op == "placeholder" and role is Role.STATE:
                b = self.bindings[meta.region(node)]
                with graph.inserting_before(first_compute):
                    view = self._view(graph, arena[b.name], b, b.extent_in)
                meta.tag(view, Role.STATE_VIEW, region=b.name)
                view.meta["val"] = node.meta.get("val")
                node.replace_all_uses_with(view)
                graph.erase_node(node)
            elif node.op == "get_attr" and role is Role.BUFFER:
                rebound += len(node.users)
                node.replace_all_uses_with(arena[meta.region(node)])
                graph.erase_node(node)

        out_node = next(n for n in graph.nodes if n.op == "output")
        values = list(out_node.args[0])
        n_out = len(sig.outputs)
        in_place, written = [], []
        for name, value in zip(sig.regions, values[n_out:]):
            b = self.bindings[name]
            if self._is_arena_view(value, arena[name], b):
                in_place.append(name)
                continue
            want = _narrowed_shape(b, b.extent_out)
            got = tuple(value.meta["val"].shape) if "val" in value.meta else None
            if got != want:
                raise PassError(f"state_rewrite: the step's next {name!r} has shape {got}, but the catalog's next "
                                f"entry holds {want}; the declared retention does not match the model")
            with graph.inserting_before(out_node):
                src = value
                group = []
                if view_root(value) is arena[name]:  # overlapping copy: read it out first
                    src = graph.call_function(aten.clone.default, (value,))
                    group.append(src)
                dst = self._view(graph, arena[name], b, b.extent_out)
                group += [dst, graph.call_function(aten.copy_.default, (dst, src))]
            for n in group:  # early_writeback may move the group up to where the state is final
                meta.tag(n, Role.WRITEBACK, region=name)
            written.append(name)
        out_node.args = (tuple(values[:n_out]),)
        gm.meta[meta.ARENA_INPUTS] = tuple(b.name for b in used)
        return PassResult(gm, True, RewriteRecord(tuple(b.name for b in used), tuple(in_place), tuple(written),
                                                  rebound))

    @staticmethod
    def _view(graph: fx.Graph, arena: fx.Node, b: RegionBinding, extent: int | None) -> fx.Node:
        if b.axis is None or extent == b.shape[b.axis]:
            return graph.call_function(aten.alias.default, (arena,))
        return graph.call_function(aten.slice.Tensor, (arena, b.axis, 0, extent))

    @staticmethod
    def _is_arena_view(value: fx.Node, arena: fx.Node, b: RegionBinding) -> bool:
        value = _same_view(value)
        if value is arena or (value.op == "call_function" and value.target is aten.alias.default
                              and _same_view(value.args[0]) is arena):  # the state view, updated in place
            return b.axis is None or b.extent_out == b.shape[b.axis]
        if (value.op == "call_function" and value.target is aten.slice.Tensor
                and _same_view(value.args[0]) is arena):
            args = list(value.args) + [None] * 5
            dim, start, end, step = args[1], args[2] or 0, args[3], args[4] or 1
            return dim == b.axis and start == 0 and step == 1 and end == b.extent_out
        return False

    # ------------------------------------------------------------------- ensures
    def ensures(self, gm: fx.GraphModule) -> None:
        for node in gm.graph.nodes:
            role = meta.role(node)
            if role in (Role.STATE, Role.BUFFER):
                raise PassError(f"state_rewrite left {role.value} node {node.name}")
        out = next(n for n in gm.graph.nodes if n.op == "output")
        for v in out.args[0]:
            if isinstance(v, fx.Node) and meta.role(view_root(v)) is Role.ARENA:
                raise PassError(f"state_rewrite: output {v.name} aliases region memory")
        if self.check_hazards:
            problems = check_graph_hazards(gm, self.bindings)
            if problems:
                raise PassError("state_rewrite: aliasing the carried state with its buffer is unsound: "
                                + "; ".join(problems[:3]))


def _same_view(node: fx.Node) -> fx.Node:
    """The node whose view ``node`` is unchanged: through ``copy_(view, x)`` (that view) and
    slices that keep all of their input (``whole_slice``)."""
    while node.op == "call_function" and (returns_written(node) or whole_slice(node)):
        node = node.args[0]
    return node


def check_graph_hazards(gm: fx.GraphModule, bindings: Mapping[str, RegionBinding]) -> list[str]:
    """Log every region read and write on scratch region memory and look for hazards.

    The log comes from the region views alone (``aliasing.record_region_accesses``:
    nothing else runs; a capacity graph's host sizes evaluated at the dims its caller runs
    it at); where that walk cannot follow the graph, from running it once.
    """
    dev = meta.traced_device(gm)
    regions = {}
    for name in meta.arena_inputs(gm):
        b = bindings[name]
        regions[name] = torch.empty(b.shape, dtype=getattr(torch, b.dtype), device=dev)
    try:  # a capacity graph's host sizes, at its caller's dims: values the walk takes
        return aliasing.region_hazards(aliasing.record_region_accesses(gm, regions, capacity_ops.host_sizes(gm)))
    except aliasing.NeedsFullRun:
        pass
    example = meta.example_inputs(gm)
    if example is None:
        return []
    regions = {name: t.zero_() for name, t in regions.items()}
    args = list(example) + [regions[n] for n in meta.arena_inputs(gm)]
    # the check must not advance the caller's generators
    with forked_rng([dev] if dev.type == "cuda" else [], "the hazard check's full run"):
        accesses = aliasing.record_accesses(gm, args, regions)
    return aliasing.region_hazards(accesses)
