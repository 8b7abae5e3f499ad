import gc, sys, torch, weakref
import cadence_fx
from cadence_fx.runtime import arena as A
from cadence_fx import compiler
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.verify import deterministic_protocol
deterministic_protocol()
made = []
weaks = []
orig = A.Arena.__init__
def init(self, *a, **k):
    orig(self, *a, **k); from torch.multiprocessing.reductions import StorageWeakRef
    made.append((self.storage.untyped_storage().data_ptr(), weakref.ref(self))); weaks.append(StorageWeakRef(self.storage.untyped_storage()))
A.Arena.__init__ = init
compiler.Arena = A.Arena
dev = torch.device(sys.argv[1])
if dev.type == "cuda": torch.cuda.memory._record_memory_history(max_entries=1_000_000)
flow, hift = s2.build_modules(0)
tail = s2.Token2WavTail(flow.to(dev), hift.to(dev), n_timesteps=int(sys.argv[2]))
opt = cadence_fx.optimize(tail, rules=sys.argv[3])
opt.set_stream_cache(*s2.synthetic_prompt(int(sys.argv[4]), 0, device=dev))
for k, (tok, last) in enumerate(s2.synthetic_chunks(3, 0)):
    torch.manual_seed(k); opt.stream(tok, last_chunk=False, return_waveform=True)
if dev.type == "cuda":
    torch.cuda.synchronize()
    for seg in torch.cuda.memory_snapshot():
        for blk in seg["blocks"]:
            if blk["size"] >= 100 << 20 and blk["state"] != "inactive":
                fr = [f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}" for f in blk.get("frames", []) if f['filename'].endswith('.py')][:14]
                print("BLOCK", blk["size"] >> 20, "MiB", blk["state"], hex(seg["address"]), fr)
gc.collect()
print("storage expired", [w.expired() for w in weaks]); print("arenas", [(hex(p), r() is not None) for p, r in made])
live = opt.session.arena.storage.untyped_storage().data_ptr()
def name(o):
    return type(o).__module__ + "." + type(o).__qualname__
for p, r in made:
    if p == live: continue
    hits = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and not isinstance(o, torch._subclasses.FakeTensor) and o.untyped_storage().data_ptr() == p]
    print("dead arena", hex(p), "tensors", len(hits), [tuple(h.shape) for h in hits[:8]])
    seen = set()
    def walk(o, depth, path):
        if depth > 6: print("   ", " <- ".join(path)); return
        refs = [x for x in gc.get_referrers(o) if x is not hits and not isinstance(x, type(sys._getframe())) and id(x) not in seen]
        if not refs: print("   ", " <- ".join(path), "<- (root)"); return
        for x in refs[:3]:
            seen.add(id(x))
            label = name(x)
            if isinstance(x, dict):
                keys = [k for k, v in x.items() if v is o][:2]
                label += f"{keys}"
            walk(x, depth + 1, path + [label])
    for h in hits[:2]:
        walk(h, 0, [f"tensor{tuple(h.shape)}"])
