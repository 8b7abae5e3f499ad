"""How long a capacity graph takes to build, paired across source trees (a change's before and after).

Token2Wav at the released configuration (seeded random weights), ``optimize(..., capacity=C,
cache=False)``: nothing is loaded from or stored on disk, so each shape is built.  Each process
prepares the catalog and the first window and flush (untimed: the symbolic steps are traced there,
once), then times ``prepare_capacity`` of the further window and flush lengths given, each a shared
graph of its own, and hashes every shared graph's printout.  Processes alternate between the trees
(``--trees A,B``: each a checkout of cadence_fx, e.g. ``git worktree add /tmp/before <commit>``),
``--pairs`` times; the verdict beside the times is whether every process built the same graphs.

    python benchmarks/capacity_build_speed.py --trees /tmp/before,. --pairs 3 --out docs/results/<dir>

Writes ``build_speed.json`` (each process's seconds and digest, per tree the median, the paired
ratios) and prints one line per process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time


def child(args) -> dict:
    import torch
    torch.set_num_threads(args.threads)
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2
    flow, hift = s2.build_modules(args.seed)
    tail = s2.Token2WavTail(flow, hift, n_timesteps=args.n_timesteps)
    opt = cadence_fx.optimize(tail, capacity=(args.capacity,), off_catalog="specialize", cache=False)
    t0 = time.perf_counter()
    opt.prepare_capacity([args.first_window], [args.first_flush], prompt_tokens=[args.prompt_tokens])
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = opt.prepare_capacity(_ints(args.windows), _ints(args.flushes), prompt_tokens=[args.prompt_tokens])
    timed = time.perf_counter() - t0
    [cexe] = [c for c in opt._capacities.values() if not isinstance(c, str)]
    h = hashlib.sha256()
    for shape, g in sorted(cexe.shared.items(), key=lambda kv: str(kv[0])):
        h.update(str(shape).encode() + b"\0" + str(g.gm.graph).encode() + b"\0")
    return {"tree": os.path.dirname(os.path.dirname(os.path.abspath(cadence_fx.__file__))),
            "first_s": round(first, 2), "shapes_s": round(timed, 2), "graphs_sha256": h.hexdigest(),
            "prepared": got}


def _ints(text: str) -> list:
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", required=True, help="comma-separated checkouts of cadence_fx, run in turn")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--capacity", type=int, default=500)
    p.add_argument("--first-window", type=int, default=11)
    p.add_argument("--first-flush", type=int, default=3)
    p.add_argument("--windows", default="12,13,14", help="timed window lengths (tokens, lookahead included)")
    p.add_argument("--flushes", default="4,5", help="timed flush lengths")
    p.add_argument("--prompt-tokens", type=int, default=120)
    p.add_argument("--n-timesteps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    rest = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--child"]
    runs = []
    for i in range(args.pairs):
        for tree in trees:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree] + [x for x in os.environ.get(
                "PYTHONPATH", "").split(os.pathsep) if x]))
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"] + rest, capture_output=True,
                                 text=True, env=env)
            if out.returncode:
                sys.stderr.write(out.stderr[-3000:])
                return out.returncode
            row = json.loads(out.stdout.strip().splitlines()[-1])
            if row["tree"] != tree:
                sys.stderr.write(f"the process imported cadence_fx from {row['tree']}, not {tree}\n")
                return 2
            row["pair"] = i
            runs.append(row)
            print(json.dumps({k: row[k] for k in ("pair", "tree", "first_s", "shapes_s", "graphs_sha256")}),
                  flush=True)
    per = {t: [r["shapes_s"] for r in runs if r["tree"] == t] for t in trees}
    ratios = [b / a for a, b in zip(per[trees[0]], per[trees[-1]])]
    import torch
    summary = {"command": " ".join(["python", "benchmarks/capacity_build_speed.py"] + rest),
               "torch": torch.__version__, "threads": args.threads,
               "shapes": len(_ints(args.windows)) + len(_ints(args.flushes)),
               "shapes_s_median": {t: statistics.median(v) for t, v in per.items()},
               "paired_ratios_last_over_first": [round(r, 3) for r in ratios],
               "ratio_median": round(statistics.median(ratios), 3),
               "same_graphs": len({r["graphs_sha256"] for r in runs}) == 1, "runs": runs}
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "build_speed.json"), "w") as f:
            f.write(json.dumps(summary, indent=1) + "\n")
    return 0 if summary["same_graphs"] else 1


if __name__ == "__main__":
    sys.exit(main())
