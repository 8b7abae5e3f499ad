"""``cadence-fx verify``: stock against optimized, every chunk, bit for bit (``cadence_fx.verify``)."""

from __future__ import annotations

import json
import sys
import time

from . import registry
from .options import add_model_args, check_flush, model_of, progress


def add_args(p) -> None:
    add_model_args(p)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--final-tokens", type=int, default=0, help="end with a flush chunk of this many tokens")
    p.add_argument("--quiet", action="store_true")


def run(args) -> int:
    import torch
    from ..verify import compare_streams, deterministic_protocol, format_table
    if torch.device(args.device).type == "cuda":
        deterministic_protocol()
    spec = model_of(args)
    check_flush(spec, args.final_tokens)
    say = progress(args.quiet)
    stock, prompt = registry.build(spec, args)
    t0 = time.perf_counter()
    opt = registry.optimize(spec, stock, args.rules, say)
    spec.start(opt, prompt)  # traces, where the stream's configuration is new
    compile_s = time.perf_counter() - t0
    spec.start(stock, prompt)
    chunks = spec.chunks(args, args.chunks, args.final_tokens)
    report = compare_streams(stock, opt, chunks, stock.device, say, seed=args.seed)
    stats = opt.stats()
    report.update({
        "model": args.model, "rules": args.rules, "device": str(stock.device), "dtype": args.dtype,
        **spec.config(args), "seed": args.seed,
        "fallbacks": stats["fallback_total"], "fallback_reasons": stats["fallbacks"], "stats": stats,
        "arena_bytes": opt.arena_bytes, "state_bytes": opt.state_bytes,
        "stock_state_bytes": opt.session.executable.plan.stock_state_bytes,
        "compile_s": round(compile_s, 2), "torch": torch.__version__,
    })
    if not args.json:
        print(format_table(report))
        print(f"exact: {report['exact']}  chunks: {report['chunks']}  fallbacks: {report['fallbacks']} "
              f"{report['fallback_reasons'] or ''}")
        print(f"state: {report['state_bytes'] / 2**20:.1f} MiB (arena {report['arena_bytes'] / 2**20:.1f} MiB)  "
              f"stock state: "
              f"{report['stock_state_bytes'] / 2**20:.1f} MiB  compile: {compile_s:.1f} s")
    else:
        print(format_table(report), file=sys.stderr)
        print(json.dumps(report))
    return 0 if report["exact"] else 1
