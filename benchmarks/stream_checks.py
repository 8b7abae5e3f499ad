"""What a new voice on capacity graphs pays in checks at its length, per check (CPU or GPU).

``at_length`` checks each catalog entry's capacity graph at a new voice's length (its dims,
guards and a hazard walk of the region views); a voice's first window or flush of a shape
checks that shape's shared graph the same way (``_StreamBuilder.on_shared``), on the chunk.
This times both, per voice, through the drop-in (``optimize(..., capacity=C)``, every
window and flush shape prepared first): ``at_length_s`` at set-up, and for each window and
flush ``check_s`` (``on_shared``: the shared graph's check, and its wrapping as the stream's
program).  With ``--idle`` each prompt length N is paired with a voice of N+1 tokens that
gets ``session.idle()`` after its steady chunks (``idle_s``): the checks are made there, and
``check_s`` is what the window's chunk still pays.  Every chunk is compared with stock
(``lockstep.compare_streams``) so a faster check that changed a bit fails the run.

    python benchmarks/stream_checks.py --n-timesteps 5 --capacity 512 --prompt-tokens 93,151,207 [--idle]
"""

from __future__ import annotations

import argparse
import functools
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
    p.add_argument("--n-timesteps", type=int, default=5)
    p.add_argument("--capacity", type=int, default=512)
    p.add_argument("--prompt-tokens", default="93,151,207")
    p.add_argument("--windows", default="14,15,20", help="window lengths (tokens, lookahead included)")
    p.add_argument("--flush", type=int, default=9)
    p.add_argument("--idle", action="store_true", help="pair each voice with one of a token more given idle time")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        from cadence_fx.lockstep import deterministic_protocol
        deterministic_protocol()
    import cadence_fx
    from cadence_fx import capacity_executable as ce
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.lockstep import compare_streams
    spent: dict = {}

    def timed(owner, name):
        f = getattr(owner, name)

        @functools.wraps(f)
        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        setattr(owner, name, g)
    timed(ce, "at_length")
    timed(ce._StreamBuilder, "on_shared")
    flow, hift = s2.build_modules(0)
    stock = s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps)
    opt = cadence_fx.optimize(stock, rules=args.rules, cache=tempfile.mkdtemp(prefix="cfx-checks-"),
                              off_catalog="specialize", capacity=args.capacity)
    windows = [int(w) for w in args.windows.split(",")]
    voice_tokens = [int(x) + i for x in args.prompt_tokens.split(",") for i in (0, 1)]  # (with --idle's voices)
    opt.prepare_capacity(windows, [args.flush], prompt_tokens=voice_tokens)
    g = torch.Generator().manual_seed(0)

    def tokens(n):
        return torch.randint(0, s2.VOCAB, (n,), generator=g).tolist()
    rows, exact = [], True
    voices = [(int(x) + idle, idle) for x in args.prompt_tokens.split(",") for idle in ((0, 1) if args.idle else (0,))]
    for n, idle in voices:
        prompt = tuple(t.to(device) for t in s2.synthetic_prompt(n, seed=n))
        spent.clear()
        stock.set_stream_cache(*prompt)
        session = opt.open_session(*prompt)
        at_length_s = spent.get("at_length", 0.0)
        chunks = [(tokens(28), False) for _ in range(3)] + [(tokens(w), False) for w in windows] + [(tokens(args.flush), True)]
        checks, idle_s = [], None
        for i, chunk in enumerate(chunks):
            if i == 3 and idle:
                t0 = time.perf_counter()
                session.idle()
                idle_s = round(time.perf_counter() - t0, 4)
            spent.clear()
            exact = compare_streams(stock, session, [chunk], device, seed=1000 * n + i)["exact"] and exact
            if i >= 3:
                checks.append({"tokens": len(chunk[0]), "last": chunk[1], "check_s": round(spent.get("on_shared", 0.0), 4)})
        row = {"prompt_tokens": n, "idle": bool(idle), "idle_s": idle_s, "at_length_s": round(at_length_s, 4),
               "checks": checks}
        if idle:
            row["ahead"] = session.stats()["specializations"]["ahead"]
        session.close()
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads(),
           "n_timesteps": args.n_timesteps, "capacity": args.capacity, "rows": rows, "exact": exact,
           "at_length_s_p50": statistics.median(r["at_length_s"] for r in rows),
           "check_s_p50": statistics.median(c["check_s"] for r in rows if not r["idle"] for c in r["checks"])}
    if args.idle:
        out["check_s_p50_after_idle"] = statistics.median(c["check_s"] for r in rows if r["idle"] for c in r["checks"])
        out["idle_s_p50"] = statistics.median(r["idle_s"] for r in rows if r["idle"])
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(out, indent=1) + "\n")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
