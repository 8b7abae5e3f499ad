"""``cadence-fx`` / ``python -m cadence_fx``: explain, verify, demo, bench, serve-sim, soak.

The models are built from the upstream PyPI packages at their released
configuration with seeded random weights (``--checkpoint DIR`` loads real ones).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

MODELS = ("token2wav", "mimi", "vibevoice")
#: the dtypes each model runs: Token2Wav's flow in fp32 or upstream's fp16, Mimi as moshi
#: runs it, VibeVoice's decoder in any (VibeVoice itself runs bfloat16)
DTYPES = {"token2wav": ("float32", "float16"), "mimi": ("float32",),
          "vibevoice": ("float32", "float16", "bfloat16")}


def _add_model_args(p: argparse.ArgumentParser, *, weights: bool = True, rules: str | None = "S") -> None:
    p.add_argument("--model", choices=MODELS, default="token2wav")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--prompt-tokens", type=int, default=50, help="prompt length P in tokens (mel frames = 2P)")
    p.add_argument("--n-timesteps", type=int, default=5, help="flow-matching steps per chunk (upstream: 5 or 10)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="; ".join(f"{m}: {' or '.join(d)}" for m, d in DTYPES.items()))
    if weights:
        p.add_argument("--seed", type=int, default=0, help="seeds the weights, the prompt and the tokens")
        p.add_argument("--checkpoint", default=None, help="token2wav: directory with upstream flow.pt and hift.pt; "
                                                          "mimi: moshi's .safetensors or a torch.save'd state dict; "
                                                          "vibevoice: the acoustic tokenizer's .safetensors or "
                                                          "torch.save'd state dict")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    if rules is not None:
        p.add_argument("--rules", default=rules, help="S (CPU or CUDA); on CUDA, replay: SR (per DiT "
                                                      "call) or SRc (per chunk) over the arena, R or Rc over "
                                                      "stock-managed state" + ("; auto: SRc on CUDA, S on CPU"
                                                                          if rules == "auto" else ""))


def _check_dtype(args) -> None:
    if args.dtype not in DTYPES[args.model]:
        raise SystemExit(f"--model {args.model} runs {' or '.join(DTYPES[args.model])}, not --dtype {args.dtype}")


def _progress(quiet: bool):
    if quiet:
        return None
    return lambda msg: print(f"[cadence-fx] {msg}", file=sys.stderr, flush=True)


def _build(args) -> tuple[Any, Any]:
    from .integrations import stepaudio2 as s2
    if args.prompt_tokens < 1:
        raise SystemExit("--prompt-tokens must be >= 1")
    if not 1 <= args.n_timesteps <= 16:
        raise SystemExit("--n-timesteps must be in 1..16 (upstream keeps 16 step slots)")
    _check_dtype(args)
    device = _device(args)
    flow, hift = s2.build_modules(args.seed, args.checkpoint)
    tail = s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps,
                            float16=args.dtype == "float16")
    prompt = s2.synthetic_prompt(args.prompt_tokens, args.seed, device=device)
    return tail, prompt


def _build_mimi(args):
    """Mimi (moshi) at the released configuration, seeded; fp32 only."""
    from .integrations import moshi as mm
    _check_dtype(args)
    return mm.MimiDecoder(mm.build_mimi(args.seed, args.checkpoint).to(_device(args)))


def _build_vibevoice(args):
    """VibeVoice's acoustic decoder at the released configuration, seeded, in ``--dtype``
    (VibeVoice itself runs bfloat16 on GPU)."""
    import torch
    from .integrations import vibevoice as vv
    _check_dtype(args)
    device = _device(args)
    model = vv.build_acoustic_tokenizer(args.seed, args.checkpoint)
    return vv.VibeVoiceDecoder(model.to(device=device, dtype=getattr(torch, args.dtype)))


def _device(args):
    import torch
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available on this machine")
    return device


def cmd_explain(args) -> int:
    import torch
    from .integrations import stepaudio2 as s2
    from .compiler import build_plan
    _check_dtype(args)
    device = torch.device(args.device)
    if args.model == "mimi":
        from .integrations import moshi as mm
        plan = build_plan(mm.explain_adapter(device))
    elif args.model == "vibevoice":
        from .integrations import vibevoice as vv
        plan = build_plan(vv.explain_adapter(device, getattr(torch, args.dtype)))
    else:
        plan = build_plan(s2.explain_adapter(args.prompt_tokens, args.n_timesteps, args.dtype == "float16", device))
    doc = plan.to_json()
    text = plan.explain()
    if args.trace:
        doc["partition"], lines = _partition_preview(args)
        text += "\n\nPartition preview (rule S graphs, traced here; what rules SR/SRc would leave eager)\n" + lines
    if args.json:
        print(json.dumps(doc))
    else:
        print(text)
    return 0


def _partition_preview(args) -> tuple[dict, str]:
    import cadence_fx
    from .compiler import preview_partition
    args.seed, args.checkpoint = 0, None
    if args.model in ("mimi", "vibevoice"):  # one decode is one step: SR and SRc capture the same graph
        stock = _build_mimi(args) if args.model == "mimi" else _build_vibevoice(args)
        opt = cadence_fx.optimize(stock, rules="S", progress=_progress(args.json))
        exe, adapter = opt.executable, opt.adapter
    else:
        tail, (pt, pm, spk) = _build(args)
        opt = cadence_fx.optimize(tail, rules="S", progress=_progress(args.json))
        exe, adapter = opt.executable(pm.shape[1], spk), opt._adapter(pm.shape[1], spk)
    doc, lines = {}, []
    for granularity in ("chunk", "step"):
        boundary = None if granularity == "chunk" else adapter.step_boundary()
        for idx, rec in preview_partition(exe, granularity, boundary).items():
            doc.setdefault(str(idx), {})[granularity] = {
                "regions": [{"name": n, "capturable": c, "nodes": k} for n, c, k in rec.regions],
                "eager": [{"node": v.node, "reason": v.reason} for v in rec.islands]}
            lines.append(f"  entry {idx} ({'SRc' if granularity == 'chunk' else 'SR'}): {rec}")
    return doc, "\n".join(lines)


def cmd_verify(args) -> int:
    from .verify import compare_streams, deterministic_protocol, format_table
    import torch
    if torch.device(args.device).type == "cuda":
        deterministic_protocol()
    import cadence_fx
    from .integrations import stepaudio2 as s2
    say = _progress(args.quiet)
    if args.model in ("mimi", "vibevoice"):  # one frame per chunk (mimi: 8 codes, 80 ms; vibevoice:
        # a [1, 64, 1] latent, 3,200 samples); the step is traced in optimize()
        if args.final_tokens:
            raise SystemExit(f"--final-tokens does not apply to --model {args.model}: it has no flush frame")
        tail = (_build_mimi if args.model == "mimi" else _build_vibevoice)(args)
        t0 = time.perf_counter()
        opt = cadence_fx.optimize(tail, rules=args.rules, progress=say)
        compile_s = time.perf_counter() - t0
        if args.model == "mimi":
            from .integrations import moshi as mm
            chunks = mm.synthetic_codes(args.chunks, args.seed)
        else:
            from .integrations import vibevoice as vv
            chunks = vv.synthetic_latents(args.chunks, args.seed, tail.dtype, tail.device)
        config = {}
    else:
        tail, (pt, pm, spk) = _build(args)
        t0 = time.perf_counter()
        opt = cadence_fx.optimize(tail, rules=args.rules, progress=say)
        opt.set_stream_cache(pt, pm, spk)
        compile_s = time.perf_counter() - t0
        tail.set_stream_cache(pt, pm, spk)
        chunks = s2.synthetic_chunks(args.chunks, args.seed, final_tokens=args.final_tokens or None)
        config = {"n_timesteps": args.n_timesteps, "prompt_tokens": args.prompt_tokens}
    report = compare_streams(tail, opt, chunks, tail.device, say)
    stats = opt.stats()
    report.update({
        "model": args.model, "rules": args.rules, "device": str(tail.device), "dtype": args.dtype,
        **config, "seed": args.seed,
        "fallbacks": stats["fallback_total"], "fallback_reasons": stats["fallbacks"], "stats": stats,
        "arena_bytes": opt.arena_bytes, "state_bytes": opt.state_bytes, "stock_state_bytes": opt.session.executable.plan.stock_state_bytes,
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


def cmd_demo(args) -> int:
    """The main job: stream ~10 s through stock and optimized, write both WAVs, compare."""
    import hashlib
    import wave
    import numpy as np
    import torch
    from .verify import compare_streams, deterministic_protocol
    if torch.device(args.device).type == "cuda":
        deterministic_protocol()
    import cadence_fx
    from .integrations import stepaudio2 as s2
    say = _progress(False)
    if args.rules == "auto":
        args.rules = "SRc" if torch.device(args.device).type == "cuda" else "S"
    if torch.device(args.device).type == "cpu":
        say("running rule S (demand-sized state at stable addresses) on the CPU; CUDA-graph replay "
            "(rules SR/SRc) needs a GPU: --device cuda")
    tail, (pt, pm, spk) = _build(args)
    opt = cadence_fx.optimize(tail, rules=args.rules, progress=say)
    t0 = time.perf_counter()
    opt.set_stream_cache(pt, pm, spk)
    compile_s = time.perf_counter() - t0
    tail.set_stream_cache(pt, pm, spk)
    chunks = s2.synthetic_chunks(args.chunks, args.seed, final_tokens=args.final_tokens or None)
    say(f"streaming {len(chunks)} chunks (~{len(chunks)} s of audio) through stock and optimized tails")
    report = compare_streams(tail, opt, chunks, tail.device, say, keep_pcm=True)
    os.makedirs(args.out, exist_ok=True)
    paths = {}
    for name, pcm in report.pop("pcm").items():
        path = os.path.join(args.out, f"token2wav-{name}.wav")
        with wave.open(path, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(24000)
            w.writeframes(pcm)
        paths[name] = (path, hashlib.sha256(pcm).hexdigest())
    stock_ms = float(np.median([r["stock_ms"] for r in report["per_chunk"]]))
    opt_ms = float(np.median([r["opt_ms"] for r in report["per_chunk"]]))
    plan = opt.session.executable.plan
    print(f"model: Token2Wav tail (stepaudio2-minicpmo {s2.UPSTREAM_VERSION}), released config, seeded random "
          f"weights, {args.n_timesteps} flow steps, {args.dtype}, {tail.device}, rules {args.rules}")
    for name, (path, sha) in paths.items():
        print(f"{name:>9}: {path}  sha256 {sha}")
    print(f"same PCM bytes: {paths['stock'][1] == paths['optimized'][1]}; every chunk's waveform and state "
          f"bit-exact: {report['exact']}")
    print(f"per-chunk median: stock {stock_ms:.1f} ms, optimized {opt_ms:.1f} ms "
          f"({stock_ms / opt_ms:.2f}x; one run each, not a benchmark); one-time trace {compile_s:.1f} s")
    print(f"state memory: arena {plan.arena_bytes / 2**20:.1f} MiB vs stock buffers + state "
          f"{plan.stock_state_bytes / 2**20:.1f} MiB ({100 * plan.arena_bytes / plan.stock_state_bytes:.1f}%)")
    if tail.device.type == "cpu":
        print("replay (rules SR/SRc) needs a CUDA GPU; this run verified rule S on the CPU")
    ok = report["exact"] and paths["stock"][1] == paths["optimized"][1]
    if args.json:
        print(json.dumps({"exact": ok, "chunks": report["chunks"], "rules": args.rules, "device": str(tail.device),
                          "stock_ms_p50": stock_ms, "optimized_ms_p50": opt_ms, "compile_s": round(compile_s, 2),
                          "arena_bytes": plan.arena_bytes, "stock_state_bytes": plan.stock_state_bytes,
                          "wav": {k: {"path": p, "sha256": h} for k, (p, h) in paths.items()},
                          "stats": opt.stats()}))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cadence-fx", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("explain", help="print the plan: clocks, regions, catalog, arena, verdicts")
    _add_model_args(p, weights=False, rules=None)
    p.add_argument("--trace", action="store_true",
                   help="also build the model (seeded), trace every entry and preview the partition (minutes on CPU)")
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser("verify", help="stock vs optimized, every chunk, bit for bit")
    _add_model_args(p)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--final-tokens", type=int, default=0, help="end with a flush chunk of this many tokens")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_verify)
    p = sub.add_parser("demo", help="the main job: ~10 s through stock and optimized, two WAVs, the verdict")
    _add_model_args(p, rules="auto")
    p.add_argument("--chunks", type=int, default=10)
    p.add_argument("--final-tokens", type=int, default=0)
    p.add_argument("--out", default="cadence-fx-demo")
    p.set_defaults(fn=cmd_demo)
    from .bench import add_bench_args, cmd_bench
    p = sub.add_parser("bench", help="variants side by side (--model token2wav|mimi): one long-lived process per "
                                     "variant, matched blocks interleaved, exactness vs stock")
    add_bench_args(p)
    p.set_defaults(fn=cmd_bench)
    from .serve import add_serve_args, cmd_serve_sim, cmd_soak
    p = sub.add_parser("serve-sim", help="N sessions on a virtual 1 s cadence: SPEAK time, deadline misses, "
                                         "peak memory, stock vs optimized (--sweep: the largest N that holds)")
    add_serve_args(p)
    p.set_defaults(fn=cmd_serve_sim)
    p = sub.add_parser("soak", help="one optimized session for many chunks: flat memory, exact checkpoints")
    add_serve_args(p, soak_cmd=True)
    p.set_defaults(fn=cmd_soak)
    args = parser.parse_args(argv)
    if getattr(args, "chunks", None) is not None and args.chunks < 1:  # bench: None is the model's default
        parser.error("--chunks must be >= 1")
    try:
        return args.fn(args)
    except Exception as e:  # noqa: BLE001 - one clear line for known errors
        from .errors import CadenceError
        if isinstance(e, CadenceError):
            print(f"cadence-fx: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
