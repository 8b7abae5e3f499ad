"""Wall time of ``cadence-fx traffic --prepare-only --prepare-shard I/N``: N processes sharing one
fresh program cache, for two source trees, alternating (paired by round).

    python3 benchmarks/prepare_shards.py --trees /tmp/before /work/main --shards 2 --rounds 2 \\
        -- --device cpu --n-timesteps 5 --capacity 500 --prompt-range 75,250 --window-range 10,11 \\
           --flush-range 3,4

Each round runs every tree once (the order alternating between rounds), each run with an empty
cache directory of its own, every shard a process of its own (``OMP_NUM_THREADS=1``).  Prints
one JSON object: per tree the walls, each shard's own ``prepare.s`` and the shapes it built and
served; ``paired_ratio``: the second tree's wall over the first's, per round; ``same_shapes``:
every run of every tree built the same shapes, each served.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def run(tree: str, shards: int, traffic_args: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="cfx-shards-") as cache:
        env = {**os.environ, "PYTHONPATH": tree, "CADENCE_FX_CACHE_DIR": cache, "OMP_NUM_THREADS": "1"}
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-m", "cadence_fx", "traffic", *traffic_args, "--prepare",
                                   "--prepare-only", "--prepare-shard", f"{i}/{shards}", "--quiet"],
                                  cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i in range(shards)]
        outs = [p.communicate() for p in procs]
        wall = time.perf_counter() - t0
    reports = []
    for p, (out, err) in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"a shard failed in {tree} (rc {p.returncode}):\n{err[-3000:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    shapes = sorted(f"{cap}: {shape}" for r in reports for cap, per in r["prepare"]["by_capacity"].items()
                    if isinstance(per, dict) for shape in per)
    return {"wall_s": round(wall, 2), "shard_s": [r["prepare"]["s"] for r in reports], "shapes": shapes,
            "all_served": all(r["prepare"]["served"] == r["prepare"]["shapes"] for r in reports)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", nargs=2, required=True, help="two source trees (PYTHONPATH roots)")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("traffic_args", nargs=argparse.REMAINDER, help="after --: the traffic's arguments")
    a = p.parse_args(argv)
    traffic_args = [x for x in a.traffic_args if x != "--"]
    runs = {t: [] for t in a.trees}
    for r in range(a.rounds):
        for tree in (a.trees if r % 2 == 0 else a.trees[::-1]):
            got = run(tree, a.shards, traffic_args)
            runs[tree].append(got)
            print(f"round {r} {tree}: {got['wall_s']} s (shards {got['shard_s']})", file=sys.stderr, flush=True)
    first, second = a.trees
    shapes = {tuple(x["shapes"]) for t in a.trees for x in runs[t]}
    out = {"shards": a.shards, "traffic_args": traffic_args,
           "trees": {t: {"wall_s": [x["wall_s"] for x in runs[t]], "median_wall_s": statistics.median(
               x["wall_s"] for x in runs[t]), "shard_s": [x["shard_s"] for x in runs[t]]} for t in a.trees},
           "paired_ratio": [round(b["wall_s"] / f["wall_s"], 3) for f, b in zip(runs[first], runs[second])],
           "same_shapes": len(shapes) == 1 and all(x["all_served"] for t in a.trees for x in runs[t]),
           "shapes": sorted(shapes)[0] if shapes else []}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
