"""Partition and LowerCudaGraph (rules SR, SRc), and the replay region's fail-closed
checks, on CPU: nothing here captures a CUDA graph.

``capturability`` is pinned verdict by verdict, ``Partition`` and ``LowerCudaGraph`` on
small ``make_fx(pre_dispatch=True)`` graphs (regenerate pins with ``EXPECTTEST_ACCEPT=1``
and read the diff: it is the split), ``CapturedRegion``'s refusals with hand-set
capture specs and a stand-in graph, and the toy model through the whole rewrite
pipeline at rules SR, run region by region against the rules-S graph.
``tests/test_replay_cuda.py`` does the capture and replay on a GPU.
"""

from __future__ import annotations

import copy
import dataclasses
import operator

import pytest
import torch
import torch.fx as fx
from expecttest import TestCase
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from cadence_fx.compiler import build_plan, buffer_bindings, check_rules, compile_executable, region_bindings, \
    rewrite_pipeline
from cadence_fx.errors import CadenceError, PassError, RulesError
from cadence_fx.passes.fold_host_constants import FoldHostConstants
from cadence_fx.passes.lower_cudagraph import LowerCudaGraph, LowerRecord, launches_kernels
from cadence_fx.passes.partition import NodeVerdict, Partition, PartitionRecord, capturability
from cadence_fx.passes.trace import autocast_recorded, trace_step
from cadence_fx.step import scope
from cadence_fx.runtime.arena import Arena
from cadence_fx.runtime.graphs import ArgSpec, CapturedRegion, fresh_regions, region_stats, run_graph
from cadence_fx.runtime.session import Session

from helpers.toy_models import ScopedToyAdapter, ToyAdapter, make_toy, toy_entry_graph, toy_inputs

aten = torch.ops.aten


def trace(fn, *args) -> fx.GraphModule:
    with torch.no_grad(), autocast_recorded():  # as trace_step traces (torch 2.5 would drop an autocast)
        return make_fx(fn, pre_dispatch=True)(*args)


def run(gm, *args):
    with torch.no_grad():
        return gm(*args)


def lone_node(target, *vals, out=None) -> fx.Node:
    """One ``call_function`` node on placeholders whose ``meta["val"]`` are ``vals``.

    For host syncs that ``make_fx`` refuses to trace on real tensors (``.item()``,
    ``torch.equal``: "trying to get value out of a tracing tensor").
    """
    g = fx.Graph()
    args = []
    for i, v in enumerate(vals):
        p = g.placeholder(f"a{i}")
        p.meta["val"] = v
        args.append(p)
    node = g.call_function(target, tuple(args))
    node.meta["val"] = out
    return node


def verdicts(gm: fx.GraphModule, device_type: str) -> dict[str, tuple[bool, str]]:
    return {n.name: (v.capturable, v.reason) for n in gm.graph.nodes
            for v in [capturability(n, device_type)]}


# ---------------------------------------------------------------- capturability
class TestCapturability(TestCase):
    def test_host_syncs(self):
        x = torch.zeros(3)
        got = [capturability(lone_node(target, x, out=0.0), "cuda")
               for target in (aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default)]
        self.assertEqual(got, [
            NodeVerdict("_local_scalar_dense_default", False, "host sync: aten._local_scalar_dense.default"),
            NodeVerdict("item_default", False, "host sync: aten.item.default"),
            NodeVerdict("is_nonzero_default", False, "host sync: aten.is_nonzero.default"),
        ])
        equal = lone_node(aten.equal.default, x, x, out=True)
        self.assertEqual(capturability(equal, "cpu"),
                         NodeVerdict("equal_default", False, "host sync: aten.equal.default"))

    def test_nonzero_is_reported_by_its_data_dependent_shape(self):
        gm = trace(lambda x: torch.nonzero(x > 0), torch.randn(4))
        self.assertEqual(verdicts(gm, "cpu"), {
            "x_1": (True, "placeholder"),
            "gt": (True, "device op"),
            "nonzero": (False, "data-dependent shape: aten.nonzero.default"),
            "output": (True, "output"),
        })
        repeats = lone_node(aten.repeat_interleave.Tensor, torch.tensor([1, 2]), out=torch.zeros(3, dtype=torch.long))
        self.assertEqual(capturability(repeats, "cpu").reason, "data-dependent shape: aten.repeat_interleave.Tensor")

    def test_istft_reads_its_window_envelope_back_to_the_host(self):
        gm = trace(lambda s: torch.istft(s, 8, window=torch.hann_window(8)), torch.randn(5, 4, dtype=torch.complex64))
        self.assertEqual(verdicts(gm, "cpu"), {
            "s_1": (True, "placeholder"),
            "hann_window": (True, "device op"),
            "istft": (False, "host sync: aten.istft.default"),
            "output": (True, "output"),
        })

    def test_host_tensors_when_capturing_for_cuda(self):
        gm = trace(lambda x: (x * 2).sum(), torch.randn(3))
        self.assertEqual(verdicts(gm, "cuda"), {
            "x_1": (True, "placeholder"),
            "mul": (False, "runs on cpu: aten.mul.Tensor"),
            "sum_1": (False, "runs on cpu: aten.sum.default"),
            "output": (True, "output"),
        })
        self.assertTrue(all(c for c, _ in verdicts(gm, "cpu").values()))
        # an op whose result is on the device but which reads a host tensor
        moved = lone_node(aten.add.Tensor, torch.zeros(3), torch.zeros(3), out=torch.empty(3, device="meta"))
        self.assertEqual(capturability(moved, "meta").reason, "reads a cpu tensor: aten.add.Tensor")

    def test_dispatcher_state_is_capturable(self):
        def f(a, b):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = a @ b
            with torch.enable_grad():
                z = a + 1
            return y, z

        gm = trace(f, torch.randn(2, 2), torch.randn(2, 2))
        for device_type in ("cpu", "cuda"):
            got = verdicts(gm, device_type)
            for name in ("_enter_autocast", "_exit_autocast", "_set_grad_enabled", "_set_grad_enabled_1"):
                self.assertEqual(got[name], (True, "dispatcher state (no kernel)"), f"{name} on {device_type}")
        self.assertEqual(verdicts(gm, "cuda")["matmul"], (False, "runs on cpu: aten.matmul.default"))
        # the graph replays the autocast (torch 2.5's make_fx alone records none: fp32 here)
        self.assertEqual(run(gm, torch.randn(2, 2), torch.randn(2, 2))[0].dtype, torch.bfloat16)

    def test_getitem_graph_nodes_and_other_targets(self):
        gm = trace(lambda x: torch.split(x, 2)[1] * 2, torch.randn(4))
        self.assertEqual(verdicts(gm, "cpu"), {
            "x_1": (True, "placeholder"),
            "split": (True, "device op"),
            "getitem": (True, "getitem"),
            "getitem_1": (True, "getitem"),
            "mul": (True, "device op"),
            "output": (True, "output"),
        })
        x = torch.zeros(3)
        self.assertEqual(capturability(lone_node(operator.add, x, x, out=x), "cpu").reason,
                         "not an aten op: <built-in function add>")
        prims = lone_node(torch.ops.prims.convert_element_type.default, x, out=x)
        self.assertEqual(capturability(prims, "cpu").reason,
                         "op outside the allow-list: prims.convert_element_type.default")


