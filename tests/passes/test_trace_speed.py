"""The two tracing speed-ups change nothing but the time.

``trace.one_fake_mode``: make_fx records every ``meta["val"]`` in one fake mode (not a
new one per value; torch 2.5's make_fx makes one per value whatever the context, so
there it traces as before); the graph and every recorded value are the same, and a
``TracingContext`` the caller already has is left alone.  ``PassManager``
regenerates the module's code once after its last pass (not after every pass); the
code is the same as pass by pass.  ``benchmarks/trace_time.py`` measures both.
"""

from __future__ import annotations

import contextlib
import copy
from unittest import mock

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from cadence_fx import step as meta
from cadence_fx.errors import NeedsForeground, TraceError
from cadence_fx.compiler import build_plan, buffer_bindings, region_bindings, rewrite_pipeline
from cadence_fx.passes import trace
from cadence_fx.passes.trace import trace_step
from cadence_fx.runtime.arena import Arena

from helpers.toy_models import ToyAdapter, make_toy, toy_entry_graph

needs_tracing_context = pytest.mark.skipif(
    not hasattr(getattr(torch, "_guards", None), "TracingContext"), reason="this torch has no TracingContext")
#: the speed-up itself: torch 2.5's make_fx makes a fake mode per value whatever the context
needs_make_fx_to_ask_the_context = pytest.mark.skipif(
    not (hasattr(getattr(torch, "_guards", None), "TracingContext") and trace.make_fx_asks_the_context()),
    reason=f"torch {torch.__version__}: make_fx's extract_val makes a FakeTensorMode per value, "
           "it does not call torch._guards.detect_fake_mode (pytorch/pytorch#144168)")


def traced_toy(entry_index: int = 1):
    """The toy's step at one catalog entry, traced as the compiler traces it, and its bindings."""
    gm, bindings, _ = toy_entry_graph(ToyAdapter(make_toy(), 2), entry_index)
    return gm, bindings


def recorded(gm: fx.GraphModule) -> list:
    """Every node's value layout and cadence tags, and the graph-level cadence keys."""
    out = []
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        layout = ((tuple(v.shape), v.dtype, v.stride(), v.device) if isinstance(v, torch.Tensor)
                  else type(v).__name__)
        out.append((n.name, layout, meta.tag_of(n), meta.scopes(n)))
    return out + [meta.signature(gm), meta.traced_device(gm),
                  [tuple(t.shape) for t in meta.example_inputs(gm)]]


def fake_modes(gm: fx.GraphModule) -> set[int]:
    return {id(v.fake_mode) for n in gm.graph.nodes for v in [n.meta.get("val")] if hasattr(v, "fake_mode")}


def shared_and_per_value() -> tuple[fx.GraphModule, fx.GraphModule]:
    shared, _ = traced_toy()
    with mock.patch.object(trace, "one_fake_mode", contextlib.nullcontext):
        per_value, _ = traced_toy()
    return shared, per_value


@needs_tracing_context
def test_one_fake_mode_records_the_same_graph_and_values():
    shared, per_value = shared_and_per_value()
    assert shared.code == per_value.code
    assert recorded(shared) == recorded(per_value)
    assert len(fake_modes(per_value)) > 10  # torch alone makes one each


@needs_tracing_context
@needs_make_fx_to_ask_the_context
def test_one_fake_mode_is_in_effect():
    shared, per_value = shared_and_per_value()
    # one mode for every value, where torch alone makes one each
    assert len(fake_modes(shared)) == 1
    assert len(fake_modes(per_value)) > 10


@needs_tracing_context
def test_an_enclosing_tracing_context_is_left_alone():
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    theirs = TracingContext(FakeTensorMode(allow_fallback_kernels=True))
    with tracing(theirs):
        with trace.one_fake_mode():
            assert TracingContext.try_get() is theirs
        gm, _ = traced_toy()
        assert TracingContext.try_get() is theirs
    assert TracingContext.try_get() is None
    # make_fx recorded every value in their mode (where it asks the context at all)
    if trace.make_fx_asks_the_context():
        assert fake_modes(gm) == {id(theirs.fake_mode)}
    else:  # torch 2.5: no torch._guards.detect_fake_mode in make_fx's extract_val
        assert len(fake_modes(gm)) > 10 and id(theirs.fake_mode) not in fake_modes(gm)


