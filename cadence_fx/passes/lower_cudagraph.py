"""lower_cudagraph: capturable submodules -> replay-region modules (rule R).

Input: a partitioned ``GraphModule`` (``Partition``) whose children carry their
verdict (``step.capturable``).  Each capturable child is replaced by a region
wrapper around it, made by the ``region`` factory the compiler hands in
(``runtime.graphs.CapturedRegion``: a pass never imports the runtime); eager
islands stay as they are.  Capture itself happens per session
(``runtime.graphs.capture_entry``), because a graph binds the session's arena by
address.

A piece that writes into one of its arguments must get that very memory at every
replay: a static copy would take the write away from its owner (e.g. a state
tensor under rules R, or a tensor an eager island made).  Such arguments are
marked bound by address, so a replay on other memory is refused and runs eagerly.
A piece of views only is marked trivial: nothing to capture.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.fx as fx

from .. import step as meta
from ..errors import PassError
from .base import CadencePass, PassResult, is_view, view_root, written_args

#: ``region(piece, bound, name=..., trivial=...) -> module``: ``bound[i]`` says the
#: piece writes into placeholder i; ``trivial``: the piece launches no kernel
RegionFactory = Callable[..., torch.nn.Module]


def launches_kernels(piece: fx.GraphModule) -> bool:
    """Whether a piece launches anything: a views-only piece would capture an empty
    graph (useless, and torch warns), so its region runs it as is.  A piece that is one
    call of a shared step (``step_share``) launches what the step does."""
    return any((n.op == "call_function" and not is_view(n))
               or (n.op == "call_module" and launches_kernels(piece.get_submodule(n.target)))
               for n in piece.graph.nodes)


def written_placeholders(piece: fx.GraphModule) -> list[bool]:
    """Per placeholder of ``piece``: does an op write into it (or into a view of it)?"""
    written = {view_root(w) for n in piece.graph.nodes if n.op in ("call_function", "call_module")
               for w in written_args(n)}  # a shared step's call: what its summary says it writes
    return [n in written for n in piece.graph.nodes if n.op == "placeholder"]


@dataclasses.dataclass(frozen=True)
class LowerRecord:
    captured: tuple[str, ...]
    eager: tuple[str, ...]

    def __str__(self) -> str:
        return f"captured {list(self.captured)}; eager islands {list(self.eager)}"


class LowerCudaGraph(CadencePass):
    """requires: a partitioned graph (children with a capturable verdict).
    ensures: every capturable child is now a region wrapper; no eager island is."""

    name = "lower_cudagraph"

    def __init__(self, region: RegionFactory):
        self.region = region

    def requires(self, gm: fx.GraphModule) -> None:
        if not any(meta.capturable(m) is not None for m in gm.children()):
            raise PassError("lower_cudagraph needs a graph from partition (no capturable tags)")

    def call(self, gm: fx.GraphModule) -> PassResult:
        captured, eager = [], []
        for name, child in list(gm.named_children()):
            if meta.capturable(child):
                setattr(gm, name, self.region(child, written_placeholders(child), name=name,
                                              trivial=not launches_kernels(child)))
                captured.append(name)
            else:
                eager.append(name)
        return PassResult(gm, bool(captured), LowerRecord(tuple(captured), tuple(eager)))

    def ensures(self, gm: fx.GraphModule) -> None:
        for name, child in gm.named_children():
            if meta.capturable(child):  # a piece left unwrapped would run eagerly, silently
                raise PassError(f"lower_cudagraph: capturable region {name} was not wrapped for replay")
