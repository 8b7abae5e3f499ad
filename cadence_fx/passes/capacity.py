"""capacity: a symbolic step -> ONE graph for every value of its dims, its sizes held at a capacity.

``specialize`` makes a symbolic step (``trace_symbolic``) concrete at each value of its
dims, so every prompt length has graphs of its own (a new voice: a specialization and a
capture).  Here the step is rewritten once, at a capacity ``C`` of each dim: every
tensor whose size carries a symbol is held at its size at ``C`` (a *padded* value), its
live part a prefix, on each symbolic dim, of its size at the stream's value ``s``; what
lies past it is never read as a result.  The graph takes each dim twice: as the host int
its caller runs it at (``capacity_ops.at_dims``, read by the islands), and as an input
``len_<d>``, the same value as a device int64 scalar (read by the rest).

Each node that touches a symbol runs one of two ways (``capacity_plan``'s rules decide;
``CapacityPlan`` says which and why):

- **capacity**: the node as the step at ``C`` would run it, where that gives the live
  prefix exactly: views that keep each symbolic dim whole and in place, pointwise ops
  whose operands line up on those dims, factories, ``cat``/``stack`` (a ``cat`` that puts
  something after a padded part writes it at a device offset, ``offset_cat``), ``copy_``
  into a padded destination (a write that keeps the destination's own values past the
  live prefix, ``masked_copy``: nothing of another value is overwritten), and, where the
  caller found it exact on its device and dtype, attention over padded keys
  (``masked_attention``).  These read no host size: a CUDA graph of them serves every ``s``.
- **exact**: anything else that reads a padded dim (a reduction over it, a view that
  moves it, an argument computed from ``s``): the node runs as ``specialize`` would make
  it, on views of the live prefixes (``narrow`` at host sizes), so its bits are the
  step's own.  Runs of these are the *islands*: eager, between graphs.

Nothing is guessed: an op with no rule here runs exact.  Sizes are sympy expressions
over the symbols; a host size is computed by ``host_size`` and a device one by
``device_size``, each from the expression's Python text (checked against sympy when
the plan is made).  ``check_dims`` refuses a value of a dim past the capacity, one
whose extents would not fit, and one outside the step's guards.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Mapping

import torch
import torch.fx as fx

from .. import step as meta
from ..step import Role
from .base import changes_layout_in_place, fake_tensor, returns_written, written_args
from .capacity_ops import (DEVICE_SIZE, FAITHFUL, MASKED_ATTENTION, MASKED_COPY, OFFSET_CAT, TO_CAPACITY, at_dims,
                           host_size, probe_masked_attention, within)
from .capacity_plan import (_ASSERTS, _MODE, _OF, CAPACITY, DEVICE, EXACT, CapacityPlan, CapacityRefused, _binding,
                            _name, _padded, _plan, _symbolic, _Walk, check_dims, exact_view, plan_capacity)
from .specialize import _value, expr_text, module_without_code
from .trace_symbolic import SymbolicStep, SymTensor, _free_symbols

__all__ = ["CapacityPlan", "CapacityRefused", "arguments", "at_dims", "capacity_form", "check_dims", "check_shapes",
           "plan_capacity"]
aten = torch.ops.aten


def capacity_form(sym: SymbolicStep, capacity: Mapping[str, int], masked_attention=False,
                  buffers: "Mapping[str, torch.Tensor] | None" = None,
                  keep_values: bool = False, code: bool = True) -> tuple[fx.GraphModule, CapacityPlan]:
    """``sym`` rewritten to run at every value of its dims up to ``capacity`` (see the
    module doc), and its plan.  The graph takes ``sym``'s inputs, then one more input per
    dim, ``len_<d>`` (its value, a device int64 scalar; placeholder ``in_len_<d>``), then
    ``sym``'s state and buffers: each padded one at its size at the capacity, its live
    part a prefix.  It returns ``sym``'s outputs so, padded ones at the capacity.  It runs
    inside ``capacity_ops.at_dims({d: value})`` (the host sizes its islands read); call
    ``check_dims`` before running it at new dims.  ``buffers``: region -> the tensor (at the
    capacity) its ``buf_<region>`` placeholder becomes, a ``get_attr`` as ``specialize``
    makes it (None: they stay placeholders, last).  ``masked_attention``: see
    ``plan_capacity`` (``attention_probe`` makes a probe that asks the device).
    ``keep_values``: see ``check_shapes``.  ``code=False``: the graph's Python code is not
    generated (``module_without_code``: calling it raises) for a caller that only rewrites it
    (``capacity_build``: the rule-S passes generate the code of what they return)."""
    clash = [f"len_{d}" for d in sym.dims if f"len_{d}" in meta.signature(sym.gm).inputs]
    if clash:
        raise CapacityRefused(f"the step has an input named {clash[0]}, the name of its dim's device length")
    plan, walk = _plan(sym, capacity, masked_attention)
    gm = _Emit(sym, walk, plan, buffers).module(code)
    check_shapes(gm, sym, plan, keep_values)
    return gm, plan


def arguments(gm: fx.GraphModule, tensors: Mapping[str, torch.Tensor],
              lengths: Mapping[str, torch.Tensor]) -> list:
    """``gm``'s positional arguments: ``tensors`` by placeholder name (``in_*``, ``state_*``,
    ``buf_*``) and each dim's device length by dim name."""
    return [lengths[n.target[len("in_len_"):]] if n.target.startswith("in_len_") else tensors[n.target]
            for n in gm.graph.nodes if n.op == "placeholder"]


