"""specialize: a symbolic step (``trace_symbolic``) at concrete dims -> the graph ``trace`` records.

Given the dims' values and the tensors each placeholder takes (example inputs and
state at the entry's extents, the arena views the buffers are bound to):

1. every placeholder's shape, evaluated at the dims, must be the given tensor's, and
   every guard the symbolic trace recorded must hold; otherwise
   ``SpecializationRefused`` names the first that does not (the compiler then traces
   concretely: never a graph outside its guards);
2. each int/bool node becomes its value (its ``step.SYM`` expression at the dims);
   runtime asserts on them are checked and dropped; the ``dim_*`` markers go;
3. each ``buf_<region>`` placeholder becomes a ``get_attr`` of the bound tensor,
   tagged ``Role.BUFFER`` as ``trace`` tags it;
4. ``FakeTensorProp`` records every node's value at the concrete shapes (one fake
   mode), and slices that keep their whole input (``slice(x, d, 0, >= size, 1)``,
   which a symbolic trace records where Python indexing at known sizes records
   nothing) are dropped.

The result is node for node the graph ``trace`` records at those shapes (up to
node names), checked in ``tests/passes/test_specialize.py``; it runs no model code.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Hashable, Mapping

import torch
import torch.fx as fx

from ..errors import SpecializationRefused
from .. import step as meta
from ..step import Role
from .base import CALL_SUMMARY, copy_node, whole_slice, without_code
from .step_share import SHARED, share_calls
from .trace_symbolic import SymbolicStep, SymTensor

_ASSERTS = {getattr(torch.ops.aten, n).default for n in ("_assert_scalar", "sym_constrain_range",
                                                        "sym_constrain_range_for_size")
            if hasattr(torch.ops.aten, n)}


def check_binding(sym: SymbolicStep, dims: Mapping[str, int],
                  tensors: Mapping[str, torch.Tensor]) -> dict:
    """The symbols' values; raises ``SpecializationRefused`` on a shape, dtype or guard that disagrees."""
    if set(dims) != set(sym.dims):
        raise SpecializationRefused(f"dims {sorted(dims)} are not the symbolic step's {sorted(sym.dims)}")
    import sympy
    binding = {sym.symbols[d]: sympy.Integer(int(v)) for d, v in dims.items()}
    for p in sym.placeholders:
        if p.name.startswith("dim_"):
            continue
        t = tensors.get(p.name)
        if t is None:
            raise SpecializationRefused(f"no tensor for placeholder {p.name}")
        want = tuple(_value(s, binding, p.name) for s in p.shape)
        if tuple(t.shape) != want or t.dtype != p.dtype:
            raise SpecializationRefused(f"{p.name} is {tuple(t.shape)} {t.dtype}; the symbolic step at {dict(dims)} "
                                        f"takes {want} {p.dtype}")
    _check_guards(sym, dims, binding)
    return binding


def check_guards(sym: SymbolicStep, dims: Mapping[str, int]) -> None:
    """``SpecializationRefused`` unless every guard of ``sym`` holds at ``dims`` (all its dims)."""
    import sympy
    _check_guards(sym, dims, {sym.symbols[d]: sympy.Integer(int(v)) for d, v in dims.items()})


def _check_guards(sym: SymbolicStep, dims: Mapping[str, int], binding: Mapping) -> None:
    for g in sym.guards:
        if _value(g, binding, "a guard") is not True:
            raise SpecializationRefused(f"guard {g} does not hold at {dict(dims)}")


def _value(expr, binding: Mapping, what: str):
    """``expr`` (an int, or a sympy expression over the symbols) at ``binding``: int, float or bool."""
    if isinstance(expr, (bool, int, float)):
        return expr
    from sympy.logic.boolalg import BooleanAtom
    try:
        v = _replaced(expr, tuple(binding.items()))
    except TypeError:  # a value that does not hash: no memo
        v = expr.xreplace(binding)
    if isinstance(v, (bool, int)):  # the whole expression was one symbol
        return v
    if isinstance(v, BooleanAtom):
        return bool(v)
    if getattr(v, "is_Integer", False):
        return int(v)
    if getattr(v, "is_Number", False):
        return float(v)
    raise SpecializationRefused(f"{what}: {expr} is not a number at {binding} ({v})")


@functools.lru_cache(maxsize=1 << 16, typed=True)
def _replaced(expr, binding: tuple):
    """``expr.xreplace(dict(binding))``, memoized: the capacity passes evaluate the same few
    hundred sizes at the same few bindings tens of thousands of times a build (sympy's
    ``xreplace`` walks the expression each time)."""
    return expr.xreplace(dict(binding))


