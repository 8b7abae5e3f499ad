"""Pass infrastructure, shaped after ``torch.fx.passes.infra``.

A pass is an object with ``requires(gm)`` (preconditions), ``call(gm)`` returning a
``PassResult(graph_module, modified, record)`` and ``ensures(gm)`` (postconditions).
A pass keeps no state between calls: what it did is its result's ``record``.
``PassManager`` runs an ordered list, checks explicit ordering constraints, lints the
graph (``Graph.lint``: every argument defined before its use, names unique, targets
present) after every pass in debug mode and once after the last pass otherwise (about
30 ms per lint of a released model's entry, ten passes per entry, every new prompt
length), and, on failure, says which passes ran before.  A pass called alone lints its result.

Generated code: ``gm.recompile()`` turns the graph into Python source (about a second
at a released model's size).  A pass called alone regenerates it before its
``ensures``; ``PassManager`` regenerates it once, after the last pass, unless a pass
declares ``ensures_runs_code`` (its check calls the module itself) or debug is on; a
manager built with ``code=False`` never does (its result is only read, lowered from a
copy or interpreted: calling it raises, ``without_code``).  Passes read the graph, never
``gm.code``; an ``fx.Interpreter`` also runs the graph, so the hazard checks need no
fresh code.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
import sys
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from .. import step as meta
from ..errors import PassError
from ..foreground import make_way


@dataclasses.dataclass
class PassResult:
    graph_module: fx.GraphModule
    modified: bool
    record: Any = None  # a small, printable result (what the pass did)


class CadencePass:
    """Base class: override ``call``; ``requires``/``ensures`` raise ``PassError``."""

    name: str = "pass"
    #: ``ensures`` calls the module's generated code (so it must be regenerated first)
    ensures_runs_code: bool = False

    def requires(self, gm: fx.GraphModule) -> None:  # noqa: D401 - hook
        return None

    def call(self, gm: fx.GraphModule) -> PassResult:
        raise NotImplementedError

    def ensures(self, gm: fx.GraphModule) -> None:
        return None

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        return self.run(gm, recompile=True)

    def run(self, gm: fx.GraphModule, recompile: bool, lint: bool = True) -> PassResult:
        """requires, call, lint (unless a ``PassManager`` lints once at its end), (regenerate
        the code), ensures."""
        self.requires(gm)
        result = self.call(gm)
        if lint:
            result.graph_module.graph.lint()
        if recompile or self.ensures_runs_code:
            result.graph_module.recompile()
        self.ensures(result.graph_module)
        return result

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


_CALLS = ("call_function", "call_method", "call_module")


def add_node(graph: fx.Graph, op: str, target: Any, args: tuple = (), kwargs: "dict | None" = None,
             name: "str | None" = None, type_expr: Any = None) -> fx.Node:
    """``graph.create_node(...)``: the same node, at the same place, faster.

    torch 2.13's ``create_node`` walks a call's arguments with pytree to warn about a raw
    ``SymInt`` among them, about 70% of the time it takes to copy a node there.  Copies
    of nodes torch made (specialize, partition, the memo, the program cache) are much of
    a new prompt length's host work, so a call node here is created without arguments
    and given them by assignment (``Node.args``/``kwargs``: the same bookkeeping of uses
    as construction, without the walk).  torch 2.11's ``create_node`` does not walk:
    there it changes nothing (paired on the released model, ``docs/results``).  A graph
    whose module watches node creation (``_create_node_hooks``) is handed to
    ``create_node`` as is: its hooks see the node as they always do.
    """
    owner = graph.owning_module
    if (op not in _CALLS or not (args or kwargs)
            or (owner is not None and getattr(owner, "_create_node_hooks", None))):
        return graph.create_node(op, target, args, kwargs, name, type_expr)
    node = graph.create_node(op, target, (), None, name, type_expr)
    if args:
        node.args = args
    if kwargs:
        node.kwargs = kwargs
    return node


def copy_node(graph: fx.Graph, node: fx.Node, arg_transform: Callable[[fx.Node], Any] = lambda n: n) -> fx.Node:
    """``graph.node_copy(node, arg_transform)`` through ``add_node``: the same copy."""
    args = fx.node.map_arg(node.args, arg_transform)
    kwargs = fx.node.map_arg(node.kwargs, arg_transform)
    new = add_node(graph, node.op, node.target, args, kwargs, node.name, node.type)
    new.meta = copy.copy(node.meta)
    return new


def this_before_that(this: type, that: type) -> Callable[[Sequence[CadencePass]], bool]:
    """Ordering constraint: every ``this`` pass comes before every ``that`` pass."""

    def check(passes: Sequence[CadencePass]) -> bool:
        seen_that = False
        for p in passes:
            if isinstance(p, that):
                seen_that = True
            if isinstance(p, this) and seen_that:
                return False
        return True

    check.__name__ = f"{this.__name__}_before_{that.__name__}"
    return check


class PassManager:
    """Runs passes in order; ``checks`` run after every pass when ``debug`` is on.

    The module's code is regenerated once, after the last pass (after every pass in
    debug mode, or with ``recompile_every_pass``: how it was done before, kept to
    measure and to compare against); with ``code=False`` never after the last pass: the
    result's ``forward`` raises (``without_code``).
    """

    recompile_every_pass: bool = False

    def __init__(self, passes: Sequence[CadencePass], constraints=(), checks=(), debug: bool = False,
                 let_go: "Callable[[fx.GraphModule], None] | None" = None, code: bool = True):
        self.passes = list(passes)
        self.code = code
        self.constraints = list(constraints)
        self.checks = list(checks)
        self.debug = debug
        #: called, once the whole pipeline succeeded, on each module a pass replaced by a new
        #: one (partition's split: the pre-partition graph, ~9k-16k nodes an entry, that
        #: nothing runs again), so its graph can be unlinked and freed by reference count;
        #: the caller's input among them (it must not use it after)
        self.let_go = let_go
        for c in self.constraints:
            if not c(self.passes):
                raise PassError(f"pass order violates {c.__name__}: {[type(p).__name__ for p in self.passes]}")

    def __call__(self, gm: fx.GraphModule) -> tuple[fx.GraphModule, list[PassResult]]:
        results: list[PassResult] = []
        replaced: list[fx.GraphModule] = []
        every = self.debug or self.recompile_every_pass
        for i, p in enumerate(self.passes):
            make_way()  # a background build steps aside while a chunk runs (foreground.py)
            try:
                res = p.run(gm, recompile=every, lint=every)
                if res.graph_module is not gm:
                    replaced.append(gm)
                gm = res.graph_module
                if self.debug:
                    for check in self.checks:
                        check(gm)
            except Exception as e:  # re-raise with the pipeline position
                ran = [type(q).__name__ for q in self.passes[:i]]
                raise PassError(f"{type(p).__name__} failed after {ran}: {e}") from e
            results.append(res)
        if not every:
            make_way()
            try:
                gm.graph.lint()  # the graph that runs; each pass's own ensures ran on its result
            except Exception as e:
                raise PassError(f"the graph after {[type(q).__name__ for q in self.passes]} is malformed: {e}") from e
            make_way()
            gm.recompile() if self.code else without_code(gm)
        elif not self.code:
            without_code(gm)
        if self.let_go is not None:
            for old in replaced:
                self.let_go(old)
        return gm, results


def lazy_graph_module_class() -> type:
    """torch's lazy GraphModule where it has one: a module of it generates its Python code
    once, when it first runs (or its ``code`` is read), not at construction or at every
    ``recompile`` before that.  A partition's pieces (their code is generated at capture, or
    never where a region's capture walks the graph) and a decoded runnable graph (a capacity
    graph that lowering splits into pieces never runs as itself) use it."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:  # pragma: no cover - older torch
        return fx.GraphModule
    return _LazyGraphModule