def attention_probe(sym: SymbolicStep, capacity: Mapping[str, int], values: Mapping[str, "list[int]"], device,
                    seed: int = 0):
    """A ``masked_attention`` probe for ``plan_capacity``: each distinct attention call over
    padded keys is run on ``device`` (``capacity_ops.probe_masked_attention``) as the capacity
    form runs it (query, keys and values laid out as at the capacity, the call's ``scale``)
    against the step's own call at every value the dims' ``values`` give (value ``i`` of each
    dim together: its live keys, and every operand laid out as at that value)."""
    at_cap = _binding(sym, capacity)

    def layout(t: SymTensor, binding) -> tuple:
        return tuple(tuple(_value(x, binding, "a size") for x in xs) for xs in (t.shape, t.stride)) + (
            _value(t.offset, binding, "an offset"),)

    def probe(q: SymTensor, k: SymTensor, v: SymTensor, live, scale=None) -> bool:
        cases = []
        for vs in zip(*values.values()):
            here = _binding(sym, dict(zip(values, vs)))
            cases.append((_value(live, here, "a size"), layout(q, here), layout(k, here), layout(v, here)))
        return probe_masked_attention(layout(q, at_cap), layout(k, at_cap), layout(v, at_cap), k.dtype, device,
                                      sorted(set(cases)), seed, scale)
    return probe


def check_shapes(gm: fx.GraphModule, sym: SymbolicStep, plan: CapacityPlan, keep_values: bool = False) -> None:
    """The rewrite's postcondition, on fake tensors (``FakeTensorProp``), at the dims the step
    was traced at and at the capacity: every node made from a node of ``sym`` has that
    node's shape at the capacity (a capacity node) or at the dims it runs at (an exact one).
    A slice clamped, a view that moved a dim, an island's value at the wrong size:
    ``CapacityRefused``, never a wrong graph.  ``keep_values``: each node's fake value at the
    capacity stays in ``meta["val"]`` (what the compiler's passes read)."""
    if dict(sym.dims) != dict(plan.capacity) and all(0 <= sym.dims[d] <= plan.capacity[d] for d in sym.dims):
        check_shapes_at(gm, sym, plan, sym.dims)
    check_shapes_at(gm, sym, plan, plan.capacity, keep_values)


