"""Region access analysis shared by state_rewrite and partition (an analysis, not a pass).

After ``state_rewrite`` a region's carried state (read through ``state_<r>`` in the
traced graph) and the over-provisioned module buffer it replaces (written through a
``get_attr``) are the *same* arena memory, as they are in upstream eager whenever the
returned cache is a view of the buffer.  That is only sound if the graph never reads
the old state from memory the buffer has already overwritten.  ``region_hazards``
proves it for one catalog entry: it runs the graph on scratch tensors of the region
shapes and records, per op, the byte interval of every region argument it reads or
writes and whether that argument descends from the state view (``S``) or the buffer
(``B``).  Intervals over-approximate what a strided view touches, so a reported
hazard may be spurious but a real one is never missed.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping

import torch
import torch.fx as fx

from .. import step as meta
from ..step import Role, byte_interval
from .base import aliased_arg, call_summary, is_view, returns_written, written_args


@dataclasses.dataclass(frozen=True)
class Access:
    position: float  # the op's place in the graph (an op inside a shared step's call: between the call's and the next)
    node: str
    region: str
    origin: str  # "S" (through the state view), "B" (through the buffer) or "?" (unknown)
    kind: str  # "read" | "write"
    lo: int
    hi: int


def origins(gm: fx.GraphModule, seed: "Mapping[fx.Node, str] | None" = None) -> dict[fx.Node, str]:
    """S/B tags: ``Role.STATE_VIEW`` nodes are S, ``Role.ARENA`` placeholders B; views inherit.
    ``seed``: tags known already (a shared step's placeholders: its call's arguments')."""
    tag: dict[fx.Node, str] = dict(seed or {})
    for node in gm.graph.nodes:
        if node in tag:
            continue
        role = meta.role(node)
        if role is Role.STATE_VIEW:
            tag[node] = "S"
        elif role is Role.ARENA:
            tag[node] = "B"
        else:
            src = aliased_arg(node)  # a view, an in-place op's result, a call's item that is its argument
            if src is not None and src in tag:  # the same memory, the same origin
                tag[node] = tag[src]
    return tag


def _inner(call: fx.Node, position: float, env: Mapping, tags: Mapping, memo: "dict | None" = None):
    """(submodule, positions, env, tags) to walk a shared step's call: its placeholders
    are the call's arguments (their values and origins), its ops sit between the call's
    position and the next.  ``memo``: the submodule's tags by its arguments' origins (every
    call of a shared step whose arguments have the same origins has the same tags)."""
    sub = call.graph.owning_module.get_submodule(call.target)
    nodes = list(sub.graph.nodes)
    step = 1.0 / (len(nodes) + 1)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    inner_env = {p: env[a] for p, a in zip(placeholders, call.args) if isinstance(a, fx.Node) and a in env}
    seed = {p: tags[a] for p, a in zip(placeholders, call.args) if isinstance(a, fx.Node) and a in tags}
    key = (id(sub), tuple(seed.get(p) for p in placeholders))
    inner_tags = memo.get(key) if memo is not None else None
    if inner_tags is None:
        inner_tags = origins(sub, seed)
        if memo is not None:
            memo[key] = inner_tags
    positions = {n: position + (j + 1) * step for j, n in enumerate(nodes)}
    return sub, positions, inner_env, inner_tags


def _region_args(n: fx.Node, position: int, env: Mapping, storages: Mapping[str, int], tags: Mapping) -> list[Access]:
    """The accesses of one op: each argument whose value (in ``env``) is region memory."""
    writes = set(written_args(n))
    out = []
    for a in n.all_input_nodes:
        val = env.get(a)
        if not isinstance(val, torch.Tensor):
            continue
        ptr = val.untyped_storage().data_ptr()
        for r, sp in storages.items():
            if ptr == sp:
                lo, hi = byte_interval(val)
                out.append(Access(position, n.name, r, tags.get(a, "?"), "write" if a in writes else "read", lo, hi))
    return out


def record_accesses(gm: fx.GraphModule, args: list, regions: Mapping[str, torch.Tensor]) -> list[Access]:
    """Run ``gm`` on ``args`` and log every region read/write (values are irrelevant)."""
    storages = {r: t.untyped_storage().data_ptr() for r, t in regions.items()}
    tags = origins(gm)
    log: list[Access] = []

    class Recorder(fx.Interpreter):
        def __init__(self, module, tags, positions=None):
            super().__init__(module)
            self.tags, self.positions, self.position = tags, positions, 0

        def run_node(self, n):
            at = self.positions[n] if self.positions is not None else self.position
            self.position += 1
            if n.op == "call_function" and not is_view(n):
                log.extend(_region_args(n, at, self.env, storages, self.tags))
            if n.op == "call_module" and call_summary(n) is not None:  # a shared step: its ops, logged
                sub, positions, _, inner_tags = _inner(n, at, {}, self.tags)
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                return Recorder(sub, inner_tags, positions).run(*args, **kwargs)
            return super().run_node(n)

    with torch.no_grad():
        Recorder(gm, tags).run(*args)
    return log


#: ops whose result may share its input's memory though their schemas say otherwise
_UNANNOTATED_VIEWS = {torch.ops.aten._unsafe_view.default, torch.ops.aten._reshape_alias.default}


class NeedsFullRun(Exception):
    """The graph does something to region memory the region-only walk cannot follow."""


class WalkPlan:
    """What ``record_region_accesses`` visits of a graph that no longer changes, worked out
    once (nothing in it depends on the sizes a walk runs at): the S/B tags (``origins``) and
    the nodes that may take region memory, in order.  Those are the arena placeholders' and,
    by the walk's own rules, the nodes a view, an in-place op, an unannotated view or a
    shared step's call makes of them; every other node the walk passes over at every size.
    A capacity graph is walked once per stream length (``capacity_executable.hazards_at``):
    with a plan each walk visits ~a tenth of its nodes and tags none.  ``fits(gm)``: the plan
    is ``gm``'s as it is now (a graph rewritten since is planned again)."""

    def __init__(self, gm: fx.GraphModule):
        self.graph, self.count = gm.graph, len(gm.graph.nodes)
        self.tags = origins(gm)
        maybe = {n for n in gm.graph.nodes if n.op == "placeholder" and meta.role(n) is Role.ARENA}
        self.nodes: list[tuple[int, fx.Node]] = []
        for index, n in enumerate(gm.graph.nodes):
            if n.op not in ("call_function", "call_module") or not any(a in maybe for a in n.all_input_nodes):
                continue
            self.nodes.append((index, n))
            first = n.args[0] if n.args else None
            passes_on = is_view(n) or returns_written(n) or n.target in _UNANNOTATED_VIEWS  # _walk's env rules
            if n.op == "call_module" or (passes_on and isinstance(first, fx.Node) and first in maybe):
                maybe.add(n)  # may be region memory after the walk's step (a call: its items may)

    def fits(self, gm: fx.GraphModule) -> bool:
        return gm.graph is self.graph and len(gm.graph.nodes) == self.count


def record_region_accesses(gm: fx.GraphModule, regions: Mapping[str, torch.Tensor],
                           scalars: "Mapping[fx.Node, object] | None" = None,
                           plan: "WalkPlan | None" = None) -> list[Access]:
    """``record_accesses`` without running the model: the same log, from the region views alone.

    Only region memory is logged, and only views of it (and in-place ops, whose result
    is their written argument) are region memory: every other op returns fresh memory.
    So the walk executes the view ops whose source is region memory, on the region
    tensors (values never matter, only layouts), and logs every other op's region
    arguments; it runs nothing else.  Raises ``NeedsFullRun`` where it cannot follow
    (a call that is not an aten op takes region memory, a view's argument is unknown):
    the caller then runs the graph (``record_accesses``).  ``scalars``: values of nodes
    that are not region memory but that views of it take (a capacity graph's host sizes).
    ``plan``: ``gm``'s ``WalkPlan`` (the same log, from fewer nodes; refused if ``gm`` changed).
    """
    if plan is not None and not plan.fits(gm):
        raise ValueError("record_region_accesses: the walk plan is another graph's (or the graph changed since)")
    storages = {r: t.untyped_storage().data_ptr() for r, t in regions.items()}
    env: dict[fx.Node, object] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder" and meta.role(node) is Role.ARENA:
            env[node] = regions[meta.region(node)]
    log: list[Access] = []
    with torch.no_grad():
        _walk(gm, None, env, plan.tags if plan is not None else origins(gm), storages, log, {}, scalars or {},
              plan.nodes if plan is not None else None)
    return log


def _walk(gm: fx.GraphModule, positions: "Mapping | None", env: dict, tags: Mapping, storages: Mapping,
          log: list, memo: dict, scalars: Mapping = {}, nodes: "list | None" = None) -> None:
    """``record_region_accesses``' walk over one graph (a shared step's call: over its
    submodule, at the call's arguments; ``memo``: ``_inner``'s; ``nodes``: a ``WalkPlan``'s,
    else every node)."""

    value = functools.partial(_value, env=env, scalars=scalars)

    def known(a) -> bool:
        return isinstance(a, fx.Node) and a in env

    for index, n in (nodes if nodes is not None else enumerate(gm.graph.nodes)):
        position = positions[n] if positions is not None else index
        if n.op not in ("call_function", "call_module"):
            continue
        if not any(known(a) for a in n.all_input_nodes):
            continue
        if n.op == "call_module":
            if call_summary(n) is None:
                raise NeedsFullRun(f"{n.name} (a call of module {n.target}) takes region memory")
            sub, inner_positions, inner_env, inner_tags = _inner(n, position, env, tags, memo)
            _walk(sub, inner_positions, inner_env, inner_tags, storages, log, memo, scalars)
            (output,) = [o for o in sub.graph.nodes if o.op == "output"]
            env[n] = tuple(inner_env.get(v) if isinstance(v, fx.Node) else None for v in output.args[0])
            continue
        if is_view(n):
            if known(n.args[0] if n.args else None):  # else a view of other memory
                v = n.target(*value(n.args), **value(n.kwargs))
                if v is not None:  # (an item of a call that is not region memory: None)
                    env[n] = v
            continue
        if not isinstance(n.target, torch._ops.OpOverload):
            raise NeedsFullRun(f"{n.name} ({n.target}) takes region memory")
        log.extend(_region_args(n, position, env, storages, tags))
        if returns_written(n):  # its result is its first argument: region memory if that is
            if known(n.args[0]):
                env[n] = env[n.args[0]]
        elif n.target in _UNANNOTATED_VIEWS and known(n.args[0]):
            env[n] = n.target(*value(n.args), **value(n.kwargs))
        elif _returns_alias_of(n, known):
            raise NeedsFullRun(f"{n.name} ({n.target}) may return region memory")


def _value(a, env: dict, scalars: Mapping = {}):
    """``a`` with each node replaced by its region memory in ``env``, or its value in
    ``scalars`` (a module function: a recursive closure would be a reference cycle holding
    ``env``, its nodes and views, until a collection)."""
    if isinstance(a, fx.Node):
        if a in env:
            return env[a]
        if a in scalars:
            return scalars[a]
        raise NeedsFullRun(f"{a.name} is not region memory")
    if isinstance(a, (list, tuple)):
        return type(a)(_value(x, env, scalars) for x in a)
    return a


def _returns_alias_of(n: fx.Node, known) -> bool:
    """Whether a result of ``n`` may alias an argument that is region memory (per its schema)."""
    schema = n.target._schema
    sets = {ret.alias_info.before_set for ret in schema.returns if ret.alias_info is not None}
    if not sets:
        return False
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not (arg.alias_info.before_set & set().union(*sets)):
            continue
        val = n.args[i] if i < len(n.args) else n.kwargs.get(arg.name)
        vals = val if isinstance(val, (list, tuple)) else [val]
        if any(known(v) for v in vals):
            return True
    return False


def region_hazards(accesses: list[Access]) -> list[str]:
    """Reads of old state after the buffer overwrote it, and writes through the state
    view of a region that is also reached through its buffer.

    A region the graph reaches only through its state view (no bound buffer: the
    step updates the state tensor it was given in place, e.g. a ring KV cache or a
    conv carry) was one tensor at trace time and is one arena view after the
    rewrite, so writing through it is what the trace recorded.  Once the region is
    also reached through a buffer, the trace saw two tensors where the arena has
    one: a write through the state view would change what the buffer reads.
    """
    problems = []
    writes_b: dict[str, list[Access]] = {}  # by region, in the log's order (the first overlap is the one named)
    for a in accesses:
        if a.kind == "write" and a.origin in ("B", "?"):
            writes_b.setdefault(a.region, []).append(a)
    through_buffer = {a.region for a in accesses if a.origin in ("B", "?")}
    for a in accesses:
        if a.kind == "write" and (a.origin == "?" or (a.origin == "S" and a.region in through_buffer)):
            problems.append(f"{a.node} writes region {a.region!r} through the state view; "
                            "upstream wrote a separate tensor there")
        if a.origin in ("S", "?") and a.kind == "read":
            for w in writes_b.get(a.region, ()):
                if w.position < a.position and w.lo < a.hi and a.lo < w.hi:
                    problems.append(f"{a.node} reads old state of region {a.region!r} bytes [{a.lo}, {a.hi}) "
                                    f"after {w.node} overwrote [{w.lo}, {w.hi}) through the buffer")
                    break
    return problems
