"""What a new turn of the same voice costs: ``Token2WavSession.reset()`` against stock's set-up.

    python benchmarks/turn_reset.py --device cuda --rules SRc --n-timesteps 5 \
        --prompt-tokens 75,250 --turns 3 --chunks 4 --out DIR

Per prompt length: one session is opened; each turn after the first starts with
``reset()`` (timed, device synchronized before and after), while stock sets the same
prompt up again (``set_stream_cache``, timed the same way: what a turn costs without a
kept snapshot).  Every turn streams ``--chunks`` windows and a flush against stock
(``torch.equal`` on every waveform and state tensor, SHA-256 of the PCM), so ``exact``
stands beside every number; ``replayed`` counts the chunks the captured graphs ran.
Writes ``DIR/turn-reset-<rules>-<steps>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rules", default="SRc")
    ap.add_argument("--n-timesteps", type=int, default=5)
    ap.add_argument("--prompt-tokens", default="75,250")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)

    import torch
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.lockstep import compare_streams, deterministic_protocol

    deterministic_protocol()
    device = torch.device(args.device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed(fn) -> float:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return (time.perf_counter() - t0) * 1e3

    flow, hift = s2.build_modules(args.seed)
    tail = s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps)
    opt = cadence_fx.optimize(tail, rules=args.rules)
    rows = []
    for p in (int(x) for x in args.prompt_tokens.split(",")):
        prompt = tuple(t.to(device) for t in s2.synthetic_prompt(p, seed=args.seed + p))
        t0 = time.perf_counter()
        session = opt.open_session(*prompt)
        sync()
        open_s = time.perf_counter() - t0
        reset_ms, stock_setup_ms, turns = [], [], []
        for turn in range(args.turns):
            if turn:
                reset_ms.append(round(timed(session.reset), 3))
            stock_setup_ms.append(round(timed(lambda: tail.set_stream_cache(*prompt)), 3))
            chunks = s2.synthetic_chunks(args.chunks, seed=args.seed + 100 * turn + p, final_tokens=1 + turn * 7)
            before = sum(session.stats().get("replays", {}).values())
            report = compare_streams(tail, session, chunks, device, seed=args.seed + turn)
            turns.append({"turn": turn, "exact": report["exact"], "chunks": report["chunks"],
                          "replayed": sum(session.stats().get("replays", {}).values()) - before,
                          "pcm_sha256": report["pcm_sha256_optimized"], "mismatches": report["mismatches"]})
            print(json.dumps({"prompt_tokens": p, **turns[-1]}), flush=True)
        rows.append({"prompt_tokens": p, "open_session_s": round(open_s, 3), "setup_bytes": session.setup_bytes,
                     "reset_ms": reset_ms, "stock_set_stream_cache_ms": stock_setup_ms,
                     "exact": all(t["exact"] for t in turns), "turns": turns})
        session.close()
    resets = [m for r in rows for m in r["reset_ms"]]
    out = {"gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "rules": args.rules,
           "n_timesteps": args.n_timesteps, "command": "python3 benchmarks/turn_reset.py " + " ".join(sys.argv[1:]),
           "reset_ms_median": round(statistics.median(resets), 3) if resets else None,
           "reset_ms_max": max(resets) if resets else None,
           "exact": all(r["exact"] for r in rows), "rows": rows}
    path = Path(args.out) / f"turn-reset-{args.rules}-{args.n_timesteps}.json"
    path.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("reset_ms_median", "reset_ms_max", "exact")}))
    return 0 if out["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
