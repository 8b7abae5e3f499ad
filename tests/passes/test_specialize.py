"""trace_symbolic + specialize, pinned on a six-line step with a growing cache.

The step appends two frames to a cache of ``prompt + 3`` frames, keeps the
prompt and the last four once longer than 8 frames (a guard: ``prompt + 5 > 8``),
and writes the cache into a bound buffer of ``prompt + 10`` frames.  One symbolic
trace serves every prompt that satisfies its guards; each specialization is the
graph ``trace_step`` records at those shapes, and runs bit-equal to eager.
"""

from __future__ import annotations

import pytest
import torch
from expecttest import TestCase

from cadence_fx import step as meta
from cadence_fx.errors import SpecializationRefused, TraceError
from cadence_fx.passes.specialize import check_binding, specialize
from cadence_fx.passes.trace import trace_step
from cadence_fx.passes.trace_symbolic import ModuleStateChanged, trace_symbolic
from cadence_fx.step import Role
from helpers.graph_structure import structure
from helpers.growing_cache import F32, SIG, bind, symbolic
from helpers.trace_forms import WHOLE_SLICES_TRACED, without_whole_slices

def tensors(prompt: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return ({"in_x": torch.randn(1, 2, generator=g), "state_cache": torch.randn(1, prompt + 3, generator=g)},
            {"buf": torch.zeros(1, prompt + 10)})


def eager(prompt: int, t, buffers):
    out, new = bind({"buf": buffers["buf"]}, prompt=prompt)({"x": t["in_x"]}, {"cache": t["state_cache"]})
    return out["y"], new["cache"]


class TestSpecialize(TestCase):
    def test_one_trace_serves_every_prompt_its_guards_admit(self):
        sym = symbolic(6)
        self.assertEqual([p.name for p in sym.placeholders], ["dim_prompt", "in_x", "state_cache", "buf_buf"])
        self.assertEqual([meta.role(n) for n in sym.gm.graph.nodes if n.op == "placeholder"],
                         [Role.DIM, Role.INPUT, Role.STATE, Role.BUFFER])
        self.assertIn("s", str(sym.placeholders[2].shape[1]))  # the cache's frames are symbolic
        for prompt in (4, 6, 9, 40):
            t, buffers = tensors(prompt, seed=prompt)
            gm = specialize(sym, {"prompt": prompt}, t, buffers)
            with torch.no_grad():
                got = gm(t["in_x"], t["state_cache"])
            want = eager(prompt, t, {"buf": torch.zeros(1, prompt + 10)})
            self.assertTrue(all(torch.equal(a, b) for a, b in zip(got, want)), prompt)
            self.assertTrue(torch.equal(buffers["buf"][:, :prompt + 4], want[1]))
            self.assertFalse(any(isinstance(n.meta.get("val"), torch.SymInt) for n in gm.graph.nodes))

    def test_specialized_graph_pinned_and_equal_to_a_concrete_trace(self):
        sym = symbolic(6)
        t, buffers = tensors(9)
        gm = specialize(sym, {"prompt": 9}, t, buffers)
        if WHOLE_SLICES_TRACED:  # torch 2.5: the same graph, its names counting the whole slices dropped
            self.assertExpectedInline(gm.code.strip(), """\
def forward(self, in_x, state_cache):
    _cadence_buffer_buf = self._cadence_buffer_buf
    cat = torch.ops.aten.cat.default([state_cache, in_x], 1);  state_cache = in_x = None
    slice_2 = torch.ops.aten.slice.Tensor(cat, 1, 0, 9)
    slice_4 = torch.ops.aten.slice.Tensor(cat, 1, -4, 9223372036854775807);  cat = None
    cat_1 = torch.ops.aten.cat.default([slice_2, slice_4], 1);  slice_2 = slice_4 = None
    slice_6 = torch.ops.aten.slice.Tensor(_cadence_buffer_buf, 1, 0, 13)
    copy_ = torch.ops.aten.copy_.default(slice_6, cat_1);  slice_6 = copy_ = None
    slice_8 = torch.ops.aten.slice.Tensor(_cadence_buffer_buf, 1, 0, 13);  _cadence_buffer_buf = None
    mul = torch.ops.aten.mul.Tensor(slice_8, 2);  slice_8 = None
    return (mul, cat_1)""")
        else:
            self.assertExpectedInline(gm.code.strip(), """\
def forward(self, in_x, state_cache):
    _cadence_buffer_buf = self._cadence_buffer_buf
    cat = torch.ops.aten.cat.default([state_cache, in_x], 1);  state_cache = in_x = None
    slice_1 = torch.ops.aten.slice.Tensor(cat, 1, 0, 9)
    slice_2 = torch.ops.aten.slice.Tensor(cat, 1, -4, 9223372036854775807);  cat = None
    cat_1 = torch.ops.aten.cat.default([slice_1, slice_2], 1);  slice_1 = slice_2 = None
    slice_3 = torch.ops.aten.slice.Tensor(_cadence_buffer_buf, 1, 0, 13)
    copy_ = torch.ops.aten.copy_.default(slice_3, cat_1);  slice_3 = copy_ = None
    slice_4 = torch.ops.aten.slice.Tensor(_cadence_buffer_buf, 1, 0, 13);  _cadence_buffer_buf = None
    mul = torch.ops.aten.mul.Tensor(slice_4, 2);  slice_4 = None
    return (mul, cat_1)""")
        concrete = trace_step(bind(buffers, prompt=9), SIG, {"x": t["in_x"]}, {"cache": t["state_cache"]},
                              {"buf": buffers["buf"]})
        if WHOLE_SLICES_TRACED:  # torch 2.5.1's trace keeps the whole slices (no-ops) specialize drops
            concrete = without_whole_slices(concrete)
        self.assertEqual(structure(gm), structure(concrete))
        [get] = [n for n in gm.graph.nodes if n.op == "get_attr"]
        self.assertEqual(meta.tag_of(get), {"role": Role.BUFFER, "region": "buf"})
        self.assertIs(getattr(gm, get.target), buffers["buf"])

    def test_a_prompt_outside_the_guards_is_refused_by_name(self):
        sym = symbolic(6)  # traced where the cache is trimmed: prompt + 5 > 8
        t, buffers = tensors(3)
        with pytest.raises(SpecializationRefused, match=r"guard .*\+ 5 > 8 does not hold at \{'prompt': 3\}"):
            specialize(sym, {"prompt": 3}, t, buffers)
        t, buffers = tensors(4)  # the smallest prompt it admits
        specialize(sym, {"prompt": 4}, t, buffers)

    def test_a_tensor_of_another_shape_or_dtype_is_refused(self):
        sym = symbolic(6)
        t, buffers = tensors(6)
        bad = dict(t, state_cache=torch.zeros(1, 10))
        with pytest.raises(SpecializationRefused, match=r"state_cache is \(1, 10\).*takes \(1, 9\)"):
            check_binding(sym, {"prompt": 6}, {**bad, "buf_buf": buffers["buf"]})
        with pytest.raises(SpecializationRefused, match="buf_buf"):
            specialize(sym, {"prompt": 6}, t, {"buf": torch.zeros(1, 16, dtype=torch.float64)})
        with pytest.raises(SpecializationRefused, match="dims"):
            specialize(sym, {"other": 6}, t, buffers)

    def test_a_data_dependent_step_is_not_traced_symbolically(self):
        def reads_values(buffers, dims):
            def step(inputs, state):
                k = int(inputs["x"].sum().item() > 0)  # a host read of a value
                return {"y": inputs["x"] * k}, {"cache": state["cache"]}
            return step
        with pytest.raises(TraceError, match="symbolic"):
            trace_symbolic(reads_values, SIG, {"prompt": 6}, {"x": ((1, 2), F32)},
                           {"cache": ((1, ("prompt", 1, 3)), F32)}, {}, torch.device("cpu"))


class Lazy(torch.nn.Module):
    """Builds a table on first use and keeps it (as upstream's positional encodings move
    themselves to the input's device on the first call)."""

    def __init__(self):
        super().__init__()
        self.table = None

    def forward(self, x):
        if self.table is None or self.table.dtype != x.dtype:
            self.table = torch.ones(1, 2, dtype=x.dtype)
        return x + self.table


def test_a_step_that_rebinds_module_state_is_refused_and_the_module_put_back():
    lazy = Lazy()

    def bind_lazy(buffers, dims=None):
        def step(inputs, state):
            return {"y": lazy(inputs["x"])}, {"cache": state["cache"] * 1}
        return step

    def trace():
        return trace_symbolic(bind_lazy, SIG, {"prompt": 6}, {"x": ((1, 2), F32)},
                              {"cache": ((1, ("prompt", 1, 3)), F32)}, {}, torch.device("cpu"), watch=(lazy,))
    with pytest.raises(ModuleStateChanged, match=r"rebound Lazy.table \(new\)"):
        trace()
    assert lazy.table is None  # no fake tensor left in the model
    bind_lazy({})({"x": torch.zeros(1, 2)}, {"cache": torch.zeros(1, 9)})  # the first use, for real
    real = lazy.table
    sym = trace()
    assert lazy.table is real
    t = {"in_x": torch.randn(1, 2), "state_cache": torch.randn(1, 7)}
    gm = specialize(sym, {"prompt": 4}, t, {})
    assert torch.equal(gm(t["in_x"], t["state_cache"])[0], t["in_x"] + 1)


def test_a_module_without_code_refuses_to_run_until_recompiled():
    """``module_without_code`` (a symbolic step read from disk, a copy about to be rewritten)
    has no generated code: running it raises instead of running a stale forward."""
    import torch.fx as fx
    from cadence_fx.passes.specialize import module_without_code

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([2.0, 3.0]))

        def forward(self, x):
            return x * self.w + 1

    traced = fx.symbolic_trace(Scale())
    graph = fx.Graph()
    graph.output(graph.graph_copy(traced.graph, {}))
    gm = module_without_code(traced, graph)
    x = torch.tensor([1.0, 1.0])
    with pytest.raises(RuntimeError, match="code was not generated"):
        gm(x)
    assert gm.w is traced.w  # its constants are the root's, shared
    gm.recompile()
    assert torch.equal(gm(x), traced(x))
    assert torch.equal(traced(x), torch.tensor([3.0, 4.0]))  # the root's own code is untouched


