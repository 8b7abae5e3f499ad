"""Passes, one class each, pinned on small graphs: PruneDead, FoldHostConstants,
StateRewrite (with the aliasing analysis), EarlyWriteback, PassManager.

Every pinned graph is ``make_fx(pre_dispatch=True)`` of a few lines (or ``trace_step``
of a five-line Token2Wav-like step).  Regenerate pins with ``EXPECTTEST_ACCEPT=1``
and read the diff: it is the rewrite.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx
from expecttest import TestCase
from torch.fx.experimental.proxy_tensor import make_fx

from cadence_fx.errors import PassError
from cadence_fx.passes import aliasing
from cadence_fx.passes.base import CadencePass, PassManager, PassResult, op_counts, this_before_that
from cadence_fx.passes.early_writeback import EarlyWriteback
from cadence_fx.passes.fold_host_constants import FoldHostConstants
from cadence_fx.passes.prune_dead import PruneDead
from cadence_fx.passes.state_rewrite import RegionBinding, RewriteRecord, StateRewrite
from cadence_fx.passes.trace import trace_step
from cadence_fx.step import StepSignature
from helpers.trace_forms import WHOLE_SLICES_TRACED

aten = torch.ops.aten


def trace(fn, *args) -> fx.GraphModule:
    with torch.no_grad():
        return make_fx(fn, pre_dispatch=True)(*args)


def run(gm: fx.GraphModule, *args):
    with torch.no_grad():
        return gm(*args)


def counts(gm: fx.GraphModule) -> dict[str, int]:
    """Op counts by short name (``aten.cat.default`` -> ``cat``)."""
    out: dict[str, int] = {}
    for key, n in op_counts(gm).items():
        short = key.split(".")[1] if key.startswith("aten.") else key
        out[short] = out.get(short, 0) + n
    return out


# --------------------------------------------------------------------- PruneDead
def prune_me(x, buf):
    unused = x.sin() * 2  # noqa: F841 - pure and unused: dropped
    torch.rand(3)  # unused draw: kept, or every later draw would shift
    buf.add_(x)  # a write: kept
    return x.cos()


class TestPruneDead(TestCase):
    def test_keeps_random_and_writes_drops_pure(self):
        gm = trace(prune_me, torch.randn(3), torch.zeros(3))
        self.assertExpectedInline(gm.code.strip(), """\
def forward(self, x_1, buf_1):
    sin = torch.ops.aten.sin.default(x_1)
    mul = torch.ops.aten.mul.Tensor(sin, 2);  sin = mul = None
    rand = torch.ops.aten.rand.default([3], device = device(type='cpu'), pin_memory = False);  rand = None
    add_ = torch.ops.aten.add_.Tensor(buf_1, x_1);  buf_1 = add_ = None
    cos = torch.ops.aten.cos.default(x_1);  x_1 = None
    return cos""")
        original = copy.deepcopy(gm)
        before = counts(gm)

        result = PruneDead()(gm)

        self.assertExpectedInline(result.graph_module.code.strip(), """\
def forward(self, x_1, buf_1):
    rand = torch.ops.aten.rand.default([3], device = device(type='cpu'), pin_memory = False);  rand = None
    add_ = torch.ops.aten.add_.Tensor(buf_1, x_1);  buf_1 = add_ = None
    cos = torch.ops.aten.cos.default(x_1);  x_1 = None
    return cos""")
        self.assertTrue(result.modified)
        self.assertEqual(result.record, {"removed": 2})
        after = counts(result.graph_module)
        self.assertEqual(before, {"sin": 1, "mul": 1, "rand": 1, "add_": 1, "cos": 1})
        self.assertEqual(after, {"rand": 1, "add_": 1, "cos": 1})

        # Same outputs, same writes, and the generator advanced by the same draw.
        x = torch.randn(3)
        buf_a, buf_b = torch.zeros(3), torch.zeros(3)
        torch.manual_seed(7)
        out_a = run(original, x, buf_a)
        next_a = torch.rand(4)
        torch.manual_seed(7)
        out_b = run(result.graph_module, x, buf_b)
        next_b = torch.rand(4)
        self.assertTrue(torch.equal(out_a, out_b))
        self.assertTrue(torch.equal(buf_a, buf_b) and torch.equal(buf_b, x))
        self.assertTrue(torch.equal(next_a, next_b))

    def test_second_run_is_a_no_op(self):
        gm = PruneDead()(trace(prune_me, torch.randn(3), torch.zeros(3))).graph_module
        again = PruneDead()(gm)
        self.assertFalse(again.modified)
        self.assertEqual(again.record, {"removed": 0})


# ------------------------------------------------------------- FoldHostConstants
class TestFoldHostConstants(TestCase):
    def test_folds_arange_exp_to(self):
        def f(x):
            pos = torch.exp(-0.5 * torch.arange(3, dtype=torch.float32)).to(x.device)  # host-built
            return x * pos

        gm = trace(f, torch.randn(2, 3))
        self.assertExpectedInline(gm.code.strip(), """\
def forward(self, x_1):
    arange = torch.ops.aten.arange.default(3, dtype = torch.float32, device = device(type='cpu'), pin_memory = False)
    mul = torch.ops.aten.mul.Tensor(arange, -0.5);  arange = None
    exp = torch.ops.aten.exp.default(mul);  mul = None
    to = torch.ops.aten.to.dtype_layout(exp, dtype = torch.float32, layout = torch.strided, device = device(type='cpu'));  exp = None
    mul_1 = torch.ops.aten.mul.Tensor(x_1, to);  x_1 = to = None
    return mul_1""")
        original = copy.deepcopy(gm)

        result = FoldHostConstants()(gm)

        self.assertExpectedInline(result.graph_module.code.strip(), """\
def forward(self, x_1):
    _folded0 = self._folded0
    mul_1 = torch.ops.aten.mul.Tensor(x_1, _folded0);  x_1 = _folded0 = None
    return mul_1""")
        self.assertTrue(result.modified)
        self.assertEqual(result.record, {"folded": 1})
        self.assertEqual(counts(original), {"arange": 1, "mul": 2, "exp": 1, "to": 1})
        self.assertEqual(counts(gm), {"mul": 1})
        const = next(n for n in gm.graph.nodes if n.op == "get_attr")
        self.assertEqual(const.meta["cadence"], {"role": "folded", "from": "to"})
        # the constant holds the bits eager computes on every call
        self.assertTrue(torch.equal(gm._folded0, torch.exp(-0.5 * torch.arange(3, dtype=torch.float32))))
        x = torch.randn(2, 3)
        self.assertTrue(torch.equal(run(original, x), run(gm, x)))

    def test_keeps_factory_written_in_place(self):
        def f(x):
            z = torch.zeros(2, 3)  # input-independent when made...
            z[0] = x  # ...but written later: folding would freeze the first call's x
            return z * 2

        gm = trace(f, torch.randn(3))
        code = gm.code.strip()
        self.assertExpectedInline(code, """\
