"""``cadence-fx serve-sim`` and ``cadence-fx soak``: their options and entry points."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .. import registry
from ...errors import InputError
from .check import in_processes, plain_options
from .sim import MIXES, MODES, SimConfig, plot_sweep, serve_sim_report, sweep_sizes
from .soak import soak


def _resolve(args):
    """The device, once ``--model``, ``--prompt-tokens`` and ``--rules auto`` are settled."""
    import torch
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available on this machine")
    if args.prompt_tokens < 1:
        raise SystemExit("--prompt-tokens must be >= 1")
    if args.rules == "auto":
        args.rules = "SRc" if device.type == "cuda" else "S"
    if device.type == "cuda":
        from ...lockstep import deterministic_protocol
        deterministic_protocol()  # stock eager is bit-reproducible on a GPU only with it
    return device


def cmd_serve_sim(args) -> int:
    import torch
    say = None if args.json else (lambda msg: print(f"[serve-sim] {msg}", file=sys.stderr, flush=True))
    spec = registry.get(args.model)
    device = _resolve(args)
    if args.dtype not in spec.dtypes:
        raise SystemExit(f"--dtype {args.dtype}: {args.model} runs {', '.join(spec.dtypes)}")
    if args.sessions < 1 or args.seconds < 1:
        raise SystemExit("--sessions and --seconds must be >= 1")
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= set(MODES) or not modes:
        raise SystemExit(f"--modes: choose from {','.join(MODES)}")
    if args.overlap and device.type != "cuda":
        raise SystemExit("--overlap launches sessions on their own CUDA streams: it needs --device cuda")
    if args.profile and device.type != "cuda":
        raise SystemExit("--profile reads the GPU's kernel times from torch.profiler: it needs --device cuda")
    if args.check_workers < 1:
        raise SystemExit("--check-workers must be >= 1")
    make_streams = None
    if args.ray_sends and not args.ray_replicas:
        raise SystemExit("--ray-sends needs --ray-replicas")
    if args.ray_replicas:
        make_streams = _ray_streams(args, device)
    points = None
    if args.sweep_points:
        if not args.sweep:
            raise SystemExit("--sweep-points needs --sweep")
        try:
            points = sweep_sizes(args.max_sessions, [int(n) for n in args.sweep_points.split(",") if n.strip()])
        except (ValueError, InputError) as e:
            raise SystemExit(f"--sweep-points {args.sweep_points!r}: {e}") from None

    def make_optimized():
        return registry.optimize(spec, spec.build(args)[0], args.rules, say)

    def make_stock(i):  # its own weights and buffers, as upstream serves one stream per model
        return spec.build(args)[0]

    meta = {"model": args.model, "rules": args.rules, "dtype": args.dtype, **spec.config(args),
            "unit": spec.unit, "unit_seconds": spec.unit_seconds, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "stock_layout": "one stock model per session: its own weights and fixed state buffers",
            "sweep_points": points, "check_workers": args.check_workers}
    # a tick is one chunk (Token2Wav: 1 s) or frame (Mimi: 80 ms) of audio: its budget
    cfg = SimConfig(args.seconds, args.mix, args.seed, args.warmup_ticks, budget_ms=1000.0 * spec.unit_seconds,
                    profile=args.profile)
    report = serve_sim_report(make_optimized=make_optimized, make_stock=make_stock,
                              # through Ray a prompt travels from the CPU (the replica moves it to its device)
                              make_prompt=lambda i: spec.serve.prompt(args, i, torch.device("cpu") if args.ray_replicas
                                                                      else device), hooks=spec.serve,
                              device=device, cfg=cfg,
                              sessions=args.sessions, modes=modes,
                              sweep_to=args.max_sessions if args.sweep else None, overlap=args.overlap,
                              meta=meta, say=say, check_exact=not args.no_exact_check, points=points,
                              tokens=spec.serve.tokens(args),
                              run_jobs=None if args.check_workers == 1 else in_processes(args, cfg, args.check_workers, say),
                              make_streams=make_streams)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        if args.sweep:
            png = plot_sweep(report, os.path.join(args.out, "serve-sim.png"))
            report["png"] = png
            if png is None:
                print("[serve-sim] matplotlib is not importable: no PNG (the JSON has every number)", file=sys.stderr)
        with open(os.path.join(args.out, "serve-sim.json"), "w") as f:
            json.dump(report, f, indent=1)
    if args.json:
        print(json.dumps(report))
    else:
        print(_format_serve(report))
    return 0 if report["exact"] in (True, None) else 1


def _ray_streams(args, device):
    """``--ray-replicas K``: the optimized sessions as conversations of a Ray Serve app."""
    import torch
    if args.ray_replicas < 0:
        raise SystemExit("--ray-replicas must be >= 0")
    if args.overlap or args.profile:
        raise SystemExit("--overlap and --profile are in-process options; through Ray each replica always launches "
                         "its sessions on their own CUDA streams, and its kernels run in the replica's process")
    gpus = 0
    if device.type == "cuda":
        gpus = 1
        if args.ray_replicas > torch.cuda.device_count():
            raise SystemExit(f"--ray-replicas {args.ray_replicas}: one replica per GPU, and this host has "
                             f"{torch.cuda.device_count()}")
    import importlib.util
    if importlib.util.find_spec("ray") is None:
        raise SystemExit("--ray-replicas needs Ray Serve: pip install 'cadence_fx[ray]'")
    per_replica = args.ray_max_conversations or (args.max_sessions if args.sweep else args.sessions)
    # a replica sees only its own GPU (Ray sets CUDA_VISIBLE_DEVICES): "cuda", whatever --device named
    options = {**plain_options(args), "device": "cuda" if device.type == "cuda" else "cpu"}
    from .ray_sim import RayStreams
    return lambda: RayStreams(options, args.ray_replicas, per_replica, gpus, per_conversation=args.ray_sends)


def _speak(r: dict[str, Any], misses: str) -> str:
    """One run's SPEAK time, deadline misses and peak memory, as the serve report prints them."""
    sp = r.get("speak_ms") or {}
    peak = r.get("peak_memory_bytes")
    return (f"SPEAK mean {sp.get('mean')} p99 {sp.get('p99')} ms, misses {misses}, "
            f"peak {'n/a' if peak is None else f'{peak / 2 ** 20:,.0f} MiB'}")


