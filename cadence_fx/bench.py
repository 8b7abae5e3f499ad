"""``cadence-fx bench``: latency, kernel time, launches and peak memory per variant.

Each (block, variant) runs in its own process (``python -m cadence_fx.bench --worker``),
so a variant's peak memory is its own and no variant inherits another's allocator,
graphs or compiled code.  Blocks are matched: block ``b`` runs every variant once, in
an order rotated by ``b``, and speedups are the median over blocks of the paired ratio
``B0_p50 / V_p50``.

In a worker: build the tail (seeded weights), apply the variant, set up the prompt
(``compile_s`` covers optimize/compile/capture, setup and warm-up beyond steady
speed), stream ``--warmup`` chunks (default 3: chunk 0 has no crossfade partner,
chunk 1 grows the attention caches to the prompt + 100 retained frames, from chunk 2
on every chunk has the steady shape), reset the peak-memory counter, then stream
``--chunks`` timed chunks per block.  Before streamed chunk ``i`` (warm-up chunks
included, counted from 0) every variant seeds ``torch.manual_seed(seed * 1000 + i)``
(CPU and CUDA generators), so all variants draw the same noise and their PCM and
float waveforms can be compared by SHA-256 across processes.  On CUDA the
deterministic protocol of ``verify`` is on, and one extra chunk after the block runs
under ``torch.profiler`` for GPU time and launch counts.

Variants: ``B0`` (stock), ``S``, ``SR``, ``SRc`` (``cadence_fx.optimize`` rules) and
the CUDA-only controls in ``CONTROLS``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Iterable, Sequence

from .errors import CadenceError

RULE_VARIANTS = ("B0", "S", "SR", "SRc")
#: controls: the same stock tail, made faster by something other than cadence_fx
CONTROLS = {
    "compile-ro": "torch.compile(estimator.forward_chunk, mode='reduce-overhead', dynamic=False)",
    "compile-ro-auto": "torch.compile(estimator.forward_chunk, mode='reduce-overhead') (dynamic: default)",
    "compile": "torch.compile(estimator.forward_chunk) (default mode, dynamic=False)",
    "cudagraphs": "torch.compile(estimator.forward_chunk, backend='cudagraphs', dynamic=False)",
    "vendor": "upstream's own CUDA graphs: flow.scatter_cuda_graph(True)",
}
CUDA_ONLY = ("SR", "SRc", *CONTROLS)
VARIANTS = (*RULE_VARIANTS, *CONTROLS)
DEFAULT_WARMUP = 3


class BenchError(CadenceError, ValueError):
    """A bench request that cannot run as asked (unknown variant, CUDA-only on CPU, ...)."""


def check_variants(variants: Sequence[str], device: str) -> list[str]:
    """Validate the variant list for ``device``; a clear error names the offending variant."""
    variants = list(variants)
    if not variants:
        raise BenchError("no variants given; e.g. --variants B0,S")
    if len(set(variants)) != len(variants):
        raise BenchError(f"duplicate variants in {','.join(variants)}")
    for v in variants:
        if v not in VARIANTS:
            raise BenchError(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
        if v in CUDA_ONLY and not device.startswith("cuda"):
            what = CONTROLS.get(v, f"rules {v} (CUDA-graph replay)")
            raise BenchError(f"variant {v!r} needs CUDA ({what}); this bench runs on --device {device}. "
                             f"On the CPU use B0 and S.")
    return variants


def rotating_order(variants: Sequence[str], blocks: int) -> list[tuple[int, str]]:
    """Block ``b`` runs every variant once, starting at variant ``b mod n``."""
    n = len(variants)
    return [(b, variants[(b + k) % n]) for b in range(blocks) for k in range(n)]


# ---------------------------------------------------------------------------- statistics
def _percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), no numpy needed."""
    s = sorted(xs)
    if not s:
        raise ValueError("percentile of no values")
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def paired_speedups(b0_blocks: Sequence[Sequence[float]], v_blocks: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Per block ``b``: ``p50(B0 chunk ms of b) / p50(V chunk ms of b)``; their median.

    Blocks pair by index; unmatched trailing blocks (a failed run) are ignored.
    """
    ratios = [statistics.median(b) / statistics.median(v) for b, v in zip(b0_blocks, v_blocks) if b and v]
    return {"median": statistics.median(ratios) if ratios else None, "ratios": ratios}


def _median_or_none(xs: Iterable[Any]) -> Any:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(results: dict[str, list[dict[str, Any]]], meta: dict[str, Any]) -> dict[str, Any]:
    """The report from the workers' JSON records.

    ``results[variant]`` is the list of block records (``block``, ``chunk_ms``,
    ``peak_bytes``, ``pcm_sha256``, ``wave_sha256``, ``compile_s``, ``kernel_ms``,
    ``launches``), in block order.  ``exact`` is None for B0 and otherwise whether every
    block's PCM and waveform hashes equal B0's for that block.
    """
    b0 = sorted(results.get("B0", []), key=lambda r: r["block"])
    b0_by_block = {r["block"]: r for r in b0}
    b0_ms = [r["chunk_ms"] for r in b0]
    out = dict(meta)
    out["variants"] = {}
    if b0:
        out["b0_reproducible"] = len({(r["pcm_sha256"], r["wave_sha256"]) for r in b0}) == 1
    for name, recs in results.items():
        recs = sorted(recs, key=lambda r: r["block"])
        all_ms = [t for r in recs for t in r["chunk_ms"]]
        peaks = [r.get("peak_bytes") for r in recs if r.get("peak_bytes") is not None]
        if name == "B0" or not b0:
            exact = None
        else:
            exact = all(r["block"] in b0_by_block
                        and r["pcm_sha256"] == b0_by_block[r["block"]]["pcm_sha256"]
                        and r["wave_sha256"] == b0_by_block[r["block"]]["wave_sha256"] for r in recs)
        sp = paired_speedups(b0_ms, [r["chunk_ms"] for r in recs]) if b0 else {"median": None, "ratios": []}
        out["variants"][name] = {
            "p50_ms": _percentile(all_ms, 50) if all_ms else None,
            "p90_ms": _percentile(all_ms, 90) if all_ms else None,
            "kernel_ms": _median_or_none(r.get("kernel_ms") for r in recs),
            "peak_mib": max(peaks) / 2**20 if peaks else None,
            "launches": _median_or_none(r.get("launches") for r in recs),
            "graph_launches": _median_or_none(r.get("graph_launches") for r in recs),
            "compile_s": _median_or_none(r.get("compile_s") for r in recs),
            "vocoder_share": _median_or_none(r.get("vocoder_share") for r in recs),
            "exact": exact,
            "speedup": sp["median"],
            "speedup_per_block": sp["ratios"],
            "block_p50_ms": [statistics.median(r["chunk_ms"]) for r in recs],
            "pcm_sha256": recs[0]["pcm_sha256"] if recs else None,
            "wave_sha256": recs[0]["wave_sha256"] if recs else None,
            "blocks": len(recs),
            "chunks": len(all_ms),
        }
    return out


def _fmt(x: Any, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def markdown_table(report: dict[str, Any]) -> str:
    head = ("| variant | p50 ms | p90 ms | speedup vs B0 | kernel ms | launches | peak MiB | compile s | exact |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|:---:|")
    rows = []
    for name, v in report["variants"].items():
        exact = "(ref)" if name == "B0" else {None: "n/a", True: "yes", False: "NO"}[v["exact"]]
        speed = "1.00x" if name == "B0" else ("n/a" if v["speedup"] is None else f"{v['speedup']:.2f}x")
        rows.append(f"| {name} | {_fmt(v['p50_ms'], '.1f')} | {_fmt(v['p90_ms'], '.1f')} | {speed} | "
                    f"{_fmt(v['kernel_ms'], '.1f')} | {_fmt(v['launches'], '.0f')} | {_fmt(v['peak_mib'], '.0f')} | "
                    f"{_fmt(v['compile_s'], '.1f')} | {exact} |")
    return "\n".join([head, *rows])


def plot(report: dict[str, Any], path: str) -> str | None:
    """Latency per variant against its kernel floor, and peak memory; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = list(report["variants"])
    v = report["variants"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(4 + 1.2 * len(names), 4))
    xs = range(len(names))
    p50 = [v[n]["p50_ms"] or 0 for n in names]
    err = [max(0.0, (v[n]["p90_ms"] or 0) - (v[n]["p50_ms"] or 0)) for n in names]
    a.bar(xs, p50, yerr=[[0] * len(names), err], color="tab:blue", label="p50 (whisker: p90)")
    kern = [(i, v[n]["kernel_ms"]) for i, n in enumerate(names) if v[n]["kernel_ms"] is not None]
    if kern:
        a.scatter([i for i, _ in kern], [k for _, k in kern], marker="_", s=600, color="tab:red",
                  label="GPU kernel time (floor)", zorder=3)
    a.set_xticks(list(xs), names)
    a.set_ylabel("ms per chunk")
    a.set_title("latency per chunk")
    a.legend(fontsize=8)
    mem = [v[n]["peak_mib"] or 0 for n in names]
    b.bar(xs, mem, color="tab:green")
    b.set_xticks(list(xs), names)
    b.set_ylabel("MiB")
    b.set_title("peak allocated (n/a on CPU)" if not any(mem) else "peak allocated")
    fig.suptitle(f"{report.get('gpu') or report.get('device')}, {report.get('dtype')}, "
                 f"{report.get('n_timesteps')} steps", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------- worker
def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=("token2wav",), default="token2wav")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--chunks", type=int, default=8, help="timed chunks per block")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                   help=f"untimed chunks before the blocks (default {DEFAULT_WARMUP}: until every chunk has the "
                        "steady shape)")
    p.add_argument("--prompt-tokens", type=int, default=50)
    p.add_argument("--n-timesteps", type=int, default=5)
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--no-profile", action="store_true", help="skip the profiler chunk (CUDA)")


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _apply_control(tail, variant: str) -> None:
    """Make the stock tail's DiT estimator run through the control's mechanism (CUDA only)."""
    import torch
    est = tail.flow.decoder.estimator
    if variant == "vendor":
        with torch.inference_mode():
            tail.flow.scatter_cuda_graph(True)
        return
    inner = type(est).forward_chunk.__get__(est)
    if variant == "compile-ro":
        compiled = torch.compile(inner, mode="reduce-overhead", dynamic=False)
    elif variant == "compile-ro-auto":
        compiled = torch.compile(inner, mode="reduce-overhead")
    elif variant == "compile":
        compiled = torch.compile(inner, dynamic=False)
    elif variant == "cudagraphs":
        compiled = torch.compile(inner, backend="cudagraphs", dynamic=False)
    else:
        raise BenchError(f"unknown control {variant!r}")
    graphed = variant != "compile"

    def forward_chunk(*args, **kwargs):
        if not graphed:
            return compiled(*args, **kwargs)
        # graph outputs live in a static pool that the next replay overwrites: start a new
        # step and hand the CFM its own copies (it copies them into its cache buffers anyway)
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(*args, **kwargs)
        return torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)
    est.forward_chunk = forward_chunk