def forward(self, x_1):
    zeros = torch.ops.aten.zeros.default([2, 3], device = device(type='cpu'), pin_memory = False)
    select = torch.ops.aten.select.int(zeros, 0, 0)
    copy_ = torch.ops.aten.copy_.default(select, x_1);  select = x_1 = copy_ = None
    mul = torch.ops.aten.mul.Tensor(zeros, 2);  zeros = None
    return mul""")
        result = FoldHostConstants()(gm)
        self.assertFalse(result.modified)
        self.assertEqual(result.record, {"folded": 0})
        self.assertEqual(gm.code.strip(), code)
        x = torch.randn(3)
        self.assertTrue(torch.equal(run(gm, x)[0], 2 * x))

    def test_keeps_a_module_buffer_written_through_another_get_attr(self):
        """make_fx emits one get_attr per access of a buffer: a write through one of
        them makes every read of the buffer live (rules R trace over stock buffers)."""
        class Cache(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("buf", torch.zeros(2, 3))

            def forward(self, x):
                self.buf[0] = x
                return self.buf.sum(0)

        gm = make_fx(Cache(), pre_dispatch=True)(torch.randn(3))
        code = gm.code.strip()
        self.assertExpectedInline(code, """\
def forward(self, arg0_1):
    _tensor_constant0 = self._tensor_constant0
    select = torch.ops.aten.select.int(_tensor_constant0, 0, 0);  _tensor_constant0 = None
    copy_ = torch.ops.aten.copy_.default(select, arg0_1);  select = arg0_1 = copy_ = None
    _tensor_constant0_1 = self._tensor_constant0
    sum_1 = torch.ops.aten.sum.dim_IntList(_tensor_constant0_1, [0]);  _tensor_constant0_1 = None
    return sum_1""")
        result = FoldHostConstants()(gm)
        self.assertEqual(result.record, {"folded": 0})
        self.assertEqual(gm.code.strip(), code)
        x = torch.randn(3)
        self.assertTrue(torch.equal(gm(x), x))

    def test_keeps_random_draws(self):
        def f(x):
            return x + torch.rand(3) * 2  # input-independent, but a draw per call

        gm = trace(f, torch.randn(3))
        code = gm.code.strip()
        self.assertExpectedInline(code, """\
def forward(self, x_1):
    rand = torch.ops.aten.rand.default([3], device = device(type='cpu'), pin_memory = False)
    mul = torch.ops.aten.mul.Tensor(rand, 2);  rand = None
    add = torch.ops.aten.add.Tensor(x_1, mul);  x_1 = mul = None
    return add""")
        result = FoldHostConstants()(gm)
        self.assertEqual(result.record, {"folded": 0})
        self.assertEqual(gm.code.strip(), code)
        x = torch.zeros(3)
        self.assertFalse(torch.equal(run(gm, x), run(gm, x)))  # still draws fresh numbers

    def test_keeps_parameter_derived_compute(self):
        weight = torch.nn.Parameter(torch.randn(3))

        def f(x):
            return x * weight.exp()  # a checkpoint load changes the weight: never fold

        gm = trace(f, torch.randn(3))
        code = gm.code.strip()
        self.assertExpectedInline(code, """\
def forward(self, x_1):
    _param_constant0 = self._param_constant0
    exp = torch.ops.aten.exp.default(_param_constant0);  _param_constant0 = None
    mul = torch.ops.aten.mul.Tensor(x_1, exp);  x_1 = exp = None
    return mul""")
        result = FoldHostConstants()(gm)
        self.assertEqual(result.record, {"folded": 0})
        self.assertEqual(gm.code.strip(), code)
        with torch.no_grad():
            weight.add_(1.0)
        x = torch.randn(3)
        self.assertTrue(torch.equal(run(gm, x), x * weight.detach().exp()))

    def test_ensures_rejects_a_leftover_host_transfer(self):
        table = torch.arange(4, dtype=torch.float32)

        def f(x):
            return x + table.to(x.device)

        gm = trace(f, torch.randn(4))
        with self.assertRaisesRegex(PassError, "left a host transfer .*_tensor_constant0"):
            FoldHostConstants().ensures(gm)
        FoldHostConstants()(gm)  # the pass itself folds it, and its own ensures passes
        self.assertNotIn("to", counts(gm))


# ------------------------------------------------------------------ StateRewrite
SIG = StepSignature(inputs=("x",), regions=("kv", "c"), outputs=("y",))


def windowed_step(buf: torch.Tensor, prefix: int, retain: int):
    """Token2Wav's pattern in five lines, on a stride-2 clock.

    kv [2, T]: grown newest first, written into the over-provisioned ``buf`` whose
    slice is the next state, trimmed to ``prefix + retain`` frames; c [2]: a Fixed carry.
    """
    def step(inputs, state):
        cache = torch.cat([inputs["x"], state["kv"]], dim=1)
        n = cache.shape[1]
        buf[:, :n] = cache
        cache = buf[:, :n]
        y = cache.sum(1) + state["c"]
        if n > prefix + retain:
            cache = torch.cat([cache[:, :prefix], cache[:, -retain:]], dim=1)
        return {"y": y}, {"kv": cache, "c": y * 0.5}
    return step


def bindings(capacity: int, ext_in: int, ext_out: int) -> list[RegionBinding]:
    return [RegionBinding("kv", (2, capacity), "float32", 1, ext_in, ext_out, True),
            RegionBinding("c", (2,), "float32", None, None, None, True)]


def traced_step(prefix: int, retain: int, ext_in: int):
    """(graph, the buffer it writes, step inputs, state) at one catalog entry.

    The buffer is the arena-bound one, at the Window's capacity prefix + retain + 2.
    """
    buf = torch.zeros(2, prefix + retain + 2)
    g = torch.Generator().manual_seed(0)
    inputs = {"x": torch.randn(2, 2, generator=g)}
    state = {"kv": torch.randn(2, ext_in, generator=g), "c": torch.randn(2, generator=g)}
    gm = trace_step(windowed_step(buf, prefix, retain), SIG, inputs, state, {"kv": buf})
    return gm, buf, inputs, state


def arena_for(capacity: int, state: dict) -> dict[str, torch.Tensor]:
    kv = torch.full((2, capacity), -1.0)  # garbage beyond the live extent must not matter
    kv[:, :state["kv"].shape[1]] = state["kv"]
    return {"kv": kv, "c": state["c"].clone()}


class TestStateRewrite(TestCase):
    def test_in_place_and_written_back(self):
        # Window(retain=2, prefix=1), stride 2: step 0 grows kv 1 -> 3 frames, no trim.
        gm, buf, inputs, state = traced_step(prefix=1, retain=2, ext_in=1)
        if WHOLE_SLICES_TRACED:  # torch 2.5: the same graph with its whole slices
            self.assertExpectedInline(gm.code.strip(), """\
