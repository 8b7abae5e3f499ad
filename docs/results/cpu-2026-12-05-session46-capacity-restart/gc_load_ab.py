import sys, time, glob, pickle, statistics, gc
import torch
torch.set_num_threads(2)
import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.programs import disk as d
from cadence_fx.programs.serialize import decode_graph, decode_step, tensor_paths
from cadence_fx.runtime import collector
flow, hift = s2.build_modules(0)
tail = s2.Token2WavTail(flow, hift, n_timesteps=5)
opt = cadence_fx.optimize(tail, rules="S", cache=False, capacity=500)
mods = opt.adapter_for(500, torch.zeros(1, 192)).modules()
recs = []
for f in sorted(glob.glob(sys.argv[1] + "/*.cfx")):
    data = open(f, "rb").read()
    head, _, payload = data[len(d.MAGIC):].partition(b"\n")
    rec = pickle.loads(payload)
    if "plan" in rec and rec["step"] is not None:
        recs.append(payload)
keep = []  # what a loader keeps (graphs held, as a capacity holds them)
def load(payload):
    rec = pickle.loads(payload)
    live = tensor_paths(mods)
    r, names = rec["folds"]
    given = dict(zip(names, decode_graph(r, mods, runnable=True, live=live)()))
    gm = decode_graph(rec["graph"], mods, runnable=False, given=given, live=live)
    st = decode_step(rec["step"], mods)
    keep.append((gm, st))
res = {"gc": [], "held": []}
for i in range(6):
    for mode in (("gc", "held") if i % 2 else ("held", "gc")):
        t0 = time.perf_counter()
        if mode == "held":
            with collector.held():
                for p in recs: load(p)
        else:
            for p in recs: load(p)
        res[mode].append(time.perf_counter() - t0)
print({k: (round(statistics.median(v), 3), [round(x, 2) for x in v]) for k, v in res.items()}, len(recs), "records each")
