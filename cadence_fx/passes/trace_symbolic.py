"""trace_symbolic: one streaming step -> ONE pre-dispatch aten graph for every value of some dims.

``trace`` records a step at exact shapes, so every prompt length needs its own trace
(a minute on the H200 host for a released speech decoder).  Here the dims that vary
between streams (``StreamingAdapter.symbolic_dims``, e.g. ``prompt_frames``) are
free symbols: ``make_fx(..., pre_dispatch=True, tracing_mode="symbolic")`` runs the
step on fake tensors whose sizes are affine in those symbols, and records one graph
plus the guards (a ``ShapeEnv``'s) under which it is the step.  ``specialize`` binds
the dims, checks the guards and yields the graph ``trace`` would have recorded at
those shapes, without running the model's Python again.

Only the growth axes are symbolic (an axis is given as ``(dim, a, b)``: ``a * dim +
b``); every other size is static, so the trace costs about 1.3x a concrete one and
records a handful of guards.  Nothing runs for real: parameters and host constants
are recorded as in ``trace``.

Placeholders: ``dim_<d>`` (a marker whose size is dim ``d``, ``Role.DIM``), then
``in_*``/``state_*`` as in ``trace``, then ``buf_<region>`` (``Role.BUFFER``): the
module buffers bound to a region, which ``trace`` records as constants of one size.
Every node's recorded value is kept as plain data in ``node.meta[step.SYM]`` (a
sympy expression for an int/bool node, a ``SymTensor`` for a tensor) and the fake
values, which hold the trace's ``ShapeEnv``, are dropped: a ``SymbolicStep`` is plain
data plus a graph (what the disk cache stores).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Mapping, Sequence, Union

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from ..errors import NeedsForeground, TraceError
from ..foreground import fenced
from .. import step as meta
from ..step import Role, StepSignature
from .trace import autocast_recorded
from .trace_memo import DEFAULT_METHODS, TRACE_TURN, CallMemo

#: a size: an int, or ``(dim, a, b)`` for ``a * dim + b``
Size = Union[int, tuple]
Shape = tuple


@dataclasses.dataclass(frozen=True)
class SymTensor:
    """A tensor value of a symbolic graph as plain data: sizes, strides and offset
    are ints or sympy expressions over the step's symbols (``specialize`` evaluates them)."""

    shape: tuple
    stride: tuple
    offset: object
    dtype: torch.dtype
    device: torch.device


@dataclasses.dataclass(frozen=True)
class Placeholder:
    """What one placeholder of a symbolic step takes: shape (sizes may be affine in the dims) and dtype."""

    name: str
    shape: tuple  # ints and sympy expressions over the step's symbols
    dtype: torch.dtype


@dataclasses.dataclass
class SymbolicStep:
    """A step traced once with ``dims`` free; ``specialize`` makes it concrete."""

    gm: fx.GraphModule
    dims: dict[str, int]  # the values it was traced at (hints)
    symbols: dict[str, object]  # dim -> its sympy symbol
    placeholders: tuple[Placeholder, ...]  # in graph order (markers first)
    guards: tuple[object, ...]  # sympy booleans over the symbols; all must hold
    buffer_regions: tuple[str, ...]  # regions whose bound buffers are placeholders, in order
    trace_s: float = 0.0
    #: module calls recorded / copied / traced again by ``trace_memo`` (refusals by reason)
    memo: dict = dataclasses.field(default_factory=dict, compare=False)
    #: fake values with no symbol in them, built once by ``specialize`` and shared by its results
    static_values: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def describe(self) -> str:
        return (f"symbolic in {sorted(self.dims)}, {len(self.gm.graph.nodes)} nodes, "
                f"{len(self.guards)} guards, traced at {self.dims} in {self.trace_s:.1f} s")


def _size(s: Size, syms: Mapping[str, torch.SymInt]):
    if isinstance(s, tuple):
        dim, a, b = s
        return syms[dim] * a + b if a != 1 else syms[dim] + b
    return int(s)


class ModuleStateChanged(TraceError):
    """The step rebound a module's tensor while tracing on fake tensors (e.g. a table it
    extends or moves to the input's device on first use).  The modules are restored;
    running the step once for real does that first use, and a second trace records none."""