def without_code(gm: fx.GraphModule) -> fx.GraphModule:
    """Mark ``gm``'s Python code as not generated: its ``forward`` (code of an earlier graph,
    or none) raises until ``recompile()``, which replaces it.  For a module only read,
    rewritten or interpreted (``fx.Interpreter`` walks the graph, not the code)."""
    type(gm).forward = _not_generated  # its own class (fx makes one per GraphModule)
    return gm


def _not_generated(self, *args, **kwargs):
    raise RuntimeError("this GraphModule's code was not generated (passes.base.without_code): "
                       "call recompile() before running it")


def fake_tensor(mode, shape, stride, dtype: torch.dtype, device, offset: int = 0) -> torch.Tensor:
    """A fake tensor of ``mode`` with that layout, made as the mode makes one (``FakeTensor``
    over a meta tensor) without dispatching an op through the mode (its cache hashes the
    arguments: ~100 us a tensor against ~17 here).  Call it outside the mode (inside it,
    the meta tensor would be made fake too: ``unset_fake_temporarily``)."""
    from torch._subclasses.fake_tensor import FakeTensor
    extent = offset + (sum((s - 1) * st for s, st in zip(shape, stride)) + 1 if all(shape) else 0)
    elem = torch.empty(extent, dtype=dtype, device="meta").as_strided(shape, stride, offset)
    return FakeTensor(mode, elem, torch.device(device))


