"""New voices through the drop-in, per prompt length against ``capacity=``, each against stock (``--rules``).

Real duplex services take a new voice prompt per session (75-250 tokens).  Without
``capacity`` each new length is compiled for itself (a specialization of the model's
symbolic steps, then the passes); with ``optimize(..., capacity=C)`` it runs graphs built
once for every length up to ``C`` (``cadence_fx.capacity_executable``) after a check at its
length.  Both drop-ins (``off_catalog="specialize"``) first serve one warm-up voice
(``--trace-tokens``: the symbolic traces, the capacity's graphs, the window's and the flush's
shape), timed apart.  Then each voice of ``--prompt-tokens`` streams ``--turns`` turns
(``--steady`` chunks of 25+3 tokens, a ``--window``-token window, a ``--flush``-token flush, a
reset between turns), every chunk against the stock tail set up alike (waveform, PCM,
every state tensor: ``lockstep.compare_streams``).  Per variant and voice: set-up seconds
(``open_session``: what a new voice waits for before its first chunk, stock's
``set_stream_cache`` beside it), time to first audio (set-up + first chunk), chunk ms
median, routes, the arena's bytes; overall medians, paired ratios, and ``exact``.

    python benchmarks/capacity_voices.py --n-timesteps 2 --capacity 500 --prompt-tokens 90,111,150,188,237
    python benchmarks/capacity_voices.py --device cuda --rules SRc --n-timesteps 5 --capacity 500 ...
    python benchmarks/capacity_voices.py --device cuda --rules SRc ... --shared-captures

``--shared-captures`` adds a third variant, the capacity's graphs captured once for every
voice on its working arena (``runtime.working``), paired against the capacity variant
(``paired_shared``: shared / capacity per voice).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import torch


def _tokens(n: int, seed: int) -> list[int]:
    from cadence_fx.integrations import stepaudio2 as s2
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, s2.VOCAB, (n,), generator=g).tolist()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _turn(args, seed: int) -> list:
    return ([(_tokens(28, seed + i), False) for i in range(args.steady)]
            + [(_tokens(args.window, seed + 50), False), (_tokens(args.flush, seed + 51), True)])


def _voice(opt, stock, n: int, args, device: torch.device) -> dict:
    """One voice on ``opt`` against ``stock``: its set-up, then its turns."""
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.lockstep import compare_streams
    prompt = tuple(t.to(device) for t in s2.synthetic_prompt(n, seed=n))
    _sync(device)
    t0 = time.perf_counter()
    stock.set_stream_cache(*prompt)
    _sync(device)
    t1 = time.perf_counter()
    session = opt.open_session(*prompt)
    _sync(device)
    t2 = time.perf_counter()
    rows = []
    for t in range(args.turns):
        if t:
            stock.set_stream_cache(*prompt)
            session.reset()
        rows += compare_streams(stock, session, _turn(args, 1000 * n + 100 * t), device, seed=n + t)["per_chunk"]
    arena = session.session.arena.nbytes if session.session.arena is not None else 0
    capacity = session.session.executable.notes.get("capacity")
    session.close()
    return {"prompt_tokens": n, "prompt_frames": 2 * n, "capacity": capacity,
            "exact": all(r["wave_equal"] and r["pcm_equal"] and r["state_equal"] for r in rows),
            "setup_s": round(t2 - t1, 3), "stock_setup_s": round(t1 - t0, 3),
            "ttfa_ms": round(1000 * (t2 - t1) + rows[0]["opt_ms"], 1),
            "stock_ttfa_ms": round(1000 * (t1 - t0) + rows[0]["stock_ms"], 1),
            "chunk_ms_p50": round(statistics.median(r["opt_ms"] for r in rows), 1),
            "stock_chunk_ms_p50": round(statistics.median(r["stock_ms"] for r in rows), 1),
            "routes": [r["route"] for r in rows], "arena_bytes": arena}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--rules", default="S", help="S, SR or SRc (capacity graphs need S)")
    p.add_argument("--n-timesteps", type=int, default=2)
    p.add_argument("--capacity", type=int, default=500, help="prompt frames")
    p.add_argument("--trace-tokens", type=int, default=75, help="the warm-up voice (not measured with the others)")
    p.add_argument("--prompt-tokens", default="90,111,150,188,237")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--steady", type=int, default=3)
    p.add_argument("--window", type=int, default=14, help="tokens (11 + 3 lookahead)")
    p.add_argument("--flush", type=int, default=7)
    p.add_argument("--shared-captures", action="store_true",
                   help="a third variant: the capacity's graphs captured once for every voice (optimize(..., "
                        "shared_captures=True); rules SR/SRc), paired against the capacity variant")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        from cadence_fx.lockstep import deterministic_protocol
        deterministic_protocol()
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2
    flow, hift = s2.build_modules(0)
    stock = s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps)
    cache = tempfile.mkdtemp(prefix="cfx-capacity-voices-")  # both variants: one trace of each step
    out = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads(),
           "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
           "n_timesteps": args.n_timesteps, "rules": args.rules, "capacity": args.capacity, "turn": {
               "steady": args.steady, "window": args.window, "flush": args.flush, "turns": args.turns},
           "variants": {}}
    variants = [("per-length", {}), ("capacity", {"capacity": args.capacity})]
    if args.shared_captures:
        variants.append(("shared", {"capacity": args.capacity, "shared_captures": True}))
    for name, options in variants:
        opt = cadence_fx.optimize(stock, rules=args.rules, cache=cache, off_catalog="specialize", **options)
        t0 = time.perf_counter()
        warm = _voice(opt, stock, args.trace_tokens, argparse.Namespace(**{**vars(args), "turns": 1}), device)
        warm["wall_s"] = round(time.perf_counter() - t0, 1)
        voices = [_voice(opt, stock, int(n), args, device) for n in args.prompt_tokens.split(",")]
        for v in voices:
            print(json.dumps({"variant": name, **{k: v[k] for k in v if k != "routes"}}), flush=True)
        routes = [r for v in voices for r in v["routes"]]
        out["variants"][name] = {
            "warm_up": warm, "voices": voices, "exact": warm["exact"] and all(v["exact"] for v in voices),
            "program_share": round(sum(r.startswith(("graph", "replay")) for r in routes) / len(routes), 4),
            "replayed_share": round(sum(r.startswith("replay") for r in routes) / len(routes), 4),
            "setup_s_p50": statistics.median(v["setup_s"] for v in voices),
            "ttfa_ms_p50": statistics.median(v["ttfa_ms"] for v in voices),
            "stock_ttfa_ms_p50": statistics.median(v["stock_ttfa_ms"] for v in voices),
            "chunk_ms_p50": statistics.median(v["chunk_ms_p50"] for v in voices),
            "stock_chunk_ms_p50": statistics.median(v["stock_chunk_ms_p50"] for v in voices),
            "arena_bytes_max": max(v["arena_bytes"] for v in voices)}
        if "capacity" in options:
            out["variants"][name]["capacity_stats"] = opt.capacity_stats()
    per, cap = out["variants"]["per-length"], out["variants"]["capacity"]
    out["exact"] = all(v["exact"] for v in out["variants"].values())
    out["paired"] = _paired(cap, per)  # per voice: capacity / per-length
    if "shared" in out["variants"]:
        out["paired_shared"] = _paired(out["variants"]["shared"], cap)  # per voice: shared / capacity
    print(json.dumps({"exact": out["exact"], "paired": out["paired"], "paired_shared": out.get("paired_shared"),
                      **{f"{k}_{n}": v[k] for n, v in out["variants"].items()
                         for k in ("program_share", "replayed_share", "setup_s_p50", "ttfa_ms_p50", "stock_ttfa_ms_p50",
                                   "chunk_ms_p50", "arena_bytes_max")}}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(out, indent=1) + "\n")
    return 0 if out["exact"] else 1


def _paired(a: dict, b: dict) -> dict:
    """Per voice ``a / b`` of set-up, time to first audio and chunk median: their medians."""
    def ratio(key):
        return round(statistics.median(x[key] / y[key] for x, y in zip(a["voices"], b["voices"])), 3)
    return {"setup_ratio_p50": ratio("setup_s"), "ttfa_ratio_p50": ratio("ttfa_ms"),
            "chunk_ratio_p50": ratio("chunk_ms_p50")}


if __name__ == "__main__":
    sys.exit(main())
