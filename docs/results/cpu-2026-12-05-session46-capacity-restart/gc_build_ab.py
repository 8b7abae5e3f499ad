import time, statistics, contextlib
import torch
torch.set_num_threads(2)
import cadence_fx
from cadence_fx import capacity_build as cb
from cadence_fx.runtime import collector
from cadence_fx.integrations import stepaudio2 as s2
flow, hift = s2.build_modules(0)
tail = s2.Token2WavTail(flow, hift, n_timesteps=5)
opt = cadence_fx.optimize(tail, rules="S", cache=False, capacity=500, off_catalog="specialize")
opt.prepare_capacity([11], [], prompt_tokens=())  # the capacity, the window's symbolic step
res = {"gc": [], "held": []}
n = 12
real = collector.held
for i in range(3):
    for mode in (("gc", "held") if i % 2 else ("held", "gc")):
        cb.collector.held = real if mode == "held" else contextlib.nullcontext
        t0 = time.perf_counter()
        opt.prepare_capacity([n], [], prompt_tokens=())
        res[mode].append(time.perf_counter() - t0)
        n += 1
cb.collector.held = real
print({k: (round(statistics.median(v), 2), [round(x, 2) for x in v]) for k, v in res.items()})
