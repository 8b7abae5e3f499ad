"""What unlinking the graphs a build lets go saves a new prompt length's build, paired.

A replayed entry's build lets go of two kinds of graph: the pre-partition graph (the
specialized, rewritten entry that partition replaced by its pieces: ``PassManager``'s
``let_go``, ``interpret.let_go_module``) and the pieces' graphs once their step lists are
built (``graphs.compact_entry``, ``interpret.drop_graph``).  ``interpret._let_go`` unlinks
each, so that its nodes are freed by reference count then.  The control replaces
``_let_go`` with nothing: those graphs then wait, as reference cycles, for the young
collection that ends the build (``runtime/collector.held``).  In ONE process, on one
optimized Token2Wav tail (its rule S program store, as the drop-in's): for each prompt
length the SRc programs are built ``--reps`` times per variant, the variants in
alternating order; timed: the build's wall time, and the collections inside it (their
seconds, and the objects they found unreachable, from ``gc.callbacks``).  Exactness:
every build's programs must be the same step lists (each piece's and shared step's
marshalled steps, its call targets and its constants) as the first build of that
length: the unlinking changes nothing the runtime reads.  CPU by default (the build is
host work; ``--device cuda`` builds for the GPU).  Prints one JSON object.

    python3 benchmarks/let_go_cost.py --n-timesteps 10 --prompt-tokens 47,53,59 --reps 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import cadence_fx
from cadence_fx import compiler
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.runtime import interpret
from cadence_fx.runtime.graphs import CapturedRegion
from gc_clock import GcClock  # this folder (a script's path)


def programs_of(exe) -> list:
    """What the runtime reads of each replayed entry: its pieces' (and their shared steps') step lists."""
    out = []
    for index, program in sorted(exe.programs.items()):
        for name, mod in program.run.named_children():
            if not isinstance(mod, CapturedRegion) or mod.trivial:
                continue
            for sub_name, gm in [(name, mod.piece)] + list(mod.piece.named_children()):
                if not isinstance(gm, torch.fx.GraphModule) or interpret.has_code(gm):
                    continue
                blob, size, targets, consts = interpret._program(gm)
                out.append((index, sub_name, blob, size, [repr(t) for t in targets], [repr(c) for c in consts]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-timesteps", type=int, default=10)
    ap.add_argument("--prompt-tokens", default="47,53,59", help="new prompt lengths, comma-separated")
    ap.add_argument("--reps", type=int, default=2, help="builds per variant and length")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    lengths = [int(t) for t in args.prompt_tokens.split(",")]
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps)
    opt = cadence_fx.optimize(tail, rules="S", cache=False)
    opt.set_stream_cache(*s2.synthetic_prompt(23, seed=23, device=device))  # the trace: not timed
    let_go = interpret._let_go
    clock = GcClock()

    def build(tokens: int, unlink: bool):
        interpret._let_go = let_go if unlink else (lambda graph: None)
        try:
            prompt = s2.synthetic_prompt(tokens, seed=tokens, device=device)
            clock.start()
            t0 = time.perf_counter()
            exe = compiler._compile(opt.adapter_for(int(prompt[1].shape[1]), prompt[2]), "SRc",
                                    programs=opt.programs)
            return exe, time.perf_counter() - t0, clock.total_s, clock.found
        finally:
            interpret._let_go = let_go

    build(lengths[0] - 6, True)  # one new length first, untimed (first-use costs)
    rows, exact = [], True
    for tokens in lengths:
        reference = None
        for rep in range(args.reps):
            for unlink in ((True, False) if (rep + len(rows)) % 2 == 0 else (False, True)):
                exe, wall, gc_s, found = build(tokens, unlink)
                programs = programs_of(exe)
                if reference is None:
                    reference = programs
                same = programs == reference and len(programs) > 0
                exact &= same
                rows.append({"prompt_tokens": tokens, "unlinked": unlink, "build_s": round(wall, 3),
                             "collections_s": round(gc_s, 3), "found_by_collections": found,
                             "pieces": len(programs), "same_programs": same})
                del exe

    def med(unlink: bool, key: str) -> float:
        return round(statistics.median(r[key] for r in rows if r["unlinked"] is unlink), 3)

    pairs = [(a["build_s"], b["build_s"]) for a, b in zip(
        (r for r in rows if r["unlinked"]), (r for r in rows if not r["unlinked"]))]
    print(json.dumps({
        "torch": torch.__version__, "device": str(device), "n_timesteps": args.n_timesteps,
        "threads": torch.get_num_threads(), "command": "let_go_cost.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "build_s": {"unlinked": med(True, "build_s"), "linked": med(False, "build_s")},
        "ratio": round(med(True, "build_s") / med(False, "build_s"), 3),
        "faster_pairs": f"{sum(a < b for a, b in pairs)}/{len(pairs)}",
        "collections_s": {"unlinked": med(True, "collections_s"), "linked": med(False, "collections_s")},
        "found_by_collections": {"unlinked": med(True, "found_by_collections"),
                                 "linked": med(False, "found_by_collections")},
        "exact": exact, "rows": rows}))


if __name__ == "__main__":
    main()