# -------------------------------------------------------------------- Partition
class Gate(nn.Module):
    """x [4] -> (x * w * arange, count of its positive entries): a host sync in the middle."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, -2.0, 3.0, -4.0]))
        self.register_buffer("bias", torch.tensor([0.5, 0.5, -0.5, -0.5]))

    def forward(self, x):
        h = x * self.w * torch.arange(1.0, 5.0)  # the arange is host-built: folded to _folded0
        idx = torch.nonzero(h > 0)  # host sync: an eager island
        return h + self.bias, idx.sum() + self.bias


def gate_graph() -> tuple[Gate, fx.GraphModule]:
    model = Gate()
    gm = trace(model, torch.randn(4))
    return model, FoldHostConstants()(gm).graph_module


GATE_X = torch.tensor([0.3, 0.2, -0.1, -0.7])


class TestPartition(TestCase):
    def test_chunk_splits_around_a_host_sync(self):
        model, gm = gate_graph()
        self.assertExpectedInline(gm.code.strip(), """\
def forward(self, arg0_1):
    _param_constant0 = self._param_constant0
    mul = torch.ops.aten.mul.Tensor(arg0_1, _param_constant0);  arg0_1 = _param_constant0 = None
    _folded0 = self._folded0
    mul_1 = torch.ops.aten.mul.Tensor(mul, _folded0);  mul = _folded0 = None
    gt = torch.ops.aten.gt.Scalar(mul_1, 0)
    nonzero = torch.ops.aten.nonzero.default(gt);  gt = None
    _tensor_constant0 = self._tensor_constant0
    add = torch.ops.aten.add.Tensor(mul_1, _tensor_constant0);  mul_1 = _tensor_constant0 = None
    sum_1 = torch.ops.aten.sum.default(nonzero);  nonzero = None
    _tensor_constant0_1 = self._tensor_constant0
    add_1 = torch.ops.aten.add.Tensor(sum_1, _tensor_constant0_1);  sum_1 = _tensor_constant0_1 = None
    return (add, add_1)""")
        expected = run(gm, GATE_X)

        partition = Partition("cpu", "chunk")
        result = partition(gm)
        split = result.graph_module

        self.assertTrue(result.modified)
        self.assertExpectedInline(split.code.strip(), """\
def forward(self, arg0_1):
    submod_0 = self.submod_0(arg0_1);  arg0_1 = None
    getitem = submod_0[0]
    getitem_1 = submod_0[1];  submod_0 = None
    submod_1 = self.submod_1(getitem_1);  getitem_1 = None
    submod_2 = self.submod_2(getitem, submod_1);  getitem = submod_1 = None
    getitem_2 = submod_2[0]
    getitem_3 = submod_2[1];  submod_2 = None
    return (getitem_2, getitem_3)""")
        self.assertExpectedInline(split.submod_0.code.strip(), """\
def forward(self, arg0_1):
    _param_constant0 = self._param_constant0
    mul = torch.ops.aten.mul.Tensor(arg0_1, _param_constant0);  arg0_1 = _param_constant0 = None
    _folded0 = self._folded0
    mul_1 = torch.ops.aten.mul.Tensor(mul, _folded0);  mul = _folded0 = None
    gt = torch.ops.aten.gt.Scalar(mul_1, 0)
    return (mul_1, gt)""")
        self.assertExpectedInline(split.submod_1.code.strip(), """\
