"""partition: tag every node capturable or not (with the reason), split into regions.

A CUDA graph replays kernels; it cannot replay host work.  A node is *not*
capturable when it runs on the CPU (its value lives on the host), synchronises the
host with the device (``.item()``, ``aten.equal``, ``_local_scalar_dense``,
``nonzero``...), has a data-dependent output shape, or is outside the allow-list of
namespaces we know to be capture-safe.  ``Partition`` groups maximal runs of
capturable nodes into submodules (``split_in_order``: pieces in order, each op in
graph order, because the graph mutates arena memory and order is semantics), leaving the rest as
eager islands.  With ``granularity="step"`` it also cuts at every ``boundary``
key change (``boundary(node) -> hashable``, e.g. "inside the DiT or not"), so each
DiT call is its own graph.

The region graph is checked with networkx: acyclic, and no region reads arena
memory another region overwrote after the reader's predecessor ran (order kept).
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Callable

import networkx as nx
import torch
import torch.fx as fx

from .. import step as meta
from ..errors import PassError
from .base import (CadencePass, PassResult, by_op, call_summary, copy_node, is_view, lazy_graph_module_class,
                   returns_written)
from .capacity_ops import DEVICE_SIZE, FAITHFUL, MASKED_ATTENTION, MASKED_COPY, OFFSET_CAT, TO_CAPACITY, host_size
from .capacity_plan import _MODE, EXACT

aten = torch.ops.aten

HOST_SYNC = {
    aten._local_scalar_dense.default, aten.item.default, aten.equal.default, aten.is_nonzero.default,
    aten.nonzero.default, aten.masked_select.default, aten.unique_consecutive.default,
    aten._unique2.default, aten.allclose.default,
    # istft checks its window envelope with a host read (is_scalar_tensor_true) on
    # every call: capturing it invalidates the capture (istft_check replaces it by its
    # own ops minus that read wherever the read cannot change: a constant window).
    aten.istft.default,
}
DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default, aten.repeat_interleave.Tensor,
                  aten._unique2.default, aten.unique_consecutive.default}
#: op namespaces whose kernels are capture-safe when their inputs live on the device
ALLOWED_NAMESPACES = ("aten",)
#: ops outside them that are too: the capacity form's (``capacity_ops``: device kernels on
#: device lengths, no host read; its host sizes are plain Python calls, eager islands)
CAPTURE_SAFE = frozenset({FAITHFUL, DEVICE_SIZE, OFFSET_CAT, MASKED_COPY, MASKED_ATTENTION, TO_CAPACITY})
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


_OP_VERDICTS: dict[int, tuple] = {}  # by_op's table for _aten_verdict


def _op_verdict(t) -> tuple[bool | None, str]:
    """What a node's target alone decides: (capturable, reason), or (None, "") for an
    aten op, whose placement decides."""
    if t is operator.getitem:
        return True, "getitem"
    if t in DISPATCHER_STATE:
        return True, "dispatcher state (no kernel)"
    if not isinstance(t, torch._ops.OpOverload):
        return False, f"not an aten op: {t}"
    return by_op(_OP_VERDICTS, t, _aten_verdict)


def _aten_verdict(t: torch._ops.OpOverload) -> tuple[bool | None, str]:
    if t in DATA_DEPENDENT:
        return False, f"data-dependent shape: {t}"
    if t in HOST_SYNC:
        return False, f"host sync: {t}"
    if t.namespace not in ALLOWED_NAMESPACES and t not in CAPTURE_SAFE:
        return False, f"op outside the allow-list: {t}"
    return None, ""


def capturability(node: fx.Node, device_type: str | None = "cuda") -> NodeVerdict:
    """Whether one node may run inside a CUDA graph, and why not.

    ``device_type=None`` skips the placement checks: a preview of a graph traced on
    the CPU (``cadence-fx explain --trace``) for what would stay eager on any device.
    """
    if node.op in ("placeholder", "output", "get_attr"):
        return NodeVerdict(node.name, True, node.op)
    if node.op == "call_module":
        return _call_verdict(node, device_type)
    capturable, reason = _op_verdict(node.target)
    if capturable is not None:
        return NodeVerdict(node.name, capturable, reason)
    t = node.target
    if device_type is None:
        return NodeVerdict(node.name, True, "op (placement not checked)")
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (list, tuple)) else [vals]
    for v in vals:
        if isinstance(v, torch.Tensor) and v.device.type != device_type:
            return NodeVerdict(node.name, False, f"runs on {v.device.type}: {t}")
    host = _host_input(node, device_type)
    if host is not None:
        return NodeVerdict(node.name, False, f"reads a {host} tensor: {t}")
    return NodeVerdict(node.name, True, "device op")


def _host_input(node: fx.Node, device_type: str) -> "str | None":
    """The device type of an input a capture would freeze, or None.  A 0-dim host tensor
    is passed to a kernel by value: fine for a constant, but one computed per call would
    be frozen into the graph at capture."""
    for a in node.all_input_nodes:
        v = a.meta.get("val")
        if (isinstance(v, torch.Tensor) and v.device.type != device_type
                and (v.dim() > 0 or a.op != "get_attr")):
            return v.device.type
    return None


def _call_verdict(node: fx.Node, device_type: str | None) -> NodeVerdict:
    """A shared step's call (``step_share``) may be captured when every op in it may, and
    it reads no per-call host tensor; any other module call may not."""
    if call_summary(node) is None:
        return NodeVerdict(node.name, False, f"a module call: {node.target}")
    sub = node.graph.owning_module.get_submodule(node.target)
    memo = sub.meta.setdefault("cadence_capturability", {})
    if device_type not in memo:
        bad = [v for v in (capturability(n, device_type) for n in sub.graph.nodes) if not v.capturable]
        memo[device_type] = f"in {node.target}: {bad[0].node} ({bad[0].reason})" if bad else None
    if memo[device_type] is not None:
        return NodeVerdict(node.name, False, memo[device_type])
    host = _host_input(node, device_type) if device_type is not None else None
    if host is not None:
        return NodeVerdict(node.name, False, f"reads a {host} tensor: {node.target}")
    return NodeVerdict(node.name, True, "a shared step's call (every op in it capturable)")


def repeated_calls(gm: fx.GraphModule) -> set[fx.Node]:
    """The ``call_module`` nodes of a submodule the graph calls more than once (a shared step)."""
    calls = [n for n in gm.graph.nodes if n.op == "call_module" and call_summary(n) is not None]
    targets = [n.target for n in calls]
    return {n for n in calls if targets.count(n.target) > 1}


@dataclasses.dataclass(frozen=True)
class PartitionRecord:
    regions: tuple[tuple[str, bool, int], ...]  # (submodule name, capturable, node count)
    islands: tuple[NodeVerdict, ...]  # the non-capturable nodes with reasons

    def __str__(self) -> str:
        cap = sum(1 for _, c, _ in self.regions if c)
        n = len(self.regions)
        return (f"{n} region{'s' if n != 1 else ''} ({cap} capturable, {n - cap} eager); "
                f"eager nodes: {[f'{v.node} ({v.reason})' for v in self.islands][:5]}")


def length_bound(gm: fx.GraphModule) -> dict[fx.Node, str]:
    """The nodes of a capacity-form graph (``passes.capacity``) whose work depends on the
    stream's length, each with why: a host size and host arithmetic on one, a node that
    reads one (a narrow to the live prefix, a faithful copy), and a node the capacity plan
    runs exact (at the stream's own sizes).  Everything else runs at the capacity on device
    lengths, the same kernels at every length: ``Partition(length_free=True)`` keeps only
    that in its pieces, so a piece captured once replays for every length (architecture
    item 4, captures shared by voices).  A view that reads a host size (the trim's window of
    a cache, at an offset the length sets), or an in-place op's result (the memory it
    wrote), is memory at the stream's own address: what uses it is length-bound too (a view
    of it, and the first op or call that reads it), so no piece takes such a tensor, which
    a capture would bind at one length's address; what crosses into a piece is a value the
    islands made, copied in before each replay.  A tensor an island made at the stream's
    own sizes crosses only through a pad to the capacity (``TO_CAPACITY``); one that
    crossed otherwise would meet the replay's shape check, which refuses it (counted)."""
    out: dict[fx.Node, str] = {}
    host = set()  # host sizes, and Python arithmetic on them
    for n in gm.graph.nodes:
        if n.op not in ("call_function", "call_module"):
            continue
        reads = [a for a in n.all_input_nodes if a in out]
        if n.target is host_size:
            out[n] = "a host size"
            host.add(n)
        elif any(a in host for a in reads):
            if n.op == "call_function" and n.target in _HOST_ARITHMETIC:
                out[n] = "host arithmetic on a host size"
                host.add(n)
            else:
                out[n] = "reads a host size"
        elif n.meta.get(_MODE) == EXACT:
            out[n] = "runs at the stream's own sizes"
        elif n.target is TO_CAPACITY:
            out[n] = "pads a value of the stream's own sizes"
        elif any(a.op == "call_function" and (is_view(a) or returns_written(a)) for a in reads):
            out[n] = "reads a view at the stream's own offset or size"
    return out  # (a capacity node never reads a padded exact value but through TO_CAPACITY: capacity_plan)


