"""Print the partition of each catalog entry (what is captured, what stays eager and why)."""
import sys
import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2


rules = sys.argv[1] if len(sys.argv) > 1 else "SRc"
flow, hift = s2.build_modules(0)
tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=5)
pt, pm, spk = s2.synthetic_prompt(50, device="cuda")
opt = cadence_fx.optimize(tail, rules=rules)
exe = opt.executable(pm.shape[1], spk)
for idx, prog in exe.programs.items():
    print("entry", idx, exe.notes["rewrite"][idx][-600:])
    for name, mod in prog.run.named_children():
        n = sum(1 for x in getattr(mod, "piece", mod).graph.nodes if x.op == "call_function")
        print("  ", name, type(mod).__name__, n)