def forward(self, in_x, state_kv, state_c):
    cat = torch.ops.aten.cat.default([in_x, state_kv], 1);  in_x = state_kv = None
    _tensor_constant0 = self._tensor_constant0
    slice_1 = torch.ops.aten.slice.Tensor(_tensor_constant0, 0, 0, 9223372036854775807);  _tensor_constant0 = None
    slice_2 = torch.ops.aten.slice.Tensor(slice_1, 1, 0, 3);  slice_1 = None
    copy_ = torch.ops.aten.copy_.default(slice_2, cat);  slice_2 = cat = copy_ = None
    _tensor_constant0_1 = self._tensor_constant0
    slice_3 = torch.ops.aten.slice.Tensor(_tensor_constant0_1, 0, 0, 9223372036854775807);  _tensor_constant0_1 = None
    slice_4 = torch.ops.aten.slice.Tensor(slice_3, 1, 0, 3);  slice_3 = None
    sum_1 = torch.ops.aten.sum.dim_IntList(slice_4, [1])
    add = torch.ops.aten.add.Tensor(sum_1, state_c);  sum_1 = state_c = None
    mul = torch.ops.aten.mul.Tensor(add, 0.5)
    return (add, slice_4, mul)""")
        else:
            self.assertExpectedInline(gm.code.strip(), """\
def forward(self, in_x, state_kv, state_c):
    cat = torch.ops.aten.cat.default([in_x, state_kv], 1);  in_x = state_kv = None
    _tensor_constant0 = self._tensor_constant0
    slice_1 = torch.ops.aten.slice.Tensor(_tensor_constant0, 1, 0, 3);  _tensor_constant0 = None
    copy_ = torch.ops.aten.copy_.default(slice_1, cat);  slice_1 = cat = copy_ = None
    _tensor_constant0_1 = self._tensor_constant0
    slice_2 = torch.ops.aten.slice.Tensor(_tensor_constant0_1, 1, 0, 3);  _tensor_constant0_1 = None
    sum_1 = torch.ops.aten.sum.dim_IntList(slice_2, [1])
    add = torch.ops.aten.add.Tensor(sum_1, state_c);  sum_1 = state_c = None
    mul = torch.ops.aten.mul.Tensor(add, 0.5)
    return (add, slice_2, mul)""")
        original = copy.deepcopy(gm)
        before = counts(gm)

        rewrite = StateRewrite(bindings(capacity=5, ext_in=1, ext_out=3))
        result = rewrite(gm)

        if WHOLE_SLICES_TRACED:  # torch 2.5: the same graph with its whole slices
            self.assertExpectedInline(result.graph_module.code.strip(), """\
def forward(self, in_x, arena_kv, arena_c):
    slice_tensor = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 1)
    alias_default = torch.ops.aten.alias.default(arena_c)
    cat = torch.ops.aten.cat.default([in_x, slice_tensor], 1);  in_x = slice_tensor = None
    slice_1 = torch.ops.aten.slice.Tensor(arena_kv, 0, 0, 9223372036854775807)
    slice_2 = torch.ops.aten.slice.Tensor(slice_1, 1, 0, 3);  slice_1 = None
    copy_ = torch.ops.aten.copy_.default(slice_2, cat);  slice_2 = cat = copy_ = None
    slice_3 = torch.ops.aten.slice.Tensor(arena_kv, 0, 0, 9223372036854775807);  arena_kv = None
    slice_4 = torch.ops.aten.slice.Tensor(slice_3, 1, 0, 3);  slice_3 = None
    sum_1 = torch.ops.aten.sum.dim_IntList(slice_4, [1]);  slice_4 = None
    add = torch.ops.aten.add.Tensor(sum_1, alias_default);  sum_1 = alias_default = None
    mul = torch.ops.aten.mul.Tensor(add, 0.5)
    alias_default_1 = torch.ops.aten.alias.default(arena_c);  arena_c = None
    copy__default = torch.ops.aten.copy_.default(alias_default_1, mul);  alias_default_1 = mul = copy__default = None
    return (add,)""")
        else:
            self.assertExpectedInline(result.graph_module.code.strip(), """\
