"""Diagnostic (H200): istft_check and Partition on the compiled Token2Wav entries."""
import os, re, torch
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
torch.use_deterministic_algorithms(True)
import torch.fx as fx
import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.passes import istft_check as ic
from cadence_fx.passes.partition import Partition, capturability
flow, hift = s2.build_modules(0)
tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=5)
opt = cadence_fx.optimize(tail, rules="S", cache=False)
opt.set_stream_cache(*s2.synthetic_prompt(20, seed=2, device="cuda"))
p = opt.session.executable.programs[2]
g = fx.Graph(); g.output(g.graph_copy(p.run.graph, {})); cp = fx.GraphModule(p.run, g)
print("pass:", ic.IstftWithoutHostRead()(cp).record)
bad = [(n.name, str(n.target), capturability(n, "cuda").reason) for n in cp.graph.nodes if not capturability(n, "cuda").capturable]
print("non-capturable after pass:", bad[:10])
print("partition:", str(Partition("cuda")(cp).record)[:600])
opt2 = cadence_fx.optimize(tail, rules="SRc", cache=False)
opt2.set_stream_cache(*s2.synthetic_prompt(20, seed=2, device="cuda"))
for idx, text in opt2.session.executable.notes["rewrite"].items():
    i = text.find("IstftWithoutHostRead"); print("SRc", idx, text[i:i+700])
