"""Which voice lengths each window and flush graph of a capacity serves (CPU or GPU).

A capacity's shared graphs take the branches of the model's code its own length takes
(``docs/serving.md``, choosing a capacity).  For each capacity this builds the shared
graphs of the given window and flush lengths (``opt.prepare_capacity``) and prints what
prepare reports for each, "serves N of M lengths" (M: the lengths up to the capacity the
catalog serves), beside Token2Wav's rule read from its guards: a chunk of n new tokens
(a window's tokens less its 3 lookahead tokens, a flush's tokens) branches on whether n
divides the prompt's mel frames + 99, so a graph serves the lengths whose class is the
capacity's.

    python benchmarks/capacity_classes.py --capacities 512,500 --windows 16,20 --flushes 13,7
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capacities", default="512,500")
    p.add_argument("--windows", default="16,20", help="window lengths (tokens, lookahead included)")
    p.add_argument("--flushes", default="13,7")
    p.add_argument("--n-timesteps", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2
    windows = [int(w) for w in args.windows.split(",") if w]
    flushes = [int(f) for f in args.flushes.split(",") if f]
    flow, hift = s2.build_modules(0)
    stock = s2.Token2WavTail(flow, hift, n_timesteps=args.n_timesteps)
    rows = []
    for cap in (int(c) for c in args.capacities.split(",")):
        opt = cadence_fx.optimize(stock, rules="S", cache=tempfile.mkdtemp(prefix="cfx-classes-"),
                                  off_catalog="specialize", capacity=cap)
        got = opt.prepare_capacity(windows, flushes, prompt_tokens=())[f"{cap} mel frames"]  # (this capacity only)
        lengths = [v for v in range(4, cap + 1, 2) if (v + 99) % 25]  # the catalog's (its guards: even, >= 4, its class)
        for label, how in got.items():
            tokens = int(label.split("token (1, ")[1].split(")")[0])
            last = label.endswith("last_chunk")
            n = tokens if last else tokens - 3
            rule = sum(((cap + 99) % n == 0) == ((v + 99) % n == 0) for v in lengths)
            row = {"capacity": cap, "shape": label, "new_tokens": n, "prepare": how,
                   "rule_serves": f"{rule} of {len(lengths)}"}
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