def test_a_shared_form_is_kept_per_what_decides_the_predicate():
    """``shared_form`` keeps one outlined form per predicate: an adapter hands a new closure
    at each call (the same answers: the same form), but two closures of one code that
    captured other values answer differently and must not share one."""
    from cadence_fx.passes.specialize import _predicate_key

    def make(scope):
        return lambda n: scope in str(n)
    assert _predicate_key(make("estimator")) == _predicate_key(make("estimator"))
    assert _predicate_key(make("estimator")) != _predicate_key(make("vocoder"))
    held = [1]
    unhashable = (lambda n: n in held)
    assert _predicate_key(unhashable) != _predicate_key(lambda n: n in held)  # each its own


def test_value_is_the_recorded_value_or_a_get_attrs_tensor():
    """``step.value``: a node's ``meta["val"]``; a ``get_attr`` without one (torch 2.5.1's
    make_fx records none on a constant's) reads its tensor from the module, dotted target
    and all; any other node without one has no value."""
    root = torch.nn.Module()
    root.sub = torch.nn.Module()
    root.sub.register_buffer("table", torch.arange(6.0).reshape(2, 3))
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    bare, recorded = graph.get_attr("sub.table"), graph.get_attr("sub.table")
    add = graph.call_function(torch.ops.aten.add.Tensor, (x, bare))
    graph.output(add)
    gm = torch.fx.GraphModule(root, graph)
    fake = torch.empty(2, 3, device="meta")
    recorded.meta["val"] = fake
    assert meta.value(gm, bare) is gm.sub.table  # no recorded value: the constant itself
    assert meta.value(gm, recorded) is fake  # a recorded value wins over the tensor
    assert meta.value(gm, add) is None and meta.value(gm, x) is None  # only a get_attr reads the module
    add.meta["val"] = fake
    assert meta.value(gm, add) is fake


