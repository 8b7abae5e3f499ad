"""How long a new voice waits for replay: setup time per prompt length, exactness beside it.

One process per row, so "first" really is first and "cold start" really is a new process:

    python benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps 5 \
        --prompt-tokens 75,150,250 --out DIR [--control compile-ro]

runs, each in its own Python process:

1. ``cold``: an empty program cache directory; ``optimize`` then the first prompt length
   (symbolic trace + specialize + passes + capture + prompt setup), then each further
   length on the same optimized model (specialize + passes + capture + setup);
2. ``warm``: a new process on the cache directory ``cold`` filled: the first length's
   ready time is the restarted process's (``cold_start_cached_s``);
3. with ``--control compile-ro``: the stock tail with its DiT under
   ``torch.compile(mode="reduce-overhead", dynamic=False)`` (the bench's control), once
   with an empty inductor cache and once with the cache the first run filled; its "ready"
   time per length is set-up plus the three chunks that reach steady state, less three
   steady chunks.

Every cadence_fx length is then streamed against stock (warm-up, growth, trim, steady,
a flush), ``torch.equal`` on every waveform and state tensor and SHA-256 of the PCM:
``exact`` stands beside every number.  Each cadence_fx row also says how long the
garbage collector ran inside its ``ready_s`` (``gc``: full collections' seconds and
count, and the young generations' seconds), and after it the objects the collector
tracks (``tracked_objects``: what a full collection walks) and its collections so far
by generation (``collections``).  Writes ``DIR/setup-<rules>-<steps>.json`` and prints
it (``--summary``: a headline and a line per row; ``--summarize REPORT...`` prints that of
reports already written, running nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _sync(device) -> None:
    import torch
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_cadence(args) -> dict:
    import torch
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.lockstep import compare_streams, deterministic_protocol
    if args.device == "cuda":
        deterministic_protocol()
    device = torch.device(args.device)
    flow, hift = s2.build_modules(args.seed)
    tail = s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps)
    kwargs = {"cache": args.cache_dir} if args.cache_dir else {}
    try:
        opt = cadence_fx.optimize(tail, rules=args.rules, **kwargs)
    except TypeError:  # a cadence_fx without the disk cache
        opt = cadence_fx.optimize(tail, rules=args.rules)
    from gc_clock import GcClock  # this folder (a script's path)
    rows, gc_clock = [], GcClock()
    for tokens in args.prompt_tokens:
        prompt = s2.synthetic_prompt(tokens, seed=tokens, device=device)
        profile = None
        if args.profile and len(rows) == 1:  # the second length: where a specialization's time goes
            import cProfile
            profile = cProfile.Profile()
            profile.enable()
        _sync(device)
        gc_clock.start()
        t0 = time.perf_counter()
        opt.set_stream_cache(*prompt)
        _sync(device)
        ready = time.perf_counter() - t0
        gc_s = gc_clock.report()  # the collections inside ready_s
        if profile is not None:
            import io
            import pstats
            profile.disable()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(60)
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(40)  # the leaves
            Path(args.profile).write_text(text.getvalue())
            profile.dump_stats(args.profile + ".prof")  # the raw profile: callers and callees, read anywhere
        exe = opt.session.executable
        import gc
        tracked = len(gc.get_objects())  # the heap a full collection would walk now (outside ready_s)
        gc_gens = [g["collections"] for g in gc.get_stats()]
        tail.set_stream_cache(*prompt)
        chunks = s2.synthetic_chunks(args.chunks, seed=tokens, final_tokens=11)
        report = compare_streams(tail, opt, chunks, device, seed=tokens)
        rows.append({"prompt_tokens": tokens, "ready_s": round(ready, 3),
                     "how": [e["how"] for e in exe.notes["setup"].values()],
                     "split": exe.notes.get("setup_s"),
                     "capture_s": round(opt.session.stats()["setup_s"].get("capture_s", 0.0), 3),
                     "gc": gc_s, "tracked_objects": tracked, "collections": gc_gens,
                     "capture_retried": opt.session.stats().get("capture_retried", {}),
                     "exact": bool(report["exact"]),
                     "pcm_sha256": report["pcm_sha256_optimized"], "chunks": len(chunks),
                     "mismatches": report["mismatches"][:3]})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        if args.gc_freeze and len(rows) == 1:  # the traced programs and the model: never walked again
            import gc
            gc.collect()
            gc.freeze()
    return {"rows": rows}


def run_control(args) -> dict:
    import torch
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.tools.bench.controls import apply_control
    device = torch.device(args.device)
    flow, hift = s2.build_modules(args.seed)
    tail = s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps)
    apply_control(tail, args.control)
    rows = []
    for tokens in args.prompt_tokens:
        prompt = s2.synthetic_prompt(tokens, seed=tokens, device=device)
        chunks = s2.synthetic_chunks(6, seed=tokens)
        _sync(device)
        t0 = time.perf_counter()
        tail.set_stream_cache(*prompt)
        for tok, last in chunks[:3]:
            tail.stream(tok, last_chunk=last, return_waveform=True)
        _sync(device)
        first3 = time.perf_counter() - t0
        steady = []
        for tok, last in chunks[3:6]:
            t1 = time.perf_counter()
            tail.stream(tok, last_chunk=last, return_waveform=True)
            _sync(device)
            steady.append(time.perf_counter() - t1)
        per_chunk = sorted(steady)[1]
        rows.append({"prompt_tokens": tokens, "ready_s": round(first3 - 3 * per_chunk, 3),
                     "steady_chunk_ms": round(per_chunk * 1000, 1)})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {"rows": rows}


def _child(args, extra: list[str], env: dict, timeout: int | None = None, tokens: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", "--device", args.device, "--rules", args.rules,
           "--n-timesteps", str(args.n_timesteps), "--prompt-tokens", tokens or ",".join(map(str, args.prompt_tokens)),
           "--chunks", str(args.chunks), "--seed", str(args.seed)] + (["--gc-freeze"] if args.gc_freeze else []) + extra
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, timeout=timeout or args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout or args.timeout} s", "wall_s": round(time.perf_counter() - t0, 1)}
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}", "wall_s": round(time.perf_counter() - t0, 1)}
    out = json.loads(done.stdout.decode().strip().splitlines()[-1])
    out["process_wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def summary_lines(result: dict) -> list[str]:
    """A report's headline and one line per row (what a device call's log needs), not its whole JSON."""
    head = {k: result.get(k) for k in ("first_setup_s", "new_prompt_length_ready_s", "cold_start_cached_s", "exact")}
    lines = [f"{result.get('rules')} {result.get('n_timesteps')} steps, {result.get('torch')}: {json.dumps(head)}"]
    for run in ("cold", "warm"):
        part = result.get(run) or {}
        if "error" in part:
            lines.append(f"{run} error: {str(part['error'])[:300]}")
        for r in part.get("rows", []):
            split = r.get("split") or {}
            lines.append(f"{run} {r['prompt_tokens']} tokens: ready {r['ready_s']} s "
                         + json.dumps({k: split.get(k) for k in ("trace_s", "specialize_s", "passes_s")})
                         + f" capture {r.get('capture_s')} exact {r.get('exact')}")
    control = result.get("control") or {}
    for cache in ("empty_cache", "warm_cache"):
        part = control.get(cache)
        if isinstance(part, dict):
            rows = [(r.get("prompt_tokens"), r.get("ready_s"), r.get("steady_chunk_ms")) for r in part.get("rows", [])]
            lines.append(f"control {control.get('variant')} {cache} (not exact): (tokens, ready_s, steady_chunk_ms) {rows}"
                         + (f" error: {str(part['error'])[:200]}" if "error" in part else ""))
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--rules", default="SRc")
    p.add_argument("--n-timesteps", type=int, default=5)
    p.add_argument("--prompt-tokens", type=lambda s: [int(x) for x in s.split(",")], default=[75, 150, 250])
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--control", default=None, help="also time a bench control, e.g. compile-ro")
    p.add_argument("--control-timeout", type=int, default=None, help="seconds per control run")
    p.add_argument("--control-once", action="store_true", help="the control with an empty cache only")
    p.add_argument("--control-prompt-tokens", default=None, help="prompt lengths for the control (default: all)")
    p.add_argument("--out", default=".")
    p.add_argument("--timeout", type=int, default=540)
    p.add_argument("--skip-warm", action="store_true", help="no restarted-process row (no disk cache to test)")
    p.add_argument("--profile", default=None, help="cProfile the second length's set-up (cold run) into this file")
    p.add_argument("--gc-freeze", action="store_true",
                   help="gc.freeze() after the first set-up (what a serving process may do after warm-up)")
    p.add_argument("--summary", action="store_true",
                   help="print a headline and one line per row instead of the whole report (the file is whole)")
    p.add_argument("--summarize", nargs="+", default=None, metavar="REPORT",
                   help="run nothing: print the summary of reports this script wrote")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--run-control", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.summarize:
        for f in args.summarize:
            print(f)
            print("\n".join(summary_lines(json.loads(Path(f).read_text()))))
        return 0
    if args.child:
        if args.run_control:
            args.control = args.run_control
            print(json.dumps(run_control(args)))
        else:
            print(json.dumps(run_cadence(args)))
        return 0

    import torch
    result = {"device": args.device, "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "rules": args.rules,
              "n_timesteps": args.n_timesteps, "prompt_tokens": args.prompt_tokens,
              "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:]))}
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as inductor:
        cold = _child(args, ["--cache-dir", cache] + (["--profile", args.profile] if args.profile else []), {})
        warm = {"skipped": True} if args.skip_warm else _child(args, ["--cache-dir", cache], {})
        result["cold"], result["warm"] = cold, warm
        if "rows" in cold:
            result["first_setup_s"] = cold["rows"][0]["ready_s"]
            result["new_prompt_length_ready_s"] = [r["ready_s"] for r in cold["rows"][1:]]
        if "rows" in warm:
            result["cold_start_cached_s"] = warm["rows"][0]["ready_s"]
        rows = [r for run in (cold, warm) for r in run.get("rows", [])]
        result["exact"] = bool(rows) and all(r["exact"] for r in rows) and "error" not in cold and "error" not in warm
        if args.control:
            env = {"TORCHINDUCTOR_CACHE_DIR": inductor}
            result["control"] = {"variant": args.control,
                                 "empty_cache": _child(args, ["--run-control", args.control], env, args.control_timeout,
                                                       args.control_prompt_tokens)}
            if not args.control_once:
                result["control"]["warm_cache"] = _child(args, ["--run-control", args.control], env,
                                                         args.control_timeout, args.control_prompt_tokens)
    out = Path(args.out) / f"setup-{args.rules}-{args.n_timesteps}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(summary_lines(result)) if args.summary else json.dumps(result, indent=1))
    return 0 if result.get("exact") else 1


if __name__ == "__main__":
    raise SystemExit(main())
