"""Diagnostic (H200): what istft_check records on the compiled Token2Wav entries."""
import os, re, torch
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
torch.use_deterministic_algorithms(True)
import torch.fx as fx
import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.passes import istft_check as ic
flow, hift = s2.build_modules(0)
tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=5)
for rules in ("S", "SRc"):
    opt = cadence_fx.optimize(tail, rules=rules, cache=False)
    opt.set_stream_cache(*s2.synthetic_prompt(20, seed=2, device="cuda"))
    exe = opt.session.executable
    for idx, text in exe.notes["rewrite"].items():
        m = re.search(r"IstftWithoutHostRead: ([^;]*(; kept: \[[^\]]*\])?)", text)
        print(rules, idx, "RECORD:", m.group(1) if m else None)
    if rules == "S":
        p = exe.programs[2]
        for n in p.run.graph.nodes:
            if n.target is torch.ops.aten.istft.default:
                w = n.args[4]
                print("window", w.op, w.target, [(a.op, str(a.target)) for a in w.all_input_nodes] if isinstance(w, fx.Node) else w)
                x = n.args[0]; v = x.meta.get("val")
                print("x", x.op, x.target, type(v).__name__, getattr(v, "shape", None), getattr(v, "device", None))
        g = fx.Graph(); g.output(g.graph_copy(p.run.graph, {})); cp = fx.GraphModule(p.run, g)
        print("S entry 2 pass:", ic.IstftWithoutHostRead()(cp).record)
