"""``cadence-fx demo``: the main job, ~10 s through stock and optimized, two WAVs, the verdict.

Every chunk is seeded as ``verify`` seeds it, so the WAVs have the same bytes in every run.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import wave

from . import registry
from .options import add_model_args, check_flush, model_of, progress
from .verify import setup_words


def add_args(p) -> None:
    add_model_args(p, rules="auto")
    p.add_argument("--chunks", type=int, default=10)
    p.add_argument("--final-tokens", type=int, default=0)
    p.add_argument("--out", default="cadence-fx-demo")


def write_wav(path: str, pcm: bytes, sample_rate: int) -> str:
    """Mono int16 PCM as a WAV file; returns its PCM's SHA-256."""
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm)
    return hashlib.sha256(pcm).hexdigest()


def run(args) -> int:
    import numpy as np
    import torch
    from ..lockstep import compare_streams, deterministic_protocol
    if torch.device(args.device).type == "cuda":
        deterministic_protocol()
    say = progress(False)
    if args.rules == "auto":
        args.rules = "SRc" if torch.device(args.device).type == "cuda" else "S"
    if torch.device(args.device).type == "cpu":
        say("running rule S (demand-sized state at stable addresses) on the CPU; CUDA-graph replay "
            "(rules SR/SRc) needs a GPU: --device cuda")
    spec = model_of(args)
    check_flush(spec, args.final_tokens)
    stock, prompt = registry.build(spec, args)
    opt = registry.optimize(spec, stock, args.rules, say)
    t0 = time.perf_counter()
    spec.start(opt, prompt)
    compile_s = time.perf_counter() - t0
    spec.start(stock, prompt)
    chunks = spec.chunks(args, args.chunks, args.final_tokens)
    say(f"streaming {len(chunks)} {spec.unit}s (~{len(chunks) * spec.unit_seconds:g} s of audio) through stock "
        f"and optimized")
    report = compare_streams(stock, opt, chunks, stock.device, say, keep_pcm=True, seed=args.seed)
    os.makedirs(args.out, exist_ok=True)
    paths = {}
    for name, pcm in report.pop("pcm").items():
        path = os.path.join(args.out, f"{spec.name}-{name}.wav")
        paths[name] = (path, write_wav(path, pcm, spec.sample_rate))
    stock_ms = float(np.median([r["stock_ms"] for r in report["per_chunk"]]))
    opt_ms = float(np.median([r["opt_ms"] for r in report["per_chunk"]]))
    plan = opt.session.executable.plan
    print(f"model: {spec.describe(args)}, {args.dtype}, {stock.device}, rules {args.rules}")
    for name, (path, sha) in paths.items():
        print(f"{name:>9}: {path}  sha256 {sha}")
    print(f"same PCM bytes: {paths['stock'][1] == paths['optimized'][1]}; every {spec.unit}'s waveform and state "
          f"bit-exact: {report['exact']}")
    print(f"per-{spec.unit} median: stock {stock_ms:.1f} ms, optimized {opt_ms:.1f} ms "
          f"({stock_ms / opt_ms:.2f}x; one run each, not a benchmark); one-time trace {compile_s:.1f} s")
    print(f"setup: {setup_words(opt.stats()['setup_s'])}")
    print(f"state memory: arena {plan.arena_bytes / 2**20:.1f} MiB vs stock buffers + state "
          f"{plan.stock_state_bytes / 2**20:.1f} MiB ({100 * plan.arena_bytes / plan.stock_state_bytes:.1f}%)")
    if stock.device.type == "cpu":
        print("replay (rules SR/SRc) needs a CUDA GPU; this run verified rule S on the CPU")
    ok = report["exact"] and paths["stock"][1] == paths["optimized"][1]
    if args.json:
        print(json.dumps({"exact": ok, "chunks": report["chunks"], "rules": args.rules, "device": str(stock.device),
                          "stock_ms_p50": stock_ms, "optimized_ms_p50": opt_ms, "compile_s": round(compile_s, 2),
                          "arena_bytes": plan.arena_bytes, "stock_state_bytes": plan.stock_state_bytes,
                          "wav": {k: {"path": p, "sha256": h} for k, (p, h) in paths.items()},
                          "setup_s": opt.stats()["setup_s"], "stats": opt.stats()}))
    return 0 if ok else 1
