"""``cadence-fx verify``: stock against optimized, every chunk, bit for bit (``cadence_fx.lockstep``).

``--prompt-tokens 23,41`` streams each prompt length in turn through ONE optimized model
(each against its own stock stream, the same chunks and seeds): the first length traces,
a later one is a specialization of what the first traced.  The report's keys are the
first length's; ``exact`` is every length's; ``setups`` and ``per_prompt`` hold each length's.
"""

from __future__ import annotations

import json
import sys
import time

from . import registry
from .options import add_model_args, check_flush, each_prompt_length, model_of, progress

#: per prompt length, what ``per_prompt`` keeps of its comparison
RESULT_KEYS = ("exact", "chunks", "mismatches", "pcm_sha256_stock", "pcm_sha256_optimized")


def add_args(p) -> None:
    add_model_args(p, prompt_list=True)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--final-tokens", type=int, default=0, help="end with a flush chunk of this many tokens")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--module", default=None, metavar="PKG.MOD:FACTORY",
                   help="verify your own model: FACTORY() returns (model, inputs), a model in the generic step "
                        "form and one entry per chunk; --rules, --seed and --json apply, the other model options "
                        "do not")


def how_words(split: dict) -> str:
    """How a session got its programs, in words, from its ``stats()["setup_s"]``."""
    if not split["compiled"]:
        return "compiled earlier (an executable of this configuration existed)"
    kinds: dict[str, int] = {}
    for how in split["how"].values():
        kinds[how] = kinds.get(how, 0) + 1
    return "; ".join(f"{how} ({n} {'entry' if n == 1 else 'entries'})" for how, n in kinds.items())


def setup_words(split: dict) -> str:
    """``how_words`` and the seconds of each part of a session's set-up."""
    return (f"{how_words(split)} (trace {split['trace_s']:.2f} s, specialize {split['specialize_s']:.2f} s, "
            f"passes {split['passes_s']:.2f} s, capture {split['capture_s']:.2f} s"
            + (f", waited {split['waited_s']:.2f} s for another process's trace" if split.get("waited_s") else "")
            + ")")


def setup_row(prompt_tokens: int, seconds: float, split: dict) -> dict:
    """One ``setups`` row: ``traced`` is whether a new trace (symbolic or concrete) was made for it."""
    traced = split["compiled"] and any(how != "specialized" for how in split["how"].values())
    return {"prompt_tokens": prompt_tokens, "setup_s": round(seconds, 2), "traced": traced,
            "how": how_words(split), "split": split}


def run(args) -> int:
    if args.module:
        return run_module(args)
    import torch
    from ..lockstep import compare_streams, deterministic_protocol, format_table
    if torch.device(args.device).type == "cuda":
        deterministic_protocol()
    spec = model_of(args)
    check_flush(spec, args.final_tokens)
    lengths = each_prompt_length(spec, args.prompt_tokens)
    args.prompt_tokens = lengths[0]  # the report's configuration is the first length's
    say = progress(args.quiet)
    stock, prompt = registry.build(spec, args)
    t0 = time.perf_counter()
    opt = registry.optimize(spec, stock, args.rules, say)
    chunks = spec.chunks(args, args.chunks, args.final_tokens)
    runs, setups = [], []
    for i, tokens in enumerate(lengths):
        if i:
            if say:
                say(f"prompt length {tokens} tokens ({i + 1}/{len(lengths)}) on the same optimized model")
            prompt = spec.prompt(_with_prompt(args, tokens))
        t_start = time.perf_counter()
        spec.start(opt, prompt)  # compiles, where the stream's configuration is new
        done = time.perf_counter()
        if not i:
            compile_s = done - t0  # the report's compile_s, as before: optimize and the first start
        spec.start(stock, prompt)
        result = compare_streams(stock, opt, chunks, stock.device, say, seed=args.seed)
        stats = opt.stats()
        result.update({"stats": stats, "arena_bytes": opt.arena_bytes, "state_bytes": opt.state_bytes,
                       "stock_state_bytes": opt.session.executable.plan.stock_state_bytes})
        runs.append(result)
        setups.append(setup_row(tokens if spec.prompt else None, done - t_start, stats["setup_s"]))
    report, stats = runs[0], runs[0]["stats"]
    report.update({
        "model": args.model, "rules": args.rules, "device": str(stock.device), "dtype": args.dtype,
        **spec.config(args), "seed": args.seed,
        "fallbacks": stats["fallback_total"], "fallback_reasons": stats["fallbacks"], "stats": stats,
        "compile_s": round(compile_s, 2), "torch": torch.__version__, "setup_s": stats["setup_s"],
        "setups": setups,
        "per_prompt": [{"prompt_tokens": row["prompt_tokens"], **{k: r[k] for k in RESULT_KEYS},
                        "fallbacks": r["stats"]["fallback_total"], "arena_bytes": r["arena_bytes"]}
                       for row, r in zip(setups, runs)],
    })
    report["exact"] = all(r["exact"] for r in report["per_prompt"])  # every length's (the first's: per_prompt[0])
    _print(args, report, runs, compile_s, format_table)
    return 0 if report["exact"] else 1


