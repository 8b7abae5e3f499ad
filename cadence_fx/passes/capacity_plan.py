"""capacity_plan: how each node of a symbolic step runs when its sizes are held at a capacity.

The analysis half of ``passes.capacity`` (which rewrites the graph as this says): each
node that touches a symbol gets a mode, ``capacity`` (its op at the capacity gives the
live prefix exactly, by a rule below) or ``exact`` (it runs at the stream's own sizes,
on views of the live prefixes), and a reason.  ``CapacityPlan`` is that, as plain data
(printable, ``explain``); ``check_dims`` is what binding a stream's dims must pass.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Mapping

import torch
import torch.fx as fx

from .. import step as meta
from ..errors import SpecializationRefused, TraceError
from ..step import Role
from .base import is_mutating, is_view, view_root, written_args
from .capacity_ops import _refusal, size_at
from .specialize import _ASSERTS, _value, expr_text
from .trace_symbolic import SymbolicStep, SymTensor, _free_symbols

CAPACITY, EXACT, DEVICE = "capacity", "exact", "device"
_MODE, _OF = "cadence_capacity", "cadence_capacity_of"  # node.meta: how it runs, the step's node it is
aten = torch.ops.aten

_STRUCTURAL = {"transpose", "t", "permute", "unsqueeze", "squeeze", "alias", "detach", "clone", "contiguous",
               "_to_copy", "lift_fresh_copy", "alias_copy", "to", "zeros_like", "ones_like", "empty_like",
               "full_like", "type_as"}
_RESHAPES = {"view", "reshape", "_unsafe_view", "view_as", "reshape_as", "flatten", "unflatten"}
_FACTORIES = {"zeros", "ones", "full", "empty", "new_zeros", "new_ones", "new_full", "new_empty"}
_SPLITS = {"split", "split_with_sizes", "chunk", "unbind"}
_ATTENTION = {"scaled_dot_product_attention"}
#: views that keep indices: an exact one runs on the live prefix's view (its memory, the step's aliasing)
_INDEX_VIEWS = {"slice", "narrow", "select", "transpose", "t", "permute", "unsqueeze", "squeeze", "expand",
                "alias", "detach", "split", "split_with_sizes", "chunk", "unbind", "dropout"}
_BY_OFFSET = {"as_strided", "as_strided_", "as_strided_scatter", "as_strided_copy", "set_", "_reshape_alias"}
#: integer division by the padding raises: these run exact on integer operands
_DIVISIONS = {"div", "floor_divide", "remainder", "fmod", "div_", "floor_divide_", "remainder_", "fmod_"}


def exact_view(node: fx.Node) -> bool:
    """An exact node run on views of the live prefixes (not copies): a view that keeps indices,
    or an item of one."""
    return node.target is operator.getitem or (is_view(node) and _name(node) in _INDEX_VIEWS)


def _returns_alias(node: fx.Node) -> bool:
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and any(r.alias_info is not None for r in t._schema.returns)


class CapacityRefused(TraceError):
    """The step cannot be held at a capacity (an expression the rewrite cannot compute)."""


# ---------------------------------------------------------------- the plan

@dataclasses.dataclass(frozen=True)
class CapacityPlan:
    """How each node touching a symbol runs: ``(node, mode, how)``; pure data, printable."""

    capacity: dict  # dim -> the value sizes are held at
    symbols: dict  # dim -> its symbol's name
    modes: tuple  # (node name, CAPACITY | EXACT, how or why)
    attention: str  # over padded keys: "masked", "exact", or "probed" (the caller's probe decided each)
    extents: tuple = ()  # every padded size expression (text), checked by ``check_dims``
    islands: tuple = ()  # the exact nodes, grouped by data edges (node names)

    def counts(self) -> dict:
        out: dict = {}
        for _, mode, how in self.modes:
            out.setdefault(mode, {}).setdefault(how, 0)
            out[mode][how] += 1
        return {m: dict(sorted(c.items())) for m, c in sorted(out.items())}

    def explain(self) -> str:
        cap = ", ".join(f"{d} <= {c}" for d, c in self.capacity.items())
        lines = [f"capacity form: {cap}; attention over padded keys: "
                 f"{self.attention}"]
        for mode, hows in self.counts().items():
            lines.append(f"  {mode}: {sum(hows.values())} nodes (" +
                         ", ".join(f"{h} {n}" for h, n in hows.items()) + ")")
        lines.append(f"  islands: {len(self.islands)}" +
                     (f", largest {max(len(i) for i in self.islands)} nodes" if self.islands else ""))
        return "\n".join(lines)


def _padded(v) -> dict:
    """dim -> size expression, for each dim of a recorded tensor value whose size carries a symbol."""
    if not isinstance(v, SymTensor):
        return {}
    return {d: s for d, s in enumerate(v.shape) if getattr(s, "free_symbols", None)}


def _texts(xs) -> tuple:
    return tuple(expr_text(x) for x in xs)


def _symbolic(x) -> bool:
    return bool(getattr(x, "free_symbols", None))


def _name(node: fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return t.overloadpacket.__name__
    return getattr(t, "__name__", str(t))


class _Walk:
    """The mode of every node (shared by ``plan_capacity`` and ``capacity_form``)."""

    def __init__(self, sym: SymbolicStep, masked_attention):
        self.sym, self.masked = sym, masked_attention
        self.probed: dict = {}  # a probe's answers (``plan_capacity``)
        self.written_roots = {view_root(w) for n in sym.gm.graph.nodes if n.op == "call_function"
                              for w in written_args(n)}  # memory the step writes (by its base)
        self.scalar: dict[fx.Node, object] = {}  # int/bool/float nodes: their expression
        self.cap: set[fx.Node] = set()  # nodes with a capacity form
        self.exact: set[fx.Node] = set()  # nodes with an exact form of their own (not a narrow)
        self.mode: dict[fx.Node, tuple] = {}  # nodes touching a symbol: (mode, how)
        self.extents: set = set()
        for node in sym.gm.graph.nodes:
            self._visit(node)

    def value(self, a):
        return a.meta.get(meta.SYM) if isinstance(a, fx.Node) else a

    def _visit(self, node: fx.Node) -> None:
        v = node.meta.get(meta.SYM)
        for x in (v if isinstance(v, (list, tuple)) else (v,)):
            self.extents.update(_padded(x).values())
        if node.op == "placeholder":
            if meta.role(node) is Role.DIM:
                self.scalar[node] = None
            else:
                self.cap.add(node)  # the caller's tensor: at the capacity where padded
                if not _padded(v):
                    self.exact.add(node)
            return
        if node.op == "output":
            return
        if node.op == "get_attr":
            self.cap.add(node); self.exact.add(node)
            return
        if node.op != "call_function":
            raise CapacityRefused(f"{node.name}: a {node.op} node (the rewrite reads aten calls only)")
        if v is not None and not isinstance(v, (SymTensor, list, tuple)):
            self.scalar[node] = v  # an int/bool of sizes: a constant, or computed where used
            return
        ins = [a for a in node.all_input_nodes if a not in self.scalar]
        touches = (_free_symbols(v) or any(_free_symbols(self.value(a)) for a in node.all_input_nodes)
                   or any(_symbolic(self.scalar.get(a)) for a in node.all_input_nodes if a in self.scalar))
        if not touches:
            self.cap.add(node); self.exact.add(node)  # static: one form
            return
        if node.target in _ASSERTS:
            return  # checked by ``check_dims`` (the step's guards hold them)
        whole = isinstance(v, SymTensor) and not _padded(v)  # a tensor at its exact size: both forms
        if node.target is operator.getitem:  # an item of a split: the forms its list has
            src = node.args[0]
            self.mode[node] = (CAPACITY if src in self.cap else EXACT, "item")
            if src in self.cap or whole:
                self.cap.add(node)
            if src in self.exact or whole:
                self.exact.add(node)
            return
        # an input with no capacity form (an island's padded value or list): this node follows it
        missing = [a for a in ins if isinstance(self.value(a), (SymTensor, list, tuple)) and a not in self.cap]
        how = None if missing else self._rule(node, v)
        if how is None or how.startswith("exact: "):
            self.mode[node] = (EXACT, how[7:] if how else "follows an exact island")
            self.exact.add(node)
            if whole:
                self.cap.add(node)
            self._check_exact(node)
            return
        self.mode[node] = (CAPACITY, how)
        self.cap.add(node)
        if whole:
            self.exact.add(node)

    def _check_exact(self, node: fx.Node) -> None:
        """An exact node runs on the live prefixes: views of them where it is a view that keeps
        indices (``exact_view``) or the memory it writes, else copies in the step's own layout
        (``capacity_ops.faithful``).  A copy cannot stand for memory the step writes: an op that
        returns an alias of such an input is refused, and so is one reading storage by offset."""
        if exact_view(node):
            return
        name = _name(node)
        if name in _BY_OFFSET:
            raise CapacityRefused(f"{node.name}: {name} reads memory by offset and stride, which the capacity moves")
        if not _returns_alias(node):
            return
        for a in node.all_input_nodes:
            if _free_symbols(self.value(a)) and view_root(a) in self.written_roots:
                raise CapacityRefused(f"{node.name}: {name} of {a.name}, a value whose memory the step writes "
                                      f"and the capacity form holds at other strides")

    # ------------------------------------------------------------ rules: a "how", or "exact: why"

    def _sym_args(self, node: fx.Node) -> list:
        out = []
        fx.node.map_arg((node.args, node.kwargs), lambda a: out.append(a) if _symbolic(self.scalar.get(a)) else None)
        return out

    def _rule(self, node: fx.Node, v) -> "str | None":
        t = node.target
        if not isinstance(t, torch._ops.OpOverload):
            return "exact: not an aten op"
        name = _name(node)
        sym_args = self._sym_args(node)
        ins = [(a, self.value(a)) for a in node.all_input_nodes if a not in self.scalar]
        if name in _ATTENTION or (name == "copy_" and len(node.args) >= 2):
            if sym_args:
                return "exact: symbolic argument"
            return self._attention(node) if name in _ATTENTION else self._copy(node, v)
        if is_mutating(node):
            return "exact: writes in place"
        if torch.Tag.nondeterministic_seeded in t.tags and name != "dropout":  # (attention: only without dropout)
            return "exact: draws random numbers"  # how many would follow the padding
        if name == "dropout":
            return "view" if len(node.args) > 2 and node.args[2] is False and not sym_args else "exact: dropout"
        if name in _STRUCTURAL:
            return "exact: symbolic argument" if sym_args else "view"
        if name in _RESHAPES or name in ("expand", "expand_as"):
            src = self.value(node.args[0])
            return "reshape" if self._same_layout(src, v, name.startswith("expand")) else "exact: moves a padded dim"
        if name in ("slice", "narrow"):
            return self._slice(node, v, name)
        if name == "select":
            src, d = self.value(node.args[0]), node.args[1]
            return "exact: selects in a padded dim" if (d % len(src.shape)) in _padded(src) or sym_args else "view"
        if name in _SPLITS:
            src = self.value(node.args[0])
            d = node.args[1] if name == "unbind" and len(node.args) > 1 else (node.args[2] if len(node.args) > 2 else 0)
            d = node.kwargs.get("dim", d)
            return "exact: splits a padded dim" if (d % len(src.shape)) in _padded(src) or sym_args else "view"
        if name in _FACTORIES or (name == "arange" and len(node.args) == 1):
            return "factory" if self._sizes_only(node, v) else "exact: symbolic argument"
        if name in ("cat", "stack"):
            return self._cat(node, v, name)
        if name == "repeat":
            return "exact: symbolic argument" if sym_args else (
                "copy" if all(node.args[1][len(node.args[1]) - len(v.shape) + d] == 1 for d in _padded(v))
                else "exact: repeats a padded dim")
        if sym_args:
            return "exact: symbolic argument"
        if torch.Tag.pointwise in t.tags and isinstance(v, SymTensor):
            if name in _DIVISIONS and not all(x.dtype.is_floating_point for x in [v] + [iv for _, iv in ins]
                                              if isinstance(x, SymTensor)):
                return "exact: integer division (the padding may hold zeros)"
            return "pointwise" if all(self._aligned(iv, v) for _, iv in ins) else "exact: operands not aligned"
        return "exact: reads a padded dim"

    def _aligned(self, iv, out) -> bool:
        """Broadcasting ``iv`` to ``out`` keeps each padded dim where it is, at the same size."""
        if not isinstance(iv, SymTensor):
            return True
        pi, po, k = _padded(iv), _padded(out), len(out.shape) - len(iv.shape)
        for d, e in pi.items():
            if po.get(d + k) != e:
                return False
        for d, e in po.items():
            j = d - k
            if 0 <= j < len(iv.shape) and iv.shape[j] != 1 and pi.get(j) != e:
                return False
        return True

    def _same_layout(self, src, out, expand: bool) -> bool:
        """A reshape (or expand) that keeps every padded dim whole, at the same place in the
        index order: the padded sizes in order are the same, and so are the products of the
        static sizes between them."""
        if not isinstance(src, SymTensor) or not isinstance(out, SymTensor):
            return False
        if expand:
            return self._aligned(src, out)

        def segments(shape):
            out, run = [], 1
            for s in shape:
                if _symbolic(s):
                    out += [run, s]; run = 1
                else:
                    run *= int(s)
            return out + [run]
        return segments(src.shape) == segments(out.shape)

    def _slice(self, node, v, name) -> str:
        src = self.value(node.args[0])
        args = list(node.args[1:]) + [None] * 4
        d = node.kwargs.get("dim", args[0] if args[0] is not None else 0) % len(src.shape)
        start = node.kwargs.get("start", args[1])
        step = node.kwargs.get("step", args[3] if name == "slice" else 1) or 1
        start_v = self.scalar.get(start, start) if isinstance(start, fx.Node) else start
        if d not in _padded(src):
            return "exact: symbolic argument" if self._sym_args(node) else "view"
        if not isinstance(start_v, int) or start_v < 0 or not isinstance(step, int) or step < 1:
            return "exact: slices a padded dim from a symbolic start"
        return "slice"  # emitted with its end at the output's size at the capacity

    def _sizes_only(self, node, v) -> bool:
        """A factory's symbolic arguments are all in its size list, each the padded size of
        its value at that dim (a fill value or dtype computed from a size is not)."""
        at = 1 if _name(node).startswith("new_") else 0
        size = node.args[at] if len(node.args) > at else node.kwargs.get("size")
        if not isinstance(size, (list, tuple)):  # arange(end): the end is the one size
            size = [size]
        inside = [a for a in size if isinstance(a, fx.Node) and _symbolic(self.scalar.get(a))]
        if len(inside) != len(self._sym_args(node)) or len(size) != len(v.shape):
            return False
        return all(not _symbolic(self.scalar.get(a)) or self.scalar[a] == v.shape[d]
                   for d, a in enumerate(size) if isinstance(a, fx.Node))

    def _cat(self, node, v, name) -> str:
        parts = node.args[0]
        d = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0))
        pv = [self.value(p) for p in parts]
        if self._sym_args(node):
            return "exact: symbolic argument"
        if name == "stack":
            return "copy" if all(x.shape == pv[0].shape for x in pv) else "exact: parts differ"
        d %= len(v.shape)
        rest = [{k: e for k, e in _padded(x).items() if k != d} for x in pv if x.shape[d] != 0]
        if any(r != rest[0] for r in rest):
            return "exact: parts padded differently"
        if d not in _padded(v):
            return "copy"
        padded = [i for i, x in enumerate(pv) if d in _padded(x)]
        return "copy" if padded == [len(pv) - 1] else "offset cat"

    def _copy(self, node, v) -> str:
        dst, src = (self.value(a) for a in node.args[:2])
        if not self._aligned(src, dst):
            return "exact: operands not aligned"
        return "masked write" if _padded(dst) else "copy"

    def _attention(self, node) -> str:
        q, k, v = (self.value(a) for a in node.args[:3])
        extra = list(node.args[3:]) + [x for key, x in node.kwargs.items() if key not in ("scale",)]
        if _padded(q):
            return "exact: padded queries"
        if not len(q.shape) == len(k.shape) == len(v.shape) == 4:
            return "exact: attention not over [batch, heads, tokens, channels]"  # the form measured
        if not _padded(k):
            return "exact: keys not padded"  # (only their strides carry a symbol)
        kd = len(k.shape) - 2
        if set(_padded(k)) != {kd} or _padded(k) != _padded(v) or any(x not in (None, 0, 0.0, False) for x in extra):
            return "exact: masked or causal attention"
        if callable(self.masked):  # the caller's probe, asked once per layout, live size and scale
            scale = node.kwargs.get("scale")
            key = tuple((_texts(t.shape), _texts(t.stride), expr_text(t.offset)) for t in (q, k, v)) + (
                q.dtype, expr_text(_padded(k)[kd]), scale)
            if key not in self.probed:
                self.probed[key] = bool(self.masked(q, k, v, _padded(k)[kd], scale))
            return "masked attention" if self.probed[key] else "exact: attention (the masked call differs here)"
        return "masked attention" if self.masked else "exact: attention (not found exact padded here)"


def plan_capacity(sym: SymbolicStep, capacity: Mapping[str, int], masked_attention=False) -> CapacityPlan:
    """The plan for ``sym`` held at ``capacity`` (dim -> its largest value).
    ``masked_attention``: whether attention over padded keys runs masked at the capacity
    (only where the caller checked it bit-equal to the exact call on its device and
    dtype), or ``probe(q, k, v, live, scale) -> bool`` asked once per distinct call (its query,
    key and value values, ``SymTensor``s, the keys' live size, an expression over the symbols,
    and the call's ``scale``; distinct: in any operand's layout, the live size or the scale):
    ``capacity_ops.probe_masked_attention`` runs that check on the device."""
    return _plan(sym, capacity, masked_attention)[0]


def _plan(sym: SymbolicStep, capacity: Mapping[str, int], masked_attention) -> tuple:
    if set(capacity) != set(sym.dims):
        raise CapacityRefused(f"capacity for {sorted(capacity)}, the step's dims are {sorted(sym.dims)}")
    at_cap = _binding(sym, capacity)
    for g in sym.guards:  # the capacity is a length the step serves
        if _value(g, at_cap, "a guard") is not True:
            raise CapacityRefused(f"the capacity {dict(capacity)} is outside the step's guard {g}")
    try:  # the graph checks its guards from their text at every new length: they must read back
        names_t = tuple(str(sym.symbols[d]) for d in sym.dims)
        why = _refusal(names_t, tuple(str(g) for g in sym.guards), (), tuple(int(capacity[d]) for d in sym.dims),
                       tuple(int(capacity[d]) for d in sym.dims))
    except Exception as e:  # noqa: BLE001 - a guard whose text sympy cannot read back
        raise CapacityRefused(f"a guard of the step cannot be checked from its text: {type(e).__name__}: {e}") from e
    if why:
        raise CapacityRefused(f"the capacity {dict(capacity)}: {why} (read back from its text)")
    walk = _Walk(sym, masked_attention)
    names = {d: str(s) for d, s in sym.symbols.items()}
    extents = tuple(sorted({str(e) for e in walk.extents}))
    layouts = {x for n in sym.gm.graph.nodes for v in [n.meta.get(meta.SYM)]
               for t in (v if isinstance(v, (list, tuple)) else (v,)) if isinstance(t, SymTensor)
               for x in (*t.stride, t.offset) if _symbolic(x)}  # what an exact node's layout copy computes
    _check_texts(sym, capacity, [e for e in walk.extents] + [e for e in walk.scalar.values() if _symbolic(e)]
                 + sorted(layouts, key=str))
    plan = CapacityPlan(dict(capacity), names, tuple((n.name, m, h) for n, (m, h) in walk.mode.items()),
                        "probed" if callable(masked_attention) else ("masked" if masked_attention else "exact"),
                        extents, _islands(walk))
    return plan, walk


def _binding(sym: SymbolicStep, dims: Mapping[str, int]) -> dict:
    import sympy
    return {sym.symbols[d]: sympy.Integer(int(v)) for d, v in dims.items()}


def _check_texts(sym, capacity, exprs) -> None:
    """Every expression's Python text gives sympy's value at the capacity and at the trace's dims."""
    names = tuple(str(sym.symbols[d]) for d in sym.dims)
    for at in (capacity, sym.dims):
        binding = _binding(sym, at)
        values = tuple(int(at[d]) for d in sym.dims)
        for e in exprs:
            try:
                ok = size_at(expr_text(e), names, *values) == _value(e, binding, "a size")
            except Exception:  # noqa: BLE001 - a text Python cannot evaluate
                ok = False
            if not ok:
                raise CapacityRefused(f"size {e} cannot be computed from its text (at {dict(at)})")


