"""step_share, pinned on a three-step toy flow (the first step differs: it also builds a
table the later steps read), and its inverse.  On the released model the later flow
steps share one step, and inlining gives back the unrolled graph op for op (in
``tests/integrations/test_token2wav.py``'s ten-step test, which traces that model)."""

from __future__ import annotations

import copy

import pytest
import torch
from expecttest import TestCase
from torch.fx.experimental.proxy_tensor import make_fx

from cadence_fx import step as meta
from cadence_fx.errors import PassError
from cadence_fx.passes.step_share import SHARED, call_key, find_calls, hoist_constants, inline_calls, share_calls

from helpers.graph_structure import structure


class Est(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, t, cache, first, act=torch.tanh):
        h = self.lin(x) * t + torch.arange(4.0) * t  # the second term needs no input: it moves out
        if first:
            h = h + cache.sum()  # the first call does more (as Token2Wav's first step does)
        cache.copy_(cache * 0.5 + h.mean())
        return act(h)


class Flow(torch.nn.Module):
    def __init__(self, acts=(torch.tanh,) * 3, first=True):
        super().__init__()
        self.est, self.acts, self.first = Est(), acts, first

    def forward(self, x, caches):
        for k in range(3):
            t, slot = torch.full((1,), (k + 1) / 3), caches[k]  # per step: its time and its cache slot
            with meta.scope("estimator"):
                x = x + self.est(x, t, slot, self.first and k == 0, self.acts[k])
        return x


def traced(**kw):
    torch.manual_seed(0)
    flow = Flow(**kw)
    with torch.no_grad():
        gm = make_fx(flow, pre_dispatch=True)(torch.randn(2, 4), torch.zeros(3, 4))
    return flow, gm


def inside(node):
    return "estimator" in meta.scopes(node)


def run(gm, x, caches):
    with torch.no_grad():
        return gm(x, caches)