#: Python arithmetic a traced graph does on sizes (its result a host value, like its operands)
_HOST_ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg,
                    operator.truediv, operator.pow}


class Partition(CadencePass):
    """requires: nothing beyond a lint-clean graph (any traced or rewritten step).
    ensures: every child carries its capturable verdict, and the region graph is
    acyclic with every region running after the regions it reads (``_check_region_graph``)."""

    name = "partition"

    def __init__(self, device_type: str | None = "cuda", granularity: str = "chunk",
                 boundary: Callable[[fx.Node], object] | None = None, calls_apart: bool = False,
                 length_free: bool = False):
        if granularity not in ("chunk", "step"):
            raise PassError(f"granularity must be 'chunk' or 'step', got {granularity!r}")
        if granularity == "step" and boundary is None:
            raise PassError("granularity='step' needs a boundary key (the adapter's step_boundary)")
        self.device_type, self.granularity, self.boundary = device_type, granularity, boundary
        # each call of a module called more than once (a shared step) a region of its own, in
        # chunk granularity too: capture records it once and replays it at every call
        # (runtime.graphs.capture_entry); per step, every call is one already
        self.calls_apart = calls_apart
        # a capacity graph's pieces that serve every length: what depends on it stays eager
        self.length_free = length_free

    def call(self, gm: fx.GraphModule) -> PassResult:
        _alias_returned_constants(gm)
        verdicts = {n: capturability(n, self.device_type) for n in gm.graph.nodes}
        if self.length_free:
            for n, why in length_bound(gm).items():
                if verdicts[n].capturable:
                    verdicts[n] = NodeVerdict(n.name, False, f"{why} (length-free pieces)")
        apart = repeated_calls(gm) if self.calls_apart else set()
        part: dict[fx.Node, int] = {}
        current, prev = 0, None
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "output"):
                continue
            if node.op == "get_attr":
                # constants are read inside every region that uses them (split_in_order)
                continue
            if node.target is operator.getitem and node.args[0] in part:
                # a tuple never crosses a region boundary: each item leaves with its producer
                part[node] = part[node.args[0]]
                continue
            key = (verdicts[node].capturable,
                   self.boundary(node) if self.granularity == "step" else node if node in apart else None)
            if prev is not None and key != prev:
                current += 1
            part[node] = current
            prev = key
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                users = [u for u in node.users if u in part]
                part[node] = min(part[u] for u in users) if users else 0

        # a repeated call's own constant arguments (a flow step's time embedding, folded)
        # come in as arguments: one graph can then serve every call, each call's copied in
        lift = {a for c in apart for a in c.all_input_nodes
                if a.op == "get_attr" and set(a.users) <= apart and _contiguous_tensor(gm, a)}
        split = split_in_order(gm, part, lift)
        calls: dict[int, list[fx.Node]] = {}  # each piece's ops, grouped once
        for n, p in part.items():
            if n.op in ("call_function", "call_module"):
                calls.setdefault(p, []).append(n)
        regions = []
        for name, mod in split.named_children():
            idx = int(name.removeprefix("submod_"))
            nodes = calls.get(idx, [])
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
    leaves through an ``alias`` in a region: ``split_in_order`` only exports values
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


