"""What a voice pays for a window or flush of another branch class, with and without idle time (CPU or GPU).

A capacity's shared graph of a shape serves the voice lengths in the capacity's branch
class of the model's code (docs/serving.md, choosing a capacity): Token2Wav's chunk of n new
tokens branches on whether n divides the prompt's mel frames + 99.  A voice of the other
class gets a program of its own for that shape, traced at its exact shapes: on the chunk
that first sends it, or, given idle time before it (``session.idle()``), there
(``_StreamBuilder.work_ahead`` -> ``Variants.build_ahead``).  This pairs voices of that class
(each pair: one without idle time, one of the next length of the class given ``idle()``
after its steady chunks) through the drop-in on capacity graphs (``optimize(..., capacity=C)``,
the shape prepared first), and reports for each voice the shape's chunk wall time
(``chunk_ms``), the programs built on it, and the idle seconds; every chunk is compared with
stock (``lockstep.compare_streams``: waveform, PCM, state), so a program built ahead that
changed a bit fails the run.

    python benchmarks/other_class.py --n-timesteps 2 --capacity 500 --flush 3 --prompt-tokens 150,156,162,168
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--rules", default="S")
    p.add_argument("--n-timesteps", type=int, default=2)
    p.add_argument("--capacity", type=int, default=500)
    p.add_argument("--flush", type=int, default=3, help="the flush's tokens (its new-token count n)")
    p.add_argument("--prompt-tokens", default="150,156,162,168",
                   help="voices in pairs (the second of each given idle time), each of the flush's other class")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        from cadence_fx.lockstep import deterministic_protocol
        deterministic_protocol()
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.lockstep import compare_streams, sync
    voices = [int(x) for x in args.prompt_tokens.split(",")]
    n, cap_class = args.flush, (args.capacity + 99) % args.flush == 0
    wrong = [v for v in voices if ((2 * v + 99) % n == 0) == cap_class]
    if len(voices) % 2 or wrong:
        raise SystemExit(f"--prompt-tokens: pairs of voices of the {n}-token flush's other class than capacity "
                         f"{args.capacity}'s; {wrong or voices} is not")
    flow, hift = s2.build_modules(0)
    stock = s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps)
    opt = cadence_fx.optimize(stock, rules=args.rules, cache=tempfile.mkdtemp(prefix="cfx-other-"),
                              off_catalog="specialize", capacity=args.capacity)
    prepared = opt.prepare_capacity([], [n], prompt_tokens=voices)
    g = torch.Generator().manual_seed(0)

    def tokens(k):
        return torch.randint(0, s2.VOCAB, (k,), generator=g).tolist()
    rows, exact = [], True
    for i, v in enumerate(voices):
        idle = i % 2 == 1
        prompt = tuple(t.to(device) for t in s2.synthetic_prompt(v, seed=v))
        stock.set_stream_cache(*prompt)
        session = opt.open_session(*prompt)
        variants = session.session.executable.variants
        for j in range(3):
            exact = compare_streams(stock, session, [(tokens(28), False)], device, seed=1000 * v + j)["exact"] and exact
        idle_s = None
        if idle:
            t0 = time.perf_counter()
            session.idle()
            idle_s = round(time.perf_counter() - t0, 3)
        built = variants.built
        report = compare_streams(stock, session, [(tokens(n), True)], device, seed=1000 * v + 3)
        sync(device)
        exact = report["exact"] and exact
        (chunk,) = report["per_chunk"]
        (how,) = [h["how"] for h in variants.stats()["held"].values()] or ["-"]
        row = {"prompt_tokens": v, "idle": idle, "idle_s": idle_s, "chunk_ms": round(chunk["opt_ms"], 1),
               "stock_ms": round(chunk["stock_ms"], 1), "built_on_chunk": variants.built - built,
               "route": chunk["route"], "how": how, "exact": report["exact"]}
        if idle:
            row["ahead"] = variants.stats()["ahead"]
        session.close()
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads(),
           "n_timesteps": args.n_timesteps, "capacity": args.capacity, "flush": n,
           "prepared": prepared, "rows": rows, "exact": exact,
           "chunk_ms_p50_without_idle": statistics.median(r["chunk_ms"] for r in rows if not r["idle"]),
           "chunk_ms_p50_after_idle": statistics.median(r["chunk_ms"] for r in rows if r["idle"]),
           "idle_s_p50": statistics.median(r["idle_s"] for r in rows if r["idle"])}
    print(json.dumps({k: v for k, v in out.items() if k not in ("rows", "prepared")}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(out, indent=1) + "\n")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