class TestStepShare(TestCase):
    def test_the_later_steps_call_one_step_and_compute_the_same(self):
        flow, gm = traced()
        unrolled = copy.deepcopy(gm)
        assert [len(c) for c in find_calls(gm.graph, inside)] == [13, 11, 11]
        gm, record = share_calls(gm, inside)
        gm.recompile()
        assert record.hoisted == 3 * 2  # arange and its product, of every call
        assert "arange" not in gm.get_submodule(SHARED).code
        self.assertEqual(str(record), "3 calls, 2 share one step of 9 ops (4 inputs, 1 outputs); calls [1, 2]; "
                                      "6 constant ops moved out; left: call 0 (11 ops) differs from the shared step")
        self.assertExpectedInline(gm.get_submodule(SHARED).code.strip(), """\
def forward(self, in0_add_3, in1_full_1, in2_mul_4, in3_select_1):
    _param_constant0 = self._param_constant0
    _param_constant1 = self._param_constant1
    linear_1 = torch.ops.aten.linear.default(in0_add_3, _param_constant0, _param_constant1);  _param_constant0 = _param_constant1 = None
    mul_3 = torch.ops.aten.mul.Tensor(linear_1, in1_full_1);  linear_1 = in1_full_1 = None
    add_4 = torch.ops.aten.add.Tensor(mul_3, in2_mul_4);  mul_3 = in2_mul_4 = None
    mul_5 = torch.ops.aten.mul.Tensor(in3_select_1, 0.5)
    mean_1 = torch.ops.aten.mean.default(add_4)
    add_5 = torch.ops.aten.add.Tensor(mul_5, mean_1);  mul_5 = mean_1 = None
    copy__1 = torch.ops.aten.copy_.default(in3_select_1, add_5);  in3_select_1 = add_5 = copy__1 = None
    tanh_1 = torch.ops.aten.tanh.default(add_4);  add_4 = None
    add_6 = torch.ops.aten.add.Tensor(in0_add_3, tanh_1);  in0_add_3 = tanh_1 = None
    return (add_6,)""")
        calls = [n for n in gm.graph.nodes if n.op == "call_module"]
        assert calls[0].args[0].name == "add_3"  # each step's x: the first step's result,
        assert calls[1].args[0].args == (calls[0], 0)  # then the previous call's
        assert [n.args[2].name for n in calls] == ["mul_4", "mul_7"]  # each step's arange * t, moved out
        assert [n.args[3].name for n in calls] == ["select_1", "select_2"]  # each step's cache slot
        # the same values and the same writes, in place, as the unrolled graph
        x, caches = torch.randn(2, 4), torch.randn(3, 4)
        c1, c2 = caches.clone(), caches.clone()
        assert torch.equal(run(gm, x, c1), run(unrolled, x, c2)) and torch.equal(c1, c2)

    def test_inlining_gives_back_the_unrolled_graph_op_for_op(self):
        _, gm = traced()
        hoisted = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))  # the same parameters
        hoist_constants(hoisted, find_calls(hoisted.graph, inside))  # what share_calls moves first
        share_calls(gm, inside)
        inline_calls(gm)
        assert not hasattr(gm, SHARED)
        assert structure(gm) == structure(hoisted)

    def test_calls_on_inputs_of_another_layout_are_not_alike(self):
        _, gm = traced()
        [_, a, b] = find_calls(gm.graph, inside)
        assert call_key(a)[0] == call_key(b)[0]
        b_x = call_key(b)[1][0]
        b_x.meta["val"] = torch.empty(3, 4)  # another layout of the step's input: another step
        assert call_key(a)[0] != call_key(b)[0]
        gm2, record = share_calls(gm, inside)
        assert record.shared == () and not hasattr(gm2, SHARED)

    def test_calls_of_other_ops_on_the_same_arguments_are_not_alike(self):
        _, gm = traced(acts=(torch.tanh, torch.tanh, torch.sigmoid), first=False)
        gm, record = share_calls(gm, inside)
        assert record.shared == (0, 1), str(record)
        assert record.left == ("call 2 (9 ops) differs from the shared step",)
        gm.recompile()
        assert "sigmoid" not in gm.get_submodule(SHARED).code and "sigmoid" in gm.code

    def test_a_module_that_has_the_name_already_is_refused(self):
        _, gm = traced()
        gm.register_module(SHARED, torch.nn.Identity())
        with pytest.raises(PassError, match="already has an attribute"):
            share_calls(gm, inside)


def test_the_analyses_see_a_call_as_the_ops_it_runs():
    """A call writes the cache slot it is given (the toy's ``copy_``), returns fresh
    memory, and so has an effect: what ``written_args``, ``view_root`` and
    ``has_side_effect`` say of the call is what they say of its ops."""
    from cadence_fx.passes.base import CALL_SUMMARY, CallSummary, has_side_effect, view_root, written_args
    _, gm = traced()
    share_calls(gm, inside)
    sub = gm.get_submodule(SHARED)
    assert sub.meta[CALL_SUMMARY] == CallSummary(written=(3,), aliases=(None,), effects=True)
    calls = [n for n in gm.graph.nodes if n.op == "call_module"]
    for call in calls:
        assert written_args(call) == [call.args[3]] and has_side_effect(call)
        (item,) = call.users
        assert view_root(item) is item  # fresh memory: its own root
    # a step that only reads, and returns a view of its input: no effect, that item is the input's memory
    def viewing(x):
        outs = []
        for _ in range(2):
            x = x * 2.0  # between the calls
            with meta.scope("estimator"):
                outs.append(x[0])
                x = x.tanh()
        return outs + [x]

    g = make_fx(viewing, pre_dispatch=True)(torch.randn(2, 4))
    share_calls(g, inside)
    assert g.get_submodule(SHARED).meta[CALL_SUMMARY] == CallSummary(written=(), aliases=(0, None), effects=False)
    for call in [n for n in g.graph.nodes if n.op == "call_module"]:
        assert not has_side_effect(call) and written_args(call) == []
        first = [u for u in call.users if u.args[1] == 0][0]
        assert view_root(first) is view_root(call.args[0])  # the item is the input's memory


