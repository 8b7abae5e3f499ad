"""``cadence-fx traffic --prepare``: a capacity's window and flush graphs built before the traffic.

``prepare_for`` calls ``opt.prepare_capacity`` for the traffic's ranges (``--prepare-shard I/N``:
every N-th window and flush length from the I-th, so that processes sharing the program
cache each build a part, and the run after them loads it all); ``--prepare-only`` prints its
report alone (``emit_prepared``) and runs no conversation.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shard I/N (e.g. 0/4)") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= I < N")
    return i, n


def prepare_for(args, opt, ranges, lookahead: int, say) -> dict:
    """``--prepare``: ``opt.prepare_capacity`` for the ranges' windows (+ lookahead) and flushes, and
    the capacities of the branch classes of the range's prompt lengths that a capacity refuses."""
    (w_lo, w_hi), (f_lo, f_hi), (p_lo, p_hi) = ranges["window"], ranges["flush"], ranges["prompt"]
    i, n = args.prepare_shard or (0, 1)  # --prepare-shard: every n-th length from the i-th
    t0 = time.perf_counter()
    # odd shards prepare the branch classes' capacities first: the shards then trace the classes'
    # symbolic programs and the capacity's at once, not one after another (the order only)
    built = opt.prepare_capacity(list(range(w_lo + lookahead, w_hi + lookahead + 1))[i::n],
                                 list(range(f_lo, f_hi + 1))[i::n], prompt_tokens=range(p_lo, p_hi + 1),
                                 classes_first=i % 2 == 1)
    captured = built.pop("captured", None)  # --shared-captures: each capacity's captures, apart
    classes = built.pop("classes", None)  # prompt lengths a capacity refuses: where each runs
    hows = [h for per in built.values() if isinstance(per, dict) for h in per.values()]
    if say:
        say(f"prepared {len(hows)} window and flush shapes in {time.perf_counter() - t0:.1f} s")
    return {"s": round(time.perf_counter() - t0, 2), "shapes": len(hows),
            "served": sum(h.startswith(("held", "built", "loaded from disk", "the catalog's own")) for h in hows),
            "loaded": sum(h.startswith("loaded from disk") for h in hows),
            "by_capacity": built, "captured": captured, "classes": classes}


def emit_prepared(args, prepared: dict) -> None:
    """``--prepare-only``'s report: the prepare section alone (printed; prepare.json under ``--out``)."""
    text = json.dumps({"prepare": prepared, "shard": args.prepare_shard, "capacity": list(args.capacity)})
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "prepare.json"), "w") as f:
            f.write(text + "\n")
    print(text)

__all__ = ["emit_prepared", "parse_shard", "prepare_for"]