def forward(self, in_x, arena_kv, arena_c):
    slice_tensor = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 1)
    alias_default = torch.ops.aten.alias.default(arena_c)
    cat = torch.ops.aten.cat.default([in_x, slice_tensor], 1);  in_x = slice_tensor = None
    slice_1 = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 3)
    copy_ = torch.ops.aten.copy_.default(slice_1, cat);  slice_1 = cat = copy_ = None
    slice_2 = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 3);  arena_kv = None
    sum_1 = torch.ops.aten.sum.dim_IntList(slice_2, [1]);  slice_2 = None
    add = torch.ops.aten.add.Tensor(sum_1, alias_default);  sum_1 = alias_default = None
    mul = torch.ops.aten.mul.Tensor(add, 0.5)
    alias_default_1 = torch.ops.aten.alias.default(arena_c);  arena_c = None
    copy__default = torch.ops.aten.copy_.default(alias_default_1, mul);  alias_default_1 = mul = copy__default = None
    return (add,)""")
        self.assertEqual(result.record, RewriteRecord(arena_inputs=("kv", "c"), in_place=("kv",),
                                                      written_back=("c",), buffers_rebound=2))
        self.assertFalse(hasattr(rewrite, "record"))  # the record is the result's: no state between calls
        self.assertEqual(str(result.record), "arena inputs ['kv', 'c']; in place ['kv']; written back ['c']; "
                                             "buffer reads/writes rebound: 2")
        after = counts(gm)
        whole = 2 if WHOLE_SLICES_TRACED else 0  # torch 2.5: the two whole slices of buf, kept
        self.assertEqual(before, {"cat": 1, "slice": 2 + whole, "copy_": 1, "sum": 1, "add": 1, "mul": 1})
        self.assertEqual(after, {"slice": 3 + whole, "alias": 2, "cat": 1, "copy_": 2, "sum": 1, "add": 1, "mul": 1})

        roles = {n.name: n.meta.get("cadence", {}).get("role") for n in gm.graph.nodes}
        self.assertEqual([n.name for n in gm.graph.nodes if n.op == "placeholder"], ["in_x", "arena_kv", "arena_c"])
        self.assertEqual((roles["arena_kv"], roles["arena_c"]), ("arena", "arena"))
        self.assertNotIn("buffer", roles.values())
        self.assertNotIn("state", roles.values())
        self.assertEqual(gm.meta["cadence_arena_inputs"], ("kv", "c"))

        # The same numbers: outputs, and the next state now sits in the arena.
        y_ref, kv_ref, c_ref = run(original, inputs["x"], state["kv"], state["c"])
        arena = arena_for(5, state)
        kv_ptr = arena["kv"].data_ptr()
        (y,) = run(gm, inputs["x"], arena["kv"], arena["c"])
        self.assertTrue(torch.equal(y, y_ref))
        self.assertTrue(torch.equal(arena["kv"][:, :3], kv_ref))
        self.assertTrue(torch.equal(arena["c"], c_ref))
        self.assertEqual(arena["kv"].data_ptr(), kv_ptr)

    def test_trim_is_written_back(self):
        # Window(retain=1, prefix=1), stride 2: step 0 grows kv 1 -> 3 and trims to 2.
        gm, buf, inputs, state = traced_step(prefix=1, retain=1, ext_in=1)
        original = copy.deepcopy(gm)
        result = StateRewrite(bindings(capacity=4, ext_in=1, ext_out=2))(gm)
        if WHOLE_SLICES_TRACED:  # torch 2.5: the same graph with its whole slices
            self.assertExpectedInline(result.graph_module.code.strip(), """\
def forward(self, in_x, arena_kv, arena_c):
    slice_tensor = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 1)
    alias_default = torch.ops.aten.alias.default(arena_c)
    cat = torch.ops.aten.cat.default([in_x, slice_tensor], 1);  in_x = slice_tensor = None
    slice_1 = torch.ops.aten.slice.Tensor(arena_kv, 0, 0, 9223372036854775807)
    slice_2 = torch.ops.aten.slice.Tensor(slice_1, 1, 0, 3);  slice_1 = None
    copy_ = torch.ops.aten.copy_.default(slice_2, cat);  slice_2 = cat = copy_ = None
    slice_3 = torch.ops.aten.slice.Tensor(arena_kv, 0, 0, 9223372036854775807)
    slice_4 = torch.ops.aten.slice.Tensor(slice_3, 1, 0, 3);  slice_3 = None
    sum_1 = torch.ops.aten.sum.dim_IntList(slice_4, [1])
    add = torch.ops.aten.add.Tensor(sum_1, alias_default);  sum_1 = alias_default = None
    slice_5 = torch.ops.aten.slice.Tensor(slice_4, 0, 0, 9223372036854775807)
    slice_6 = torch.ops.aten.slice.Tensor(slice_5, 1, 0, 1);  slice_5 = None
    slice_7 = torch.ops.aten.slice.Tensor(slice_4, 0, 0, 9223372036854775807);  slice_4 = None
    slice_8 = torch.ops.aten.slice.Tensor(slice_7, 1, -1, 9223372036854775807);  slice_7 = None
    cat_1 = torch.ops.aten.cat.default([slice_6, slice_8], 1);  slice_6 = slice_8 = None
    mul = torch.ops.aten.mul.Tensor(add, 0.5)
    slice_tensor_1 = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 2);  arena_kv = None
    copy__default = torch.ops.aten.copy_.default(slice_tensor_1, cat_1);  slice_tensor_1 = cat_1 = copy__default = None
    alias_default_1 = torch.ops.aten.alias.default(arena_c);  arena_c = None
    copy__default_1 = torch.ops.aten.copy_.default(alias_default_1, mul);  alias_default_1 = mul = copy__default_1 = None
    return (add,)""")
        else:
            self.assertExpectedInline(result.graph_module.code.strip(), """\