def test_the_region_walk_follows_a_call_into_its_ops():
    """The hazard check's walk (and the logging run) over the shared graph logs, in order,
    the region accesses it logs over the unrolled graph: each call's write of its cache
    slot at the slot's own bytes."""
    from cadence_fx.passes import aliasing
    from cadence_fx.step import Role
    _, gm = traced()
    [_, caches] = [n for n in gm.graph.nodes if n.op == "placeholder"]
    meta.tag(caches, Role.ARENA, region="cache")

    def log(g, run):
        region = torch.zeros(3, 4)
        if run:
            accesses = aliasing.record_accesses(g, [torch.randn(2, 4), region], {"cache": region})
        else:
            accesses = aliasing.record_region_accesses(g, {"cache": region})
            # a walk plan (the calls of the shared step among its nodes) logs the same
            assert aliasing.record_region_accesses(g, {"cache": region}, plan=aliasing.WalkPlan(g)) == accesses
        assert [a.position for a in accesses] == sorted(a.position for a in accesses)
        return [(a.region, a.origin, a.kind, a.lo, a.hi) for a in accesses]

    unrolled = log(gm, False)
    assert [(k, lo) for _, _, k, lo, _ in unrolled if k == "write"] == [("write", 0), ("write", 16), ("write", 32)]
    share_calls(gm, inside)
    gm.recompile()
    assert log(gm, False) == unrolled
    assert log(gm, True) == unrolled


@pytest.mark.parametrize("granularity", ["chunk", "step"])
def test_partition_puts_a_call_in_a_region_and_the_pieces_compute_the_same(granularity):
    """A call is capturable when every op in it is: in one chunk-sized region, or (per
    step) a region of its own; the split graph computes and writes what the unrolled does."""
    from cadence_fx.passes.base import PassManager
    from cadence_fx.passes.partition import Partition
    _, gm = traced()
    unrolled = copy.deepcopy(gm)
    share_calls(gm, inside)
    boundary = (lambda n: "estimator" in meta.scopes(n)) if granularity == "step" else None
    split, [result] = PassManager([Partition("cpu", granularity, boundary)])(gm)
    assert all(capturable for _, capturable, _ in result.record.regions), str(result.record)
    pieces = [m for _, m in split.named_children()]
    holding = [p for p in pieces if hasattr(p, SHARED)]
    assert len(holding) == (1 if granularity == "chunk" else 2)  # each call site's piece calls the one step
    assert all(p.get_submodule(SHARED) is holding[0].get_submodule(SHARED) for p in holding)
    x, caches = torch.randn(2, 4), torch.randn(3, 4)
    c1, c2 = caches.clone(), caches.clone()
    assert torch.equal(run(split, x, c1), run(unrolled, x, c2)) and torch.equal(c1, c2)


def test_a_constant_the_step_writes_is_not_moved_ahead_of_the_write():
    """A module tensor the step updates in place and reads through another attribute
    over the same memory (two ``get_attr`` nodes, one storage) is not input-independent:
    its read stays after the write, and the shared graph computes what the unrolled does."""
    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.seen = torch.zeros(4)
            self.seen_view = self.seen[:]  # the same memory under another name
            self.table = torch.arange(4.0)  # never written: its product moves out, read and all

        def forward(self, x):
            for _ in range(3):
                x = x * 1.5  # between the calls
                with meta.scope("estimator"):
                    self.seen.add_(1.0)
                    x = x + self.seen_view * 2.0 + self.table * 3.0
            return x

    with torch.no_grad():
        gm = make_fx(Counting(), pre_dispatch=True)(torch.zeros(2, 4))
    unrolled = copy.deepcopy(gm)  # its own copy of the (one) counter
    gm, record = share_calls(gm, inside)
    gm.recompile()
    assert record.hoisted == 3 and record.shared == (1, 2), str(record)  # table * 3, of every call
    x = torch.randn(2, 4)
    assert torch.equal(gm(x), unrolled(x))
