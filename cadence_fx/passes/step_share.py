"""step_share: repeated calls that record the same ops -> calls of ONE submodule.

A flow-matching decoder runs its estimator ``n_timesteps`` times per chunk, and the
trace unrolls every call: on a released speech decoder at 5 steps the estimator calls are
75% of an entry's nodes, at 10 steps 85% (``docs/architecture.md``, "What a new prompt
length still costs").  Specializing, rewriting and capturing a new prompt length all
pay per node, so they would pay ``n_timesteps - 1`` times less for the later steps if
the graph held one copy of the step and called it.  This pass makes that graph: it
finds the calls, proves which of them are copies of one another, and outlines them.

Given a predicate ``inside(node)`` (the adapter's ``repeated_calls()``: "traced inside
the estimator"), a *call* is a maximal run of consecutive nodes inside.  First each
call's input-independent ops (``fold_host_constants``' rule: pure, nothing below them
is a placeholder, a parameter or a region buffer, nothing writes them; a step's time
embedding, computed from its own time) move ahead of it, out of it
(``hoist_constants``): they fold per call site as they fold per step in the unrolled
graph, and what the call keeps can be captured.  Then each call gets a key: per node
its op, target, role tag and arguments, where an argument is a node of the same call
(by position), a constant (``get_attr``, by attribute name: the same tensor) or an
input from outside the call (by first-use order), each input's layout (sizes,
strides, dtype and device: a symbolic step's ``SymTensor``, else its fake value)
included, but not its storage offset: each step reads its own slot of the DiT
caches, a view at another offset, and no op's meaning depends on where its input
starts (an op that reads an offset, ``as_strided``, has it as an argument).  Calls
with one key record the same ops on inputs of the same layout: the graph computes each
as the template's ops applied to that call's inputs, which is what ``share_calls``
makes explicit:

- the template (the first call of the largest group of two or more with one key) is
  copied once into a submodule ``shared_step`` (its inputs as placeholders, its
  constants as the submodule's own attributes, the same tensors; it returns every value
  any call's outside uses; its nodes keep the template's value metadata, offsets of
  views included: a later stage that binds the step per call site reads each site's
  own inputs), with a ``base.CallSummary`` of what a call does to its arguments (the
  analyses read a call through it);
- every call of the group becomes ``call_module shared_step`` on that call's inputs at
  the call's place, and a ``getitem`` per value used after it (with the call's own
  value metadata);
- the other calls (on a flow decoder, typically the first step: it also builds tables
  the later steps read) are left as they were, and said so in the record.

``inline_calls`` is the inverse: it copies the submodule's ops back in place of each
call, so the graph comes back op for op (up to the moved constant ops; checked on the
released model in ``tests/integrations/test_token2wav.py``'s ten-step test).  The
order of every op that reads an input, and so every write and every random draw, is
the unrolled graph's: a call runs its ops where the run stood.

``specialize(share=...)`` outlines a symbolic step once and binds the outer graph and
the shared step once each per new length; the rewrite passes, partition (a call is
capturable when every op in it is) and capture (which records the call's kernels
where it stands) take that graph.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Callable

import torch
import torch.fx as fx
from torch.fx.graph_module import _copy_attr  # what GraphModule.__init__ uses (dotted names too)

from .. import step as meta
from ..errors import PassError
from .base import CALL_SUMMARY, CallSummary, copy_node, has_side_effect, view_roots, written_args
from .fold_host_constants import input_independent

SHARED = "shared_step"


@dataclasses.dataclass(frozen=True)
class ShareRecord:
    calls: int  # runs of ``inside`` nodes found
    shared: tuple[int, ...]  # which of them now call the submodule (by position)
    nodes_each: int  # ops in the shared step
    inputs: int  # the step's inputs from outside (per call)
    outputs: int  # values a call returns
    left: tuple[str, ...]  # per call not shared: why
    hoisted: int = 0  # input-independent ops moved out of the calls (they fold per call site)

    def __str__(self) -> str:
        if not self.shared:
            return f"{self.calls} calls, none shared ({'; '.join(self.left) or 'no two alike'})"
        return (f"{self.calls} calls, {len(self.shared)} share one step of {self.nodes_each} ops "
                f"({self.inputs} inputs, {self.outputs} outputs); calls {list(self.shared)}"
                + (f"; {self.hoisted} constant ops moved out" if self.hoisted else "")
                + (f"; left: {'; '.join(self.left)}" if self.left else ""))


def find_calls(graph: fx.Graph, inside: Callable[[fx.Node], bool]) -> list[list[fx.Node]]:
    """Maximal runs of consecutive op nodes for which ``inside`` holds, in graph order."""
    calls, current = [], None
    for node in graph.nodes:
        if node.op in ("call_function", "call_method", "call_module", "get_attr") and inside(node):
            if node.op == "get_attr":  # a constant read inside: part of the run, not its boundary
                if current is not None:
                    current.append(node)
                continue
            if current is None:
                current = []
                calls.append(current)
            current.append(node)
        elif node.op != "get_attr":
            current = None
    return calls


def _layout(node: fx.Node):
    sym = node.meta.get(meta.SYM)
    if sym is not None:  # not its storage offset: each step's cache slot starts elsewhere
        return ("sym", sym.shape, sym.stride, sym.dtype, sym.device) if hasattr(sym, "stride") else ("sym", sym)
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor):
        return ("val", tuple(v.shape), tuple(v.stride()), v.dtype, v.device)
    if isinstance(v, (int, float, bool)):
        return ("value", type(v))
    return ("op", node.op, node.target)


def _hashable(a):
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_hashable(x) for x in a))
    if isinstance(a, dict):
        return ("dict", tuple((k, _hashable(v)) for k, v in a.items()))
    if isinstance(a, slice):
        return ("slice", _hashable(a.start), _hashable(a.stop), _hashable(a.step))
    try:
        hash(a)
    except TypeError:
        return ("id", id(a))
    return a


def call_key(call: list[fx.Node]) -> tuple[tuple, list[fx.Node]]:
    """(the call's key, its inputs from outside in first-use order)."""
    local: dict[fx.Node, int] = {}
    inputs: dict[fx.Node, int] = {}
    rows = []

    def ref(a: fx.Node):
        if a in local:
            return ("local", local[a])
        if a.op == "get_attr":
            return ("attr", a.target)
        if a not in inputs:
            inputs[a] = len(inputs)
        return ("input", inputs[a], _layout(a))

    for i, node in enumerate(call):
        args = fx.node.map_arg((node.args, node.kwargs), ref)
        rows.append((node.op, node.target, meta.role(node), _hashable(args)))
        local[node] = i
    return tuple(rows), list(inputs)


def share_calls(gm: fx.GraphModule, inside: Callable[[fx.Node], bool],
                name: str = SHARED) -> tuple[fx.GraphModule, ShareRecord]:
    """Replace the largest group of alike calls by calls of one submodule (in place)."""
    if hasattr(gm, name):
        raise PassError(f"step_share: {type(gm).__name__} already has an attribute {name!r}")
    calls = find_calls(gm.graph, inside)
    hoisted = hoist_constants(gm, calls)
    keyed = [call_key(c) for c in calls]
    groups: dict[tuple, list[int]] = {}
    for i, (key, _) in enumerate(keyed):
        groups.setdefault(key, []).append(i)
    best = max((g for g in groups.values() if len(g) > 1), key=len, default=[])
    left = tuple(f"call {i} ({len(calls[i])} ops) differs from the shared step"
                 for i in range(len(calls)) if i not in best)
    if not best:
        return gm, ShareRecord(len(calls), (), 0, 0, 0, left, hoisted)
    template, t_inputs = calls[best[0]], keyed[best[0]][1]
    members = [set(calls[i]) for i in best]
    # positions (in the call) of values used after it, at any call of the group
    used = sorted({j for i, nodes in zip(best, members) for j, n in enumerate(calls[i])
                   if n.op != "get_attr" and any(u not in nodes for u in n.users)})
    sub = _submodule(gm, template, t_inputs, used)
    gm.add_submodule(name, sub)
    replaced: dict[fx.Node, fx.Node] = {}  # a value of an earlier call -> its getitem
    for i in best:
        call, inputs = calls[i], [replaced.get(a, a) for a in keyed[i][1]]
        with gm.graph.inserting_before(call[0]):
            node = gm.graph.call_module(name, tuple(inputs))
        node.meta.update({k: v for k, v in call[0].meta.items() if k == meta.SCOPE})
        node.meta["step_share"] = {"call": i}
        inner, anchor = set(call), node
        for k, j in enumerate(used):
            value = call[j]
            outside = [u for u in value.users if u not in inner]
            if not outside:
                continue
            with gm.graph.inserting_after(anchor):
                item = anchor = gm.graph.call_function(operator.getitem, (node, k))
            item.meta = dict(value.meta)
            replaced[value] = item
            for u in outside:
                u.replace_input_with(value, item)
        read = {a for n in call for a in n.all_input_nodes if a.op == "get_attr" and a not in inner}
        for n in reversed(call):
            if n.op == "get_attr" and any(u not in inner for u in n.users):
                node.prepend(n)  # a constant read after the call too: kept, before the call
                continue
            gm.graph.erase_node(n)
        for a in read:  # make_fx reads a constant once per use: the reads only the call made go
            if not a.users:
                gm.graph.erase_node(a)
    gm.graph.lint()
    return gm, ShareRecord(len(calls), tuple(best), sum(n.op != "get_attr" for n in template),
                           len(t_inputs), len(used), left, hoisted)


def hoist_constants(gm: fx.GraphModule, calls: list[list[fx.Node]]) -> int:
    """Move each call's input-independent ops (``fold_host_constants``' rule: pure, no
    placeholder, parameter or region buffer below them, nothing writing them) to just
    before the call, in order, and out of it: a step's time embedding, computed from
    its own time, then folds into a constant per call site as it folds per step in the
    unrolled graph, and what is left of the step reads it (and can be captured)."""
    constant = set(input_independent(gm))
    moved = 0
    for call in calls:
        keep = [n for n in call if n not in constant]
        if not keep:
            continue
        for n in call:
            if n in constant:  # a constant read inside the call moves with the ops that read it
                keep[0].prepend(n)
                moved += n.op != "get_attr"
        call[:] = keep
    return moved


def _submodule(gm: fx.GraphModule, template: list[fx.Node], inputs: list[fx.Node],
               used: list[int]) -> fx.GraphModule:
    graph = fx.Graph()
    root = torch.nn.Module()
    env: dict[fx.Node, fx.Node] = {}
    for k, a in enumerate(inputs):
        env[a] = graph.placeholder(f"in{k}_{a.name}")
        env[a].meta = {key: v for key, v in a.meta.items() if key != meta.TAG}  # an input, whatever fed it
    attrs: dict[str, fx.Node] = {}

    def attr(a: fx.Node) -> fx.Node:
        """A constant the step reads (in the call or before it): the submodule's own attribute."""
        if a.target not in attrs:
            _copy_attr(gm, root, a.target)
            attrs[a.target] = graph.get_attr(a.target)
            attrs[a.target].meta = dict(a.meta)
        return attrs[a.target]

    def arg(a: fx.Node) -> fx.Node:
        if a in env:
            return env[a]
        if a.op == "get_attr":
            return attr(a)
        raise PassError(f"step_share: {a.name} is read by the step but is neither in it nor an input")

    for node in template:
        env[node] = attr(node) if node.op == "get_attr" else copy_node(graph, node, arg)
    graph.output(tuple(env[template[j]] for j in used))
    sub = fx.GraphModule(root, graph, class_name="SharedStep")
    sub.meta[CALL_SUMMARY] = summarize(sub)
    return sub


def summarize(sub: fx.GraphModule) -> CallSummary:
    """What a call of ``sub`` does to its arguments (``base.CallSummary``), from its ops."""
    nodes = list(sub.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    index = {p: i for i, p in enumerate(placeholders)}
    roots = view_roots(sub)
    written = sorted({index[roots[w]] for n in nodes for w in written_args(n) if roots[w] in index})
    (output,) = [n for n in nodes if n.op == "output"]
    aliases = tuple(index.get(roots[v]) if isinstance(v, fx.Node) else None for v in output.args[0])
    effects = any(has_side_effect(n) for n in nodes if n.op not in ("placeholder", "output"))  # a write too
    return CallSummary(tuple(written), aliases, effects)


def inline_calls(gm: fx.GraphModule, name: str = SHARED) -> fx.GraphModule:
    """The graph with every call of submodule ``name`` replaced by its ops (in place)."""
    sub = gm.get_submodule(name)
    for call in [n for n in gm.graph.nodes if n.op == "call_module" and n.target == name]:
        env: dict[fx.Node, object] = {}
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        env.update(zip(placeholders, call.args))
        results = None
        with gm.graph.inserting_before(call):
            for n in sub.graph.nodes:
                if n.op == "placeholder":
                    continue
                if n.op == "output":
                    results = fx.node.map_arg(n.args[0], lambda a: env[a])
                    continue
                if n.op == "get_attr":  # read where the call stood, as a trace reads it
                    if not hasattr(gm, n.target):
                        _copy_attr(sub, gm, n.target)
                    env[n] = copy_node(gm.graph, n)
                    continue
                env[n] = copy_node(gm.graph, n, lambda a: env[a])
        for user in list(call.users):
            if user.op != "call_function" or user.target is not operator.getitem:
                raise PassError(f"step_share: {user.name} uses the call {call.name} whole")
            user.replace_all_uses_with(results[user.args[1]])
            gm.graph.erase_node(user)
        gm.graph.erase_node(call)
    gm.delete_submodule(name)
    gm.graph.lint()
    return gm