def run_module(args) -> int:
    """``--module pkg.mod:factory``: ``cadence_fx.verify`` on what the factory returns."""
    import importlib
    import torch
    from .. import verify
    from ..errors import CadenceError
    from ..lockstep import deterministic_protocol, format_table
    mod, _, attr = args.module.partition(":")
    if not mod or not attr.isidentifier():
        raise CadenceError(f"--module {args.module!r}: write it as pkg.mod:factory (a function returning "
                           f"(model, inputs))")
    try:
        factory = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
        raise CadenceError(f"--module {args.module!r}: {type(e).__name__}: {e}") from e
    model, inputs = factory()
    device = next((t.device for t in list(model.parameters()) + list(model.buffers())), torch.device("cpu"))
    if device.type == "cuda":
        deterministic_protocol()
    report = verify(model, inputs, rules=args.rules, seed=args.seed, progress=progress(args.quiet))
    out = sys.stderr if args.json else sys.stdout
    print(format_table(report), file=out)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"exact: {report['exact']}  chunks: {report['chunks']}  fallbacks: {report['fallbacks']} "
              f"{report['fallback_reasons'] or ''}")
    return 0 if report["exact"] else 1


def _with_prompt(args, tokens: int):
    """``args`` at another prompt length (the command's own ``args`` keep the first)."""
    import argparse
    return argparse.Namespace(**{**vars(args), "prompt_tokens": tokens})


def _print(args, report: dict, runs: list[dict], compile_s: float, format_table) -> None:
    out = sys.stderr if args.json else sys.stdout
    for row, run in zip(report["per_prompt"], runs):
        if len(runs) > 1:
            print(f"prompt {row['prompt_tokens']} tokens: exact: {row['exact']}  fallbacks: {row['fallbacks']}",
                  file=out)
        print(format_table(run), file=out)
    if not args.json:
        print(f"exact: {report['exact']}  chunks: {report['chunks']}  fallbacks: {report['fallbacks']} "
              f"{report['fallback_reasons'] or ''}")
        print(f"state: {report['state_bytes'] / 2**20:.1f} MiB (arena {report['arena_bytes'] / 2**20:.1f} MiB)  "
              f"stock state: {report['stock_state_bytes'] / 2**20:.1f} MiB  compile: {compile_s:.1f} s")
    for row in report["setups"]:
        where = "" if row["prompt_tokens"] is None else f", prompt {row['prompt_tokens']} tokens"
        print(f"setup{where}: {row['setup_s']:.2f} s, {setup_words(row['split'])}", file=out)
    if args.json:
        print(json.dumps(report))