def forward(self, in_x, arena_kv, arena_c):
    slice_tensor = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 1)
    alias_default = torch.ops.aten.alias.default(arena_c)
    cat = torch.ops.aten.cat.default([in_x, slice_tensor], 1);  in_x = slice_tensor = None
    slice_1 = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 3)
    copy_ = torch.ops.aten.copy_.default(slice_1, cat);  slice_1 = cat = copy_ = None
    slice_2 = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 3)
    sum_1 = torch.ops.aten.sum.dim_IntList(slice_2, [1])
    add = torch.ops.aten.add.Tensor(sum_1, alias_default);  sum_1 = alias_default = None
    slice_3 = torch.ops.aten.slice.Tensor(slice_2, 1, 0, 1)
    slice_4 = torch.ops.aten.slice.Tensor(slice_2, 1, -1, 9223372036854775807);  slice_2 = None
    cat_1 = torch.ops.aten.cat.default([slice_3, slice_4], 1);  slice_3 = slice_4 = None
    mul = torch.ops.aten.mul.Tensor(add, 0.5)
    slice_tensor_1 = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 2);  arena_kv = None
    copy__default = torch.ops.aten.copy_.default(slice_tensor_1, cat_1);  slice_tensor_1 = cat_1 = copy__default = None
    alias_default_1 = torch.ops.aten.alias.default(arena_c);  arena_c = None
    copy__default_1 = torch.ops.aten.copy_.default(alias_default_1, mul);  alias_default_1 = mul = copy__default_1 = None
    return (add,)""")
        self.assertEqual(result.record.in_place, ())
        self.assertEqual(result.record.written_back, ("kv", "c"))

        self.assert_rewritten_matches(original, gm, inputs, state, capacity=4)

    def test_overlapping_write_back_reads_out_first(self):
        # A next state that is another window of the same arena slot (here: drop the
        # oldest frame, buf[:, 1:n]) is cloned before it is copied to the slot's front.
        def step(inputs, state):
            cache = torch.cat([inputs["x"], state["kv"]], dim=1)
            buf[:, :3] = cache
            return {"y": cache.sum(1)}, {"kv": buf[:, 1:3], "c": state["c"]}

        buf = torch.zeros(2, 5)
        g = torch.Generator().manual_seed(3)
        inputs, state = {"x": torch.randn(2, 2, generator=g)}, {"kv": torch.randn(2, 1, generator=g),
                                                                 "c": torch.randn(2, generator=g)}
        gm = trace_step(step, SIG, inputs, state, {"kv": buf})
        original = copy.deepcopy(gm)
        result = StateRewrite(bindings(capacity=5, ext_in=1, ext_out=2))(gm)
        self.assertEqual(result.record.written_back, ("kv",))
        self.assertEqual(result.record.in_place, ("c",))  # returned as given: its arena view already
        clone = next(n for n in gm.graph.nodes if n.target is aten.clone.default)
        self.assertEqual(clone.args[0].target, aten.slice.Tensor)
        self.assertEqual(clone.args[0].args[1:], (1, 1, 3))

        self.assert_rewritten_matches(original, gm, inputs, state, capacity=5)

    def assert_rewritten_matches(self, original, gm, inputs, state, capacity):
        """The rewritten graph on an arena gives the original's output and next state (2 frames)."""
        y_ref, kv_ref, c_ref = run(original, inputs["x"], state["kv"], state["c"])
        arena = arena_for(capacity, state)
        (y,) = run(gm, inputs["x"], arena["kv"], arena["c"])
        self.assertTrue(torch.equal(y, y_ref))
        self.assertTrue(torch.equal(arena["kv"][:, :2], kv_ref))
        self.assertTrue(torch.equal(arena["c"], c_ref))

    def test_requires_a_traced_step(self):
        gm = trace(lambda x: x + 1, torch.randn(2))
        with self.assertRaisesRegex(PassError, "needs a graph from trace_step"):
            StateRewrite(bindings(5, 1, 3))(gm)

    def test_requires_the_entry_shapes(self):
        gm, *_ = traced_step(prefix=1, retain=2, ext_in=1)
        with self.assertRaisesRegex(PassError, r"region 'kv' was traced with shape \(2, 1\) but the catalog "
                                               r"entry's arena view is \(2, 3\)"):
            StateRewrite(bindings(capacity=5, ext_in=3, ext_out=3))(gm)

    def test_requires_a_binding_per_carried_region(self):
        gm, *_ = traced_step(prefix=1, retain=2, ext_in=1)
        with self.assertRaisesRegex(PassError, "carried state 'c' has no region binding"):
            StateRewrite(bindings(5, 1, 3)[:1])(gm)

    def test_retention_that_does_not_match_the_model(self):
        # The model trims to 1 + 1 = 2 frames; a declaration of 3 next frames is wrong.
        gm, *_ = traced_step(prefix=1, retain=1, ext_in=1)
        with self.assertRaisesRegex(PassError, r"next 'kv' has shape \(2, 2\), but the catalog's next entry "
                                               r"holds \(2, 3\); the declared retention does not match"):
            StateRewrite(bindings(capacity=4, ext_in=1, ext_out=3))(gm)


# ------------------------------------------------------------------ EarlyWriteback
def rewritten(step, capacity: int, ext_in: int, ext_out: int, seed: int = 0):
    """``step`` traced at one entry and through StateRewrite: (graph, original, inputs, state)."""
    buf = torch.zeros(2, capacity)
    g = torch.Generator().manual_seed(seed)
    inputs = {"x": torch.randn(2, 2, generator=g)}
    state = {"kv": torch.randn(2, ext_in, generator=g), "c": torch.randn(2, generator=g)}
    gm = trace_step(step(buf), SIG, inputs, state, {"kv": buf})
    original = copy.deepcopy(gm)
    StateRewrite(bindings(capacity, ext_in, ext_out))(gm)
    return gm, original, inputs, state


def position(gm: fx.GraphModule, pred) -> int:
    return next(i for i, n in enumerate(gm.graph.nodes) if pred(n))


def writeback_of(region: str):
    return lambda n: n.target is aten.copy_.default and n.meta.get("cadence", {}) == {"role": "writeback",
                                                                                       "region": region}