def trace_symbolic(bind: Callable, signature: StepSignature, dims: Mapping[str, int],
                   inputs: Mapping[str, tuple[Shape, torch.dtype]], state: Mapping[str, tuple[Shape, torch.dtype]],
                   buffers: Mapping[str, tuple[Shape, torch.dtype, Sequence[str]]],
                   device: torch.device, watch: Sequence[torch.nn.Module] = (),
                   memo_methods: Sequence[str] | None = DEFAULT_METHODS) -> SymbolicStep:
    """Trace ``bind(buffers_by_path, dims) -> step`` once with ``dims`` symbolic.

    ``inputs``/``state``: name -> (shape, dtype), sizes ints or ``(dim, a, b)``;
    ``buffers``: region -> (shape, dtype, module buffer paths bound to it).  Raises
    ``TraceError`` if the step cannot be traced symbolically (e.g. it reads a tensor's
    values on the host, or needs an unbacked size): the caller then traces concretely.
    ``watch``: the model's modules.  A step that rebinds one of their tensors while
    tracing would leave a fake tensor in the model (and in the graph): they are put
    back and ``ModuleStateChanged`` names the attribute.  A graph constant that is a
    fake tensor is refused too.  ``memo_methods``: the methods of ``watch``'s module
    classes whose repeated calls are copied rather than traced again
    (``trace_memo.CallMemo``; ``None``: trace every call).  One trace at a time in a
    process (``trace_memo.TRACE_TURN``: another thread's waits).
    """
    with TRACE_TURN:
        return _trace_symbolic(bind, signature, dims, inputs, state, buffers, device, watch, memo_methods)


def _trace_symbolic(bind, signature, dims, inputs, state, buffers, device, watch, memo_methods) -> SymbolicStep:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
    from torch._dynamo.source import ConstantSource

    missing = [n for n in signature.inputs if n not in inputs] + [n for n in signature.regions if n not in state]
    if missing:
        raise TraceError(f"trace_symbolic: no shape for {missing}")
    t0 = time.perf_counter()
    shape_env = ShapeEnv(duck_shape=False)  # two dims of one value stay two symbols
    mode = FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True, allow_fallback_kernels=True)
    symbols, syms = {}, {}
    for d, v in dims.items():
        sym = shape_env.create_symbol(int(v), ConstantSource(f"dim_{d}"), dynamic_dim=DimDynamic.DYNAMIC)
        symbols[d] = sym
        syms[d] = shape_env.create_symintnode(sym, hint=int(v))

    def fake(shape: Shape, dtype: torch.dtype) -> torch.Tensor:
        with mode:
            return torch.empty([_size(s, syms) for s in shape], dtype=dtype, device=device)

    names, roles, args = [], [], []
    for d in dims:
        names.append(f"dim_{d}"); roles.append((Role.DIM, {"name": d}))
        with mode:
            args.append(torch.empty((syms[d],), dtype=torch.uint8, device="meta"))
    for n in signature.inputs:
        names.append(f"in_{n}"); roles.append((Role.INPUT, {"name": n})); args.append(fake(*inputs[n]))
    for r in signature.regions:
        names.append(f"state_{r}"); roles.append((Role.STATE, {"name": r})); args.append(fake(*state[r]))
    buffer_regions = tuple(buffers)
    for r in buffer_regions:
        shape, dtype, _ = buffers[r]
        names.append(f"buf_{r}"); roles.append((Role.BUFFER, {"region": r})); args.append(fake(shape, dtype))
    nd, ni, ns = len(dims), len(signature.inputs), len(signature.regions)

    def flat(*a):
        dim_values = {d: m.shape[0] for d, m in zip(dims, a[:nd])}
        bound = {path: t for r, t in zip(buffer_regions, a[nd + ni + ns:]) for path in buffers[r][2]}
        fn = bind(bound, dim_values)
        out, new = fn(dict(zip(signature.inputs, a[nd:nd + ni])), dict(zip(signature.regions, a[nd + ni:nd + ni + ns])))
        unknown = set(new) - set(signature.regions)
        if unknown:
            raise TraceError(f"step returned undeclared state {sorted(unknown)}; declare a Region for each")
        return tuple(out[k] for k in signature.outputs) + tuple(new[k] for k in signature.regions)

    before = _module_tensors(watch)
    memo = CallMemo(watch, () if os.environ.get("CADENCE_FX_TRACE_MEMO") == "0" else (memo_methods or ()))
    try:
        # runs nothing for real (fake tensors): on a build's thread the fence alone guards the
        # generators, so a stream whose dims fall in a branch class no symbolic step serves yet
        # is traced on the worker too, instead of failing its build
        with (autocast_recorded(), torch.no_grad(), fenced([], "a symbolic trace", runs_for_real=False),
              memo.installed()):
            gm = make_fx(flat, pre_dispatch=True, tracing_mode="symbolic", _allow_non_fake_inputs=True)(*args)
    except (TraceError, NeedsForeground):  # NeedsForeground: the build's fence refused a real draw
        raise
    except Exception as e:
        raise TraceError(f"symbolic trace failed ({', '.join(dims)} free): {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from e
    finally:
        changed = _restore(watch, before)
    if changed:
        raise ModuleStateChanged(f"the step rebound {', '.join(changed[:3])} while tracing on fake tensors "
                                 f"(put back)")
    from torch._subclasses.fake_tensor import FakeTensor
    fake = [n.target for n in gm.graph.nodes if n.op == "get_attr" and isinstance(getattr(gm, n.target, None), FakeTensor)]
    if fake:
        raise TraceError(f"symbolic trace: constants {fake[:3]} are fake tensors (built while tracing and kept)")

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    specs = []
    for node, name, (role, fields), arg in zip(placeholders, names, roles, args):
        node.name = node.target = name
        meta.tag(node, role, **fields)
        specs.append(Placeholder(name, tuple(_expr(s, shape_env) for s in arg.shape), arg.dtype))

    ours = set(symbols.values())
    for node in gm.graph.nodes:
        if "val" not in node.meta:
            continue
        value = _plain(node.meta.pop("val"), shape_env)
        node.meta.pop("tensor_meta", None)
        node.meta[meta.SYM] = value
        extra = _free_symbols(value) - ours
        if extra:
            raise TraceError(f"symbolic trace: node {node.name} depends on sizes not given by "
                             f"{sorted(dims)} ({sorted(map(str, extra))}: data-dependent)")
    guards = _guards(shape_env, symbols)
    gm.meta[meta.SIGNATURE] = signature
    gm.meta[meta.DEVICE] = device
    gm.graph.lint()
    return SymbolicStep(gm, {d: int(v) for d, v in dims.items()}, symbols, tuple(specs), guards,
                        buffer_regions, round(time.perf_counter() - t0, 3), memo=dict(memo.stats))


_MISSING = object()


def _module_tensors(modules: Sequence[torch.nn.Module]) -> dict:
    """What each module holds (attributes, buffers, parameters), by (module, kind, name)."""
    out = {}
    for root in modules:
        for m in root.modules():
            for name, v in vars(m).items():
                if not name.startswith("_"):
                    out[(m, "attr", name)] = v
            for kind in ("_buffers", "_parameters"):
                for name, v in getattr(m, kind).items():
                    out[(m, kind, name)] = v
    return out


def _restore(modules: Sequence[torch.nn.Module], before: dict) -> list[str]:
    """Put back every tensor the trace bound or rebound on a module; the names of those it changed."""
    if not modules:
        return []
    after = _module_tensors(modules)
    changed = []
    for key in before.keys() | after.keys():
        old, new = before.get(key, _MISSING), after.get(key, _MISSING)
        if old is new or not (isinstance(old, torch.Tensor) or isinstance(new, torch.Tensor)):
            continue
        m, kind, name = key
        changed.append(f"{type(m).__name__}.{name}" + (" (new)" if not isinstance(old, torch.Tensor) else ""))
        target = vars(m) if kind == "attr" else getattr(m, kind)
        if old is _MISSING:
            target.pop(name, None)
        else:
            target[name] = old
    return sorted(changed)


def _expr(v, shape_env):
    """An int, or the sympy expression of a symbolic size (replacements applied)."""
    if isinstance(v, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        expr = v.node.expr
        replace = getattr(shape_env, "replace", None)
        expr = replace(expr) if replace is not None else expr
        return int(expr) if getattr(expr, "is_Integer", False) else expr
    return v


def _plain(v, shape_env):
    """A recorded value as plain data: expressions, ``SymTensor``s, and containers of them."""
    if isinstance(v, torch.Tensor):
        return SymTensor(tuple(_expr(x, shape_env) for x in v.shape), tuple(_expr(x, shape_env) for x in v.stride()),
                         _expr(v.storage_offset(), shape_env), v.dtype, v.device)
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x, shape_env) for x in v)
    if isinstance(v, (torch.SymInt, torch.SymBool, torch.SymFloat, int, float, bool)) or v is None:
        return _expr(v, shape_env)
    raise TraceError(f"symbolic trace: cannot keep a recorded value of type {type(v).__name__}")


