"""How a capacity's graphs partition for replay: per session (the host sizes in one island at
each graph's head) against length-free (every op whose work depends on the voice's length an
eager island, so one capture serves every voice: ``runtime.working``), per catalog entry.

Nothing runs on a device: the rule-S graphs of ``optimize(tail, capacity=(C,))`` for one voice
are partitioned as rules R would (``compiler.preview_partition``: the op-level verdicts).
Where the attention probe runs matters: on the CPU every attention over padded keys runs
exact (the probe finds the CPU's masked call not bit-equal), so its calls are islands here;
on a GPU the probe may mask them (then they sit in the pieces).  Prints one JSON line per
entry: regions (per session, length-free), capturable and eager regions, island nodes by
reason and by op.

    python benchmarks/capacity_regions.py --n-timesteps 5 --capacity 500 --prompt-tokens 111
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--n-timesteps", type=int, default=5)
    p.add_argument("--capacity", type=int, default=500, help="prompt frames")
    p.add_argument("--prompt-tokens", type=int, default=111)
    args = p.parse_args(argv)
    import cadence_fx
    from cadence_fx.compiler import preview_partition
    from cadence_fx.integrations import stepaudio2 as s2
    device = torch.device(args.device)
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps)
    opt = cadence_fx.optimize(tail, capacity=(args.capacity,), off_catalog="specialize")
    t0 = time.perf_counter()
    session = opt.open_session(*s2.synthetic_prompt(args.prompt_tokens, seed=args.prompt_tokens, device=device))
    exe = session.session.executable
    print(json.dumps({"torch": torch.__version__, "device": str(device), "n_timesteps": args.n_timesteps,
                      "prompt_tokens": args.prompt_tokens, "on": exe.notes.get("capacity"),
                      "build_s": round(time.perf_counter() - t0, 1)}), flush=True)
    plain, free = preview_partition(exe), preview_partition(exe, length_free=True)
    for idx in sorted(free):
        record = free[idx]
        why = collections.Counter(v.reason.split(" (")[0].split(": <")[0] for v in record.islands)
        ops = collections.Counter(v.node.rstrip("_0123456789") for v in record.islands)
        print(json.dumps({"entry": idx, "regions_per_session": len(plain[idx].regions),
                          "regions_length_free": len(record.regions),
                          "capturable": sum(1 for _, c, _ in record.regions if c),
                          "eager": sum(1 for _, c, _ in record.regions if not c),
                          "island_nodes": len(record.islands), "why": dict(why),
                          "ops": dict(ops.most_common(12))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