@functools.lru_cache(maxsize=1 << 16, typed=True)
def expr_text(expr) -> str:
    """``str(expr)``, memoized (sympy prints an expression anew each time, about 0.3 ms for
    a size's sum; the capacity passes print the same few hundred many times a build)."""
    return str(expr)


def specialize(sym: SymbolicStep, dims: Mapping[str, int], tensors: Mapping[str, torch.Tensor],
               buffers: Mapping[str, torch.Tensor], recompile: bool = True,
               share: "Callable[[fx.Node], bool] | None" = None) -> fx.GraphModule:
    """The concrete graph of ``sym`` at ``dims``.

    ``tensors``: placeholder name (``in_*``, ``state_*``) -> a tensor of the shape and
    dtype it takes (values unused; the inputs are kept as ``step.EXAMPLE_INPUTS``);
    ``buffers``: region -> the tensor its buffers are bound to (an arena view).
    ``recompile=False`` leaves the module's code stale for a caller whose passes
    regenerate it (``PassManager`` does, once, after the last pass).
    ``share``: the adapter's ``repeated_calls()``: the alike calls it marks are one
    submodule (``step_share``, outlined once per symbolic step), specialized once and
    called at each place; inlining it gives the unrolled result op for op.
    """
    named = dict(tensors)
    named.update({f"buf_{r}": t for r, t in buffers.items()})
    binding = check_binding(sym, dims, named)

    src = sym.gm if share is None else shared_form(sym, share)
    gm = _bound_copy(sym, binding, dims, buffers, src)
    _record_values(gm, binding, sym)
    _drop_whole_slices(gm)
    if hasattr(src, SHARED):
        sub = _bound_copy(sym, binding, dims, {}, src.get_submodule(SHARED), inner=True)
        _record_values(sub, binding, sym)
        _drop_whole_slices(sub)
        sub.graph.lint()
        sub = _lazy_module(sub)  # its code generated at its first call (a capture runs it; rule S: the first chunk)
        sub.meta[CALL_SUMMARY] = src.get_submodule(SHARED).meta[CALL_SUMMARY]
        gm.add_submodule(SHARED, sub)
    sig = meta.signature(sym.gm)
    gm.meta[meta.SIGNATURE] = sig
    gm.meta[meta.DEVICE] = meta.traced_device(sym.gm)
    gm.meta[meta.EXAMPLE_INPUTS] = [tensors[f"in_{n}"].clone() for n in sig.inputs]
    gm.graph.lint()
    if recompile:
        gm.recompile()
    return gm


class _Dim:
    """A dims marker's place in the walk: a node still reading it is refused."""