def check_shapes_at(gm: fx.GraphModule, sym: SymbolicStep, plan: CapacityPlan, dims, keep_values: bool = False) -> None:
    """``check_shapes`` at ``dims``; ``keep_values``: each node's fake value stays in ``meta["val"]``."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import py_sym_types
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    at_cap, here = _binding(sym, plan.capacity), _binding(sym, dims)
    device = meta.traced_device(sym.gm)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        lengths = {d: torch.tensor(int(dims[d]), device=device) for d in sym.dims}
        fakes = {p.name: torch.empty([_value(x, at_cap, "a size") for x in p.shape], dtype=p.dtype, device=device)
                 for p in sym.placeholders if not p.name.startswith("dim_")}
    args = arguments(gm, fakes, lengths)
    want = {n.name: n.meta.get(meta.SYM) for n in sym.gm.graph.nodes}

    def recorded(v):  # a static node's value, as the trace recorded it (no symbol in it)
        if isinstance(v, SymTensor):
            return fake_tensor(mode, v.shape, v.stride, v.dtype, v.device)
        return type(v)(recorded(x) for x in v) if isinstance(v, (list, tuple)) else v

    snapshot = any(_changes_metadata(n.target) for n in gm.graph.nodes if n.op == "call_function")

    def kept(v):  # a node's value as ``meta["val"]`` holds it
        if isinstance(v, FakeTensor):
            return v
        if isinstance(v, torch.Tensor):
            return mode.from_tensor(v, static_shapes=True)
        return v if isinstance(v, (*py_sym_types, int, float, bool)) else None

    class Prop(FakeTensorProp):
        def run_node(self, n):  # static nodes are not run: what the trace recorded is their value
            if n.meta.get(_MODE) == "static":
                with unset_fake_temporarily():  # (the prop runs inside the mode: see fake_tensor)
                    n.meta["val"] = value = recorded(want[n.meta[_OF]])
                return value
            if snapshot:
                return super().run_node(n)
            # FakeTensorProp's own, less its copy of each value (``snapshot_fake``, a detach: a
            # tenth of a build): no node changes a tensor's sizes or strides in place, so a
            # value read later still has the layout its node gave it (and, the prop running
            # without grad, no autograd history to cut)
            result = fx.Interpreter.run_node(self, n)
            val = fx.node.map_aggregate(result, kept)
            if val is not None:
                n.meta["val"] = val
            return result
    with at_dims(dims), torch.no_grad():
        Prop(gm, mode).propagate(*args)

    def shapes(v, binding):
        if isinstance(v, SymTensor):
            return tuple(_value(x, binding, "a size") for x in v.shape)
        if isinstance(v, torch.Tensor):
            return tuple(v.shape)
        if isinstance(v, (list, tuple)):
            return tuple(shapes(x, binding) for x in v)
        return None
    for node in gm.graph.nodes:
        src = node.meta.get(_OF)
        if src is None:
            continue
        how = node.meta.get(_MODE)
        expected = shapes(want[src], here if how == EXACT else at_cap)
        got = shapes(node.meta.get("val"), None)
        if expected != got:
            raise CapacityRefused(f"{src} ({how}) is {got} at {dict(dims)}, not {expected}")
    if not keep_values:
        for node in gm.graph.nodes:
            node.meta.pop("val", None)  # sizes of one run, not of the graph


def _changes_metadata(target) -> bool:
    """An op that changes its input's sizes, strides or storage in place (``t_``, ``unsqueeze_``,
    ``resize_``, ``set_``...: ``base.changes_layout_in_place``), or a target that is no op
    (nothing says what it does)."""
    if not isinstance(target, torch._ops.OpOverload):
        return not _known_pure(target)
    return changes_layout_in_place(target)


def _known_pure(target) -> bool:  # what a capacity graph calls besides ops: host sizes, checks, grad mode
    return target in (host_size, within, torch._C._set_grad_enabled) or \
        getattr(target, "__module__", None) in ("_operator", "math")


class _Emit:
    """The capacity graph, node by node as ``_Walk`` decided."""

    def __init__(self, sym: SymbolicStep, walk: _Walk, plan: CapacityPlan, buffers=None):
        self.sym, self.walk, self.plan, self.g = sym, walk, plan, fx.Graph()
        self.names = tuple(str(sym.symbols[d]) for d in sym.dims)
        self.dims = tuple(sym.dims)
        self.at_capacity = _binding(sym, plan.capacity)
        self.buffers, self.attrs, self.pending = buffers, {}, []
        self.cap_env: dict = {}
        self.exact_env: dict = {}
        self.own_layout: set = set()  # nodes whose exact form is laid out as the step lays it out
        self.memo: dict = {}
        self.dev: list = []
        self.hoisted = None  # the last node of the graph's head: the dims' check, then the host sizes
        for node in sym.gm.graph.nodes:
            self._emit(node)

    def _lengths(self) -> None:
        """The device lengths, as inputs after the step's own (once, where the inputs end)."""
        if self.dev:
            return
        for d in self.dims:
            n = self.g.placeholder(f"in_len_{d}")
            meta.tag(n, Role.INPUT, name=f"len_{d}")
            self.dev.append(n)

    def _placeholders_end(self) -> None:
        """After the last placeholder: the bound buffers' ``get_attr``s, and the dims' check."""
        self._lengths()
        if self.pending is None:
            return
        for b in self.pending:
            region = meta.region(b)
            attr = f"_cadence_buffer_{region}"
            self.attrs[attr] = t = self.buffers.get(region)
            v = b.meta[meta.SYM]
            want = tuple(_value(x, self.at_capacity, "a size") for x in v.shape)
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != want or t.dtype != v.dtype \
                    or t.device.type != torch.device(v.device).type:
                got = "nothing" if not isinstance(t, torch.Tensor) else f"{tuple(t.shape)} {t.dtype} on {t.device}"
                raise CapacityRefused(f"buffer {region!r}: bound to {got}; the capacity form takes "
                                      f"{want} {v.dtype} on {v.device.type}")
            get = self.g.create_node("get_attr", attr)
            meta.tag(get, Role.BUFFER, region=region)
            self.cap_env[b] = get
            if not _padded(b.meta.get(meta.SYM)):
                self.exact_env[b] = get
        self.pending = None  # a dim past the capacity never runs (check_dims says more):
        self.hoisted = self.g.call_function(within, (self.dims, tuple(int(self.plan.capacity[d]) for d in self.dims),
                                                     self.names, tuple(str(g) for g in self.sym.guards),
                                                     self.plan.extents, list(self.dev)))

    def module(self, code: bool = True) -> fx.GraphModule:
        gm = module_without_code(self.sym.gm, self.g, self.attrs)
        sig = meta.signature(self.sym.gm)
        gm.meta[meta.SIGNATURE] = dataclasses.replace(sig, inputs=sig.inputs + tuple(f"len_{d}" for d in self.dims))
        gm.meta[meta.DEVICE] = meta.traced_device(self.sym.gm)
        self.g.lint()
        if code:
            gm.recompile()
        return gm

    # sizes
    def size(self, e, form: str):
        """``e`` as ``form`` reads it: a constant at the capacity, a host int (``host_size``),
        or a device scalar (``DEVICE_SIZE``; a constant ``e`` too, where asked for one)."""
        if not _symbolic(e) and form != DEVICE:
            return _value(e, {}, "a size")
        if form == CAPACITY:
            return _value(e, self.at_capacity, "a size")
        key = (form, expr_text(e))
        if key not in self.memo and form == EXACT:
            # hoisted to the top, after the dims' check: a host size reads the dims alone, and
            # a run of them there leaves the rest of the graph in one piece to capture (rule R)
            with self.g.inserting_after(self.hoisted):
                self.memo[key] = self.hoisted = self.g.call_function(host_size, (key[1], self.names, self.dims))
        elif key not in self.memo:
            self.memo[key] = self.g.call_function(DEVICE_SIZE, (key[1], ",".join(self.names), list(self.dev)))
        return self.memo[key]

    def exact_of(self, a: fx.Node):
        if a not in self.exact_env:  # a padded value held at the capacity only: its live prefix
            x = self.cap_env[a]
            for d, e in sorted(_padded(a.meta.get(meta.SYM)).items()):
                x = self.g.call_function(aten.narrow.default, (x, d, 0, self.size(e, EXACT)))
            self.exact_env[a] = x
        return self.exact_env[a]

    def args(self, node: fx.Node, form: str):
        in_place = set(written_args(node)) if form == EXACT else set()

        def f(a):
            if a in self.walk.scalar:
                e = self.walk.scalar[a]
                if e is None:
                    raise CapacityRefused(f"{node.name} reads a dims marker")
                return self.size(e, form)
            if form != EXACT:
                return self.cap_env[a]
            if exact_view(node) or a in in_place or a in self.own_layout or not _free_symbols(a.meta.get(meta.SYM)):
                return self.exact_of(a)  # the live prefix's view: its memory (a view keeps indices)
            return self.faithful(a)
        return fx.node.map_arg(node.args, f), fx.node.map_arg(node.kwargs, f)

    def faithful(self, a: fx.Node) -> fx.Node:
        """``a``'s live values in the layout the step gives them at these dims (sizes, strides,
        storage offset): a copy, made where it is read (the memory may be written in between)."""
        v = a.meta[meta.SYM]
        host = lambda xs: [self.size(x, EXACT) for x in xs]  # noqa: E731
        return self.g.call_function(FAITHFUL, (self.exact_of(a), host(v.shape), host(v.stride),
                                               self.size(v.offset, EXACT)))

    def call(self, node: fx.Node, target, args, kwargs=None, mode: str = "") -> fx.Node:
        new = self.g.call_function(target, tuple(args), dict(kwargs or {}))
        new.meta.update({k: v for k, v in node.meta.items() if k not in (meta.SYM, "val", "tensor_meta")})
        new.meta[_MODE], new.meta[_OF] = mode, node.name
        return new

    def _emit(self, node: fx.Node) -> None:
        w, v = self.walk, node.meta.get(meta.SYM)
        if node in w.scalar or (node.op == "call_function" and node.target in _ASSERTS):
            return
        if node.op == "placeholder":
            if meta.role(node) is Role.DIM:
                return
            if not node.name.startswith("in_"):
                self._lengths()
            if meta.role(node) is Role.BUFFER and self.buffers is not None:
                self.pending.append(node)  # a get_attr of the bound tensor, where the placeholders end
                return
            new = self.g.placeholder(node.name)
            new.meta.update({k: v for k, v in node.meta.items() if k != meta.SYM})
            self.cap_env[node] = new
            if not _padded(v):
                self.exact_env[node] = new
            return
        self._placeholders_end()
        if node.op == "output":
            outs = []
            for a in node.args[0]:
                if not _padded(a.meta.get(meta.SYM)):
                    outs.append(self.exact_of(a))
                elif a in self.cap_env:
                    outs.append(self.cap_env[a])
                else:
                    shape = [self.size(e, CAPACITY) for e in a.meta[meta.SYM].shape]
                    outs.append(self.g.call_function(TO_CAPACITY, (self.exact_env[a], shape)))
            self.g.output(tuple(outs))
            return
        if node.op == "get_attr" or node not in w.mode:  # static: one form
            if node.op == "get_attr":
                new = self.g.get_attr(node.target)
                new.meta.update(node.meta)
            else:
                args, kwargs = self.args(node, EXACT)
                new = self.call(node, node.target, args, kwargs, "static")
            self.cap_env[node] = self.exact_env[node] = new
            return
        mode, how = w.mode[node]
        if node.target is operator.getitem:
            src, i = node.args
            if src in self.cap_env:
                self.cap_env[node] = self.call(node, operator.getitem, (self.cap_env[src], i), mode=CAPACITY)
            if src in self.exact_env:
                self.exact_env[node] = self.call(node, operator.getitem, (self.exact_env[src], i), mode=EXACT)
                if src in self.own_layout:
                    self.own_layout.add(node)
            elif not _padded(v):
                self.exact_env[node] = self.cap_env[node]
            if node not in self.cap_env and isinstance(v, SymTensor) and not _padded(v):
                self.cap_env[node] = self.exact_env[node]  # an exact item at its own size: both forms
            return
        if mode == EXACT:
            args, kwargs = self.args(node, EXACT)
            new = self.exact_env[node] = self.call(node, node.target, args, kwargs, EXACT)
            if isinstance(v, SymTensor) and not _padded(v):
                self.cap_env[node] = new
            if not exact_view(node) and not returns_written(node):
                self.own_layout.add(node)  # made here from the step's layouts: the step's own
            return
        new = self.cap_env[node] = self._capacity_node(node, how, v)
        if isinstance(v, SymTensor) and not _padded(v):
            self.exact_env[node] = new

    def _capacity_node(self, node: fx.Node, how: str, v) -> fx.Node:
        args, kwargs = self.args(node, CAPACITY)
        kwargs = dict(kwargs)
        if how == "slice":
            src = node.args[0].meta[meta.SYM]
            rest = list(args[1:]) + [None] * 4
            d = kwargs.pop("dim", rest[0] if rest[0] is not None else 0) % len(src.shape)
            start = kwargs.pop("start", rest[1]) or 0
            step = kwargs.pop("step", (rest[3] if _name(node) == "slice" else 1) or 1)
            kwargs.pop("end", None); kwargs.pop("length", None)
            size = self.size(v.shape[d], CAPACITY)
            return self.call(node, aten.slice.Tensor, (args[0], d, start, start + step * size, step), mode=how)
        if how == "offset cat":
            parts = node.args[0]
            d = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % len(v.shape)
            offsets, total = [], 0
            for p in parts:
                offsets.append(self.size(total, DEVICE))
                total = total + p.meta[meta.SYM].shape[d]
            return self.call(node, OFFSET_CAT, (list(args[0]), d, offsets), mode=how)
        if how == "masked write":
            dst = node.args[0].meta[meta.SYM]
            dims = sorted(_padded(dst))
            lengths = [self.size(_padded(dst)[d], DEVICE) for d in dims]
            write = self.call(node, MASKED_COPY, (args[0], args[1], dims, lengths), mode=how)
            del write.meta[_OF]  # returns nothing: copy_'s value is its destination, written
            return args[0]
        if how == "masked attention":
            k = node.args[1].meta[meta.SYM]
            length = self.size(k.shape[len(k.shape) - 2], DEVICE)
            return self.call(node, MASKED_ATTENTION, (args[0], args[1], args[2], length, kwargs.get("scale")),
                             mode=how)
        return self.call(node, node.target, args, kwargs, how)