def forward(self, gt):
    nonzero = torch.ops.aten.nonzero.default(gt);  gt = None
    return nonzero""")
        self.assertExpectedInline(split.submod_2.code.strip(), """\
def forward(self, mul_1, nonzero):
    _tensor_constant0 = self._tensor_constant0
    add = torch.ops.aten.add.Tensor(mul_1, _tensor_constant0);  mul_1 = _tensor_constant0 = None
    sum_1 = torch.ops.aten.sum.default(nonzero);  nonzero = None
    _tensor_constant0_1 = self._tensor_constant0
    add_1 = torch.ops.aten.add.Tensor(sum_1, _tensor_constant0_1);  sum_1 = _tensor_constant0_1 = None
    return (add, add_1)""")
        self.assertFalse(hasattr(partition, "record"))  # the record is the result's: no state between calls
        self.assertExpectedInline(str(result.record), """\
3 regions (2 capturable, 1 eager); eager nodes: ['nonzero (data-dependent shape: aten.nonzero.default)']""")
        self.assertEqual(result.record, PartitionRecord(
            regions=(("submod_0", True, 3), ("submod_1", False, 1), ("submod_2", True, 3)),
            islands=(NodeVerdict("nonzero", False, "data-dependent shape: aten.nonzero.default"),)))
        self.assertEqual({n: m.meta["cadence_capturable"] for n, m in split.named_children()},
                         {"submod_0": True, "submod_1": False, "submod_2": True})

        # the split graph computes the same bits as the original and as eager
        got = run(split, GATE_X)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(got, expected)))
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(got, run(model, GATE_X))))

    def test_an_autocast_over_several_pieces_is_in_force_in_each(self):
        """A piece after the one that entered an autocast enters it again (and every piece
        but the last leaves it): each piece runs its ops under the state they were traced in."""
        def f(a, b):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = a @ b
                n = torch.nonzero(y > 0).sum()
                z = y @ b + n
            return z

        a, b = torch.randn(4, 4), torch.randn(4, 4)
        gm = trace(f, a, b)
        split = Partition("cpu")(gm).graph_module
        self.assertEqual([m.meta["cadence_capturable"] for m in split.children()], [True, False, True])
        self.assertExpectedInline(split.submod_2.code.strip(), """\
def forward(self, nonzero, matmul, b_1):
    _enter_autocast = torch.amp.autocast_mode._enter_autocast('cpu', torch.bfloat16, True, False)
    sum_1 = torch.ops.aten.sum.default(nonzero);  nonzero = None
    matmul_1 = torch.ops.aten.matmul.default(matmul, b_1);  matmul = b_1 = None
    add = torch.ops.aten.add.Tensor(matmul_1, sum_1);  matmul_1 = sum_1 = None
    _exit_autocast = torch.amp.autocast_mode._exit_autocast(_enter_autocast);  _enter_autocast = _exit_autocast = None
    return add""")
        got, want = split(a, b), gm(a, b)
        self.assertEqual(got.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(got, want) and torch.equal(got, f(a, b)))

    def test_constants_are_sunk_into_the_regions(self):
        model, gm = gate_graph()
        split = Partition("cpu")(gm).graph_module
        # the parent passes no constant: pieces read weights from their own memory
        self.assertEqual([n.op for n in split.graph.nodes if n.op not in ("call_module", "call_function")],
                         ["placeholder", "output"])
        for call in (n for n in split.graph.nodes if n.op == "call_module"):
            self.assertTrue(all(a.op != "get_attr" for a in call.all_input_nodes), call.format_node())
        # by identity: the parameter is the model's own, the folded table and the buffer
        # are the very tensors the traced graph held (no copies)
        params = dict(split.submod_0.named_parameters())
        self.assertEqual(list(params), ["_param_constant0"])
        self.assertEqual(params["_param_constant0"].data_ptr(), model.w.data_ptr())
        self.assertIs(split.submod_0._folded0, gm._folded0)
        # the graph reads the buffer twice: the piece holds it once, under the traced name
        self.assertIs(split.submod_2._tensor_constant0, gm._tensor_constant0)
        self.assertEqual([n.target for n in split.submod_2.graph.nodes if n.op == "get_attr"],
                         ["_tensor_constant0", "_tensor_constant0"])
        self.assertEqual(gm._tensor_constant0.data_ptr(), model.bias.data_ptr())
        self.assertEqual(dict(split.submod_1.named_buffers()), {})

    def test_a_returned_buffer_leaves_its_region_through_an_alias(self):
        """Stock-managed state (rules R): upstream returns a whole buffer as the next state."""
        class Carry(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("buf", torch.zeros(2, 3))

            def forward(self, x):
                self.buf[0] = x
                return x * 2, self.buf

        model = Carry()
        with torch.no_grad():
            gm = make_fx(model, pre_dispatch=True)(torch.randn(3))
        split = Partition("cpu")(gm).graph_module
        self.assertExpectedInline(split.code.strip(), """\