def _free_symbols(value) -> set:
    if isinstance(value, SymTensor):
        out = set()
        for x in (*value.shape, *value.stride, value.offset):
            out |= getattr(x, "free_symbols", set())
        return out
    if isinstance(value, (list, tuple)):
        return set().union(*(_free_symbols(x) for x in value)) if value else set()
    return set(getattr(value, "free_symbols", set()))


def _guards(shape_env, symbols: Mapping[str, object]) -> tuple:
    """Every guard the trace recorded, the symbols' value ranges and their replacements."""
    import sympy
    ours = set(symbols.values())
    out = []
    for g in shape_env.guards:
        expr = g.expr
        extra = expr.free_symbols - ours
        if extra:
            raise TraceError(f"symbolic trace: a guard ({expr}) depends on sizes not given by the dims: "
                             f"{sorted(map(str, extra))}")
        out.append(expr)
    for sym in ours:
        vr = shape_env.var_to_range.get(sym)
        if vr is not None:
            for bound, rel in ((vr.lower, sympy.Ge), (vr.upper, sympy.Le)):
                if str(bound) not in ("oo", "-oo", "int_oo", "-int_oo"):  # an unbounded side holds
                    out.append(rel(sym, int(bound)))
        rep = shape_env.replacements.get(sym)
        if rep is not None:
            out.append(sympy.Eq(sym, rep))
    for expr_list in getattr(shape_env, "deferred_runtime_asserts", {}).values():
        for ra in expr_list:
            expr = ra.expr
            if expr.free_symbols - ours:
                raise TraceError(f"symbolic trace: a runtime assert ({expr}) depends on data-dependent sizes")
            out.append(expr)
    return tuple(out)