# ----------------------------------------------------------------- op classification
#: in-place ops that change a tensor's sizes, strides or storage (a copy of its values would not)
LAYOUT_IN_PLACE = frozenset({"resize_", "resize_as_", "set_", "as_strided_", "t_", "transpose_", "squeeze_",
                             "unsqueeze_", "swapaxes_", "swapdims_", "_unsafe_set_version_counter"})


def changes_layout_in_place(target) -> bool:
    """Whether ``target`` is an op of ``LAYOUT_IN_PLACE`` (any overload)."""
    return isinstance(target, torch._ops.OpOverload) and target.overloadpacket.__name__ in LAYOUT_IN_PLACE


def is_random(node: fx.Node) -> bool:
    """Ops that draw from a generator: they must run exactly as often as in eager."""
    t = node.target
    if not isinstance(t, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in t.tags:
        # dropout is seeded only when training; eval dropout is a pure identity
        if t.overloadpacket in (torch.ops.aten.dropout, torch.ops.aten.native_dropout):
            args = list(node.args) + [None, None, None]
            train = node.kwargs.get("train", args[2])
            return bool(train)
        return True
    return False


@dataclasses.dataclass(frozen=True)
class _SchemaFacts:
    """What the classifiers below read from an operator's schema (``t._schema`` builds a
    new Python object on every access: read once per operator, not once per node)."""

    mutable: bool
    view: bool  # the first output aliases the first input, without a write
    returns_written: bool  # the result is the (written) first argument, e.g. ``copy_``
    written: tuple[tuple[int, str], ...]  # (position, name) of every argument it writes


def by_op(table: dict, op: torch._ops.OpOverload, compute: Callable[[torch._ops.OpOverload], Any]) -> Any:
    """``compute(op)``, cached in ``table`` by ``id(op)``: an ``OpOverload``'s ``__hash__`` is
    Python code, and the passes ask ~10^5 times per new prompt length.  The entry holds
    the op, so its id is never reused (ops live as long as torch anyway)."""
    hit = table.get(id(op))
    if hit is not None and hit[0] is op:
        return hit[1]
    value = compute(op)
    table[id(op)] = (op, value)
    return value


_FACTS: dict[int, tuple] = {}  # by_op's table for _facts


def _facts(t: torch._ops.OpOverload) -> _SchemaFacts:
    return by_op(_FACTS, t, _schema_facts)


def _schema_facts(t: torch._ops.OpOverload) -> _SchemaFacts:
    schema = t._schema
    ret = schema.returns[0].alias_info if schema.returns else None
    first = schema.arguments[0].alias_info if schema.arguments else None
    return _SchemaFacts(
        mutable=schema.is_mutable,
        view=not schema.is_mutable and bool(schema.returns) and ret is not None and not ret.is_write,
        returns_written=(ret is not None and ret.is_write and first is not None and first.is_write
                         and ret.before_set == first.before_set),
        written=tuple((i, a.name) for i, a in enumerate(schema.arguments)
                      if a.alias_info is not None and a.alias_info.is_write))


def is_mutating(node: fx.Node) -> bool:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return _facts(t).mutable
    return False


def is_view(node: fx.Node) -> bool:
    """An op whose first output aliases its first input (no write)."""
    t = node.target
    if t is operator.getitem:
        return True
    if not isinstance(t, torch._ops.OpOverload):
        return False
    return _facts(t).view


def returns_written(node: fx.Node) -> bool:
    """An in-place op whose result is its first (written) argument, e.g. ``copy_``."""
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and _facts(t).returns_written


#: ``GraphModule.meta`` key of a shared step's ``CallSummary`` (``passes.step_share``)
CALL_SUMMARY = "cadence_call_summary"


@dataclasses.dataclass(frozen=True)
class CallSummary:
    """What a ``call_module`` of a shared step does to its arguments, as the analyses
    here see one op: which arguments it writes (through any view), which argument each
    returned value is (a view of, or an in-place op's result on) or None (fresh
    memory), and whether it draws random numbers, writes or is impure at all."""

    written: tuple[int, ...]
    aliases: tuple["int | None", ...]
    effects: bool


def call_summary(node: fx.Node) -> "CallSummary | None":
    """The summary of a ``call_module`` node's submodule, or None (not a shared step)."""
    if node.op != "call_module":
        return None
    owner = node.graph.owning_module
    sub = owner.get_submodule(node.target) if owner is not None else None
    return getattr(sub, "meta", {}).get(CALL_SUMMARY)


def aliased_arg(node: fx.Node) -> "fx.Node | None":
    """The argument a view-like node's value is memory of: a view's or an in-place op's
    first argument; for an item of a shared step's result, the argument that item
    aliases (None: fresh memory)."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    src = node.args[0]
    if node.target is operator.getitem and src.op == "call_module":
        summary = call_summary(src)
        if summary is None:
            return src
        i = summary.aliases[node.args[1]]
        return src.args[i] if i is not None and isinstance(src.args[i], fx.Node) else None
    if is_view(node) or returns_written(node):
        return src
    return None


_SLICE_DEFAULTS = (0, None, None, 1)  # aten.slice.Tensor(self, dim=0, start=None, end=None, step=1)


def whole_slice(node: fx.Node) -> bool:
    """Whether ``node`` is an ``aten.slice.Tensor`` that keeps all of its input (its
    result is its input's view unchanged: the same sizes, strides and offset): start 0,
    step 1, and an end at or past the sliced dim's size.  Read from the arguments where
    they say so (no end, or torch 2.5's ``2**63 - 1`` for a ``:``, as in ``buf[:, :n]``'s
    ``slice(buf, 0, 0, 2**63 - 1)``), else from the input's value (``meta["val"]``, or a
    ``get_attr``'s tensor: ``step.value``); ``False`` where neither tells."""
    if node.op != "call_function" or node.target is not torch.ops.aten.slice.Tensor:
        return False
    src = node.args[0]
    if not isinstance(src, fx.Node):
        return False
    rest = list(node.args[1:]) + list(_SLICE_DEFAULTS[len(node.args) - 1:])
    dim, start, end, step_ = (node.kwargs.get(k, v) for k, v in zip(("dim", "start", "end", "step"), rest))
    if start not in (None, 0) or step_ not in (None, 1):
        return False
    if end is None or end == sys.maxsize:
        return True
    if type(end) is not int or type(dim) is not int:
        return False  # a symbolic or computed end: only a value could tell, and it may change
    gm = node.graph.owning_module
    val = meta.value(gm, src) if gm is not None or src.op != "get_attr" else None
    if not isinstance(val, torch.Tensor) or not -val.dim() <= dim < val.dim():
        return False
    size = val.shape[dim]
    return type(size) is int and end >= size


def view_root(node: fx.Node) -> fx.Node:
    """Follow view ops (and in-place ops' results, which alias what they wrote) back to the tensor."""
    while True:
        src = aliased_arg(node)
        if src is None:
            return node
        node = src


def view_roots(gm: fx.GraphModule) -> dict[fx.Node, fx.Node]:
    """``view_root`` of every node, in one walk (each node's root is its source's)."""
    roots: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        src = aliased_arg(node)
        roots[node] = roots[src] if src is not None and src in roots else node
    return roots


def has_side_effect(node: fx.Node) -> bool:
    if node.op == "call_module":
        summary = call_summary(node)
        return summary is None or summary.effects  # a module not summarized: assume it has one
    return node.op in ("placeholder", "output") or is_random(node) or is_mutating(node) or node.is_impure()


def written_args(node: fx.Node) -> list[fx.Node]:
    """The node arguments an op writes into (per its schema's alias annotations; for a
    shared step's call, per its ``CallSummary``)."""
    t = node.target
    if node.op == "call_module":
        summary = call_summary(node)
        if summary is None:
            return []
        return [node.args[i] for i in summary.written if isinstance(node.args[i], fx.Node)]
    if not isinstance(t, torch._ops.OpOverload):
        return []
    out = []
    for i, name in _facts(t).written:
        val = node.args[i] if i < len(node.args) else node.kwargs.get(name)
        if isinstance(val, fx.Node):
            out.append(val)
        elif isinstance(val, (list, tuple)):
            out.extend(v for v in val if isinstance(v, fx.Node))
    return out


def op_counts(gm: fx.GraphModule) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function":
            key = str(n.target)
            counts[key] = counts.get(key, 0) + 1
    return counts