def _state_spans(gm: fx.GraphModule, part: dict[fx.Node, int]) -> dict:
    """Each ``_enter_autocast`` and ``_set_grad_enabled`` node -> (first piece, last piece
    it is in force in, its ``_exit_autocast`` or None), in graph order."""
    spans: dict[fx.Node, list] = {}
    autocasts: list[fx.Node] = []
    grad = None
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        idx = part[node]
        if node.target is torch.amp.autocast_mode._enter_autocast:
            if any(isinstance(a, fx.Node) for a in node.args):
                raise PassError(f"partition: {node.name} enters autocast with computed arguments")
            spans[node] = [idx, idx, None]
            autocasts.append(node)
        elif node.target is torch._C._set_grad_enabled:
            spans[node] = [idx, idx, None]
            grad = node
        elif node.target is torch.amp.autocast_mode._exit_autocast:
            enter = node.args[0]
            autocasts.remove(enter)
            spans[enter][1] = max(spans[enter][1], idx)
            spans[enter][2] = node
        for active in autocasts + ([grad] if grad is not None else []):
            spans[active][1] = max(spans[active][1], idx)
    return {k: tuple(v) for k, v in spans.items()}


def _contiguous_tensor(gm: fx.GraphModule, node: fx.Node) -> bool:
    value = meta.attr(gm, node.target)
    return isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and value.is_contiguous()