def forward(self, arg0_1):
    submod_0 = self.submod_0(arg0_1);  arg0_1 = None
    getitem = submod_0[0]
    getitem_1 = submod_0[1];  submod_0 = None
    return (getitem, getitem_1)""")
        x = torch.randn(3)
        doubled, carried = LowerCudaGraph(CapturedRegion)(split).graph_module(x)  # uncaptured: the piece runs eagerly
        self.assertTrue(torch.equal(doubled, 2 * x))
        self.assertEqual(carried.data_ptr(), model.buf.data_ptr())  # the buffer itself, not a copy
        self.assertTrue(torch.equal(model.buf[0], x))

    def test_step_granularity_cuts_where_the_boundary_key_changes(self):
        def inner(h):
            return (h * 2).sin()

        def f(x):
            a = x + 1
            with scope("inner"):
                b = inner(a)
            return b * 3

        gm = trace(f, torch.randn(3))
        self.assertEqual({n.name: n.meta.get("cadence_scope") for n in gm.graph.nodes},
                         {"x_1": None, "add": None, "mul": ("inner",), "sin": ("inner",), "mul_1": None,
                          "output": None})
        self.assertTrue(torch.equal(f(torch.ones(3)), (torch.ones(3) * 4).sin() * 3))  # no-op outside tracing

        key = lambda node: node.meta.get("cadence_scope", ())  # noqa: E731
        chunk = Partition("cpu", "chunk", key)(copy.deepcopy(gm))
        self.assertEqual(str(chunk.record), "1 region (1 capturable, 0 eager); eager nodes: []")
        step = Partition("cpu", "step", key)(gm)
        self.assertEqual(str(step.record), "3 regions (3 capturable, 0 eager); eager nodes: []")
        self.assertExpectedInline(step.graph_module.submod_1.code.strip(), """\
def forward(self, add):
    mul = torch.ops.aten.mul.Tensor(add, 2);  add = None
    sin = torch.ops.aten.sin.default(mul);  mul = None
    return sin""")
        x = torch.randn(3)
        self.assertTrue(torch.equal(run(step.graph_module, x), run(chunk.graph_module, x)))

    def test_an_island_inside_a_scope_splits_it(self):
        def f(x):
            with scope("outer"):
                a = x * 2
                with scope("inner"):
                    n = torch.nonzero(a > 0)
                b = a.sum() + n.sum()
            return b + 1

        gm = trace(f, torch.randn(4))
        self.assertEqual({n.name: n.meta.get("cadence_scope") for n in gm.graph.nodes if n.op == "call_function"},
                         {"mul": ("outer",), "gt": ("inner", "outer"), "nonzero": ("inner", "outer"),
                          "sum_1": ("outer",), "sum_2": ("outer",), "add": ("outer",), "add_1": None})
        result = Partition("cpu", "step", lambda n: "outer" in n.meta.get("cadence_scope", ()))(gm)
        self.assertEqual(result.record.regions, (("submod_0", True, 2), ("submod_1", False, 1),
                                                 ("submod_2", True, 3), ("submod_3", True, 1)))

    def test_invalid_configurations(self):
        with self.assertRaisesRegex(PassError, r"granularity='step' needs a boundary key \(the adapter's "
                                               r"step_boundary\)"):
            Partition("cuda", "step")
        with self.assertRaisesRegex(PassError, r"granularity must be 'chunk' or 'step', got 'graph'"):
            Partition("cuda", "graph")


# --------------------------------------------------------------- LowerCudaGraph
def lowered_gate() -> tuple[fx.GraphModule, LowerRecord]:
    _, gm = gate_graph()
    split = Partition("cpu")(gm).graph_module
    result = LowerCudaGraph(CapturedRegion)(split)
    return result.graph_module, result.record


class TestLowerCudaGraph(TestCase):
    def test_capturable_regions_become_captured_regions(self):
        _, gm = gate_graph()
        split = Partition("cpu")(gm).graph_module
        pieces = dict(split.named_children())

        result = LowerCudaGraph(CapturedRegion)(split)

        self.assertTrue(result.modified)
        self.assertExpectedInline(str(result.record),
                                  """captured ['submod_0', 'submod_2']; eager islands ['submod_1']""")
        lowered = result.graph_module
        for name in ("submod_0", "submod_2"):
            region = lowered.get_submodule(name)
            self.assertIsInstance(region, CapturedRegion)
            self.assertIs(region.piece, pieces[name])
            self.assertEqual(region.name, name)
            self.assertIsNone(region.graph)
            self.assertEqual(region.bound, (False,) * len([n for n in pieces[name].graph.nodes
                                                           if n.op == "placeholder"]))
        self.assertIs(lowered.submod_1, pieces["submod_1"])  # the eager island stays as it is
        self.assertNotIsInstance(lowered.submod_1, CapturedRegion)

    def test_an_argument_written_in_place_is_bound_by_address(self):
        """A static copy would take the write away from the tensor's owner."""
        def f(x, s):
            s.mul_(2)
            return x + s

        with torch.no_grad():
            gm = make_fx(f, pre_dispatch=True)(torch.randn(3), torch.randn(3))
        lowered = LowerCudaGraph(CapturedRegion)(Partition("cpu")(gm).graph_module).graph_module
        (region,) = [m for m in lowered.children() if isinstance(m, CapturedRegion)]
        names = [n.name for n in region.piece.graph.nodes if n.op == "placeholder"]
        self.assertEqual(dict(zip(names, region.bound)), {"x_1": False, "s_1": True})
        # and a session's fresh copy of the region keeps it
        (fresh,) = [m for m in fresh_regions(lowered).children() if isinstance(m, CapturedRegion)]
        self.assertEqual(fresh.bound, region.bound)

    def test_uncaptured_regions_run_their_pieces_eagerly_and_count_it(self):
        model, gm = gate_graph()
        expected = run(gm, GATE_X)
        lowered, _ = lowered_gate()
        got = run(lowered, GATE_X)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(got, expected)))
        run(lowered, GATE_X)
        self.assertEqual(region_stats(lowered), (0, {"submod_0: not captured": 2, "submod_2: not captured": 2}))

    def test_requires_a_partitioned_graph(self):
        _, gm = gate_graph()
        with self.assertRaisesRegex(PassError, r"lower_cudagraph needs a graph from partition \(no capturable tags\)"):
            LowerCudaGraph(CapturedRegion)(gm)


