"""Architecture item 4 (a): the released Token2Wav's symbolic entries held at a capacity, against specialize.

Records the symbolic steps a new prompt length builds (as ``length_inventory.py``), rewrites
each once with ``passes.capacity.capacity_form`` at ``--capacity`` prompt frames, and runs
that one graph at each of ``--prompt-frames`` against the graph ``specialize`` makes at that
length, on the same random inputs, state and bound buffers (the padding past each live
prefix holds NaN, or ``--fill``).  Checked with ``torch.equal`` on every output and new state
tensor (its live prefix) and every buffer (its live box): one JSON document with each
entry's plan (modes and islands) and verdicts.

    OMP_NUM_THREADS=1 python benchmarks/capacity_form.py --n-timesteps 2 --prompt-frames 150,222,500 [--json F]
    (--device cuda --masked-attention: the masked call where it is exact there)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def pad(t: torch.Tensor, shape, fill: float) -> torch.Tensor:
    out = torch.full(tuple(shape), fill, dtype=t.dtype, device=t.device) if t.is_floating_point() else \
        torch.zeros(tuple(shape), dtype=t.dtype, device=t.device)
    out[tuple(slice(0, n) for n in t.shape)] = t
    return out


def sizes(p_shape, binding):
    from cadence_fx.passes.specialize import _value
    return tuple(_value(s, binding, "a size") for s in p_shape)


def random_like(name: str, shape, dtype, device, g):
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 0.5).to(device=device, dtype=dtype)
    return torch.randint(0, 6561, shape, generator=g).to(device=device, dtype=dtype)


def check_entry(sym, capacity: int, frames: list[int], fill: float, device, masked: bool, seed: int) -> dict:
    from cadence_fx.errors import SpecializationRefused
    from cadence_fx.passes import capacity as cap
    from cadence_fx.passes.specialize import specialize
    t0 = time.perf_counter()
    gm, plan = cap.capacity_form(sym, {"prompt_frames": capacity}, masked_attention=masked)
    build_s = time.perf_counter() - t0
    out = {"describe": sym.describe(), "rewrite_s": round(build_s, 3), "counts": plan.counts(),
           "islands": len(plan.islands), "island_sizes": sorted((len(i) for i in plan.islands), reverse=True)[:12],
           "explain": plan.explain(), "lengths": []}
    cap_binding = cap._binding(sym, {"prompt_frames": capacity})
    sig_regions = [p for p in sym.placeholders if p.name.startswith("buf_")]
    for s in frames:
        row = {"prompt_frames": s}
        try:
            cap.check_dims(plan, sym, {"prompt_frames": s})
        except SpecializationRefused as e:
            row["refused"] = str(e)
            out["lengths"].append(row)
            continue
        binding = cap._binding(sym, {"prompt_frames": s})
        g = torch.Generator().manual_seed(seed + s)
        exact, padded = {}, {}
        for p in sym.placeholders:
            if p.name.startswith("dim_"):
                continue
            t = random_like(p.name, sizes(p.shape, binding), p.dtype, device, g)
            exact[p.name] = t
            padded[p.name] = pad(t, sizes(p.shape, cap_binding), fill)
        tensors = {k: v for k, v in exact.items() if not k.startswith("buf_")}
        buffers = {p.name[4:]: exact[p.name].clone() for p in sig_regions}
        with torch.no_grad():
            ref = specialize(sym, {"prompt_frames": s}, tensors, buffers)
            torch.manual_seed(seed)  # the vocoder's source draws noise: the same draws for both
            want = ref(*tensors.values())
            torch.manual_seed(seed)
            t1 = time.perf_counter()
            got = gm(s, torch.tensor(s, device=device), *[padded[p.name] for p in sym.placeholders
                                                          if not p.name.startswith("dim_")])
            row["run_s"] = round(time.perf_counter() - t1, 3)
        equal = [torch.equal(a, b[tuple(slice(0, n) for n in a.shape)]) for a, b in zip(want, got)]
        row["differ"] = [{"output": i, "shape": list(a.shape), "nan": bool(a.isnan().any()),
                          "max_abs": float((a - b[tuple(slice(0, n) for n in a.shape)]).abs().max())}
                         for i, (a, b, ok) in enumerate(zip(want, got, equal)) if not ok]
        bufs = [torch.equal(buffers[p.name[4:]], padded[p.name][tuple(slice(0, n) for n in buffers[p.name[4:]].shape)])
                for p in sig_regions]
        row.update(outputs=len(equal), outputs_equal=sum(equal), buffers=len(bufs), buffers_equal=sum(bufs),
                   exact=all(equal) and all(bufs))
        out["lengths"].append(row)
    out["exact"] = all(r.get("exact", True) for r in out["lengths"])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-timesteps", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=75, help="the length whose build records the entries")
    p.add_argument("--capacity", type=int, default=500, help="prompt frames the graphs are held at")
    p.add_argument("--prompt-frames", default="150,222,500")
    p.add_argument("--fill", type=float, default=float("nan"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--masked-attention", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.programs import entry as entry_mod

    syms = []
    orig = entry_mod.specialize

    def record(sym, at, tensors, by_region, recompile=True, share=None):
        syms.append(sym)
        return orig(sym, at, tensors, by_region, recompile=recompile, share=share)

    device = torch.device(args.device)
    entry_mod.specialize = record
    try:
        flow, hift = s2.build_modules(0, device=device) if args.device != "cpu" else s2.build_modules(0)
        tail = s2.Token2WavTail(flow, hift, n_timesteps=args.n_timesteps)
        opt = cadence_fx.optimize(tail, rules="S", cache=True)
        opt.set_stream_cache(*[t.to(device) for t in s2.synthetic_prompt(args.prompt_tokens, seed=1)])
    finally:
        entry_mod.specialize = orig
    seen, entries = set(), []
    frames = [int(x) for x in args.prompt_frames.split(",")]
    for sym in syms:
        if id(sym) in seen:
            continue
        seen.add(id(sym))
        entries.append(check_entry(sym, args.capacity, frames, args.fill, device, args.masked_attention, args.seed))
        print(json.dumps({k: v for k, v in entries[-1].items() if k != "explain"}, default=str), flush=True)
    out = {"torch": torch.__version__, "device": args.device, "n_timesteps": args.n_timesteps,
           "capacity": args.capacity, "fill": str(args.fill), "masked_attention": args.masked_attention,
           "exact": all(e["exact"] for e in entries), "entries": entries}
    text = json.dumps(out, indent=1, default=str)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print("exact:", out["exact"])
    return 0 if out["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