def _islands(walk: _Walk) -> tuple:
    exact = [n for n, (m, _) in walk.mode.items() if m == EXACT]
    parent = {n: n for n in exact}

    def root(n):
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n
    for n in exact:
        for a in n.all_input_nodes:
            if a in parent:
                parent[root(a)] = root(n)
    groups: dict = {}
    for n in exact:
        groups.setdefault(root(n), []).append(n.name)
    return tuple(tuple(g) for g in groups.values())


def check_dims(plan: CapacityPlan, sym: SymbolicStep, dims: Mapping[str, int]) -> None:
    """Refuse (``SpecializationRefused``) dims past the capacity, outside the step's guards,
    or at which a padded size would exceed its size at the capacity."""
    if set(dims) != set(plan.capacity):
        raise SpecializationRefused(f"dims {sorted(dims)}; the capacity form takes {sorted(plan.capacity)}")
    for d, v in dims.items():
        if not 0 <= int(v) <= plan.capacity[d]:
            raise SpecializationRefused(f"{d} = {v} is past the capacity {plan.capacity[d]}")
    names = tuple(str(sym.symbols[d]) for d in sym.dims)
    why = _refusal(names, tuple(str(g) for g in sym.guards), plan.extents,
                   tuple(int(dims[d]) for d in sym.dims), tuple(int(plan.capacity[d]) for d in sym.dims))
    if why:  # the check the graph's own first node makes (capacity_ops.within): one reading of the guards
        raise SpecializationRefused(f"{why} at {dict(dims)}")
