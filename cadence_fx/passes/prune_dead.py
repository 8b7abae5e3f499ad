"""prune_dead: drop nodes nobody uses, keeping every op with an effect.

An unused ``aten.rand`` must stay: dropping it changes how far the generator
advances and so every later random draw.  ``fx.Graph.eliminate_dead_code`` keeps it
on recent torch, but which ops it treats as impure has changed across releases;
here the rule is explicit: random draws, writes (mutable schemas), placeholders
and impure nodes always stay.
"""

from __future__ import annotations

import torch.fx as fx

from .base import CadencePass, PassResult, has_side_effect


class PruneDead(CadencePass):
    """requires: nothing.  ensures: nothing beyond the lint (removal keeps every effect by rule)."""

    name = "prune_dead"

    def call(self, gm: fx.GraphModule) -> PassResult:
        removed = 0
        for node in reversed(list(gm.graph.nodes)):
            if not node.users and not has_side_effect(node):
                gm.graph.erase_node(node)
                removed += 1
        gm.delete_all_unused_submodules()
        _drop_unused_attrs(gm)
        return PassResult(gm, removed > 0, {"removed": removed})


#: attributes the library's passes (and make_fx) set on a graph module: dropped when no
#: ``get_attr`` reads them.  ``_cadence_buffer_<region>``: ``specialize``'s binding of a
#: region's buffers to the arena traced on; once ``state_rewrite`` made them arena inputs,
#: keeping it would hold that arena's memory for as long as the executable lives.
_OWN_ATTRS = ("_tensor_constant", "_param_constant", "_folded", "_cadence_buffer_")


def _drop_unused_attrs(gm: fx.GraphModule) -> None:
    """Delete tensor attributes no ``get_attr`` refers to (frees rebound buffers)."""
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name in list(vars(gm)):
        if name.startswith(_OWN_ATTRS) and name not in used:
            delattr(gm, name)
    for name in list(gm._buffers):
        if name not in used:
            del gm._buffers[name]
    for name in list(gm._parameters):
        if name not in used:
            del gm._parameters[name]