# --------------------------------------------------- CapturedRegion (no capture)
class StandInGraph:
    """What ``CapturedRegion`` needs of a ``torch.cuda.CUDAGraph``: ``replay()``."""

    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def piece_and_args():
    """A piece ``(x [2, 3], state [2, 3]) -> x * 2 + state`` that also bumps ``state`` in place."""
    def f(x, state):
        y = x * 2 + state
        state.add_(1)
        return y

    piece = trace(f, torch.randn(2, 3), torch.zeros(2, 3))  # tracing runs f: on tensors of its own
    return piece, torch.randn(2, 3), torch.zeros(2, 3)


def hand_captured(name: str = "r"):
    """A region as ``capture`` would leave it: x copied, state bound by address."""
    piece, x, state = piece_and_args()
    region = CapturedRegion(piece, [False, True], name=name)
    region.specs = (ArgSpec.of(x, False), ArgSpec.of(state, True))
    region.static_in = [x.clone(), None]
    region.static_out = torch.full((2, 3), 7.0)  # the "graph's" output
    region.graph = StandInGraph()
    return region, x, state


class TestCapturedRegion(TestCase):
    def test_arg_spec(self):
        x = torch.randn(2, 3)
        self.assertEqual(ArgSpec.of(x, False), ArgSpec((2, 3), (3, 1), torch.float32, torch.device("cpu"), None))
        self.assertEqual(ArgSpec.of(x, True).data_ptr, x.data_ptr())
        self.assertIsNone(ArgSpec.of(x, False).mismatch(x.clone(), 0))  # copied: any address will do
        self.assertIsNone(ArgSpec.of(x, True).mismatch(x.view(2, 3), 0))  # bound: the same memory
        self.assertRegex(ArgSpec.of(x, True).mismatch(x.clone(), 4),
                         r"^arg 4 \(bound by address\) moved from 0x[0-9a-f]+ to 0x[0-9a-f]+$")

    def test_check_names_every_mismatch(self):
        region, x, state = hand_captured()
        self.assertIsNone(region.check((x, state)))
        cases = [
            ((torch.randn(2, 4), state), "r: arg 0 shape (2, 4) != captured (2, 3)"),
            ((torch.randn(3, 2).t(), state), "r: arg 0 stride (1, 2) != captured (3, 1)"),
            ((x.double(), state), "r: arg 0 dtype torch.float64 != captured torch.float32"),
            ((x.to("meta"), state), "r: arg 0 device meta != captured cpu"),
            ((2.0, state), "r: arg 0 is float, captured a tensor"),
            ((x,), "r: 1 args, captured 2"),
        ]
        for args, why in cases:
            self.assertEqual(region.check(args), why)
        moved = state.clone()
        self.assertEqual(region.check((x, moved)), f"r: arg 1 (bound by address) moved from "
                                                   f"{state.data_ptr():#x} to {moved.data_ptr():#x}")
        region.graph = None
        self.assertEqual(region.check((x, state)), "r: not captured")

    def test_a_match_replays_and_a_mismatch_runs_the_piece_eagerly(self):
        region, x, state = hand_captured()
        x2 = torch.randn(2, 3)
        out = run(region, x2, state)
        self.assertIs(out, region.static_out)  # replayed: the graph's static output
        self.assertTrue(torch.equal(region.static_in[0], x2))  # copied arg refreshed before the replay
        self.assertFalse(state.any())  # bound arg untouched by Python: the graph writes it
        self.assertEqual((region.replays, region.graph.replays, region.refusals), (1, 1, {}))

        moved = torch.zeros(2, 3)
        for i in range(2):
            out = run(region, x2, moved)
            self.assertTrue(torch.equal(out, x2 * 2 + i))  # the piece itself, eagerly
        self.assertTrue(torch.equal(moved, torch.full((2, 3), 2.0)))  # its write landed where it was given
        wide = torch.zeros(2, 4)
        with self.assertRaises(RuntimeError):  # refused, then the piece itself fails on the wrong shape
            run(region, wide, state)
        self.assertEqual(region.replays, 1)
        self.assertEqual(region.graph.replays, 1)
        self.assertEqual(region.refusals, {
            f"r: arg 1 (bound by address) moved from {state.data_ptr():#x} to {moved.data_ptr():#x}": 2,
            "r: arg 0 shape (2, 4) != captured (2, 3)": 1,
        })

    def test_trivial_regions_run_their_piece_unchecked(self):
        region, x, state = hand_captured()
        region.trivial = True
        out = run(region, torch.ones(2, 3), state.clone())
        self.assertTrue(torch.equal(out, torch.full((2, 3), 2.0)))
        self.assertEqual((region.replays, region.graph.replays, region.refusals), (0, 0, {}))

    def test_launches_kernels(self):
        views = trace(lambda x: x.transpose(0, 1)[0].unsqueeze(0), torch.randn(2, 3))
        self.assertFalse(launches_kernels(views))
        self.assertFalse(launches_kernels(trace(lambda x: torch.split(x, 1)[0], torch.randn(2, 3))))
        self.assertFalse(launches_kernels(trace(lambda x: x.reshape(3, 2).narrow(0, 1, 1).t(), torch.randn(2, 3))))
        self.assertTrue(launches_kernels(trace(lambda x: x.transpose(0, 1) * 2, torch.randn(2, 3))))
        self.assertTrue(launches_kernels(trace(lambda x: x.add_(1), torch.randn(2, 3))))  # a write is a kernel
        self.assertTrue(launches_kernels(piece_and_args()[0]))
        # lowering marks a views-only region trivial, and a session's fresh copy keeps it
        with torch.no_grad():
            gm = make_fx(lambda x: x.t()[0], pre_dispatch=True)(torch.randn(2, 3))
        lowered = LowerCudaGraph(CapturedRegion)(Partition("cpu")(gm).graph_module).graph_module
        (region,) = [m for m in lowered.children() if isinstance(m, CapturedRegion)]
        self.assertTrue(region.trivial)
        (fresh,) = [m for m in fresh_regions(lowered).children() if isinstance(m, CapturedRegion)]
        self.assertTrue(fresh.trivial)

    def test_fresh_regions_share_pieces_not_captures(self):
        lowered, _ = lowered_gate()
        lowered.submod_0.replays = 5
        lowered.submod_0.graph = StandInGraph()

        fresh = fresh_regions(lowered)

        self.assertIsNot(fresh, lowered)
        for name in ("submod_0", "submod_2"):
            old, new = lowered.get_submodule(name), fresh.get_submodule(name)
            self.assertIsInstance(new, CapturedRegion)
            self.assertIsNot(new, old)
            self.assertIs(new.piece, old.piece)
            self.assertEqual((new.name, new.bound, new.graph, new.replays, new.refusals),
                             (name, old.bound, None, 0, {}))
        self.assertIs(fresh.submod_1, lowered.submod_1)
        self.assertEqual(lowered.submod_0.replays, 5)  # the executable's regions are untouched
        self.assertIsInstance(lowered.submod_0.graph, StandInGraph)
        got, want = run(fresh, GATE_X), run(lowered, GATE_X)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(got, want)))
        self.assertEqual(region_stats(fresh)[1], {"submod_0: not captured": 1, "submod_2: not captured": 1})

    def test_run_graph_routes_call_module_nodes(self):
        lowered, _ = lowered_gate()
        calls = []

        def call_module(mod, args):
            calls.append((type(mod).__name__, len(args)))
            return mod.piece(*args) if isinstance(mod, CapturedRegion) else mod(*args)

        with torch.no_grad():
            got = run_graph(lowered, [GATE_X], call_module)
        self.assertEqual(calls, [("CapturedRegion", 1), ("GraphModule", 1), ("CapturedRegion", 2)])
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(got, run(lowered, GATE_X))))
        self.assertEqual(region_stats(lowered), (0, {"submod_0: not captured": 1, "submod_2: not captured": 1}))