def _lazy_module(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` as torch's lazy GraphModule (code on first call; a plain one on older torch)."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule as cls
    except ImportError:  # pragma: no cover - older torch
        cls = fx.GraphModule
    return cls(gm, gm.graph)


def shared_form(sym: SymbolicStep, inside: "Callable[[fx.Node], bool]") -> fx.GraphModule:
    """``sym``'s graph with its alike repeated calls outlined (``step_share``), made once
    per symbolic step and kept with it (``sym.gm`` itself is never changed)."""
    key = ("shared form", _predicate_key(inside))
    hit = sym.static_values.get(key)
    if hit is None:
        graph = fx.Graph()
        graph.output(graph.graph_copy(sym.gm.graph, {}))
        hit, record = share_calls(module_without_code(sym.gm, graph), inside)
        sym.static_values[key] = hit = hit if record.shared else sym.gm  # nothing alike: no second copy
    return hit


def _predicate_key(inside: Callable) -> Hashable:
    """What decides ``inside``'s answers, as a memo key: an adapter hands a new closure each
    time, so its code, defaults and captured values (when hashable); otherwise the
    predicate itself (a new one outlines again: a cost, never another predicate's form)."""
    code = getattr(inside, "__code__", None)
    if code is None:
        return inside
    try:
        cells = tuple(c.cell_contents for c in (inside.__closure__ or ()))
        key = (code, getattr(inside, "__defaults__", None), cells)
        hash(key)
    except (TypeError, ValueError):  # an unhashable or empty cell
        return inside
    return key


def _bound_copy(sym: SymbolicStep, binding: Mapping, dims: Mapping[str, int],
                buffers: Mapping[str, torch.Tensor], root: "fx.GraphModule | None" = None,
                inner: bool = False) -> fx.GraphModule:
    """Steps 2 and 3 in one walk over the symbolic graph (``root``: ``sym.gm`` or its
    shared form): each int/bool node is its value (no node), runtime asserts are checked
    and dropped, the ``dim_*`` markers go, each ``buf_<region>`` placeholder is a
    ``get_attr`` (after the placeholders), and every other node is copied with those
    values in its arguments.  ``inner``: ``root`` is a shared step, whose placeholders
    all stay (a call passes every argument), an int one unused: its value is bound in."""
    root = sym.gm if root is None else root
    src = root.graph
    graph = fx.Graph()
    env: dict = {}
    marker = _Dim()
    attrs: dict[str, torch.Tensor] = {}
    buffers_pending: list[fx.Node] = []

    def arg(n: fx.Node):
        v = env[n]
        if v is marker:
            raise SpecializationRefused(f"{n.name} is used by {list(n.users)} after binding the dims")
        return v

    for node in src.nodes:
        if inner and node.op == "placeholder":
            copy = copy_node(graph, node)
            value = node.meta.get(meta.SYM)
            env[node] = (_value(value, binding, node.name)
                         if value is not None and not isinstance(value, (SymTensor, list, tuple)) else copy)
            continue
        if node.op == "placeholder":
            role = meta.role(node)
            if role is Role.DIM:
                env[node] = marker
            elif role is Role.BUFFER:
                buffers_pending.append(node)
            else:
                env[node] = copy_node(graph, node, arg)
            continue
        for b in buffers_pending:  # buffers become constants, read where the placeholders end
            region = meta.region(b)
            attr = f"_cadence_buffer_{region}"
            attrs[attr] = buffers[region]
            get = graph.create_node("get_attr", attr)  # a plain attribute, as make_fx makes its constants
            get.meta.update({k: v for k, v in b.meta.items() if k != "val"})
            meta.tag(get, Role.BUFFER, region=region)
            env[b] = get
        buffers_pending = []
        value = node.meta.get(meta.SYM)
        if node.op != "output" and value is not None and not isinstance(value, (SymTensor, list, tuple)):
            env[node] = _value(value, binding, node.name)  # what it reads is dropped with it
            continue
        if node.op == "call_function" and node.target in _ASSERTS:
            args = fx.node.map_arg(node.args, lambda n: n if env[n] is marker else env[n])
            if args and args[0] is not True and node.target is torch.ops.aten._assert_scalar.default:
                raise SpecializationRefused(f"runtime assert {args[1:] or node.name} fails at {dict(dims)}")
            continue
        env[node] = copy_node(graph, node, arg)
    return module_without_code(root, graph, attrs)


def module_without_code(root: torch.nn.Module, graph: fx.Graph,
                        attrs: "Mapping[str, torch.Tensor] | None" = None) -> fx.GraphModule:
    """A GraphModule over ``graph`` holding the attributes of ``root`` its ``get_attr``
    nodes name, as ``fx.GraphModule(root, graph)`` builds it but without generating its
    Python code: its ``forward`` is stale (an empty graph's) until ``recompile()``.  For
    a graph that is only read or about to change: a symbolic step (never run, only
    specialized), a copy the passes rewrite.  Calling it before ``recompile()`` raises.
    ``attrs``: attributes set as they are (a ``get_attr`` of one reads it, not ``root``)."""
    gm = fx.GraphModule(root, fx.Graph())  # an empty graph: nothing to copy, trivial code
    from torch.fx.graph_module import _copy_attr  # what GraphModule.__init__ uses (dotted names too)
    attrs = dict(attrs or {})
    for name, value in attrs.items():
        setattr(gm, name, value)
    for node in graph.nodes:
        if node.op == "get_attr" and node.target not in attrs:
            _copy_attr(root, gm, node.target)
    gm._graph = graph  # the property setter would generate code
    graph.owning_module = gm
    return without_code(gm)


def _record_values(gm: fx.GraphModule, binding: Mapping, sym: SymbolicStep) -> None:
    """Every node's ``meta["val"]``: a fake tensor of its concrete size, stride and offset,
    as ``trace`` records them (built from a meta tensor: no fake dispatch per node).  A
    value with no symbol in it is the same at every binding: built once per symbolic
    step and shared (passes only read a value's layout)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    static = sym.static_values
    mode = static.get("mode")
    if mode is None:
        mode = static["mode"] = FakeTensorMode(allow_non_fake_inputs=True, allow_fallback_kernels=True)

    here: dict = {}  # layouts with a symbol in them, at this binding (many nodes share one)
    # a module function, not a recursive closure: that would be a reference cycle holding
    # ``here``'s fake tensors until a collection
    concrete = functools.partial(_concrete, binding=binding, static=static, here=here, mode=mode)

    for node in gm.graph.nodes:
        if meta.SYM in node.meta:
            node.meta["val"] = concrete(node.meta.pop(meta.SYM))


def _concrete(v, binding: Mapping, static: dict, here: dict, mode):
    """``_record_values``' value of ``v`` at ``binding`` (layouts cached in ``static`` or ``here``)."""
    if isinstance(v, SymTensor):
        if v in static:
            return static[v]
        if v in here:
            return here[v]
        shape = [_value(x, binding, "a size") for x in v.shape]
        stride = [_value(x, binding, "a stride") for x in v.stride]
        offset = _value(v.offset, binding, "an offset")
        span = 0 if 0 in shape else 1 + sum((n - 1) * st for n, st in zip(shape, stride))
        base = torch.empty(offset + span, dtype=v.dtype, device="meta")
        fake = mode.fake_tensor_converter.from_meta_and_device(mode, base.as_strided(shape, stride, offset), v.device)
        (here if _free(v) else static)[v] = fake
        return fake
    if isinstance(v, (list, tuple)):
        return type(v)(_concrete(x, binding, static, here, mode) for x in v)
    return None if v is None else _value(v, binding, "a value")


def _free(v: SymTensor) -> bool:
    return any(not isinstance(x, int) for x in (*v.shape, *v.stride, v.offset))


def _drop_whole_slices(gm: fx.GraphModule) -> int:
    """Replace every slice that keeps all of its input (``whole_slice``) by its input."""
    dropped = 0
    for node in list(gm.graph.nodes):
        if whole_slice(node):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            dropped += 1
    return dropped


def bind_dims(sym: SymbolicStep, dims: Mapping[str, int]) -> SymbolicStep:
    """``sym`` with some of its dims bound to values, the others still symbolic: for example an
    off-catalog chunk's step at one chunk length, its prompt length left free (what a capacity
    form of that chunk takes: ``passes.capacity``).  Every recorded value and placeholder shape
    is the expression with those symbols replaced; a guard that holds at them is dropped, one
    that fails refuses (``SpecializationRefused``).  ``sym`` is left as it was."""
    import sympy
    unknown = set(dims) - set(sym.dims)
    if unknown or set(dims) == set(sym.dims):
        raise SpecializationRefused(f"bind_dims binds some of {sorted(sym.dims)}, not {sorted(dims)} "
                                    f"(all of them: specialize)")
    binding = {sym.symbols[d]: sympy.Integer(int(v)) for d, v in dims.items()}
    guards = []
    for g in sym.guards:
        v = g.xreplace(binding)
        if v is sympy.true or v is True:
            continue
        if v is sympy.false or v is False:
            raise SpecializationRefused(f"guard {g} does not hold at {dict(dims)}")
        guards.append(v)
    graph = fx.Graph()
    graph.output(graph.graph_copy(sym.gm.graph, {}))
    memo: dict = {}  # expression -> its value here: the same sizes recur on thousands of nodes
    for node in graph.nodes:
        if meta.SYM in node.meta:
            node.meta[meta.SYM] = _rebind(node.meta[meta.SYM], binding, memo)
    gm = module_without_code(sym.gm, graph)
    gm.meta.update(sym.gm.meta)
    placeholders = tuple(dataclasses.replace(p, shape=tuple(_rebind(x, binding) for x in p.shape))
                         for p in sym.placeholders)
    return dataclasses.replace(sym, gm=gm, dims={d: v for d, v in sym.dims.items() if d not in dims},
                               symbols={d: s for d, s in sym.symbols.items() if d not in dims},
                               placeholders=placeholders, guards=tuple(guards), static_values={})


def _rebind(v, binding: Mapping, memo: "dict | None" = None):
    """A recorded value with ``binding``'s symbols replaced (an expression left with none: an int);
    ``memo``: expressions already replaced under this ``binding`` (sympy's are immutable and
    compare by structure, so an equal expression has the equal result)."""
    if isinstance(v, SymTensor):
        return SymTensor(tuple(_rebind(x, binding, memo) for x in v.shape),
                         tuple(_rebind(x, binding, memo) for x in v.stride), _rebind(v.offset, binding, memo),
                         v.dtype, v.device)
    if isinstance(v, (list, tuple)):
        return type(v)(_rebind(x, binding, memo) for x in v)
    if getattr(v, "free_symbols", None):
        if memo is not None and v in memo:
            return memo[v]
        out = v.xreplace(binding)
        if getattr(out, "is_Integer", False):
            out = int(out)
        if memo is not None:
            memo[v] = out
        return out
    return v
