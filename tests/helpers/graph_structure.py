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


def assert_later_steps_share_one(sym, n_timesteps: int) -> None:
    """A symbolic step of a flow decoder at ``n_timesteps``: on a copy of its graph,
    ``passes.step_share`` makes steps 1..n-1 calls of one submodule (the first step
    differs), and inlining them gives back the traced graph op for op, up to the
    input-independent ops it moves ahead of their call (``hoist_constants``)."""
    import collections
    from cadence_fx.passes.specialize import module_without_code
    from cadence_fx.passes.step_share import SHARED, find_calls, hoist_constants, inline_calls, share_calls

    def copied():
        graph = fx.Graph()
        graph.output(graph.graph_copy(sym.gm.graph, {}))
        return module_without_code(sym.gm, graph)

    inside = lambda n: "estimator" in meta.scopes(n)  # noqa: E731
    ops = lambda g: collections.Counter((n.op, str(n.target)) for n in g.graph.nodes if n.op != "get_attr")  # noqa: E731
    hoisted = copied()
    hoist_constants(hoisted, find_calls(hoisted.graph, inside))
    assert ops(hoisted) == ops(sym.gm)  # the same ops, input-independent ones moved ahead of their call
    traced = structure(hoisted)
    gm, record = share_calls(copied(), inside)
    assert record.calls == n_timesteps and record.shared == tuple(range(1, n_timesteps)), str(record)
    calls = [n for n in gm.graph.nodes if n.op == "call_module"]
    assert [n.target for n in calls] == [SHARED] * (n_timesteps - 1)
    sub = gm.get_submodule(SHARED).graph
    attrs = sum(n.op == "get_attr" for n in sub.nodes)
    # one copy of the step's ops instead of n-1; added: per call its node and outputs, the
    # step's inputs, constant reads and output
    before, after = len(sym.gm.graph.nodes), len(gm.graph.nodes) + len(sub.nodes)
    bound = before - (n_timesteps - 2) * record.nodes_each + (n_timesteps - 1) * (1 + record.outputs) \
        + record.inputs + attrs + 1
    assert after <= bound, (before, after, bound, str(record))
    assert structure(inline_calls(gm)) == traced