class TestEarlyWriteback(TestCase):
    def test_trim_is_committed_before_the_rest_of_the_step(self):
        # The graph of TestStateRewrite.test_trim_is_written_back: kv's trimmed next
        # state (cat_1) is copied into the arena right after it is made, before `mul`.
        gm, buf, inputs, state = traced_step(prefix=1, retain=1, ext_in=1)
        original = copy.deepcopy(gm)
        binds = bindings(capacity=4, ext_in=1, ext_out=2)
        StateRewrite(binds)(gm)
        result = EarlyWriteback(binds)(gm)
        if WHOLE_SLICES_TRACED:  # torch 2.5: the same graph with its whole slices
            self.assertExpectedInline(result.graph_module.code.strip(), """\
def forward(self, in_x, arena_kv, arena_c):
    slice_tensor = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 1)
    alias_default = torch.ops.aten.alias.default(arena_c)
    cat = torch.ops.aten.cat.default([in_x, slice_tensor], 1);  in_x = slice_tensor = None
    slice_1 = torch.ops.aten.slice.Tensor(arena_kv, 0, 0, 9223372036854775807)
    slice_2 = torch.ops.aten.slice.Tensor(slice_1, 1, 0, 3);  slice_1 = None
    copy_ = torch.ops.aten.copy_.default(slice_2, cat);  slice_2 = cat = copy_ = None
    slice_3 = torch.ops.aten.slice.Tensor(arena_kv, 0, 0, 9223372036854775807)
    slice_4 = torch.ops.aten.slice.Tensor(slice_3, 1, 0, 3);  slice_3 = None
    sum_1 = torch.ops.aten.sum.dim_IntList(slice_4, [1])
    add = torch.ops.aten.add.Tensor(sum_1, alias_default);  sum_1 = alias_default = None
    slice_5 = torch.ops.aten.slice.Tensor(slice_4, 0, 0, 9223372036854775807)
    slice_6 = torch.ops.aten.slice.Tensor(slice_5, 1, 0, 1);  slice_5 = None
    slice_7 = torch.ops.aten.slice.Tensor(slice_4, 0, 0, 9223372036854775807);  slice_4 = None
    slice_8 = torch.ops.aten.slice.Tensor(slice_7, 1, -1, 9223372036854775807);  slice_7 = None
    cat_1 = torch.ops.aten.cat.default([slice_6, slice_8], 1);  slice_6 = slice_8 = None
    slice_tensor_1 = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 2);  arena_kv = None
    copy__default = torch.ops.aten.copy_.default(slice_tensor_1, cat_1);  slice_tensor_1 = cat_1 = copy__default = None
    mul = torch.ops.aten.mul.Tensor(add, 0.5)
    alias_default_1 = torch.ops.aten.alias.default(arena_c);  arena_c = None
    copy__default_1 = torch.ops.aten.copy_.default(alias_default_1, mul);  alias_default_1 = mul = copy__default_1 = None
    return (add,)""")
        else:
            self.assertExpectedInline(result.graph_module.code.strip(), """\
def forward(self, in_x, arena_kv, arena_c):
    slice_tensor = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 1)
    alias_default = torch.ops.aten.alias.default(arena_c)
    cat = torch.ops.aten.cat.default([in_x, slice_tensor], 1);  in_x = slice_tensor = None
    slice_1 = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 3)
    copy_ = torch.ops.aten.copy_.default(slice_1, cat);  slice_1 = cat = copy_ = None
    slice_2 = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 3)
    sum_1 = torch.ops.aten.sum.dim_IntList(slice_2, [1])
    add = torch.ops.aten.add.Tensor(sum_1, alias_default);  sum_1 = alias_default = None
    slice_3 = torch.ops.aten.slice.Tensor(slice_2, 1, 0, 1)
    slice_4 = torch.ops.aten.slice.Tensor(slice_2, 1, -1, 9223372036854775807);  slice_2 = None
    cat_1 = torch.ops.aten.cat.default([slice_3, slice_4], 1);  slice_3 = slice_4 = None
    slice_tensor_1 = torch.ops.aten.slice.Tensor(arena_kv, 1, 0, 2);  arena_kv = None
    copy__default = torch.ops.aten.copy_.default(slice_tensor_1, cat_1);  slice_tensor_1 = cat_1 = copy__default = None
    mul = torch.ops.aten.mul.Tensor(add, 0.5)
    alias_default_1 = torch.ops.aten.alias.default(arena_c);  arena_c = None
    copy__default_1 = torch.ops.aten.copy_.default(alias_default_1, mul);  alias_default_1 = mul = copy__default_1 = None
    return (add,)""")
        self.assertEqual(result.record, {"moved up past nodes": {"kv": 1}})
        TestStateRewrite.assert_rewritten_matches(self, original, gm, inputs, state, capacity=4)

    def test_a_later_read_of_the_region_holds_the_write_back(self):
        def step(buf):
            def f(inputs, state):
                cache = torch.cat([inputs["x"], state["kv"]], dim=1)
                buf[:, :3] = cache
                nxt = torch.cat([buf[:, :1], buf[:, 2:3]], dim=1)  # the trimmed next state
                y = buf[:, :3].sum(1).sin()  # reads the region after the trim: the copy must wait
                return {"y": y}, {"kv": nxt, "c": state["c"]}
            return f
        gm, original, inputs, state = rewritten(step, capacity=4, ext_in=1, ext_out=2)
        EarlyWriteback(bindings(4, 1, 2))(gm)
        sin = position(gm, lambda n: n.target is aten.sum.dim_IntList)
        self.assertGreater(position(gm, writeback_of("kv")), sin)
        TestStateRewrite.assert_rewritten_matches(self, original, gm, inputs, state, capacity=4)

    def test_a_later_write_into_the_source_holds_the_write_back(self):
        def step(buf):
            def f(inputs, state):
                cache = torch.cat([inputs["x"], state["kv"]], dim=1)
                nxt = cache[:, :2].clone()
                y = inputs["x"].sum(1).cos()
                nxt.mul_(2.0)  # the source changes after it was made: the copy must follow
                return {"y": y}, {"kv": nxt, "c": state["c"]}
            return f
        gm, original, inputs, state = rewritten(step, capacity=4, ext_in=1, ext_out=2)
        result = EarlyWriteback(bindings(4, 1, 2))(gm)
        mul_ = position(gm, lambda n: n.target is aten.mul_.Tensor)
        self.assertEqual(position(gm, writeback_of("kv")), mul_ + 2)  # the slice view, then the copy
        self.assertEqual(result.record, {"moved up past nodes": {}})
        TestStateRewrite.assert_rewritten_matches(self, original, gm, inputs, state, capacity=4)

    def test_ensures_rejects_a_write_back_before_a_read(self):
        gm, buf, inputs, state = traced_step(prefix=1, retain=1, ext_in=1)
        binds = bindings(capacity=4, ext_in=1, ext_out=2)
        StateRewrite(binds)(gm)
        copy_kv = next(n for n in gm.graph.nodes if writeback_of("kv")(n))
        view = copy_kv.args[0]
        first_read = next(n for n in gm.graph.nodes if n.target is aten.cat.default)
        first_read.prepend(view)  # hand-move the write-back above the step's first read
        first_read.prepend(copy_kv)
        copy_kv.args = (view, next(n for n in gm.graph.nodes if n.op == "placeholder"))
        with self.assertRaisesRegex(PassError, "early_writeback: the write-back of 'kv' comes before"):
            EarlyWriteback(binds).ensures(gm)


# ------------------------------------------------------------------ aliasing
def hazard_step(buf: torch.Tensor):
    def step(inputs, state):
        cache = torch.cat([inputs["x"], state["kv"]], dim=1)
        buf[:, :cache.shape[1]] = cache
        y = state["kv"].sum(1) + state["c"]  # the OLD state, read after the buffer overwrote it
        return {"y": y}, {"kv": buf[:, :cache.shape[1]], "c": state["c"]}
    return step


def traced_hazard():
    buf = torch.zeros(2, 5)
    g = torch.Generator().manual_seed(1)
    inputs = {"x": torch.randn(2, 2, generator=g)}
    state = {"kv": torch.randn(2, 1, generator=g), "c": torch.randn(2, generator=g)}
    return trace_step(hazard_step(buf), SIG, inputs, state, {"kv": buf}), inputs, state


