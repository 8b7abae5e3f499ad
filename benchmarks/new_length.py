"""What a new prompt length costs on the host, step by step: specialize, each pass, and
(``--capture-code``) generating the pieces' Python code, per catalog entry of the
released Token2Wav, median of ``--reps`` repetitions on the same symbolic programs.

    OMP_NUM_THREADS=1 python benchmarks/new_length.py --n-timesteps 5 [--rules SRc] [--reps 5]

It sets up one prompt length (tracing, or loading from the program cache), records the
arguments ``specialize`` and the rewrite pipeline got for a second length, then repeats
exactly that work.  ``--rules SRc`` runs the replay pipeline's passes (istft check,
partition, lowering) on the CPU graphs (``device_type="cuda"``): what the H200 host
runs for a new length before capture.  ``--gc-off`` holds Python's collector through
each repetition (the passes' own cost; the full collections a large heap triggers are
``setup_time.py``'s ``gc``), ``--profile N`` prints the last repetition's N costliest
functions to stderr.  Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

import torch


def _has_code(gm) -> bool:
    needs = getattr(type(gm), "_needs_recompile", None)  # a lazy GraphModule's code comes on its first call
    return not (needs is not None and needs())


def _pieces(gm) -> list:
    """The pieces whose code capture would generate, on a checkout before runtime/interpret.py."""
    out = []
    for child in gm.children():  # a region's piece, or an island (on the CPU, every piece is one)
        piece = getattr(child, "piece", child)
        if isinstance(piece, torch.fx.GraphModule) and not _has_code(piece):
            out.append(piece)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n-timesteps", type=int, default=5)
    p.add_argument("--rules", default="S", help="S: the CPU pipeline; SRc: the replay pipeline's passes")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--prompt-tokens", default="75,150")
    p.add_argument("--unrolled", action="store_true",
                   help="rule S: specialize every flow step (as rules R do), not one shared step")
    p.add_argument("--capture-code", action="store_true", help="also time generating each piece's code (rules SRc)")
    p.add_argument("--gc-off", action="store_true",
                   help="hold Python's collector through each repetition: the passes' own cost, without "
                        "the full collections a heap this size triggers (setup_time.py reports those)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="profile the last repetition (cProfile) and print its N costliest functions to stderr")
    args = p.parse_args(argv)
    import cadence_fx
    from cadence_fx import compiler
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.passes import base, specialize as spec_mod
    from cadence_fx.programs import entry as entry_mod

    first, second = (int(x) for x in args.prompt_tokens.split(","))
    calls, pipes = [], []
    orig_spec, orig_pipe = entry_mod.specialize, compiler.rewrite_pipeline

    def record_spec(sym, at, tensors, by_region, recompile=True, share=None):
        calls.append((sym, dict(at), dict(tensors), dict(by_region), share))
        return orig_spec(sym, at, tensors, by_region, recompile=recompile, share=share)

    def record_pipe(bindings, rules="S", device_type="cpu", boundary=None, **kw):
        if args.rules != "S":
            rules, device_type = args.rules, "cuda"
        pipes.append((bindings, rules, device_type, boundary))
        return orig_pipe(bindings, rules, device_type, boundary, **kw)

    entry_mod.specialize, compiler.rewrite_pipeline = record_spec, record_pipe
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow, hift, n_timesteps=args.n_timesteps)
    opt = cadence_fx.optimize(tail, rules="S", cache=True)
    opt.set_stream_cache(*s2.synthetic_prompt(first, seed=first))
    calls.clear(), pipes.clear()
    try:
        opt.set_stream_cache(*s2.synthetic_prompt(second, seed=second))
    except Exception:  # noqa: BLE001 - rules SRc's graphs cannot run on the CPU; their set-up is what is timed
        pass
    entry_mod.specialize, compiler.rewrite_pipeline = orig_spec, orig_pipe

    times: dict[str, list[float]] = {}
    orig_run = base.CadencePass.run

    def timed_run(self, gm, recompile, **kw):
        t0 = time.perf_counter()
        try:
            return orig_run(self, gm, recompile, **kw)
        finally:
            key = type(self).__name__
            rep_times[key] = rep_times.get(key, 0.0) + time.perf_counter() - t0

    base.CadencePass.run = timed_run
    prof = None
    for rep in range(args.reps):
        rep_times: dict[str, float] = {}
        gc.collect()
        if args.gc_off:
            gc.disable()
        if args.profile and rep == args.reps - 1:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        for (sym, at, tensors, by_region, share), (bindings, rules, device_type, boundary) in zip(calls, pipes):
            t0 = time.perf_counter()
            gm = spec_mod.specialize(sym, at, tensors, by_region, recompile=False,
                                     share=None if args.unrolled else share)
            rep_times["specialize"] = rep_times.get("specialize", 0.0) + time.perf_counter() - t0
            t0 = time.perf_counter()
            gm, _ = compiler.rewrite_pipeline(bindings, rules, device_type, boundary)(gm)
            rep_times["passes"] = rep_times.get("passes", 0.0) + time.perf_counter() - t0
            if args.capture_code:
                rep_times["pieces"] = len(_pieces(gm)) + rep_times.get("pieces", 0)
                rep_times["piece_nodes"] = sum(len(p.graph.nodes) for p in _pieces(gm)) + rep_times.get("piece_nodes", 0)
                t0 = time.perf_counter()
                for piece in _pieces(gm):
                    piece.real_recompile() if hasattr(piece, "real_recompile") else piece.recompile()
                rep_times["capture_code"] = rep_times.get("capture_code", 0.0) + time.perf_counter() - t0
        if prof is not None:
            prof.disable()
        gc.enable()
        for k, v in rep_times.items():
            times.setdefault(k, []).append(v)
    base.CadencePass.run = orig_run
    if prof is not None:
        import pstats
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(args.profile)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(args.profile)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "n_timesteps": args.n_timesteps,
           "rules": args.rules, "unrolled": args.unrolled, "gc_off": args.gc_off, "entries": len(calls), "reps": args.reps,
           "median_s": {k: round(statistics.median(v), 3) for k, v in times.items()},
           "min_s": {k: round(min(v), 3) for k, v in times.items()}}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