def _profile_chunk(model, tokens, last, device) -> dict[str, Any]:
    """GPU time (kernels, memcpy, memset) and launch API calls of one chunk (CUDA)."""
    from torch.profiler import ProfilerActivity, profile
    _sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model.stream(tokens, last_chunk=last, return_waveform=True)
        _sync(device)
    gpu_us, launches, graph_launches, kernels = 0.0, 0, 0, 0
    for e in prof.events():
        dt = getattr(e, "device_type", None)
        if dt is not None and str(dt).endswith("CUDA"):
            gpu_us += e.time_range.elapsed_us()  # a device event: its own duration
            kernels += 1
        elif e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
                        "cudaLaunchCooperativeKernel"):
            launches += 1
        elif e.name in ("cudaGraphLaunch", "cuGraphLaunch"):
            graph_launches += 1
    return {"kernel_ms": gpu_us / 1e3, "launches": launches + graph_launches, "kernel_launches": launches,
            "graph_launches": graph_launches, "gpu_events": kernels}


def run_worker(args) -> dict[str, Any]:
    """One variant in this process; returns the block record(s) as a dict."""
    import torch
    from .verify import deterministic_protocol
    check_variants([args.variant], args.device)
    device = torch.device(args.device)
    if device.type == "cuda":
        deterministic_protocol()
    import cadence_fx
    from .cli import _build
    from .integrations import stepaudio2 as s2
    say = (lambda m: print(f"[bench {args.variant}] {m}", file=sys.stderr, flush=True)) if args.verbose else None
    tail, (pt, pm, spk) = _build(args)
    t0 = time.perf_counter()
    if args.variant in RULE_VARIANTS and args.variant != "B0":
        model = cadence_fx.optimize(tail, rules=args.variant, progress=say)
    else:
        model = tail
        if args.variant in CONTROLS:
            _apply_control(tail, args.variant)
    model.set_stream_cache(pt, pm, spk)
    _sync(device)
    setup_s = time.perf_counter() - t0
    n_total = args.warmup + args.blocks * args.chunks + 1
    chunks = s2.synthetic_chunks(n_total, args.seed)

    def stream(i: int):
        tokens, last = chunks[i]
        torch.manual_seed(args.seed * 1000 + i)  # seeds the CUDA generators too
        _sync(device)
        a = time.perf_counter()
        wav = model.stream(tokens, last_chunk=last, return_waveform=True)
        _sync(device)
        return wav, (time.perf_counter() - a) * 1e3

    t1 = time.perf_counter()
    warm_ms = [stream(i)[1] for i in range(args.warmup)]
    warmup_s = time.perf_counter() - t1
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    blocks = []
    i = args.warmup
    for b in range(args.blocks):
        pcm, wave = hashlib.sha256(), hashlib.sha256()
        ms = []
        for _ in range(args.chunks):
            wav, t = stream(i)
            i += 1
            ms.append(t)
            pcm.update(s2.pcm_bytes(wav))
            wave.update(wav.tobytes())
        blocks.append({"block": args.block + b, "chunk_ms": ms, "pcm_sha256": pcm.hexdigest(),
                       "wave_sha256": wave.hexdigest()})
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    prof = {"kernel_ms": None, "launches": None, "graph_launches": None}
    if device.type == "cuda" and not args.no_profile:
        tokens, last = chunks[i]
        torch.manual_seed(args.seed * 1000 + i)
        prof = _profile_chunk(model, tokens, last, device)
    steady = statistics.median([t for blk in blocks for t in blk["chunk_ms"]]) / 1e3
    # one-time cost: setup (optimize/trace/capture + prompt) and warm-up time beyond steady speed
    compile_s = setup_s + max(0.0, warmup_s - args.warmup * steady)
    for blk in blocks:
        blk.update({"peak_bytes": peak, "compile_s": compile_s, "setup_s": setup_s, "warmup_ms": warm_ms, **prof})
    rec = {"variant": args.variant, "device": str(device), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None, "blocks": blocks}
    if hasattr(model, "stats"):
        stats = model.stats()
        rec["fallbacks"] = stats.get("fallback_total")
    return rec


