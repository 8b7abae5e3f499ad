"""Replay vs the same partitioned graph run eagerly, region by region (debug aid)."""
import os
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch
torch.use_deterministic_algorithms(True)
import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.runtime.graphs import CapturedRegion, run_graph

flow, hift = s2.build_modules(0)
tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=5)
pt, pm, spk = s2.synthetic_prompt(10, device="cuda")
opt = cadence_fx.optimize(tail, rules="SRc")
opt.set_stream_cache(pt, pm, spk)
sess = opt.session
prog = sess._programs[0]
tok = s2.tokens_tensor(s2.synthetic_chunks(1)[0][0], "cuda")
args = [tok, spk] + [sess.arena.full(n) for n in prog.arena_inputs]
snap = sess.arena.storage.clone()
rng = torch.cuda.get_rng_state()

def trace_run(replay: bool):
    sess.arena.storage.copy_(snap)
    torch.cuda.set_rng_state(rng)
    log = []
    def call(mod, a):
        if isinstance(mod, CapturedRegion):
            out = mod(*a) if replay else mod.piece(*a)
        else:
            out = mod(*a)
        torch.cuda.synchronize()
        outs = out if isinstance(out, (tuple, list)) else (out,)
        log.append((getattr(mod, "name", type(mod).__name__), [o.clone() if isinstance(o, torch.Tensor) else o for o in outs],
                    {n: sess.arena.full(n).clone() for n in prog.arena_inputs}))
        return out
    res = run_graph(prog.run, args, call)
    return log, [r.clone() for r in res]

with torch.inference_mode():
    log_r, res_r = trace_run(True)
    log_e, res_e = trace_run(False)
    log_r2, res_r2 = trace_run(True)
print('replay deterministic:', all(torch.equal(a, b) for a, b in zip(res_r, res_r2)))
for (name, outs_r, ar_r), (_, outs_e, ar_e) in zip(log_r, log_e):
    bad_out = [i for i, (a, b) in enumerate(zip(outs_r, outs_e)) if isinstance(a, torch.Tensor) and not torch.equal(a, b)]
    bad_ar = [n for n in ar_r if not torch.equal(ar_r[n], ar_e[n])]
    print(f"{name}: outputs differing {bad_out[:10]} of {len(outs_r)}; arena regions differing {bad_ar}")
print("final outputs equal:", [torch.equal(a, b) for a, b in zip(res_r, res_e)])
for m in prog.run.children():
    if isinstance(m, CapturedRegion):
        print(m.name, "args", len(m.bound), "bound", sum(m.bound), "trivial", m.trivial,
              "static_in MiB", sum(t.nbytes for t in m.static_in if t is not None) / 2**20)
