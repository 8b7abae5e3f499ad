"""lower_cudagraph: capturable submodules -> ``CapturedRegion`` modules (rule R).

Input: a partitioned ``GraphModule`` (``Partition``) whose children carry
``meta["cadence_capturable"]``.  Each capturable child is replaced by a
``runtime.graphs.CapturedRegion`` wrapping it; eager islands stay as they are.
Capture itself happens per session (``runtime.graphs.capture_entry``), because a
graph binds the session's arena by address.

A piece that writes into one of its arguments must get that very memory at every
replay: a static copy would take the write away from its owner (e.g. a state
tensor under rules R, or a tensor an eager island made).  Such arguments are
marked bound by address, so a replay on other memory is refused and runs eagerly.
A piece of views only is marked trivial: nothing to capture.
"""

from __future__ import annotations

import dataclasses

import torch.fx as fx

from ..runtime.graphs import CapturedRegion
from .base import CadencePass, PassResult, is_view, view_root, written_args


def launches_kernels(piece: fx.GraphModule) -> bool:
    """Whether a piece launches anything: a views-only piece would capture an empty
    graph (useless, and torch warns), so its region runs it as is."""
    return any(n.op == "call_function" and not is_view(n) for n in piece.graph.nodes)


def written_placeholders(piece: fx.GraphModule) -> list[bool]:
    """Per placeholder of ``piece``: does an op write into it (or into a view of it)?"""
    written = {view_root(w) for n in piece.graph.nodes if n.op == "call_function" for w in written_args(n)}
    return [n in written for n in piece.graph.nodes if n.op == "placeholder"]


@dataclasses.dataclass(frozen=True)
class LowerRecord:
    captured: tuple[str, ...]
    eager: tuple[str, ...]

    def __str__(self) -> str:
        return f"captured {list(self.captured)}; eager islands {list(self.eager)}"


class LowerCudaGraph(CadencePass):
    name = "lower_cudagraph"

    def requires(self, gm: fx.GraphModule) -> None:
        from ..errors import PassError
        if not any(isinstance(getattr(m, "meta", None), dict) and "cadence_capturable" in m.meta
                   for m in gm.children()):
            raise PassError("lower_cudagraph needs a graph from partition (no capturable tags)")

    def call(self, gm: fx.GraphModule) -> PassResult:
        captured, eager = [], []
        for name, child in list(gm.named_children()):
            if getattr(child, "meta", {}).get("cadence_capturable"):
                setattr(gm, name, CapturedRegion(child, written_placeholders(child), name=name,
                                                 trivial=not launches_kernels(child)))
                captured.append(name)
            else:
                eager.append(name)
        return PassResult(gm, bool(captured), LowerRecord(tuple(captured), tuple(eager)))
