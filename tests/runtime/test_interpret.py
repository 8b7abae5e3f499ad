"""runtime.interpret: a graph walked as its generated code would run it (capture warm-up
and capture run pieces this way, so their code is never generated).

The oracle is the generated code itself, in this process: every output and every
argument an op writes ``torch.equal``, the random draws the same, and every value
released at the same point (after its last use; an unused value right after it is made).
"""

from __future__ import annotations

import operator
import weakref

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from cadence_fx.passes.base import lazy_graph_module_class
from cadence_fx.runtime.interpret import has_code, run_graph_module, run_piece


def _step(x, state, w):
    h = torch.nn.functional.linear(x, w)
    state.mul_(0.5).add_(h[:, :4])  # written in place, through a view chain
    noise = torch.randn_like(h)  # a random draw: the same draw in both runs
    parts = torch.split(h + noise, 2, dim=1)  # a tuple result read by getitem
    return parts[0].relu(), {"sum": parts[1].sum(), "max": h.amax(dim=0)}, [state[0]]


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, 5, generator=g), torch.randn(3, 4, generator=g), torch.randn(6, 5, generator=g)


def _traced():
    with torch.no_grad():
        gm = make_fx(_step, pre_dispatch=True)(*_inputs())
    return lazy_graph_module_class()(gm, gm.graph)  # lazy: no code until it first runs


def _run_both(gm, run):
    """(outputs, written state) of ``run(gm, args)`` on fresh inputs, generator seeded."""
    x, state, w = _inputs(1)
    torch.manual_seed(7)
    with torch.no_grad():
        out = run(gm, (x, state, w))
    return out, state


def test_a_walked_graph_equals_its_generated_code_bit_for_bit():
    gm = _traced()
    assert not has_code(gm)
    walked, walked_state = _run_both(gm, run_graph_module)
    assert not has_code(gm)  # walking generated nothing
    coded, coded_state = _run_both(gm, lambda g, a: g(*a))
    assert has_code(gm)
    assert torch.equal(walked_state, coded_state)
    flat_w, spec_w = torch.utils._pytree.tree_flatten(walked)
    flat_c, spec_c = torch.utils._pytree.tree_flatten(coded)
    assert spec_w == spec_c
    assert len(flat_c) == 4 and all(torch.equal(a, b) for a, b in zip(flat_w, flat_c))
    # a different random draw or a missed write would show: the oracle is not trivial
    other, other_state = _run_both(gm, lambda g, a: (torch.manual_seed(8), g(*a))[1])
    assert not torch.equal(other[0], coded[0])
    assert not torch.equal(walked_state, _inputs(1)[1])


def test_every_kind_of_node_and_a_placeholder_after_a_constant():
    root = torch.nn.Module()
    root.sub = torch.nn.Module()
    root.sub.register_buffer("table", torch.arange(4.0))
    root.lin = torch.nn.Linear(4, 4)
    g = fx.Graph()
    table = g.get_attr("sub.table")  # a constant before the placeholder
    x = g.placeholder("x")
    y = g.call_module("lin", (x,))
    z = g.call_method("add", (y, table), {"alpha": 2})
    first = g.call_function(operator.getitem, (z, (slice(None), slice(0, 2))))
    g.call_function(torch.ops.aten.add.Tensor, (z, 1))  # no user: made, then released at once
    g.output({"z": z, "pair": (first, [table])})
    gm = lazy_graph_module_class()(root, g)
    x = torch.randn(3, 4)
    walked = run_graph_module(gm, (x,))
    coded = gm(x)
    assert torch.equal(walked["z"], coded["z"]) and torch.equal(walked["pair"][0], coded["pair"][0])
    assert walked["pair"][1][0] is root.sub.table
    with pytest.raises(TypeError, match="takes 1 arguments, got 2"):
        run_graph_module(gm, (x, x))


_ALIVE: dict = {}


def _mark(t):
    """Keep a weak reference to ``t`` (the value the graph holds) and return it."""
    _ALIVE["made"] = weakref.ref(t)
    return t


def _probe(t):
    """Record whether the marked value is still held when this runs."""
    _ALIVE["held"] = _ALIVE["made"]() is not None
    return t


torch.fx.wrap("_mark")
torch.fx.wrap("_probe")


def _release_graph(keep: bool) -> fx.GraphModule:
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(_mark, (g.call_function(torch.mul, (x, 2)),))
    b = g.call_function(torch.add, (a, 1))  # a's last use unless keep
    p = g.call_function(_probe, (b,))
    g.output((p, a) if keep else p)
    return lazy_graph_module_class()(torch.nn.Module(), g)


