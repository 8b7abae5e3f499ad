"""How this torch's make_fx records what another torch records otherwise, where the two
graphs compute the same: tests comparing a graph with a trace accept the other form
only where the running torch records it."""

from __future__ import annotations

import torch
import torch.fx as fx

from cadence_fx.step import value


def _whole_slices_traced() -> bool:
    from torch.fx.experimental.proxy_tensor import make_fx
    with torch.no_grad():  # as trace_step traces
        gm = make_fx(lambda x: x[:, :2], pre_dispatch=True)(torch.zeros(2, 3))
    return sum(n.target is torch.ops.aten.slice.Tensor for n in gm.graph.nodes) > 1


#: make_fx records ``x[:, :n]`` at known sizes as a whole slice of dim 0 and dim 1's slice
#: (torch 2.5.1: ``slice(x, 0, 0, 9223372036854775807)``), not dim 1's alone (2.13):
#: ``specialize`` drops whole slices, a trace keeps them, and the rewrite passes keep them
WHOLE_SLICES_TRACED = _whole_slices_traced()


def without_whole_slices(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` without its slices that keep their whole input (``slice(x, d, 0,
    >= size, 1)`` of the same sizes and strides: the same view of the same memory, a
    no-op), their users reading the input."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.slice.Tensor or node.kwargs:
            continue
        src, dim, start, end, step = (*node.args, *(None, 0, None, None, 1)[len(node.args):])
        val = node.meta.get("val")
        sval = value(gm, src)  # torch 2.5.1 records no value on a constant's get_attr: the tensor itself
        if not (isinstance(val, torch.Tensor) and isinstance(sval, torch.Tensor)):
            continue
        if (start in (None, 0) and (end is None or end >= sval.shape[dim]) and step == 1
                and val.shape == sval.shape and val.stride() == sval.stride()):
            node.replace_all_uses_with(src)
            graph.erase_node(node)
    return fx.GraphModule(gm, graph)