# ------------------------------------------------------------ compiler pipeline
class TestPipeline(TestCase):
    def test_rules_append_partition_and_lower_after_the_rewrite(self):
        _, bindings, _ = toy_entry_graph(ToyAdapter(make_toy(), 2), 0)
        names = lambda pm: [type(p).__name__ for p in pm.passes]  # noqa: E731
        self.assertEqual(names(rewrite_pipeline(bindings, "S")),
                         ["PruneDead", "FoldHostConstants", "PruneDead", "StateRewrite", "EarlyWriteback",
                          "PruneDead"])
        pm = rewrite_pipeline(bindings, "SRc", "cuda", None)
        self.assertEqual(names(pm), ["PruneDead", "FoldHostConstants", "PruneDead", "StateRewrite", "EarlyWriteback",
                                     "PruneDead", "IstftWithoutHostRead", "Partition", "LowerCudaGraph"])
        self.assertEqual((pm.passes[7].device_type, pm.passes[7].granularity), ("cuda", "chunk"))
        key = ScopedToyAdapter(make_toy(), 2).step_boundary()
        pm = rewrite_pipeline(bindings, "SR", "cuda", key)
        self.assertEqual((pm.passes[7].granularity, pm.passes[7].boundary), ("step", key))
        with self.assertRaisesRegex(PassError, "granularity='step' needs a boundary key"):
            rewrite_pipeline(bindings, "SR", "cuda", None)
        # the ordering constraints hold the new passes in place
        self.assertTrue(all(c(pm.passes) for c in pm.constraints))
        # partition before a rewrite or before the istft rewrite; the write-backs moved before they exist
        for i, j in ((3, 7), (4, 7), (3, 4), (6, 7)):
            swapped = list(pm.passes)
            swapped[i], swapped[j] = swapped[j], swapped[i]
            self.assertFalse(all(c(swapped) for c in pm.constraints), (i, j))

    def test_check_rules(self):
        cpu = torch.device("cpu")
        self.assertEqual(check_rules("S", cpu), "S")
        for rules in ("SR", "SRc", "R", "Rc"):
            with self.assertRaisesRegex(RulesError, rf"rules '{rules}' replay CUDA graphs and need a CUDA device; "
                                                    rf"this model is on cpu \(CUDA available: .*\)\. "
                                                    rf"Use rules='S' here\."):
                check_rules(rules, cpu)
        with self.assertRaisesRegex(RulesError, r"unknown rules 'SRR'; choose one of S, R, SR, Rc, SRc"):
            check_rules("SRR", cpu)
        with self.assertRaisesRegex(RulesError, r"rules 'SRc' replay CUDA graphs"):
            compile_executable(ToyAdapter(make_toy(), 2), "SRc")

    def test_check_rules_on_cuda(self):
        with pytest.MonkeyPatch.context() as mp:  # past the CUDA check, on a machine without CUDA
            mp.setattr(torch.cuda, "is_available", lambda: True)
            cuda = torch.device("cuda")
            for rules in ("S", "R", "SR", "Rc", "SRc"):
                self.assertEqual(check_rules(rules, cuda), rules)

    def test_rules_without_s_keep_stock_state(self):
        _, bindings, _ = toy_entry_graph(ToyAdapter(make_toy(), 2), 0)
        names = lambda pm: [type(p).__name__ for p in pm.passes]  # noqa: E731
        self.assertEqual(names(rewrite_pipeline(bindings, "")), ["PruneDead", "FoldHostConstants", "PruneDead"])
        self.assertEqual(names(rewrite_pipeline(bindings, "Rc", "cuda")),
                         ["PruneDead", "FoldHostConstants", "PruneDead", "IstftWithoutHostRead", "Partition",
                          "LowerCudaGraph"])

    def test_replay_programs_need_prepare_replay(self):
        adapter = ToyAdapter(make_toy(), 2)
        exe = compile_executable(adapter, "S")
        exe = dataclasses.replace(exe, programs={i: dataclasses.replace(p, kind="cudagraph")
                                                 for i, p in exe.programs.items()})
        session = Session(exe, Arena(exe.plan.layout, "cpu"), adapter.fallback, {"kv": 2, "conv": None})
        with self.assertRaisesRegex(CadenceError, r"replay programs need prepare_replay\(\) on the session first"):
            session.step(toy_inputs(1)[0])