@pytest.mark.parametrize("keep", [False, True])
def test_values_are_released_where_the_generated_code_releases_them(keep):
    held = {}
    for how, run in (("walked", run_graph_module), ("coded", lambda g, a: g(*a))):
        gm = _release_graph(keep)
        _ALIVE.clear()
        run(gm, (torch.randn(3),))
        held[how] = _ALIVE["held"]
    assert held["walked"] == held["coded"] == keep, held


def test_run_piece_uses_generated_code_where_there_is_some(monkeypatch):
    gm = _traced()
    import cadence_fx.runtime.interpret as interp
    calls = []
    monkeypatch.setattr(interp, "run_graph_module", lambda g, a: calls.append(g) or g(*a))
    x, state, w = _inputs(1)
    with torch.no_grad():
        run_piece(gm, (x, state, w))  # no code yet: walked
        assert calls == [gm]
        run_piece(gm, (x, state, w))  # the walk above was a call here (monkeypatched): code now
    assert calls == [gm] and has_code(gm)
    plain = torch.nn.Linear(2, 2)
    assert torch.equal(run_piece(plain, (torch.ones(1, 2),)), plain(torch.ones(1, 2)))


def test_a_step_list_leaves_the_collector_a_few_objects_a_graph():
    """A kept executable's step lists add almost nothing for the garbage collector to walk
    (docs/architecture.md, "Fewer objects for the collector to walk"): a graph's steps are
    one bytes blob (never tracked) beside its list of call targets and its list of
    constants; a walk of it equals the generated code (the test above)."""
    import gc
    from cadence_fx.runtime.interpret import _program
    gm = _traced()
    run_graph_module(gm, _inputs())  # builds and keeps its step list
    blob, size, targets, consts = _program(gm)
    assert isinstance(blob, bytes) and not gc.is_tracked(blob)
    assert size == len(gm.graph.nodes) and targets and all(callable(t) for t in targets)
    assert all(not isinstance(c, (fx.Node, tuple, list, dict)) for c in consts)  # dtypes, devices...


def test_a_dropped_graph_is_walked_from_its_step_list_and_never_called_as_code():
    """``drop_graph`` (what ``graphs.compact_entry`` does to a replayed entry's pieces): the
    graph goes, the walk equals the generated code as before, and anything that would make
    code from the empty graph raises (a direct call, ``.code``, printing it) rather than
    computing nothing."""
    from cadence_fx.runtime.interpret import drop_graph
    want, want_state = _run_both(_traced(), lambda g, a: g(*a))
    gm = _traced()
    assert drop_graph(gm) and len(gm.graph.nodes) == 0 and not has_code(gm)
    got, got_state = _run_both(gm, run_piece)
    assert torch.equal(got_state, want_state)
    assert all(torch.equal(a, b) for a, b in zip(torch.utils._pytree.tree_leaves(got),
                                                 torch.utils._pytree.tree_leaves(want)))
    for call in (lambda: gm(*_inputs()), lambda: gm.code, lambda: str(gm)):
        with pytest.raises(RuntimeError, match="let go"):
            call()
    coded = _traced()
    coded(*_inputs())  # code generated: it runs as code, so it keeps its graph
    assert not drop_graph(coded) and len(coded.graph.nodes) > 0


def test_a_dropped_graph_is_freed_by_reference_count_not_left_to_the_collector():
    """``drop_graph`` unlinks the graph it lets go (``interpret._let_go``): with the
    collector off, every one of its nodes is freed as it is dropped (left linked, the graph
    is a reference cycle and every node lives until a collection), and the step list
    still walks to the same result."""
    import gc
    from cadence_fx.runtime.interpret import drop_graph
    want, want_state = _run_both(_traced(), lambda g, a: g(*a))
    gm = _traced()
    run_graph_module(gm, _inputs())  # its step list
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        refs = [weakref.ref(n) for n in gm.graph.nodes]
        assert len(refs) > 5
        assert drop_graph(gm)
        assert [r for r in refs if r() is not None] == []
        kept = _traced()  # a graph not dropped stays whole (a cycle: alive until collected)
        kept_refs = [weakref.ref(n) for n in kept.graph.nodes]
        del kept
        assert all(r() is not None for r in kept_refs)
    finally:
        if enabled:
            gc.enable()
    got, got_state = _run_both(gm, run_piece)
    assert torch.equal(got_state, want_state)
    assert all(torch.equal(a, b) for a, b in zip(torch.utils._pytree.tree_leaves(got),
                                                 torch.utils._pytree.tree_leaves(want)))
