import cProfile, pstats, tempfile, time, sys
import torch
import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
torch.set_num_threads(2)
flow, hift = s2.build_modules(0)
stock = s2.Token2WavTail(flow, hift, n_timesteps=5)
cache = "/tmp/prof/cfx"
opt = cadence_fx.optimize(stock, rules="S", cache=cache, off_catalog="specialize", capacity=500)
t0 = time.perf_counter()
opt.prepare_capacity([], [], prompt_tokens=())  # the capacity's own graphs (and its traces, once, to disk)
print("capacity built", round(time.perf_counter() - t0, 1), flush=True)
t0 = time.perf_counter()
opt.prepare_capacity([13], [], prompt_tokens=())  # the window's symbolic step traced (to disk), its graph
print("first shape", round(time.perf_counter() - t0, 1), flush=True)
pr = cProfile.Profile()
t0 = time.perf_counter()
pr.enable()
got = opt.prepare_capacity([14, 16], [3], prompt_tokens=())
pr.disable()
print("three shapes", round(time.perf_counter() - t0, 1), got, flush=True)
pr.dump_stats("/tmp/prof/prepare.prof")
st = pstats.Stats(pr); st.sort_stats("cumulative").print_stats(45)
