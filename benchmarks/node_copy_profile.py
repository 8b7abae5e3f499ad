"""node_copy_cost's two copies of its made-up graph, each timed twice and then under cProfile: where
node_copy's time goes on a host (session thirty-six measured x0.31 on the H200 host, x1.26 on this CPU
with the same torch 2.11).

    python benchmarks/node_copy_profile.py
"""
import cProfile
import gc
import importlib.util
import io
import pstats
import sys

import torch

spec = importlib.util.spec_from_file_location("ncc", "benchmarks/node_copy_cost.py")
ncc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ncc)
g = ncc.graph_of(600)
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      "tracked objects", len(gc.get_objects()), "gc thresholds", gc.get_threshold(), flush=True)
for name in ("node_copy", "copy_node", "node_copy", "copy_node"):
    print(f"by_{name}", round(ncc.copy_with(g, ncc.WAYS[name])[0], 4), flush=True)
for name in ("node_copy", "copy_node"):
    pr = cProfile.Profile()
    pr.enable()
    ncc.copy_with(g, ncc.WAYS[name])
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
    print(f"by_{name}")
    print(s.getvalue()[:3500])