def test_a_whole_slice_of_a_constant_without_a_recorded_value_is_dropped():
    """torch 2.5.1's ``x[:, :1]`` of a constant: a whole slice of dim 0 (``slice(c, 0, 0,
    2**63-1)``: the same sizes, strides and memory) under dim 1's, its ``get_attr`` without a
    value.  ``specialize`` drops the whole slice as it does one of a recorded value."""
    from cadence_fx.passes.specialize import _drop_whole_slices

    root = torch.nn.Module()
    root.register_buffer("c", torch.arange(6.0).reshape(2, 3))
    graph = torch.fx.Graph()
    c = graph.get_attr("c")
    whole = graph.call_function(torch.ops.aten.slice.Tensor, (c, 0, 0, 9223372036854775807))
    part = graph.call_function(torch.ops.aten.slice.Tensor, (whole, 1, 0, 1))
    graph.output(part)
    gm = torch.fx.GraphModule(root, graph)
    whole.meta["val"], part.meta["val"] = root.c[0:], root.c[:, 0:1]
    assert _drop_whole_slices(gm) == 1
    gm.recompile()
    assert [n.args[0] for n in gm.graph.nodes if n.target is torch.ops.aten.slice.Tensor] == [c]
    assert torch.equal(gm(), root.c[:, :1])


