"""A server's restart on capacity graphs: prepare with the program cache empty, then in new processes.

Token2Wav at the released configuration (seeded random weights), ``optimize(..., capacity=C)``,
``prepare_capacity(windows, flushes, prompt_tokens=[P])``: each capacity's catalog graphs and the
shared graph of each window and flush length.  The first process finds the program cache
directory empty (it traces the symbolic steps and builds every capacity graph, storing both);
each later process is a restart on the same directory (``capacity_build``: the graphs are
loaded, lowered and, with shared captures, captured).  Every process then runs one voice of
P tokens through warm-up, growth, the trim, steady chunks, a window and a flush of lengths
it prepared, against the stock tail in that process (waveform, PCM and every state tensor):
the exactness verdict beside each time.  Each process is a fresh interpreter started by this
driver, so nothing is shared but the directory.

    python benchmarks/capacity_restart.py --capacity 500 --windows 11,13 --flushes 3 --loads 2 \\
        --out docs/results/<dir>
    (GPU: --device cuda --rules SRc --shared-captures; the deterministic protocol is set)

Writes ``restart.json`` (each process's prepare seconds, what prepare said per shape, the
cache's counts, the voice's routes and verdict, peak RSS) and prints one line per process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def child(args) -> dict:
    import torch
    torch.set_num_threads(args.threads)
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.lockstep import compare_streams, deterministic_protocol
    device = torch.device(args.device)
    if device.type == "cuda":
        deterministic_protocol()
    flow, hift = s2.build_modules(args.seed)
    tail = s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps)
    said = []
    opt = cadence_fx.optimize(tail, rules=args.rules, cache=args.cache, capacity=args.capacity,
                              off_catalog="specialize", shared_captures=args.shared_captures,
                              progress=lambda m: said.append(m))
    windows, flushes = _ints(args.windows), _ints(args.flushes)
    t0 = time.perf_counter()
    got = opt.prepare_capacity(windows, flushes, prompt_tokens=[args.prompt_tokens])
    prepare_s = time.perf_counter() - t0
    loaded = {f"{c.dims}": c.loaded for c in opt._capacities.values() if not isinstance(c, str)}
    prompt = s2.synthetic_prompt(args.prompt_tokens, seed=args.seed, device=args.device)
    g = torch.Generator().manual_seed(args.seed)

    def tokens(n):
        return torch.randint(0, s2.VOCAB, (n,), generator=g).tolist()
    chunks = [(tokens(28), False) for _ in range(4)] + [(tokens(windows[0]), False), (tokens(flushes[0]), True)]
    tail.set_stream_cache(*prompt)
    session = opt.open_session(*prompt)
    t1 = time.perf_counter()
    report = compare_streams(tail, session, chunks, device, seed=args.seed)
    return {"prepare_s": round(prepare_s, 2), "prepared": got, "graphs_loaded": loaded,
            "cache": dict(opt.programs.disk.counts), "exact": report["exact"],
            "mismatches": report["mismatches"][:3], "routes": [c["route"] for c in report["per_chunk"]],
            "voice_s": round(time.perf_counter() - t1, 2),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "rejections": [m for m in said if "rejected" in m]}


def _ints(text: str) -> list:
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capacity", type=int, default=500)
    p.add_argument("--windows", default="11,13", help="window lengths (tokens, lookahead included)")
    p.add_argument("--flushes", default="3")
    p.add_argument("--prompt-tokens", type=int, default=111)
    p.add_argument("--n-timesteps", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--rules", default="S")
    p.add_argument("--shared-captures", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--loads", type=int, default=2, help="restarts after the first process")
    p.add_argument("--cache", default=None, help="(the children's) program cache directory; default: a new one")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    cache = args.cache or tempfile.mkdtemp(prefix="cfx-restart-")
    base = [sys.executable, os.path.abspath(__file__), "--child", "--cache", cache] + [
        a for a in (argv if argv is not None else sys.argv[1:]) if a != "--child"]
    runs = []
    for i in range(1 + args.loads):
        t0 = time.perf_counter()
        out = subprocess.run(base, capture_output=True, text=True)
        if out.returncode:
            sys.stderr.write(out.stderr[-3000:])
            return out.returncode
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["process_s"] = round(time.perf_counter() - t0, 2)
        row["run"] = "first (cache empty)" if i == 0 else f"restart {i}"
        runs.append(row)
        print(json.dumps({k: row[k] for k in ("run", "prepare_s", "process_s", "exact", "graphs_loaded", "cache",
                                               "peak_rss_mib")}), flush=True)
    loads = [r["prepare_s"] for r in runs[1:]]
    import torch
    summary = {"command": " ".join(["python", "benchmarks/capacity_restart.py"] + (argv or sys.argv[1:])),
               "torch": torch.__version__, "device": args.device, "threads": args.threads,
               "first_prepare_s": runs[0]["prepare_s"],
               "restart_prepare_s_median": round(statistics.median(loads), 2) if loads else None,
               "ratio": round(runs[0]["prepare_s"] / statistics.median(loads), 1) if loads else None,
               "all_exact": all(r["exact"] for r in runs), "runs": runs}
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "restart.json"), "w") as f:
            f.write(json.dumps(summary, indent=1) + "\n")
    return 0 if summary["all_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
