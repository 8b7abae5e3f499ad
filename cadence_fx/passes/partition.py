"""partition: tag every node capturable or not (with the reason), split into regions.

A CUDA graph replays kernels; it cannot replay host work.  A node is *not*
capturable when it runs on the CPU (its value lives on the host), synchronises the
host with the device (``.item()``, ``aten.equal``, ``_local_scalar_dense``,
``nonzero``...), has a data-dependent output shape, or is outside the allow-list of
namespaces we know to be capture-safe.  ``Partition`` groups maximal runs of
capturable nodes into submodules (``split_module(..., keep_original_order=True)``,
because the graph mutates arena memory and order is semantics), leaving the rest as
eager islands.  With ``granularity="step"`` it also cuts at every ``boundary``
key change (``boundary(node) -> hashable``, e.g. "inside the DiT or not"), so each
DiT call is its own graph.

The region graph is checked with networkx: acyclic, and no region reads arena
memory another region overwrote after the reader's predecessor ran (order kept).
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
from typing import Callable

import networkx as nx
import torch
import torch.fx as fx
from torch.fx.passes.split_module import split_module

from .. import step as meta
from ..errors import PassError
from .base import CadencePass, PassResult

aten = torch.ops.aten

HOST_SYNC = {
    aten._local_scalar_dense.default, aten.item.default, aten.equal.default, aten.is_nonzero.default,
    aten.nonzero.default, aten.masked_select.default, aten.unique_consecutive.default,
    aten._unique2.default, aten.allclose.default,
    # istft checks its window envelope with a host read (is_scalar_tensor_true) on
    # every call: capturing it invalidates the capture.
    aten.istft.default,
}
DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default, aten.repeat_interleave.Tensor,
                  aten._unique2.default, aten.unique_consecutive.default}
#: op namespaces whose kernels are capture-safe when their inputs live on the device
ALLOWED_NAMESPACES = ("aten",)
#: pre-dispatch graphs keep autocast and grad mode as calls: they change dispatcher
#: state on the host and launch nothing, so they may sit inside a captured region
#: (an autocast's casts are then captured as kernels, as in eager).
DISPATCHER_STATE = {torch.amp.autocast_mode._enter_autocast, torch.amp.autocast_mode._exit_autocast,
                    torch._C._set_grad_enabled}


@dataclasses.dataclass(frozen=True)
class NodeVerdict:
    node: str
    capturable: bool
    reason: str


def capturability(node: fx.Node, device_type: str | None = "cuda") -> NodeVerdict:
    """Whether one node may run inside a CUDA graph, and why not.

    ``device_type=None`` skips the placement checks: a preview of a graph traced on
    the CPU (``cadence-fx explain --trace``) for what would stay eager on any device.
    """
    if node.op in ("placeholder", "output", "get_attr"):
        return NodeVerdict(node.name, True, node.op)
    t = node.target
    if t is operator.getitem:
        return NodeVerdict(node.name, True, "getitem")
    if t in DISPATCHER_STATE:
        return NodeVerdict(node.name, True, "dispatcher state (no kernel)")
    if not isinstance(t, torch._ops.OpOverload):
        return NodeVerdict(node.name, False, f"not an aten op: {t}")
    if t in DATA_DEPENDENT:
        return NodeVerdict(node.name, False, f"data-dependent shape: {t}")
    if t in HOST_SYNC:
        return NodeVerdict(node.name, False, f"host sync: {t}")
    if t.namespace not in ALLOWED_NAMESPACES:
        return NodeVerdict(node.name, False, f"op outside the allow-list: {t}")
    if device_type is None:
        return NodeVerdict(node.name, True, "op (placement not checked)")
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (list, tuple)) else [vals]
    for v in vals:
        if isinstance(v, torch.Tensor) and v.device.type != device_type:
            return NodeVerdict(node.name, False, f"runs on {v.device.type}: {t}")
    for a in node.all_input_nodes:
        v = a.meta.get("val")
        # A 0-dim host tensor is passed to a kernel by value: fine for a constant,
        # but one computed per call would be frozen into the graph at capture.
        if (isinstance(v, torch.Tensor) and v.device.type != device_type
                and (v.dim() > 0 or a.op != "get_attr")):
            return NodeVerdict(node.name, False, f"reads a {v.device.type} tensor: {t}")
    return NodeVerdict(node.name, True, "device op")


@dataclasses.dataclass(frozen=True)
class PartitionRecord:
    regions: tuple[tuple[str, bool, int], ...]  # (submodule name, capturable, node count)
    islands: tuple[NodeVerdict, ...]  # the non-capturable nodes with reasons

    def __str__(self) -> str:
        cap = sum(1 for _, c, _ in self.regions if c)
        n = len(self.regions)
        return (f"{n} region{'s' if n != 1 else ''} ({cap} capturable, {n - cap} eager); "
                f"eager nodes: {[f'{v.node} ({v.reason})' for v in self.islands][:5]}")


class Partition(CadencePass):
    """requires: nothing beyond a lint-clean graph (any traced or rewritten step).
    ensures: every child carries its capturable verdict, and the region graph is
    acyclic with every region running after the regions it reads (``_check_region_graph``)."""

    name = "partition"

    def __init__(self, device_type: str | None = "cuda", granularity: str = "chunk",
                 boundary: Callable[[fx.Node], object] | None = None):
        if granularity not in ("chunk", "step"):
            raise PassError(f"granularity must be 'chunk' or 'step', got {granularity!r}")
        if granularity == "step" and boundary is None:
            raise PassError("granularity='step' needs a boundary key (the adapter's step_boundary)")
        self.device_type, self.granularity, self.boundary = device_type, granularity, boundary

    def call(self, gm: fx.GraphModule) -> PassResult:
        _alias_returned_constants(gm)
        verdicts = {n: capturability(n, self.device_type) for n in gm.graph.nodes}
        part: dict[fx.Node, int] = {}
        current, prev = 0, None
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "output"):
                continue
            if node.op == "get_attr":
                # constants join the region of their first user (split_module copies them)
                continue
            if node.target is operator.getitem and node.args[0] in part:
                # a tuple never crosses a region boundary: each item leaves with its producer
                part[node] = part[node.args[0]]
                continue
            key = (verdicts[node].capturable,
                   self.boundary(node) if self.granularity == "step" else None)
            if prev is not None and key != prev:
                current += 1
            part[node] = current
            prev = key
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                users = [u for u in node.users if u in part]
                part[node] = min(part[u] for u in users) if users else 0

        with _lazy_code():
            split = split_module(gm, gm, lambda n: part[n], keep_original_order=True)
            _sink_constants(split)
        regions = []
        for name, mod in split.named_children():
            idx = int(name.removeprefix("submod_"))
            nodes = [n for n, p in part.items() if p == idx and n.op == "call_function"]
            capturable = all(verdicts[n].capturable for n in nodes)
            mod.meta = getattr(mod, "meta", {})
            mod.meta[meta.CAPTURABLE] = capturable
            regions.append((name, capturable, len(nodes)))
        split.meta.update(gm.meta)
        islands = tuple(v for v in verdicts.values() if not v.capturable)
        return PassResult(split, True, PartitionRecord(tuple(regions), islands))

    def ensures(self, gm: fx.GraphModule) -> None:
        calls = [n for n in gm.graph.nodes if n.op == "call_module"]
        for n in calls:
            if meta.capturable(gm.get_submodule(n.target)) is None:
                raise PassError(f"partition: region {n.target} has no capturable verdict")
        _check_region_graph(gm)


def _alias_returned_constants(gm: fx.GraphModule) -> None:
    """A constant the graph returns as is (e.g. a whole stock buffer as the next state)
    leaves through an ``alias`` in a region: ``split_module`` only exports values
    computed in a region, and constants are sunk into the regions that use them."""
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    consts = [a for a in output.all_input_nodes if a.op == "get_attr"]
    for const in consts:
        with gm.graph.inserting_before(output):
            alias = gm.graph.call_function(aten.alias.default, (const,))
        alias.meta = dict(const.meta)
        output.replace_input_with(const, alias)
    if consts:
        gm.recompile()


def _lazy_code():
    """GraphModules made in this block generate their code on first use, not on every
    ``recompile``: ``split_module`` and the constant sinking would otherwise regenerate
    each piece's code four times (seconds at a released model's size) before it ever runs.
    A torch without ``_LazyGraphModule`` generates it eagerly, as before."""
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:  # pragma: no cover - older torch
        return contextlib.nullcontext()
    return _use_lazy_graph_module(True)


def _sink_constants(split: fx.GraphModule) -> None:
    """Move constants (parameters, buffers, folded tables) back inside each region.

    ``split_module`` keeps ``get_attr`` nodes in the parent and passes them to the
    pieces as arguments.  A captured piece must read weights from their own memory
    by address: as arguments they would be copied into static buffers on every
    replay (gigabytes), and a copy of a strided view is contiguous, which can change
    the kernel a matmul picks and so the bits.
    """
    for call in [n for n in split.graph.nodes if n.op == "call_module"]:
        sub = split.get_submodule(call.target)
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        if len(call.args) != len(placeholders) or call.kwargs:
            raise PassError(f"partition: unexpected call signature for {call.target}")
        kept = []
        for i, (arg, ph) in enumerate(zip(call.args, placeholders)):
            if isinstance(arg, fx.Node) and arg.op == "get_attr":
                value = split.get_parameter(arg.target) if isinstance(
                    _fetch(split, arg.target), torch.nn.Parameter) else _fetch(split, arg.target)
                name = f"_c{i}_{ph.name}"
                if isinstance(value, torch.nn.Parameter):
                    sub.register_parameter(name, value)
                else:
                    sub.register_buffer(name, value, persistent=False)
                with sub.graph.inserting_before(ph):
                    const = sub.graph.get_attr(name)
                ph.replace_all_uses_with(const)
                sub.graph.erase_node(ph)
            else:
                kept.append(arg)
        call.args = tuple(kept)
        sub.recompile()
    for node in list(split.graph.nodes):
        if node.op == "get_attr" and not node.users:
            split.graph.erase_node(node)
    split.recompile()


def _fetch(mod: torch.nn.Module, target: str):
    for part in target.split("."):
        mod = getattr(mod, part)
    return mod


def _check_region_graph(split: fx.GraphModule) -> None:
    """The region DAG (networkx) must be acyclic, and every region must run after the
    regions it reads from (with ``keep_original_order`` in-place writes then happen in
    eager order, which is what keeps arena reads and writes in sequence)."""
    g = nx.DiGraph()
    calls = [n for n in split.graph.nodes if n.op == "call_module"]
    order = {n: i for i, n in enumerate(calls)}
    for n in calls:
        g.add_node(n.name)
        for a in n.all_input_nodes:
            src = a.args[0] if a.op == "call_function" and a.target is operator.getitem else a
            if src.op == "call_module":
                g.add_edge(src.name, n.name)
                if order[src] >= order[n]:
                    raise PassError(f"partition: region {n.name} reads {src.name}, which runs later")
    if not nx.is_directed_acyclic_graph(g):
        raise PassError(f"partition: region graph has a cycle: {nx.find_cycle(g)}")