class TestAliasing(TestCase):
    def test_planted_hazard_fails_ensures(self):
        gm, _, _ = traced_hazard()
        with self.assertRaisesRegex(PassError, r"aliasing the carried state with its buffer is unsound: sum_1 "
                                               r"reads old state of region 'kv' bytes \[0, 24\) after copy_ "
                                               r"overwrote \[0, 32\) through the buffer"):
            StateRewrite(bindings(capacity=5, ext_in=1, ext_out=3))(gm)

    def test_the_compiler_pipeline_checks_the_graph_that_runs(self):
        # rewrite_pipeline runs StateRewrite unchecked and proves the hazard check once,
        # after EarlyWriteback: the planted hazard still fails closed
        from cadence_fx.compiler import rewrite_pipeline
        gm, _, _ = traced_hazard()
        pipeline = rewrite_pipeline(bindings(capacity=5, ext_in=1, ext_out=3), "S")
        with self.assertRaisesRegex(PassError, r"EarlyWriteback failed after .*StateRewrite.*: early_writeback: "
                                               r"aliasing the carried state with its buffer is unsound in the graph "
                                               r"with its write-backs moved: sum_1 reads old state of region 'kv'"):
            pipeline(gm)

    def test_the_planted_hazard_is_real(self):
        # Unchecked, the rewritten graph computes something else than the traced step.
        gm, inputs, state = traced_hazard()
        original = copy.deepcopy(gm)
        StateRewrite(bindings(capacity=5, ext_in=1, ext_out=3), check_hazards=False)(gm)
        y_ref = run(original, inputs["x"], state["kv"], state["c"])[0]
        arena = arena_for(5, state)
        (y,) = run(gm, inputs["x"], arena["kv"], arena["c"])
        self.assertFalse(torch.equal(y, y_ref))

    def test_region_hazards_on_recorded_accesses(self):
        gm, inputs, state = traced_hazard()
        StateRewrite(bindings(capacity=5, ext_in=1, ext_out=3), check_hazards=False)(gm)
        arena = arena_for(5, state)
        accesses = aliasing.record_accesses(gm, [inputs["x"], arena["kv"], arena["c"]], arena)
        self.assertEqual([(a.node, a.region, a.origin, a.kind) for a in accesses if a.region == "kv"],
                         [("cat", "kv", "S", "read"), ("copy_", "kv", "B", "write"), ("sum_1", "kv", "S", "read")])
        problems = aliasing.region_hazards(accesses)
        self.assertEqual(len(problems), 1)
        self.assertIn("sum_1 reads old state of region 'kv'", problems[0])

        safe, _, inputs, state = traced_step(prefix=1, retain=2, ext_in=1)
        StateRewrite(bindings(capacity=5, ext_in=1, ext_out=3), check_hazards=False)(safe)
        arena = arena_for(5, state)
        self.assertEqual(aliasing.region_hazards(
            aliasing.record_accesses(safe, [inputs["x"], arena["kv"], arena["c"]], arena)), [])
        # the region-only walk (what check_graph_hazards runs) logs the same accesses, running nothing else
        self.assertEqual(aliasing.record_region_accesses(gm, arena), accesses)
        self.assertEqual(aliasing.record_region_accesses(safe, arena),
                         aliasing.record_accesses(safe, [inputs["x"], arena["kv"], arena["c"]], arena))
        # with a walk plan (what a capacity graph's per-length check keeps): the same log, a plan of
        # another graph refused
        plan = aliasing.WalkPlan(gm)
        self.assertEqual(aliasing.record_region_accesses(gm, arena, plan=plan), accesses)
        with self.assertRaisesRegex(ValueError, "another graph's"):
            aliasing.record_region_accesses(safe, arena, plan=plan)

    def test_write_through_the_state_view(self):
        def step(inputs, state):
            state["kv"].mul_(2)  # upstream wrote a separate tensor here
            return {"y": state["kv"].sum(1) + inputs["x"].sum(1)}, {"kv": state["kv"] + 0, "c": state["c"]}

        g = torch.Generator().manual_seed(2)
        gm = trace_step(step, SIG, {"x": torch.randn(2, 2, generator=g)},
                        {"kv": torch.randn(2, 1, generator=g), "c": torch.randn(2, generator=g)})
        with self.assertRaisesRegex(PassError, "mul_ writes region 'kv' through the state view"):
            StateRewrite(bindings(capacity=5, ext_in=1, ext_out=1))(gm)

    def test_state_updated_in_place_stays_in_place(self):
        # moshi's pattern: a ring (Ring(4)) and a carry (Fixed) with no bound buffer, both
        # written through the state tensor the step was given and returned as they are.
        def step(inputs, state):
            ring, c = state["kv"], state["c"]
            ring.scatter_(1, torch.tensor([[1, 2], [1, 2]]), inputs["x"])
            y = ring.sum(1) + c
            c[:] = torch.where(y > 0, y, c)
            return {"y": y * 2}, {"kv": ring, "c": c}

        g = torch.Generator().manual_seed(3)
        inputs = {"x": torch.randn(2, 2, generator=g)}
        state = {"kv": torch.randn(2, 4, generator=g), "c": torch.randn(2, generator=g)}
        gm = trace_step(step, SIG, inputs, {k: v.clone() for k, v in state.items()})
        original = copy.deepcopy(gm)
        result = StateRewrite(bindings(capacity=4, ext_in=4, ext_out=4))(gm)
        self.assertEqual(result.record, RewriteRecord(arena_inputs=("kv", "c"), in_place=("kv", "c"),
                                                      written_back=(), buffers_rebound=0))
        self.assertEqual(counts(gm).get("clone", 0), 0)  # no read-out, no write-back
        ref = {k: v.clone() for k, v in state.items()}
        y_ref = run(original, inputs["x"], ref["kv"], ref["c"])[0]
        arena = {k: v.clone() for k, v in state.items()}
        (y,) = run(gm, inputs["x"], arena["kv"], arena["c"])
        self.assertTrue(torch.equal(y, y_ref))
        self.assertTrue(torch.equal(arena["kv"], ref["kv"]) and torch.equal(arena["c"], ref["c"]))

    def test_byte_interval_of_strided_views(self):
        t = torch.zeros(4, 6)
        self.assertEqual(aliasing.byte_interval(t), (0, 96))
        self.assertEqual(aliasing.byte_interval(t[:, :2]), (0, 4 * (3 * 6 + 1 + 1)))  # spans the gaps
        self.assertEqual(aliasing.byte_interval(t[1:2, 3:]), (4 * 9, 4 * 12))
        self.assertEqual(aliasing.byte_interval(t[:, :0]), (0, 0))


