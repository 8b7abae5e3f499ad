"""A piece run by walking its graph (runtime/interpret.py) against its generated code.

A chain of 10,000 small aten ops (add, view, mul on 4x4 tensors, so the time is Python's,
not the kernels'), median of 7:

    OMP_NUM_THREADS=1 python benchmarks/walk_vs_code.py

prints one JSON line: generating the code (``recompile``), a run of the generated code, the
first walk (which builds the walk's node table, kept per piece) and a later walk.  Capture
runs a piece twice (warm-up, capture) per session; the first session used to generate code.
"""

import json
import statistics
import time

import torch
import torch.fx as fx

from cadence_fx.passes.partition import _graph_module_class
from cadence_fx.runtime.interpret import has_code, run_graph_module


def chain(n: int) -> fx.Graph:
    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    v = x
    for i in range(n):
        if i % 3 == 0:
            v = g.call_function(torch.ops.aten.add.Tensor, (v, w))
        elif i % 3 == 1:
            v = g.call_function(torch.ops.aten.view.default, (v, [4, 4]))
        else:
            v = g.call_function(torch.ops.aten.mul.Tensor, (v, 1.0))
    g.output(v)
    return g


def median_s(f, n: int = 7) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 4)


def main() -> None:
    torch.set_num_threads(1)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    cls = _graph_module_class()
    codegen, first_walk = [], []
    for _ in range(7):
        coded, walked = cls(torch.nn.Module(), chain(10_000)), cls(torch.nn.Module(), chain(10_000))
        t0 = time.perf_counter()
        coded(x, w)  # generates the code, then runs it
        codegen.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        out = run_graph_module(walked, (x, w))
        first_walk.append(time.perf_counter() - t0)
        assert not has_code(walked) and torch.equal(out, coded(x, w))
    run = median_s(lambda: coded(x, w))
    print(json.dumps({"torch": torch.__version__, "nodes": 10_000,
                      "first_call_with_codegen_s": round(statistics.median(codegen), 4),
                      "generated_run_s": run, "first_walk_s": round(statistics.median(first_walk), 4),
                      "walk_s": median_s(lambda: run_graph_module(walked, (x, w)))}))


if __name__ == "__main__":
    main()