def _profiled(r: dict[str, Any]) -> str:
    pr = r.get("profile")
    if not pr:
        return ""
    return (f"; profiled tick: kernels {pr['kernel_ms']} ms, GPU busy {pr['gpu_busy_ms']} of {pr['tick_ms']} ms, "
            f"{pr['concurrency']} at once")


def _format_serve(report: dict[str, Any]) -> str:
    lines = [f"serve-sim {report['model']} on {report['device']}, rules {report['rules']}, {report['mix']}, "
             f"budget {report['budget_ms']:.0f} ms per tick"]
    if "sweep" in report:
        for mode, points in report["sweep"].items():
            for p in points:
                lines.append(f"  {mode:>9} N={p['sessions']:>3}: {p['status']:<5} {_speak(p, p.get('deadline_misses'))}"
                             + ("" if "exact" not in p else f", exact {p['exact']}") + _profiled(p))
        lines.append(f"largest N holding the cadence: {report['max_sessions_holding_cadence']}; "
                     f"every session exact at every N: {report['exact']}")
        return "\n".join(lines)
    for mode, r in report["modes"].items():
        misses = f"{r.get('deadline_misses')}/{r.get('speaking_ticks')}"
        lines.append(f"  {mode:>9}: {r['sessions']} sessions, {r['status']}, {_speak(r, misses)}" + _profiled(r))
    lines.append(f"every session's PCM identical between modes: {report['exact']}")
    return "\n".join(lines)