class TestToyAtRulesSR(TestCase):
    """The toy's entries through the whole pipeline at SR and SRc (device_type="cpu",
    so every node is capturable), run region by region against the rules-S graph."""

    def lowered(self, rules: str, entry_index: int):
        adapter = ScopedToyAdapter(make_toy(), 2)
        gm, bindings, plan = toy_entry_graph(adapter, entry_index)
        s_gm, _ = rewrite_pipeline(bindings, "S")(copy.deepcopy(gm))
        pm = rewrite_pipeline(bindings, rules, "cpu", adapter.step_boundary())
        lowered, results = pm(gm)
        return lowered, s_gm, [str(r.record) for r in results[-2:]], plan

    def assert_same_run(self, got_gm, want_gm, plan, where: str) -> None:
        """Both graphs on one input, one random arena each (the same values) and one seed:
        every output and the whole arena after them bit-equal."""
        x = toy_inputs(1, seed=3)[0]["x"]
        gen = torch.Generator().manual_seed(4)
        arena = {s.name: torch.randn(s.shape, generator=gen) for s in plan.layout.slots}
        a = {n: t.clone() for n, t in arena.items()}
        b = {n: t.clone() for n, t in arena.items()}
        torch.manual_seed(5)
        want = run(want_gm, x, a["kv"], a["conv"])
        torch.manual_seed(5)
        got = run(got_gm, x, b["kv"], b["conv"])
        self.assertTrue(all(torch.equal(g, w) for g, w in zip(got, want)), where)
        self.assertTrue(all(torch.equal(a[n], b[n]) for n in arena), where)

    def test_sr_gives_one_region_per_side_of_the_attention(self):
        lowered, _, records, _ = self.lowered("SR", 0)
        self.assertEqual(records, ["3 regions (3 capturable, 0 eager); eager nodes: []",
                                   "captured ['submod_0', 'submod_1', 'submod_2']; eager islands []"])
        self.assertExpectedInline(lowered.code.strip(), """\
def forward(self, in_x, arena_kv, arena_conv):
    submod_0 = self.submod_0(arena_kv, arena_conv, in_x);  arena_conv = in_x = None
    getitem = submod_0[0]
    getitem_1 = submod_0[1];  submod_0 = None
    submod_1 = self.submod_1(getitem_1, getitem, arena_kv);  getitem_1 = getitem = arena_kv = None
    submod_2 = self.submod_2(submod_1);  submod_1 = None
    return (submod_2,)""")
        self.assertEqual(tuple(lowered.meta["cadence_arena_inputs"]), ("kv", "conv"))
        # every region launches kernels: on a GPU each is captured (none is a views-only stub)
        self.assertTrue(all(isinstance(m, CapturedRegion) and not m.trivial for m in lowered.children()))
        attn = lowered.submod_1.piece
        self.assertEqual(sum(1 for n in attn.graph.nodes if n.target is aten.copy_.default), 4)  # buffer writes
        self.assertEqual(sum(1 for n in lowered.submod_2.piece.graph.nodes if n.target is aten.rand.default), 1)

    def test_src_is_one_region_per_entry(self):
        lowered, _, records, _ = self.lowered("SRc", 0)
        self.assertEqual(records, ["1 region (1 capturable, 0 eager); eager nodes: []",
                                   "captured ['submod_0']; eager islands []"])

    def test_the_graph_partition_replaced_is_let_go_by_reference_count(self):
        """``rewrite_pipeline(..., let_go=True)`` (the compiler's builds) unlinks the graph
        partition replaced once the pipeline succeeds: with the collector off, every node of
        the pipeline's input is freed as the build lets go of it (erased ones too: no pass
        leaves a reference cycle holding nodes, e.g. a recursive closure over its
        environment), the input is left with an empty graph, and the lowered program
        computes what the same pipeline without ``let_go`` computes.  Without it, the
        input's graph is a reference cycle: every node lives until a collection."""
        import gc
        import weakref
        for rules in ("SR", "SRc"):
            adapter = ScopedToyAdapter(make_toy(), 2)
            gm, bindings, plan = toy_entry_graph(adapter, 0)
            kept = copy.deepcopy(gm)
            gc.collect()
            enabled = gc.isenabled()
            gc.disable()
            try:
                refs = [weakref.ref(n) for n in gm.graph.nodes]
                lowered, results = rewrite_pipeline(bindings, rules, "cpu", adapter.step_boundary(),
                                                    let_go=True)(gm)
                self.assertEqual(len(gm.graph.nodes), 0, rules)
                del results  # the passes' results name the input module
                self.assertGreater(len(refs), 20)
                self.assertEqual([r for r in refs if r() is not None], [], rules)
                kept_refs = [weakref.ref(n) for n in kept.graph.nodes]
                plain, _ = rewrite_pipeline(bindings, rules, "cpu", adapter.step_boundary())(kept)
                del kept
                self.assertTrue(all(r() is not None for r in kept_refs), rules)
            finally:
                if enabled:
                    gc.enable()
            self.assert_same_run(lowered, plain, plan, rules)

    def test_regions_run_eagerly_are_the_rules_s_graph(self):
        for rules in ("SR", "SRc"):
            for entry_index in (0, 2):
                lowered, s_gm, _, plan = self.lowered(rules, entry_index)
                self.assert_same_run(lowered, s_gm, plan, f"{rules} entry {entry_index}")
                self.assertEqual(region_stats(lowered)[0], 0)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])


