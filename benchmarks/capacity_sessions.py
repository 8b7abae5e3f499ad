"""One capacity executable serving voices of several prompt lengths, against stock (rule S; CPU or GPU).

The released Token2Wav (seed 0) traces its catalog entries once (``--trace-tokens``); each is
rewritten at ``--capacity`` prompt frames (``cadence_fx.capacity_executable``: the capacity
form through the compiler's rule-S passes), attention over padded keys masked only where the
device's probe finds every such call of that entry exact (``--attention probe``).  Voices of
``--prompt-tokens`` then stream interleaved on those graphs, each chunk against its own stock
tail (``lockstep.compare_streams``: waveform, PCM, every state tensor), a flush at the end
(the eager fallback: no variants yet).  Prints a JSON line per voice: exact, routes, the
median chunk ms of the capacity session and of stock; ``--json`` keeps the whole report.

    python benchmarks/capacity_sessions.py --device cuda --n-timesteps 5 --prompt-tokens 75,111,188,250
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--n-timesteps", type=int, default=5)
    p.add_argument("--trace-tokens", type=int, default=75)
    p.add_argument("--capacity", type=int, default=500, help="prompt frames")
    p.add_argument("--prompt-tokens", default="75,111,188,250")
    p.add_argument("--chunks", type=int, default=5)
    p.add_argument("--attention", choices=("exact", "probe"), default="probe")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        from cadence_fx.lockstep import deterministic_protocol
        deterministic_protocol()
    import cadence_fx
    from cadence_fx.capacity_executable import at_length, capacity_executable
    from cadence_fx.compiler import open_session
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.integrations.stepaudio2.session import Token2WavSession
    from cadence_fx.lockstep import compare_streams
    from cadence_fx.passes import capacity as cap

    def tail():
        flow, hift = s2.build_modules(0)
        return s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps)

    opt = cadence_fx.optimize(tail(), rules="S", cache=True)  # the program cache (a device call's .cfx)
    tokens, mels, spk = (t.to(device) for t in s2.synthetic_prompt(args.trace_tokens, seed=1))
    opt.set_stream_cache(tokens, mels, spk)
    steps = opt.programs.entry_steps(["prompt_frames"])
    masked = False
    if args.attention == "probe":  # masked only where every padded-key call of every entry is exact here
        verdicts = []
        for sym in steps.values():
            probe = cap.attention_probe(sym, {"prompt_frames": args.capacity},
                                        {"prompt_frames": list(range(100, args.capacity + 1, 2))}, device)
            plan = cap.plan_capacity(sym, {"prompt_frames": args.capacity}, masked_attention=probe)
            verdicts += [how for name, _, how in plan.modes if name.startswith("scaled_dot_product_attention")]
        masked = bool(verdicts) and all(v == "masked attention" for v in verdicts)
        print(json.dumps({"attention_probe": sorted(set(verdicts)), "masked": masked}), flush=True)
    cexe = capacity_executable(opt.adapter_for(args.capacity, spk), steps, masked_attention=masked)
    voices = {}
    for n in (int(x) for x in args.prompt_tokens.split(",")):
        tk, ml, sp = (t.to(device) for t in s2.synthetic_prompt(n, seed=n))
        adapter = opt.adapter_for(2 * n, sp)
        session = Token2WavSession(open_session(at_length(cexe, adapter), adapter, tk, ml, sp), sp, 2 * n, device)
        stock = tail()
        stock.set_stream_cache(tk, ml, sp)
        voices[n] = (session, stock, s2.synthetic_chunks(args.chunks, seed=n, final_tokens=11), [])
    for i in range(args.chunks + 1):
        for n, (session, stock, chunks, rows) in voices.items():
            rows.append(compare_streams(stock, session, chunks[i:i + 1], device, seed=1000 * n + i)["per_chunk"][0])
    out = {"torch": torch.__version__, "device": str(device),
           "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
           "n_timesteps": args.n_timesteps, "capacity": args.capacity, "masked_attention": masked, "voices": {}}
    for n, (_, _, _, rows) in voices.items():
        v = {"prompt_tokens": n, "exact": all(r["wave_equal"] and r["pcm_equal"] and r["state_equal"] for r in rows),
             "routes": [r["route"] for r in rows],
             "capacity_ms_p50": round(statistics.median(r["opt_ms"] for r in rows[:-1]), 2),
             "stock_ms_p50": round(statistics.median(r["stock_ms"] for r in rows[:-1]), 2)}
        out["voices"][n] = v
        print(json.dumps(v), flush=True)
    out["exact"] = all(v["exact"] for v in out["voices"].values())
    print("exact:", out["exact"])
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(out, indent=1) + "\n")
    return 0 if out["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
