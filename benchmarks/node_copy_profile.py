"""node_copy_cost's two copies of its made-up graph, each timed twice and then under cProfile: where
node_copy's time goes on a host (session thirty-six measured x0.31 on the H200 host, x1.26 on this CPU
with the same torch 2.11).

    python benchmarks/node_copy_profile.py
"""
import cProfile, gc, io, pstats, sys, time
import torch
sys.argv = ["node_copy_cost.py"]
import importlib.util
spec = importlib.util.spec_from_file_location("ncc", "benchmarks/node_copy_cost.py")
ncc = importlib.util.module_from_spec(spec); spec.loader.exec_module(ncc)
import torch.fx as fx
from cadence_fx.passes.base import copy_node
g = ncc.graph_of(600)
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      "tracked objects", len(gc.get_objects()), "gc thresholds", gc.get_threshold(), flush=True)
def by_node_copy():
    out = fx.Graph(); env = {}
    for n in g.nodes:
        env[n] = out.node_copy(n, lambda a: env[a])
def by_copy_node():
    out = fx.Graph(); env = {}
    for n in g.nodes:
        env[n] = copy_node(out, n, lambda a: env[a])
for f in (by_node_copy, by_copy_node, by_node_copy, by_copy_node):
    t0 = time.perf_counter(); f(); print(f.__name__, round(time.perf_counter() - t0, 4), flush=True)
for f in (by_node_copy, by_copy_node):
    pr = cProfile.Profile(); pr.enable(); f(); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12); print(f.__name__); print(s.getvalue()[:3500])
