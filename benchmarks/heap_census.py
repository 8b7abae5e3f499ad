"""What each prompt length leaves in the Python heap, and what a full garbage collection
then costs (CPU, released Token2Wav, seeded weights).

A full collection walks every object the collector tracks.  An optimized model keeps
its symbolic programs and, per prompt length, an executable (up to ``max_executables``,
32 by default), so the walk grows with every length served: this prints, after each
length's set-up, the tracked objects, the fx nodes among them, the growth by type, and
the seconds of one ``gc.collect()`` (median of three).

    OMP_NUM_THREADS=1 python benchmarks/heap_census.py --n-timesteps 2 --prompt-tokens 23,41,60

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import statistics
import sys
import time

import torch


def _census() -> collections.Counter:
    gc.collect()
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


def _full_collect_s() -> float:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 3)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-timesteps", type=int, default=2)
    p.add_argument("--rules", default="S")
    p.add_argument("--prompt-tokens", default="23,41,60")
    args = p.parse_args(argv)
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2

    flow, hift = s2.build_modules(0)
    opt = cadence_fx.optimize(s2.Token2WavTail(flow, hift, n_timesteps=args.n_timesteps), rules=args.rules,
                              cache=False)
    before = _census()
    rows = [{"after": "model built", "tracked": sum(before.values()), "nodes": before["Node"],
             "full_collect_s": _full_collect_s()}]
    prev = before
    for tokens in (int(x) for x in args.prompt_tokens.split(",")):
        t0 = time.perf_counter()
        opt.set_stream_cache(*s2.synthetic_prompt(tokens, seed=tokens))
        ready = time.perf_counter() - t0
        now = _census()
        rows.append({"after": f"prompt of {tokens} tokens", "ready_s": round(ready, 3),
                     "tracked": sum(now.values()), "nodes": now["Node"], "full_collect_s": _full_collect_s(),
                     "growth": dict((now - prev).most_common(8))})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        prev = now
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "rules": args.rules,
                      "n_timesteps": args.n_timesteps, "python": sys.version.split()[0], "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