def split_in_order(gm: fx.GraphModule, part: dict[fx.Node, int],
                   lift: "set[fx.Node] | frozenset" = frozenset()) -> fx.GraphModule:
    """``gm`` as a parent that calls one submodule ``submod_<i>`` per partition, in order.

    What ``torch.fx.passes.split_module(gm, gm, part, keep_original_order=True)`` builds, with each
    piece's constants (parameters, buffers, folded tables) as its own attributes, read
    by ``get_attr`` inside it: a captured piece must read weights from their own memory
    by address (as arguments they would be copied into static buffers on every replay,
    gigabytes, and a copy of a strided view is contiguous, which can change the kernel a
    matmul picks and so the bits).  Pieces run in partition order and each copies its
    nodes in graph order, so every op keeps its place relative to every write.  As in
    ``split_module``, an autocast or grad mode set in one piece and still in force in a
    later one is set again at that piece's start (an autocast that ends in a later piece
    also ends at the first one's end): each piece runs under the state its ops ran under.  A value
    leaves its piece when a node of another piece or the output uses it (one value: the
    piece returns it; several: a tuple, unpacked with ``getitem`` in the parent).  The
    pieces and the parent generate their code when they first run.  ``lift``: ``get_attr``
    nodes the parent reads and hands to the pieces that use them as arguments instead
    (a repeated call's small per-call constants, ``Partition(calls_apart=True)``).
    """
    cls = lazy_graph_module_class()
    pieces: dict[int, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node.op != "call_function" and call_summary(node) is None:
            raise PassError(f"partition: cannot split a {node.op} node ({node.name})")
        pieces.setdefault(part[node], []).append(node)
    spans = _state_spans(gm, part)
    exported = {n for ns in pieces.values() for n in ns
                if any(u.op == "output" or (part.get(u) != part[n] and u.target not in DISPATCHER_STATE)
                       for u in n.users)}
    parent = fx.Graph()
    root = torch.nn.Module()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = parent.placeholder(node.target, type_expr=node.type)
            env[node].meta = dict(node.meta)
    for node in [n for n in gm.graph.nodes if n in lift]:  # in graph order
        name = node.target.replace(".", "_")
        root.register_buffer(name, meta.attr(gm, node.target), persistent=False)
        env[node] = parent.get_attr(name)
        env[node].meta = dict(node.meta)
    for idx in sorted(pieces):
        graph, module, local, consts = fx.Graph(), torch.nn.Module(), {}, {}
        inputs: list[fx.Node] = []

        def arg(a: fx.Node) -> fx.Node:
            if a in local:
                return local[a]
            if a.op == "get_attr":
                if a.target not in consts:
                    value = meta.attr(gm, a.target)
                    if not isinstance(value, torch.Tensor):
                        raise PassError(f"partition: get_attr {a.target} is a {type(value).__name__}")
                    name = a.target.replace(".", "_")
                    if isinstance(value, torch.nn.Parameter):
                        module.register_parameter(name, value)
                    else:
                        module.register_buffer(name, value, persistent=False)
                    consts[a.target] = name
                node = graph.get_attr(consts[a.target])
                node.meta = dict(a.meta)
                local[a] = node
                return node
            raise PassError(f"partition: {a.name} reaches piece {idx} unbound")

        # dispatcher state set in an earlier piece (autocast, grad mode) is set again at
        # this piece's start, and an autocast that ends in a later piece ends at its end
        for setter, (first, last, _) in spans.items():
            if first < idx <= last:
                local[setter] = graph.call_function(setter.target, setter.args, dict(setter.kwargs))
                local[setter].meta = dict(setter.meta)
        members = set(pieces[idx])
        for n in pieces[idx]:  # a parent input or another piece's result: a placeholder, first use first
            for a in n.all_input_nodes:
                if a not in members and (a.op != "get_attr" or a in lift) and a not in local:
                    local[a] = graph.placeholder(a.name)
                    local[a].meta = dict(a.meta)
                    inputs.append(a)
        for n in pieces[idx]:
            for a in n.all_input_nodes:
                arg(a)
            if n.op == "call_module" and not hasattr(module, n.target):  # a shared step: the piece calls it too
                module.add_module(n.target, gm.get_submodule(n.target))
            local[n] = copy_node(graph, n, lambda a: local[a])
        for setter, (first, last, exit_node) in reversed(spans.items()):
            if exit_node is not None and first <= idx < last:
                graph.call_function(exit_node.target, (local[setter],)).meta = dict(exit_node.meta)
        outs = [n for n in pieces[idx] if n in exported]
        graph.output(local[outs[0]] if len(outs) == 1 else tuple(local[n] for n in outs))
        name = f"submod_{idx}"
        setattr(root, name, cls(module, graph))
        call = parent.call_module(name, tuple(env[a] for a in inputs))
        if len(outs) == 1:
            env[outs[0]] = call
        else:
            for i, n in enumerate(outs):
                env[n] = parent.call_function(operator.getitem, (call, i))
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    parent.output(fx.node.map_arg(output.args[0], lambda a: env[a]))
    parent.lint()
    split = cls(root, parent)
    return split


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
