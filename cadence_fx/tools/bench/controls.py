"""Token2Wav's bench controls: the same stock tail made faster by something other than
cadence_fx (torch.compile, upstream's own CUDA graphs), and a count of what upstream's
graphs actually replayed."""

from __future__ import annotations

from typing import Any

from . import BenchError

#: controls: the same stock tail, made faster by something other than cadence_fx
CONTROLS = {
    "compile-ro": "torch.compile(estimator.forward_chunk, mode='reduce-overhead', dynamic=False)",
    "compile-ro-auto": "torch.compile(estimator.forward_chunk, mode='reduce-overhead') (dynamic: default)",
    "compile": "torch.compile(estimator.forward_chunk) (default mode, dynamic=False)",
    "cudagraphs": "torch.compile(estimator.forward_chunk, backend='cudagraphs', dynamic=False)",
    "vendor": "upstream's own CUDA graphs: flow.scatter_cuda_graph(True)",
}


def apply_control(tail, variant: str) -> None:
    """Make the stock tail's DiT estimator run through the control's mechanism (CUDA only)."""
    import torch
    est = tail.flow.decoder.estimator
    if variant == "vendor":
        with torch.inference_mode():
            tail.flow.scatter_cuda_graph(True)
        return
    inner = type(est).forward_chunk.__get__(est)
    if variant == "compile-ro":
        compiled = torch.compile(inner, mode="reduce-overhead", dynamic=False)
    elif variant == "compile-ro-auto":
        compiled = torch.compile(inner, mode="reduce-overhead")
    elif variant == "compile":
        compiled = torch.compile(inner, dynamic=False)
    elif variant == "cudagraphs":
        compiled = torch.compile(inner, backend="cudagraphs", dynamic=False)
    else:
        raise BenchError(f"unknown control {variant!r}")
    graphed = variant != "compile"

    def forward_chunk(*args, **kwargs):
        if not graphed:
            return compiled(*args, **kwargs)
        # graph outputs live in a static pool that the next replay overwrites: start a new
        # step and hand the CFM its own copies (it copies them into its cache buffers anyway)
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(*args, **kwargs)
        return torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)
    est.forward_chunk = forward_chunk


class _CountedGraph:
    """Stands in for one of upstream's captured DiT graphs and counts its replays."""

    def __init__(self, graph, counts: dict[str, Any]):
        self.graph, self.counts = graph, counts

    def replay(self) -> None:
        self.counts["graph"] += 1
        self.graph.replay()


def count_vendor_calls(estimator) -> dict[str, Any]:
    """Count the upstream DiT's ``forward_chunk`` calls and its graph replays (no upstream edits).

    Upstream replays ``estimator.graph_chunk[frames]`` when a call's frame count has a
    captured bucket and the cache fits it, and runs eagerly otherwise.  Returns the live
    counters: ``calls``, ``graph`` (replays) and ``frames`` (calls per frame count).
    """
    counts: dict[str, Any] = {"calls": 0, "graph": 0, "frames": {}}
    estimator.graph_chunk = {k: _CountedGraph(g, counts) for k, g in estimator.graph_chunk.items()}
    inner = estimator.forward_chunk

    def forward_chunk(*args, **kwargs):
        x = kwargs["x"] if "x" in kwargs else args[0]
        counts["calls"] += 1
        counts["frames"][int(x.shape[2])] = counts["frames"].get(int(x.shape[2]), 0) + 1
        return inner(*args, **kwargs)
    estimator.forward_chunk = forward_chunk
    return counts

