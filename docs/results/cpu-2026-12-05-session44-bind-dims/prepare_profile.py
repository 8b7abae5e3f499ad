import cProfile, pstats, sys, time
import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
flow, hift = s2.build_modules(0)
stock = s2.Token2WavTail(flow, hift, n_timesteps=2)
opt = cadence_fx.optimize(stock, rules="S", cache=sys.argv[1], off_catalog="specialize", capacity=500)
opt.prepare_capacity([20], [])
pr = cProfile.Profile(); pr.enable(); t=time.perf_counter()
print(opt.prepare_capacity([21, 22], [7]))
print("three more:", time.perf_counter()-t)
pr.disable(); pr.dump_stats("/tmp/prof/warm.prof")