# ------------------------------------------------------------------ PassManager
class Boom(CadencePass):
    name = "boom"

    def call(self, gm: fx.GraphModule) -> PassResult:
        raise PassError("the graph is on fire")


class TestPassManager(TestCase):
    def test_ordering_constraint(self):
        constraint = this_before_that(FoldHostConstants, StateRewrite)
        self.assertEqual(constraint.__name__, "FoldHostConstants_before_StateRewrite")
        PassManager([FoldHostConstants(), StateRewrite([])], constraints=[constraint])  # fine
        with self.assertRaisesRegex(PassError, r"pass order violates FoldHostConstants_before_StateRewrite: "
                                               r"\['PruneDead', 'StateRewrite', 'FoldHostConstants'\]"):
            PassManager([PruneDead(), StateRewrite([]), FoldHostConstants()], constraints=[constraint])

    def test_failure_names_the_passes_that_ran_before(self):
        gm = trace(lambda x: x * 2, torch.randn(2))
        pm = PassManager([PruneDead(), FoldHostConstants(), StateRewrite([])])
        with self.assertRaisesRegex(PassError, r"StateRewrite failed after \['PruneDead', 'FoldHostConstants'\]: "
                                               r"state_rewrite needs a graph from trace_step"):
            pm(gm)
        with self.assertRaisesRegex(PassError, r"Boom failed after \[\]: the graph is on fire"):
            PassManager([Boom(), PruneDead()])(gm)

    def test_a_malformed_graph_is_refused_after_the_last_pass_or_at_the_pass_in_debug_mode(self):
        class Scramble(CadencePass):
            """Moves the output before the node it returns: a use before its definition."""

            def call(self, gm):
                out = next(n for n in gm.graph.nodes if n.op == "output")
                first = next(n for n in gm.graph.nodes if n.op == "call_function")
                first.prepend(out)
                return PassResult(gm, True)

        passes = lambda: [PruneDead(), Scramble()]  # noqa: E731
        with self.assertRaisesRegex(PassError, r"the graph after \['PruneDead', 'Scramble'\] is "
                                               r"malformed: "):
            PassManager(passes())(trace(lambda x: x * 2, torch.randn(2)))
        with self.assertRaisesRegex(PassError, r"Scramble failed after \['PruneDead'\]: "):
            PassManager(passes(), debug=True)(trace(lambda x: x * 2, torch.randn(2)))
        with self.assertRaises(RuntimeError):  # called alone, a pass lints its own result
            Scramble()(trace(lambda x: x * 2, torch.randn(2)))

    def test_without_code_the_result_runs_only_once_recompiled_and_interprets_as_with_code(self):
        """``PassManager(code=False)``: the graph the passes make, no Python code generated for it
        (calling it raises, never runs an earlier graph's code), in debug mode too; an
        interpreter runs it, and recompiled it computes what ``code=True``'s result does."""
        def f(x):
            return x * torch.arange(2, dtype=torch.float32).exp() + 1

        x = torch.randn(2)
        passes = lambda: [PruneDead(), FoldHostConstants(), PruneDead()]  # noqa: E731
        with_code, _ = PassManager(passes())(trace(f, x))
        for debug in (False, True):
            gm, _ = PassManager(passes(), debug=debug, code=False)(trace(f, x))
            self.assertEqual(str(gm.graph), str(with_code.graph))
            with self.assertRaisesRegex(RuntimeError, "code was not generated"):
                gm(x)
            self.assertTrue(torch.equal(fx.Interpreter(gm).run(x), with_code(x)))
            gm.recompile()
            self.assertTrue(torch.equal(gm(x), with_code(x)))

    def test_checks_run_between_passes_in_debug_mode(self):
        def no_folded_constants(gm):
            if any(n.op == "get_attr" and n.target.startswith("_folded") for n in gm.graph.nodes):
                raise PassError("a folded constant appeared")

        def f(x):
            return x * torch.arange(2, dtype=torch.float32).exp()

        passes = lambda: [PruneDead(), FoldHostConstants(), PruneDead()]  # noqa: E731
        gm, results = PassManager(passes(), checks=[no_folded_constants])(trace(f, torch.randn(2)))
        self.assertEqual([r.record for r in results], [{"removed": 0}, {"folded": 1}, {"removed": 0}])
        with self.assertRaisesRegex(PassError, r"FoldHostConstants failed after \['PruneDead'\]: "
                                               r"a folded constant appeared"):
            PassManager(passes(), checks=[no_folded_constants], debug=True)(trace(f, torch.randn(2)))


if __name__ == "__main__":
    pytest.main([__file__, "-q"])


def test_op_classifiers_read_each_schema_once_and_say_what_the_schema_says():
    """``is_view``, ``returns_written``, ``is_mutating`` and ``written_args`` read an operator's
    schema once (``base._facts``); over every overload of every aten op they agree with
    reading the schema directly, node by node (the rules as written before the cache)."""
    import torch.fx as fx
    from cadence_fx.passes import base

    def direct(t):
        schema = t._schema
        ret = schema.returns[0].alias_info if schema.returns else None
        view = not (schema.is_mutable or not schema.returns) and ret is not None and not ret.is_write
        first = schema.arguments[0].alias_info if schema.arguments else None
        rw = bool(schema.returns and schema.arguments) and (
            ret is not None and ret.is_write and first is not None and first.is_write
            and ret.before_set == first.before_set)
        written = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
        return view, rw, schema.is_mutable, written

    graph = fx.Graph()
    seen = views = writes = 0
    for name in ("view", "slice", "select", "narrow", "transpose", "permute", "expand", "unsqueeze", "as_strided",
                 "split", "unbind", "copy_", "index_put_", "add_", "zero_", "fill_", "scatter_"):
        getattr(torch.ops.aten, name)  # loaded, so ``dir`` lists them
    for name in sorted(dir(torch.ops.aten)):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            t = getattr(packet, overload)
            n_args = len(t._schema.arguments)
            args = tuple(graph.placeholder(f"a{seen}_{i}") for i in range(n_args))
            node = graph.call_function(t, args)
            view, rw, mutable, written = direct(t)
            assert (base.is_view(node), base.returns_written(node), base.is_mutating(node)) == (view, rw, mutable), t
            assert base.written_args(node) == [args[i] for i in written], t
            seen, views, writes = seen + 1, views + view, writes + bool(written)
    assert seen > 1000 and views > 30 and writes > 200, (seen, views, writes)
