import gc, torch
from torch.multiprocessing.reductions import StorageWeakRef
from cadence_fx.runtime import arena as A
from cadence_fx import compiler
from cadence_fx.integrations import stepaudio2 as s2
weaks = []
orig = A.Arena.__init__
def init(self, *a, **k):
    orig(self, *a, **k); weaks.append(StorageWeakRef(self.storage.untyped_storage()))
A.Arena.__init__ = init
flow, hift = s2.build_modules(0)
tail = s2.Token2WavTail(flow, hift, n_timesteps=2)
import cadence_fx
opt = cadence_fx.optimize(tail)
pt, pm, spk = s2.synthetic_prompt(5, 0)
ad = opt._adapter(2 * 5, spk) if hasattr(opt, "_adapter") else None
exe = compiler._compile(ad, "SRc")
gc.collect()
print("expired after SRc compile on CPU:", [w.expired() for w in weaks])
