"""Architecture item 4 (a): the released Token2Wav's symbolic entries held at a capacity, against specialize.

Records the symbolic steps a new prompt length builds (as ``length_inventory.py``), rewrites
each once with ``passes.capacity.capacity_form`` at ``--capacity`` prompt frames, and runs
that one graph at each of ``--prompt-frames`` against the graph ``specialize`` makes at that
length, on the same random inputs, state and bound buffers (the padding past each live
prefix holds NaN, or ``--fill``).  Checked with ``torch.equal`` on every output and new state
tensor (its live prefix) and every buffer (its live box): one JSON document with each
entry's plan (modes and islands) and verdicts.

    OMP_NUM_THREADS=1 python benchmarks/capacity_form.py --n-timesteps 2 --prompt-frames 150,222,500 [--json F]
    (--device cuda --attention probe: the masked call wherever the device's probe finds it exact)
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


def tensors_at(sym, s: int, capacity: int, fill: float, device, seed: int):
    """Random inputs, state and buffers at ``s`` (``exact``) and the same held at the capacity
    with ``fill`` past each live prefix (``padded``), by placeholder name."""
    from cadence_fx.passes import capacity as cap
    binding = cap._binding(sym, {"prompt_frames": s})
    cap_binding = cap._binding(sym, {"prompt_frames": capacity})
    g = torch.Generator().manual_seed(seed + s)
    exact, padded = {}, {}
    for p in sym.placeholders:
        if p.name.startswith("dim_"):
            continue
        t = random_like(p.name, sizes(p.shape, binding), p.dtype, device, g)
        exact[p.name] = t
        padded[p.name] = pad(t, sizes(p.shape, cap_binding), fill)
    return exact, padded


def reference(sym, s: int, exact: dict, seed: int):
    """``specialize``'s graph at ``s`` run on ``exact``: (outputs, buffers it wrote)."""
    from cadence_fx.passes.specialize import specialize
    tensors = {k: v for k, v in exact.items() if not k.startswith("buf_")}
    buffers = {k[4:]: v.clone() for k, v in exact.items() if k.startswith("buf_")}
    with torch.no_grad():
        ref = specialize(sym, {"prompt_frames": s}, tensors, buffers)
        torch.manual_seed(seed)  # the vocoder's source draws noise: the same draws for both
        return ref(*tensors.values()), buffers


def compare(want, got, buffers: dict, padded: dict) -> dict:
    """``torch.equal`` on each output's and buffer's live part."""
    live = lambda b, a: b[tuple(slice(0, n) for n in a.shape)]  # noqa: E731
    equal = [torch.equal(a, live(b, a)) for a, b in zip(want, got)]
    bufs = [torch.equal(t, live(padded["buf_" + r], t)) for r, t in buffers.items()]
    return {"differ": [{"output": i, "shape": list(a.shape), "max_abs": float((a - live(b, a)).abs().max())}
                       for i, (a, b, ok) in enumerate(zip(want, got, equal)) if not ok],
            "outputs": len(equal), "outputs_equal": sum(equal), "buffers": len(bufs), "buffers_equal": sum(bufs),
            "exact": all(equal) and all(bufs)}


def check_entry(sym, capacity: int, frames: list[int], fill: float, device, masked, seed: int) -> dict:
    from cadence_fx.errors import SpecializationRefused
    from cadence_fx.passes import capacity as cap
    t0 = time.perf_counter()
    gm, plan = cap.capacity_form(sym, {"prompt_frames": capacity}, masked_attention=masked)
    out = {"describe": sym.describe(), "rewrite_s": round(time.perf_counter() - t0, 3), "counts": plan.counts(),
           "islands": len(plan.islands), "island_sizes": sorted((len(i) for i in plan.islands), reverse=True)[:12],
           "explain": plan.explain(), "lengths": []}
    for s in frames:
        row = {"prompt_frames": s}
        try:
            cap.check_dims(plan, sym, {"prompt_frames": s})
        except SpecializationRefused as e:
            row["refused"] = str(e)
            out["lengths"].append(row)
            continue
        exact, padded = tensors_at(sym, s, capacity, fill, device, seed)
        want, buffers = reference(sym, s, exact, seed)
        with torch.no_grad():
            torch.manual_seed(seed)
            t1 = time.perf_counter()
            with cap.at_dims({"prompt_frames": s}):
                got = gm(*cap.arguments(gm, padded, {"prompt_frames": torch.tensor(s, device=device)}))
            row["run_s"] = round(time.perf_counter() - t1, 3)
        row.update(compare(want, got, buffers, padded))
        out["lengths"].append(row)
    out["exact"] = all(r.get("exact", True) for r in out["lengths"])
    return out


def record_entries(n_timesteps: int, prompt_tokens: int, device) -> list:
    """The symbolic steps the released Token2Wav (seed 0) builds for a prompt of ``prompt_tokens``."""
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.programs import entry as entry_mod
    syms = []
    orig = entry_mod.specialize

    def record(sym, at, tensors, by_region, recompile=True, share=None):
        if all(sym is not x for x in syms):
            syms.append(sym)
        return orig(sym, at, tensors, by_region, recompile=recompile, share=share)

    entry_mod.specialize = record
    try:
        flow, hift = s2.build_modules(0)
        tail = s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=n_timesteps)
        opt = cadence_fx.optimize(tail, rules="S", cache=True)
        opt.set_stream_cache(*[t.to(device) for t in s2.synthetic_prompt(prompt_tokens, seed=1)])
    finally:
        entry_mod.specialize = orig
    return syms


def attention(args, sym, device):
    """``capacity_form``'s ``masked_attention`` for ``--attention``."""
    if args.attention != "probe":
        return args.attention == "masked"
    from cadence_fx.passes import capacity as cap
    return cap.attention_probe(sym, {"prompt_frames": args.capacity},
                               {"prompt_frames": list(range(100, args.capacity + 1, 2))}, device)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-timesteps", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=75, help="the length whose build records the entries")
    p.add_argument("--capacity", type=int, default=500, help="prompt frames the graphs are held at")
    p.add_argument("--prompt-frames", default="150,222,500")
    p.add_argument("--fill", type=float, default=float("nan"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--attention", choices=("exact", "masked", "probe"), default="exact",
                   help="over padded keys: exact islands, the masked call, or what a probe on the device "
                        "finds exact at every even prompt length from 100 frames to the capacity")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":  # the protocol exactness is defined under
        from cadence_fx.lockstep import deterministic_protocol
        deterministic_protocol()
    frames = [int(x) for x in args.prompt_frames.split(",")]
    entries = []
    for sym in record_entries(args.n_timesteps, args.prompt_tokens, device):
        entries.append(check_entry(sym, args.capacity, frames, args.fill, device, attention(args, sym, device),
                                   args.seed))
        print(json.dumps({k: v for k, v in entries[-1].items() if k != "explain"}, default=str), flush=True)
    out = {"torch": torch.__version__, "device": args.device, "n_timesteps": args.n_timesteps,
           "capacity": args.capacity, "fill": str(args.fill), "attention": args.attention,
           "exact": all(e["exact"] for e in entries), "entries": entries}
    text = json.dumps(out, indent=1, default=str)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print("exact:", out["exact"])
    return 0 if out["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