def cmd_soak(args) -> int:
    say = None if args.json else (lambda msg: print(f"[soak] {msg}", file=sys.stderr, flush=True))
    spec = registry.get(args.model)
    device = _resolve(args)
    tail = spec.build(args)[0]
    model = registry.optimize(spec, tail, args.rules, say)
    prompt = spec.serve.prompt(args, 0, device)
    spec.executable(model, prompt)  # trace before the clock starts
    report = soak(model, tail, prompt, spec.serve, args.chunks, args.check_every, args.seed, say=say)
    report.update(model=args.model, n_timesteps=args.n_timesteps, dtype=args.dtype, prompt_tokens=args.prompt_tokens)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "soak.json"), "w") as f:
            json.dump(report, f, indent=1)
    if args.json:
        print(json.dumps(report))
    else:
        for r in report["checkpoints"]:
            print(f"chunk {r['chunk']:>6}: exact {r['exact']}  allocated {r['allocated_bytes']}  rss {r['rss_bytes']}")
        print(f"all checkpoints exact: {report['all_exact']}; memory flat after warm-up: {report['memory_flat']} "
              f"(max - min {report['memory_flat_bytes']} bytes); chunk p50 {report['chunk_ms']['p50']} ms")
    return 0 if report["all_exact"] and report["memory_flat"] in (True, None) else 1


def add_serve_args(p: argparse.ArgumentParser, *, soak_cmd: bool = False) -> None:
    p.add_argument("--model", default=registry.DEFAULT_MODEL,
                   choices=registry.names(lambda s: s.serve and (not soak_cmd or s.serve.load_stock_state)))
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--rules", default="auto", help="optimized rules; auto: SRc on CUDA, S on CPU")
    p.add_argument("--prompt-tokens", type=int, default=50)
    p.add_argument("--n-timesteps", type=int, default=5)
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="the model's dtypes only (token2wav: float32, float16; mimi: float32; vibevoice: all three)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=None, help="directory with upstream flow.pt and hift.pt")
    p.add_argument("--out", default=None, help="write the JSON (and, sweeping, the PNG) here")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    if soak_cmd:
        p.add_argument("--chunks", type=int, default=3600, help="chunks to stream (1 s each)")
        p.add_argument("--check-every", type=int, default=100, help="chunks between checkpoints")
        return
    p.add_argument("--sessions", type=int, default=4, help="concurrent sessions N (fixed-N run)")
    p.add_argument("--seconds", type=int, default=10,
                   help="timed ticks per run or per N (a tick: one chunk or frame of audio per speaking session)")
    p.add_argument("--warmup-ticks", type=int, default=1, help="untimed ticks first (first-call costs)")
    p.add_argument("--mix", choices=MIXES, default="speak-heavy",
                   help="speak-heavy: every session speaks every tick; mixed: each speaks with p = 0.5 (seeded)")
    p.add_argument("--modes", default="stock,optimized")
    p.add_argument("--sweep", action="store_true", help="grow N from 1 until a miss, out of memory or --max-sessions; "
                                                         "then every session's PCM at every N is checked against its own "
                                                         "stock stream alone")
    p.add_argument("--no-exact-check", action="store_true",
                   help="sweeping: skip that check (report exact: null), e.g. for a quick capacity probe")
    p.add_argument("--max-sessions", type=int, default=64)
    p.add_argument("--sweep-points", default=None,
                   help="sweeping: only these N, ascending (e.g. 1,8,16,32,64); sessions still persist between them")
    p.add_argument("--check-workers", type=int, default=1,
                   help="sweeping: replay the stock streams of the exactness check in this many processes "
                        "(stock is host-bound; each process builds the model once from these options)")
    p.add_argument("--profile", action="store_true",
                   help="CUDA: after each run's (or N's) timed ticks, one more tick under torch.profiler: kernel time, "
                        "GPU busy time and their ratio (kernels running at once) per N")
    p.add_argument("--ray-replicas", type=int, default=0,
                   help="serve the optimized sessions through Ray Serve (cadence_fx.serving.ray): this many tail "
                        "replicas, one GPU each on CUDA, behind the router; needs the [ray] extra")
    p.add_argument("--ray-max-conversations", type=int, default=0,
                   help="with --ray-replicas: conversations each replica admits (default: --max-sessions sweeping, "
                        "else --sessions)")
    p.add_argument("--ray-sends", action="store_true",
                   help="with --ray-replicas: each session's chunk is its own request (independent clients), not one "
                        "tick request per tick (a gateway)")
    p.add_argument("--overlap", action="store_true",
                   help="CUDA: each optimized session on its own stream, a tick's chunks launched before any is read")


def add_soak_args(p: argparse.ArgumentParser) -> None:
    add_serve_args(p, soak_cmd=True)
