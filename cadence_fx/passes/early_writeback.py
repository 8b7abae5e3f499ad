"""early_writeback: commit a region's next state as soon as it is final (rule S).

``state_rewrite`` writes a carried region's next state back into its arena view as
the graph's last ops. That keeps the source alive to the very end: a windowed
cache's trim (a ``cat`` of two slices of a transformer's K|V cache, 125 MiB in one
released decoder) then lives through the whole vocoder, and under rules SR/SRc it crosses an eager island, where
the next captured region takes it as an input and keeps a static copy of it. This
pass moves each write-back group (``state_rewrite`` tags its nodes ``writeback``)
to just after the last node that

- touches the region's arena memory in any way (reads, writes, views), or
- writes the memory the write-back's source aliases,

and after the source itself. Every read and write of the region, and of the source,
therefore happens in the same order relative to the write-back as before; no other
node can observe the move (arena regions are disjoint slots). Random draws keep
their order: the group holds none.

Before::

    new = cat([slice(kv, 4, 0, P), slice(kv, 4, -100)], 4)   # the trimmed next state
    wav = vocoder(mel)                                         # never touches the arena
    copy_(slice(arena_kv, 4, 0, P + 100), new)
    return (wav,)

After::

    new = cat([slice(kv, 4, 0, P), slice(kv, 4, -100)], 4)
    copy_(slice(arena_kv, 4, 0, P + 100), new)                # `new` dies here
    wav = vocoder(mel)
    return (wav,)

requires: a graph from ``state_rewrite`` (no carried-state placeholder left; an arena
placeholder for every region it writes back; a binding for every arena input when
the hazards are checked).
ensures: every write-back still follows its source and every node that touches its
region; and (``aliasing.region_hazards``, as ``state_rewrite``) no op reads old state
from memory that was already overwritten. The compiler runs ``state_rewrite`` with
``check_hazards=False`` before this pass: the proof is made once, on the graph that
runs.
"""

from __future__ import annotations

from typing import Sequence

import torch.fx as fx

from .. import step as meta
from ..errors import PassError
from ..step import Role
from .base import CadencePass, PassResult, view_roots, written_args


def _groups(gm: fx.GraphModule) -> dict[str, list[fx.Node]]:
    groups: dict[str, list[fx.Node]] = {}
    for n in gm.graph.nodes:
        if meta.role(n) is Role.WRITEBACK:
            groups.setdefault(meta.region(n), []).append(n)
    return groups


def _arena(gm: fx.GraphModule, region: str) -> fx.Node:
    for n in gm.graph.nodes:
        if n.op == "placeholder" and meta.role(n) is Role.ARENA and meta.region(n) == region:
            return n
    raise PassError(f"early_writeback: write-back of {region!r} but no arena placeholder for it")


def _access(gm: fx.GraphModule) -> tuple[dict, dict, dict]:
    """``view_roots``, and per root the nodes that read it (through any view) and the
    nodes that write it: what ``_latest_dependency`` asks of every node, indexed once."""
    root_of = view_roots(gm)
    readers: dict[fx.Node, list[fx.Node]] = {}
    writers: dict[fx.Node, list[fx.Node]] = {}
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        for r in {root_of[a] for a in n.all_input_nodes}:
            readers.setdefault(r, []).append(n)
        for r in {root_of[w] for w in written_args(n)}:
            writers.setdefault(r, []).append(n)
    return root_of, readers, writers


def _latest_dependency(group: Sequence[fx.Node], arena: fx.Node, access: tuple[dict, dict, dict],
                       order: dict) -> fx.Node:
    """The last node the group must follow: its sources, every node that reads the
    region's arena memory, and every node that writes what a source aliases
    (``access``: ``_access(gm)``; ``order``: node -> its position in the graph now)."""
    root_of, readers, writers = access
    members = set(group)
    sources = [a for n in group for a in n.all_input_nodes if a not in members]
    roots = {root_of[a] for a in sources if a is not arena}
    must_follow = set(sources)
    must_follow.update(n for n in readers.get(arena, ()) if n not in members)
    for r in roots:
        must_follow.update(n for n in writers.get(r, ()) if n not in members)
    return max(must_follow, key=order.__getitem__)


class EarlyWriteback(CadencePass):
    name = "early_writeback"

    def __init__(self, bindings: Sequence = (), check_hazards: bool = True):
        self.bindings = {b.name: b for b in bindings}
        self.check_hazards = check_hazards

    def requires(self, gm: fx.GraphModule) -> None:
        if meta.signature(gm) is None:
            raise PassError("early_writeback needs a graph from trace_step and state_rewrite (no signature)")
        left = [n.name for n in gm.graph.nodes if meta.role(n) in (Role.STATE, Role.BUFFER)]
        if left:
            raise PassError(f"early_writeback needs a graph from state_rewrite; carried state {left} is "
                            f"not in the arena yet: run StateRewrite first")
        for region in _groups(gm):
            _arena(gm, region)
        if self.check_hazards and self.bindings:
            unbound = [r for r in meta.arena_inputs(gm) if r not in self.bindings]
            if unbound:
                raise PassError(f"early_writeback: arena inputs {unbound} have no region binding; "
                                f"pass the bindings state_rewrite got")

    def call(self, gm: fx.GraphModule) -> PassResult:
        moved: dict[str, int] = {}
        access = _access(gm)  # moving nodes changes their order, not what they read, write or alias
        self._moved_in = (gm.graph, len(gm.graph.nodes), access)  # for this run's ensures only
        for region, group in _groups(gm).items():
            order = {n: i for i, n in enumerate(gm.graph.nodes)}  # as the groups moved so far left it
            anchor = _latest_dependency(group, _arena(gm, region), access, order)
            if order[group[0]] <= order[anchor] + 1:
                continue  # already right after what it depends on
            skipped = order[group[0]] - order[anchor] - 1
            cursor = anchor
            for n in group:
                cursor.append(n)
                cursor = n
            moved[region] = skipped
        return PassResult(gm, bool(moved), {"moved up past nodes": moved})

    def ensures(self, gm: fx.GraphModule) -> None:
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        memo, self._moved_in = getattr(self, "_moved_in", None), None
        if memo is not None and memo[0] is gm.graph and memo[1] == len(order):
            access = memo[2]  # the graph ``call`` only reordered: the same reads, writes and views
        else:
            access = _access(gm)
        for region, group in _groups(gm).items():
            anchor = _latest_dependency(group, _arena(gm, region), access, order)
            if order[group[0]] <= order[anchor]:
                raise PassError(f"early_writeback: the write-back of {region!r} comes before {anchor.name}")
        if self.check_hazards and self.bindings:
            from .state_rewrite import check_graph_hazards
            problems = check_graph_hazards(gm, self.bindings)
            if problems:
                raise PassError("early_writeback: aliasing the carried state with its buffer is unsound in the "
                                "graph with its write-backs moved: " + "; ".join(problems[:3]))

