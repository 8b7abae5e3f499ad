"""fold_host_constants: evaluate input-independent subgraphs once, keep the result.

Upstream builds tensors on the host inside ``forward`` and copies them over on every
call (``timestep_embedding``'s ``arange``, a vocoder's harmonic table, the STFT window,
``linspace`` of the flow schedule).  A CUDA graph cannot capture a host-to-device
copy, and the work is the same on every call.  A node folds when it is pure (no
random draw, no write, not impure), depends on no placeholder, no parameter and no
region-bound buffer, and nothing writes into it or into a view of it later.  A
module buffer the graph writes anywhere is never a constant, whichever ``get_attr``
node reads it (make_fx emits one ``get_attr`` per access, all of one tensor).  It is
evaluated here by the same op on the same device as eager, so the constant has the
same bits eager computes each call.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import step as meta
from ..errors import PassError
from ..step import Role
from .base import CadencePass, PassResult, has_side_effect, view_root, written_args


def _is_param_or_region(gm: fx.GraphModule, node: fx.Node) -> bool:
    if meta.role(node) is Role.BUFFER:
        return True
    value = getattr(gm, node.target)
    return isinstance(value, torch.nn.Parameter) or str(node.target).startswith("_param_constant")


def _storage(gm: fx.GraphModule, node: fx.Node) -> int | None:
    value = getattr(gm, node.target)
    return value.untyped_storage().data_ptr() if isinstance(value, torch.Tensor) else None


def input_independent(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes whose value is the same on every call, in graph order: constants that
    are no parameter or region-bound buffer and whose memory nothing writes (through any
    ``get_attr`` of it), and the pure ops that read only those (and nothing writes into
    them or a view of them later).  What ``FoldHostConstants`` evaluates, and what
    ``step_share.hoist_constants`` may move ahead of a call."""
    mutated_roots = {view_root(w) for n in gm.graph.nodes for w in written_args(n)}
    written_storage = {_storage(gm, r) for r in mutated_roots if r.op == "get_attr"} - {None}
    out: dict[fx.Node, None] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            if not _is_param_or_region(gm, node) and _storage(gm, node) not in written_storage:
                out[node] = None
            continue
        if node.op != "call_function":
            continue
        # the cheap test first: most nodes read a placeholder or a parameter
        if any(i not in out for i in node.all_input_nodes):
            continue
        if has_side_effect(node) or view_root(node) in mutated_roots:
            continue
        out[node] = None
    return list(out)


#: gm.meta: ``(recipe, names)``: a graph module of the folded nodes returning each constant
#: ``names`` holds, in order (``FoldHostConstants(keep_recipe=True)``)
FOLDS = "cadence_folds"


class FoldHostConstants(CadencePass):
    """requires: nothing (any traced step).  ensures: no host transfer of a constant is left.

    ``keep_recipe``: the folded nodes are also kept, as a graph module of their own returning
    each constant (``gm.meta[FOLDS]``): a graph stored on disk keeps that recipe instead of the
    values, and a process that loads it computes them again from its own model's tensors,
    by the same ops on the same device (``capacity_build``)."""

    name = "fold_host_constants"

    def __init__(self, keep_recipe: bool = False):
        self.keep_recipe = keep_recipe

    def call(self, gm: fx.GraphModule) -> PassResult:
        foldable: dict[fx.Node, object] = {}
        env: dict[fx.Node, object] = {}
        for node in input_independent(gm):
            if node.op == "get_attr":
                env[node] = getattr(gm, node.target)
                continue
            args = fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
            env[node] = node.target(*args, **kwargs)
            if node.target is not operator.getitem:
                foldable[node] = env[node]

        folded, made = 0, {}
        for node, value in foldable.items():
            if not isinstance(value, torch.Tensor):
                continue
            outside_users = [u for u in node.users if u not in env]
            if not outside_users:
                continue
            name = f"_folded{folded}"
            gm.register_buffer(name, value, persistent=False)
            with gm.graph.inserting_before(node):
                const = gm.graph.get_attr(name)
            meta.tag(const, Role.FOLDED, **{"from": node.name})
            for user in outside_users:
                user.replace_input_with(node, const)
            folded += 1
            made[name] = node
        if self.keep_recipe:
            gm.meta[FOLDS] = _recipe(gm, env, made)
        # what fed only the folded values is dead now (all of it pure: it was evaluable)
        for node in reversed(list(gm.graph.nodes)):
            if node in env and node.op == "call_function" and not node.users:
                gm.graph.erase_node(node)
        return PassResult(gm, folded > 0, {"folded": folded})

    def ensures(self, gm: fx.GraphModule) -> None:
        for node in gm.graph.nodes:
            if node.target in _TRANSFERS and all(i.op == "get_attr" for i in node.all_input_nodes):
                src_node = node.all_input_nodes[0]
                src = getattr(gm, src_node.target)
                if not _is_param_or_region(gm, src_node):
                    raise PassError(f"fold_host_constants left a host transfer {node.format_node()} of a "
                                    f"{src.device} constant")


def _recipe(gm: fx.GraphModule, env: dict, made: dict) -> tuple:
    """``(recipe, names)``: the evaluated nodes that feed the constants ``made`` (name -> node)
    copied into a graph of their own, over ``gm``'s constants, returning them in ``names``' order."""
    graph, copies = fx.Graph(), {}
    for node in env:  # graph order: each node after what it reads
        copies[node] = graph.node_copy(node, lambda n: copies[n])
    names = tuple(made)
    graph.output(tuple(copies[made[n]] for n in names))
    graph.eliminate_dead_code()  # (pure, all of it: it was evaluable)
    return fx.GraphModule(gm, graph), names


_TRANSFERS = {torch.ops.aten._to_copy.default, torch.ops.aten.to.device, torch.ops.aten.to.dtype_layout,
              torch.ops.aten.to.prim_Device, torch.ops.aten.to.dtype, torch.ops.aten.to.other}