def test_whole_slice_says_a_slice_keeps_all_of_its_input_from_its_args_or_its_inputs_value():
    """The one predicate behind specialize's drop and state_rewrite's ``_same_view``."""
    from cadence_fx.passes.base import whole_slice

    root = torch.nn.Module()
    root.register_buffer("c", torch.zeros(2, 3))
    graph = torch.fx.Graph()
    x, c = graph.placeholder("x"), graph.get_attr("c")
    x.meta["val"] = torch.empty(4, 5)
    s = torch.ops.aten.slice.Tensor

    def sl(*args, **kwargs):
        return graph.call_function(s, args, kwargs)

    cases = {
        sl(x): True, sl(x, 1): True,  # no bounds at all
        sl(x, 0, 0, 9223372036854775807): True,  # torch 2.5's ':'
        sl(x, 1, None, None, 1): True, sl(x, dim=1, start=0, end=None): True,
        sl(x, 0, 0, 4): True, sl(x, 1, 0, 5): True, sl(x, -1, 0, 7): True,  # at or past the size, by value
        sl(x, 0, 0, 3): False, sl(x, 1, 0, 4): False, sl(x, -1, 0, 4): False,  # short of it
        sl(x, 0, 1, 4): False, sl(x, 0, 0, None, 2): False, sl(x, dim=0, step=2): False,
        sl(c, 1, 0, 3): True, sl(c, 1, 0, 2): False,  # a constant without a value: the tensor it reads
        sl(x, 5, 0, 9): False,  # a dim the value does not have
        graph.call_function(torch.ops.aten.narrow.default, (x, 0, 0, 4)): False,  # not a slice
    }
    bare = graph.placeholder("y")  # no value recorded: only the arguments can say
    cases[sl(bare, 0, 0, 4)] = False
    cases[sl(bare, 0, 0, 9223372036854775807)] = True
    graph.output(tuple(cases))
    torch.fx.GraphModule(root, graph)  # the get_attr's tensor is read through the owning module
    assert {n.format_node(): whole_slice(n) for n in cases} == {n.format_node(): v for n, v in cases.items()}


def test_state_rewrite_sees_the_arena_through_slices_whole_by_value():
    """``StateRewrite._is_arena_view``: a next state that is the arena itself through slices
    that keep all of it (whole by the arena's size, as specialized graphs record ``x[:n]`` at
    ``n`` = the size) is the state updated in place; one slice short of it is not."""
    from cadence_fx.passes.state_rewrite import RegionBinding, StateRewrite

    graph = torch.fx.Graph()
    arena = graph.placeholder("arena")
    arena.meta["val"] = torch.empty(4, 6)
    s = torch.ops.aten.slice.Tensor
    rows = graph.call_function(s, (arena, 0, 0, 4))  # all 4 rows, by value
    rows.meta["val"] = torch.empty(4, 6)
    whole = graph.call_function(s, (rows, 1, 0, 6))
    short = graph.call_function(s, (rows, 1, 0, 5))
    shorter_rows = graph.call_function(s, (arena, 0, 0, 3))
    shorter_rows.meta["val"] = torch.empty(3, 6)
    under_short = graph.call_function(s, (shorter_rows, 1, 0, 6))
    graph.output((whole, short, under_short))
    full = RegionBinding("r", (4, 6), "float32", 1, 6, 6, True)
    grown = RegionBinding("r", (4, 6), "float32", 1, 5, 5, True)
    assert StateRewrite._is_arena_view(whole, arena, full)
    assert StateRewrite._is_arena_view(short, arena, grown)  # the region's extent, through a whole slice
    assert not StateRewrite._is_arena_view(short, arena, full)
    assert not StateRewrite._is_arena_view(under_short, arena, full)  # 3 of 4 rows: not the arena