@needs_tracing_context
def test_the_probe_answers_for_the_torch_versions_checked():
    # so the speed-up tests above are not skipped by a probe that broke
    version = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    if version >= (2, 13):
        assert trace.make_fx_asks_the_context()
    elif version <= (2, 5):
        assert not trace.make_fx_asks_the_context()


@needs_tracing_context
def test_a_make_fx_that_does_not_ask_the_context_traces_as_before(monkeypatch):
    # torch 2.5's make_fx makes a mode per value whatever the context: none is entered
    monkeypatch.setattr(trace, "make_fx_asks_the_context", lambda: False)
    with trace.one_fake_mode():
        assert torch._guards.TracingContext.try_get() is None
    gm, _ = traced_toy()
    assert len(fake_modes(gm)) > 10


def test_without_a_tracing_context_api_tracing_runs_as_before(monkeypatch):
    # torch >= 2.5 is supported; a torch without the API must trace as it always did
    monkeypatch.delattr(torch._guards, "tracing", raising=False)
    with trace.one_fake_mode():
        assert getattr(torch._guards, "TracingContext").try_get() is None
    gm, _ = traced_toy()
    assert len(fake_modes(gm)) > 10


def count_recompiles(monkeypatch) -> list:
    calls = []
    original = fx.GraphModule.recompile

    def counted(self):
        calls.append(self)
        return original(self)
    monkeypatch.setattr(fx.GraphModule, "recompile", counted)
    return calls


@pytest.mark.parametrize("rules", ["S", ""])
def test_one_recompile_per_pipeline_and_the_same_code_as_pass_by_pass(monkeypatch, rules):
    gm, bindings = traced_toy()
    one_by_one = copy.deepcopy(gm)
    debug = copy.deepcopy(gm)
    calls = count_recompiles(monkeypatch)
    out, results = rewrite_pipeline(bindings, rules)(gm)
    assert len(calls) == 1 and calls[0] is out
    assert all(r.graph_module is out for r in results)

    # the old way: every pass alone regenerates its code before its ensures
    pipeline = rewrite_pipeline(bindings, rules)
    calls.clear()
    for p in pipeline.passes:
        one_by_one = p(one_by_one).graph_module
    assert len(calls) == len(pipeline.passes)
    assert out.code == one_by_one.code
    # debug mode checks after every pass on current code: one recompile per pass
    calls.clear()
    checked, _ = rewrite_pipeline(bindings, rules, debug=True)(debug)
    assert len(calls) == len(pipeline.passes)
    assert checked.code == out.code


def test_a_pass_whose_ensures_runs_the_code_gets_fresh_code(monkeypatch):
    from cadence_fx.passes.base import CadencePass, PassManager, PassResult

    class Double(CadencePass):
        """Rewrites every mul into an add; ``ensures`` calls the module."""
        ensures_runs_code = True

        def call(self, gm):
            for n in gm.graph.nodes:
                if n.target is torch.ops.aten.mul.Tensor:
                    n.target = torch.ops.aten.add.Tensor
            return PassResult(gm, True)

        def ensures(self, gm):
            x = torch.full((2,), 3.0)
            assert torch.equal(gm(x), x + x), "ensures ran stale code"

    gm = fx.experimental.proxy_tensor.make_fx(lambda x: x * x)(torch.ones(2))
    calls = count_recompiles(monkeypatch)
    out, _ = PassManager([Double()])(gm)
    assert len(calls) == 2  # before the ensures, and once at the end
    assert torch.equal(out(torch.full((2,), 3.0)), torch.full((2,), 6.0))