class TestFailClosedRegressions(TestCase):
    """Each of these once let a replay read stale values without a check."""

    def test_tuples_never_cross_a_region_boundary(self):
        def f(x):
            vals, counts = torch.unique_consecutive(x, return_counts=True)
            return vals * 2, counts + 1
        gm = trace(f, torch.tensor([1.0, 1.0, 2.0, 3.0, 3.0]))
        split = Partition("cpu", "chunk")(gm).graph_module
        for call in (n for n in split.graph.nodes if n.op == "call_module"):
            for a in call.args:
                self.assertFalse(a.op == "call_module", f"{call.target} takes {a.target}'s whole tuple")

    def test_a_captured_region_refuses_a_container_argument(self):
        region = CapturedRegion(nn.Identity(), [False], name="r")
        with self.assertRaisesRegex(CadenceError, "arg 0 is a tuple"):
            region.capture([(torch.ones(2),)], pool=None, stream=None)

    def test_a_per_call_host_scalar_is_not_capturable(self):
        # x on the "device" (cpu here), a 0-dim scalar on another device ("meta" stands in
        # for the host): computed per call it would be frozen into the graph at capture
        gm = trace(lambda x, s: x / s, torch.randn(4), torch.tensor(2.0))
        div = next(n for n in gm.graph.nodes if n.target is aten.div.Tensor)
        scalar = div.args[1]
        scalar.meta["val"] = torch.empty((), device="meta")
        self.assertEqual(capturability(div, "cpu").reason, "reads a meta tensor: aten.div.Tensor")
        # the same scalar as a constant of the graph is baked once, legitimately
        with gm.graph.inserting_before(div):
            const = gm.graph.get_attr("_c")
        const.meta["val"] = scalar.meta["val"]
        div.replace_input_with(scalar, const)
        self.assertTrue(capturability(div, "cpu").capturable)

    def test_a_baked_python_value_must_match_at_replay(self):
        region = CapturedRegion(nn.Identity(), [False, False], name="r")
        region.graph = object()
        region.specs = (ArgSpec.of(torch.ones(2), False), ("value", 3))
        self.assertIn("captured the value 3", region.check((torch.ones(2), 4)))
        self.assertIsNone(region.check((torch.ones(2), 3)))


class TestPreview(TestCase):
    def test_preview_partition_of_the_rule_s_graphs(self):
        from cadence_fx.compiler import preview_partition
        adapter = ScopedToyAdapter(make_toy(), 2)
        exe = compile_executable(adapter, "S")
        chunk = preview_partition(exe, "chunk")
        step = preview_partition(exe, "step", adapter.step_boundary())
        self.assertEqual(sorted(chunk), sorted(exe.programs))
        for idx in exe.programs:
            self.assertEqual(str(chunk[idx]), "1 region (1 capturable, 0 eager); eager nodes: []")
            self.assertGreater(len(step[idx].regions), 1)  # the attention call is cut out
        # previewing does not touch the rule-S programs that run
        self.assertTrue(all(p.kind == "graph" for p in exe.programs.values()))
