"""A graph's ops as comparable rows: two traces of one step compare equal op for op,
whatever their node names (tests of ``specialize`` against ``trace_step``)."""

from __future__ import annotations

import torch
import torch.fx as fx

from cadence_fx import step as meta


def structure(gm: fx.GraphModule) -> list:
    """Each op node: target, args (nodes by position, parameters by address, other constants by
    layout), value layout."""
    order = {}
    rows = []

    def arg(a):
        if isinstance(a, fx.Node):
            if a.op == "get_attr":
                t = getattr(gm, a.target)
                # a parameter by identity (which block's weight), any other constant by layout
                ident = t.data_ptr() if isinstance(t, torch.nn.Parameter) else None
                return ("attr", meta.region(a), tuple(t.shape), t.dtype, ident)
            return ("node", order[a]) if a in order else ("placeholder", meta.tag_of(a).get("name"))
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        return a

    for n in gm.graph.nodes:
        if n.op in ("placeholder", "get_attr"):
            continue
        order[n] = len(rows)
        v = n.meta.get("val")
        # a size-1 dim's stride is arbitrary (real kernels and fake meta functions may differ there)
        layout = ((tuple(v.shape), tuple(st for n, st in zip(v.shape, v.stride()) if n != 1), v.dtype)
                  if isinstance(v, torch.Tensor) else None)
        rows.append((n.op, str(n.target), arg(n.args), arg(n.kwargs), layout))
    return rows