def worker_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cadence_fx.bench --worker")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--variant", required=True)
    p.add_argument("--blocks", type=int, default=1)
    p.add_argument("--block", type=int, default=0, help="index of the first block (labels the records)")
    p.add_argument("--verbose", action="store_true")
    _model_args(p)
    args = p.parse_args(argv)
    try:
        rec = run_worker(args)
    except CadenceError as e:
        print(json.dumps({"variant": args.variant, "error": f"{type(e).__name__}: {e}"}), flush=True)
        return 2
    print(json.dumps(rec), flush=True)
    return 0


# ---------------------------------------------------------------------------- driver
def _worker_cmd(python: str, variant: str, block: int, opts: dict[str, Any]) -> list[str]:
    cmd = [python, "-m", "cadence_fx.bench", "--worker", "--variant", variant, "--blocks", "1", "--block", str(block)]
    for k, v in opts.items():
        if v is None or v is False:
            continue
        flag = "--" + k.replace("_", "-")
        cmd += [flag] if v is True else [flag, str(v)]
    return cmd


def run_bench(variants: Sequence[str], *, device: str = "cpu", chunks: int = 8, blocks: int = 3,
              warmup: int = DEFAULT_WARMUP, prompt_tokens: int = 50, n_timesteps: int = 5, dtype: str = "float32",
              seed: int = 0, checkpoint: str | None = None, out: str | None = None, profile: bool = True,
              python: str = sys.executable, command: str | None = None, verbose: bool = False,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every (block, variant) in its own process, rotating order; summarize; write JSON/PNG into ``out``."""
    variants = check_variants(variants, device)
    if "B0" not in variants:
        variants = ["B0", *variants]  # speedups and exactness are against B0
    if chunks < 1 or blocks < 1 or warmup < 0:
        raise BenchError("--chunks and --blocks must be >= 1, --warmup >= 0")
    opts = dict(device=device, chunks=chunks, warmup=warmup, prompt_tokens=prompt_tokens, n_timesteps=n_timesteps,
                dtype=dtype, seed=seed, checkpoint=checkpoint, no_profile=not profile, verbose=verbose)
    say = progress or (lambda m: print(f"[cadence-fx bench] {m}", file=sys.stderr, flush=True))
    results: dict[str, list[dict]] = {v: [] for v in variants}
    failures: dict[str, str] = {}
    worker_meta: dict[str, Any] = {}
    env = dict(os.environ)
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    order = rotating_order(variants, blocks)
    t_start = time.perf_counter()
    for b in range(blocks):
        line = []
        for bb, v in order:
            if bb != b:
                continue
            if v in failures:
                line.append(f"{v} skipped")
                continue
            t0 = time.perf_counter()
            proc = subprocess.run(_worker_cmd(python, v, b, opts), stdout=subprocess.PIPE,
                                  stderr=None if verbose else subprocess.PIPE, text=True, env=env)
            rec = None
            for ln in reversed(proc.stdout.strip().splitlines()):
                if ln.startswith("{"):
                    rec = json.loads(ln)
                    break
            if rec is None or "error" in rec or proc.returncode != 0:
                why = (rec or {}).get("error") or ((proc.stderr or "").strip().splitlines() or ["no output"])[-1]
                failures[v] = f"rc={proc.returncode}: {why}"
                line.append(f"{v} FAILED")
                say(f"variant {v} failed in block {b}: {failures[v]}")
                continue
            worker_meta.setdefault("gpu", rec.get("gpu"))
            worker_meta.setdefault("torch", rec.get("torch"))
            results[v].extend(rec["blocks"])
            p50 = statistics.median(rec["blocks"][0]["chunk_ms"])
            line.append(f"{v} p50 {p50:.1f} ms ({time.perf_counter() - t0:.0f} s)")
        say(f"block {b + 1}/{blocks}: " + ", ".join(line) + f"  [{time.perf_counter() - t_start:.0f} s]")
    import torch
    meta = {
        "model": "token2wav", "gpu": worker_meta.get("gpu"), "torch": worker_meta.get("torch", torch.__version__),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(sys.argv), "device": device, "n_timesteps": n_timesteps, "dtype": dtype,
        "prompt_tokens": prompt_tokens, "chunks": chunks, "blocks": blocks, "warmup": warmup, "seed": seed,
        "order": [f"{b}:{v}" for b, v in order], "failures": failures,
        "deterministic_protocol": device.startswith("cuda"),
    }
    report = summarize({v: r for v, r in results.items() if r}, meta)
    if out:
        os.makedirs(out, exist_ok=True)
        stem = os.path.join(out, f"bench-token2wav-{device.replace(':', '')}-{dtype}-nt{n_timesteps}")
        report["png"] = plot(report, stem + ".png")
        report["json"] = stem + ".json"
        with open(stem + ".json", "w") as f:
            json.dump(report, f, indent=2)
    return report


def add_bench_args(p: argparse.ArgumentParser) -> None:
    """The ``bench`` options (for wiring into the ``cadence-fx`` CLI)."""
    p.add_argument("--variants", default="B0,S",
                   help=f"comma-separated, from {','.join(VARIANTS)}; CUDA only: {','.join(CUDA_ONLY)}")
    p.add_argument("--blocks", type=int, default=3, help="matched blocks; each runs every variant once")
    p.add_argument("--out", default=None, help="directory for the JSON (and PNG, with matplotlib)")
    p.add_argument("--json", action="store_true", help="last stdout line: the report as JSON")
    p.add_argument("--verbose", action="store_true", help="pass the workers' progress through")
    _model_args(p)


def cmd_bench(args) -> int:
    try:
        report = run_bench([v.strip() for v in args.variants.split(",") if v.strip()], device=args.device,
                           chunks=args.chunks, blocks=args.blocks, warmup=args.warmup,
                           prompt_tokens=args.prompt_tokens, n_timesteps=args.n_timesteps, dtype=args.dtype,
                           seed=args.seed, checkpoint=args.checkpoint, out=args.out, profile=not args.no_profile,
                           verbose=args.verbose)
    except BenchError as e:
        print(f"cadence-fx bench: {e}", file=sys.stderr)
        return 2
    print(markdown_table(report))
    if report.get("json"):
        print(f"\nJSON: {report['json']}" + (f"  PNG: {report['png']}" if report.get("png") else
                                             "  (no PNG: matplotlib not importable)"))
    if report["failures"]:
        print(f"failed: {report['failures']}")
    if args.json:
        print(json.dumps(report))
    ok = not report["failures"] and all(v["exact"] is not False for v in report["variants"].values())
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--worker" in argv:
        return worker_main(argv)
    p = argparse.ArgumentParser(prog="python -m cadence_fx.bench", description=__doc__.splitlines()[0])
    add_bench_args(p)
    return cmd_bench(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
