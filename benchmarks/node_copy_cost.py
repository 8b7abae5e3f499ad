"""What copying a graph's nodes costs: ``Graph.node_copy`` against ``passes.base.copy_node``,
paired in one process on one made-up graph (CPU; much of a new prompt length's host work is
such copies: specialize's bound copy, partition's pieces, the trace memo, the program cache).
A made-up graph, not the released model's: on the H200 host (torch 2.11) it copied in 0.31x
the time while the released model's specialize and passes did not change (``new_length.py``,
paired; ``docs/results``, session thirty-six); on the CPU machine with torch 2.11, 1.26x: the
host's doing (``node_copy_profile.py``, session thirty-seven).  What a length costs is
``new_length.py``'s to say.

    python benchmarks/node_copy_cost.py [--blocks 120] [--reps 9]

The graph is a pre-dispatch trace of ``--blocks`` attention-and-MLP blocks (views with list
arguments, ``cat`` of lists, keyword arguments: the argument shapes a decoder's graph has).
Each repetition copies every node both ways, in alternating order; prints one JSON line with
each way's median seconds, the median of the per-repetition ratios, and whether the two copies
print the same graph.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from cadence_fx.passes.base import copy_node


def block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    b, t, c = x.shape
    q = torch.nn.functional.linear(x, w).view(b, t, 4, c // 4).transpose(1, 2)
    a = torch.softmax(q @ q.transpose(-1, -2) / 2.0, dim=-1) @ q
    y = a.transpose(1, 2).reshape(b, t, c)
    y = torch.cat([y[:, :1], y[:, 1:]], dim=1)
    return x + torch.nn.functional.gelu(torch.nn.functional.linear(y, w), approximate="tanh").to(torch.float32)


def graph_of(blocks: int) -> fx.Graph:
    def f(x, w):
        for _ in range(blocks):
            x = block(x, w)
        return x
    with torch.no_grad():
        return make_fx(f, pre_dispatch=True)(torch.randn(1, 6, 16), torch.randn(16, 16)).graph


#: the two ways of copying a node: torch's, and the one the passes use
WAYS = {"node_copy": lambda g, n, t: g.node_copy(n, t), "copy_node": copy_node}


def copy_with(src: fx.Graph, copier) -> tuple[float, fx.Graph]:
    t0 = time.perf_counter()
    graph, env = fx.Graph(), {}
    for n in src.nodes:
        env[n] = copier(graph, n, lambda a: env[a])
    return time.perf_counter() - t0, graph


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=120)
    p.add_argument("--reps", type=int, default=9)
    args = p.parse_args(argv)
    src = graph_of(args.blocks)
    ways = WAYS
    times = {k: [] for k in ways}
    ratios = []
    same = True
    for rep in range(args.reps):
        order = list(ways) if rep % 2 == 0 else list(reversed(ways))
        got = {}
        for k in order:
            got[k] = copy_with(src, ways[k])
            times[k].append(got[k][0])
        ratios.append(got["copy_node"][0] / got["node_copy"][0])
        same = same and str(got["copy_node"][1]) == str(got["node_copy"][1])
    print(json.dumps({"torch": torch.__version__, "nodes": len(src.nodes), "reps": args.reps,
                      "median_s": {k: round(statistics.median(v), 4) for k, v in times.items()},
                      "ratio_copy_node_over_node_copy_median": round(statistics.median(ratios), 3),
                      "same_graph": same}))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