def test_a_failing_probe_keeps_no_answer_and_fails_closed_where_no_guess_is_safe():
    # the two questions about this torch's make_fx: asked once, kept once answered
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("no make_fx here")

    slower = trace._Probe("whether it is faster", broken, on_failure=False)
    assert slower() is False and slower() is False
    assert len(calls) == 2  # a failure is not kept: asked again
    unsafe = trace._Probe("whether make_fx records torch.autocast blocks", broken, on_failure=None)
    with pytest.raises(TraceError, match="cannot tell whether make_fx records torch.autocast blocks"
                                         ".*RuntimeError: no make_fx here"):
        unsafe()
    fences = iter([NeedsForeground("fence"), NeedsForeground("fence"), None])

    def fenced_once():  # a build's fence refuses the probe's run, then the foreground answers
        e = next(fences)
        if e is not None:
            raise e
        return True

    for on_failure in (None, False):  # neither a refusal for good nor a kept "no"
        fenced = trace._Probe("q", fenced_once, on_failure=on_failure)
        with pytest.raises(NeedsForeground):
            fenced()
    assert fenced() is True  # nothing was kept: the foreground's call asks again
    answers = iter([True, False])
    once = trace._Probe("q", lambda: next(answers), on_failure=None)
    assert once() is True and once() is True  # the first answer is kept
    once.forget()
    assert once() is False


def test_a_trace_whose_autocast_probe_fails_is_refused_not_recorded_without_it(monkeypatch):
    def broken():
        raise RuntimeError("probe broke")

    monkeypatch.setattr(trace, "_records_autocast",
                        trace._Probe("whether make_fx records torch.autocast blocks", broken, on_failure=None))
    with pytest.raises(TraceError, match="cannot tell whether make_fx records torch.autocast"):
        traced_toy()


def _mixed_graph() -> fx.GraphModule:
    """Calls with nested list arguments, keyword arguments, constants and several users."""
    def f(x, y):
        a = torch.cat([x, y * 2], dim=1)
        b = a[:, 1:3].reshape(-1)
        c = torch.ones_like(b, dtype=torch.float64) + b.to(torch.float64)
        return c.sum(dim=[0], keepdim=True), a.transpose(0, 1)
    with torch.no_grad():
        return make_fx(f, pre_dispatch=True)(torch.randn(2, 3), torch.randn(2, 3))


def test_copy_node_copies_as_node_copy_does():
    from cadence_fx.passes.base import copy_node
    gm = _mixed_graph()
    assert any(n.kwargs for n in gm.graph.nodes if n.op == "call_function")  # the case it shortens
    assert any(isinstance(a, (list, tuple)) for n in gm.graph.nodes for a in n.args)
    copies = []
    for copier in (lambda g, n, t: g.node_copy(n, t), copy_node):
        graph, env = fx.Graph(), {}
        for n in gm.graph.nodes:
            env[n] = copier(graph, n, lambda a: env[a])
        copies.append((graph, env))
    (theirs, their_env), (ours, our_env) = copies
    assert str(ours) == str(theirs)
    assert ours.python_code("self").src == theirs.python_code("self").src
    for n in gm.graph.nodes:
        a, b = their_env[n], our_env[n]
        assert (b.op, b.target, b.name, b.type) == (a.op, a.target, a.name, a.type)
        assert fx.node.map_arg((b.args, b.kwargs), lambda m: m.name) == fx.node.map_arg((a.args, a.kwargs), lambda m: m.name)
        assert type(b.args) is type(a.args) and type(b.kwargs) is type(a.kwargs)
        assert [u.name for u in b.users] == [u.name for u in a.users]
        assert [m.name for m in b.all_input_nodes] == [m.name for m in a.all_input_nodes]
        assert b.meta == n.meta and b.meta is not n.meta
    ours.lint()


def test_copy_node_skips_the_argument_walk_and_keeps_creation_hooks(monkeypatch):
    from cadence_fx.passes import base
    import torch.fx.graph as fx_graph
    gm = _mixed_graph()
    walked = []
    real = fx_graph.pytree.tree_iter
    monkeypatch.setattr(fx_graph.pytree, "tree_iter", lambda *a, **k: walked.append(1) or real(*a, **k))
    graph, env = fx.Graph(), {}
    for n in gm.graph.nodes:
        env[n] = base.copy_node(graph, n, lambda a: env[a])
    assert walked == []  # torch 2.13's create_node walks every call's arguments; the copies do not
    # a module that watches node creation sees each node with its arguments, as create_node gives it
    watched = fx.GraphModule(torch.nn.Module(), fx.Graph())
    seen = []
    watched._register_create_node_hook(lambda node: seen.append((node.name, node.args)))
    x = watched.graph.placeholder("x")
    base.add_node(watched.graph, "call_function", torch.ops.aten.add.Tensor, (x, x), {}, name="y")
    assert seen[-1][0] == "y" and len(seen[-1][1]) == 2
