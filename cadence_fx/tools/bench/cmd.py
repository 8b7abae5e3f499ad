"""``cadence-fx bench``: its options and the driver.

The driver starts one worker per variant (and a second B0, ``B0-replica``: is stock
reproducible across processes?), waits until all are set up, then runs the matched
blocks: block ``b`` asks every variant, in an order rotated by ``b``, for ``--chunks``
timed chunks, one worker at a time.  Speedups are the median over blocks of the paired
ratio ``B0_p50 / V_p50``; exactness compares each block's PCM, waveform and state
hashes with B0's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import sys
import tempfile
from typing import Any, Callable, Sequence

from .. import registry
from . import BenchError
from .fleet import WorkerFleet, worker_cmd, worker_env
from .report import fmt, report_markdown, summarize, write_report

DEFAULT_WARMUP = 3
SETUP_TIMEOUT_S = 900.0
BLOCK_TIMEOUT_S = 300.0
#: a second, independent B0 worker streaming the same blocks: is stock reproducible across processes?
B0_REPLICA = "B0-replica"


def check_variants(variants: Sequence[str], device: str, model: str = registry.DEFAULT_MODEL) -> list[str]:
    """Validate the variant list of ``model`` for ``device``; a clear error names the offending variant."""
    spec = registry.bench_model(model)
    variants = list(variants)
    if not variants:
        raise BenchError("no variants given; e.g. --variants B0,S")
    if len(set(variants)) != len(variants):
        raise BenchError(f"duplicate variants in {','.join(variants)}")
    for v in variants:
        if v in spec.refused:
            raise BenchError(f"variant {v!r} is not built for --model {model}: {spec.refused[v]}")
        if v not in spec.variants():
            raise BenchError(f"unknown variant {v!r} for --model {model}; choose from {', '.join(spec.variants())}")
        if v in spec.cuda_only() and not device.startswith("cuda"):
            what = spec.controls.get(v, f"rules {v} (CUDA-graph replay)")
            why = f" {spec.controls_off_cuda}" if v in spec.controls and spec.controls_off_cuda else ""
            raise BenchError(f"variant {v!r} needs CUDA ({what}); this bench runs on --device {device}.{why} "
                             f"On the CPU use B0 and S.")
    return variants


def rotating_order(variants: Sequence[str], blocks: int) -> list[tuple[int, str]]:
    """Block ``b`` runs every variant once, starting at variant ``b mod n``."""
    n = len(variants)
    return [(b, variants[(b + k) % n]) for b in range(blocks) for k in range(n)]


def model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=registry.names(lambda s: s.bench), default=registry.DEFAULT_MODEL,
                   help="; ".join(f"{n}: a {registry.get(n).unit} is {registry.get(n).unit_seconds:g} s of audio"
                                  for n in registry.names(lambda s: s.bench)))
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--chunks", type=int, default=None,
                   help="timed chunks (mimi: frames) per block (default: token2wav 8, mimi 150: the first block "
                        "passes the KV ring's wrap at frame 125)")
    p.add_argument("--blocks", type=int, default=3, help="matched blocks; each runs every variant once")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                   help=f"untimed chunks before the blocks (default {DEFAULT_WARMUP}: until every chunk has the "
                        "steady shape)")
    p.add_argument("--prompt-tokens", type=int, default=50, help="token2wav only")
    p.add_argument("--n-timesteps", type=int, default=5, help="token2wav only")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="mimi: float32 only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--no-profile", action="store_true", help="skip the profiler chunk (CUDA)")



def run_bench(variants: Sequence[str], *, model: str = registry.DEFAULT_MODEL, device: str = "cpu", chunks: int | None = None,
              blocks: int = 3,
              warmup: int = DEFAULT_WARMUP, prompt_tokens: int = 50, n_timesteps: int = 5, dtype: str = "float32",
              seed: int = 0, checkpoint: str | None = None, out: str | None = None, profile: bool = True,
              setup_timeout: float = SETUP_TIMEOUT_S, block_timeout: float = BLOCK_TIMEOUT_S,
              python: str = sys.executable, command: str | None = None,
              worker_command: Callable[[str], list[str]] | None = None,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the variants of ``model`` in their own worker processes; summarize; write JSON/markdown/PNG into ``out``.

    ``chunks``: timed chunks per block (None: the model's default; a Mimi chunk is one
    80 ms frame).  ``prompt_tokens`` and ``n_timesteps`` are Token2Wav's.
    ``worker_command(variant)`` gives a worker's command line (default: this module's
    ``--worker`` with the options above).  With ``out`` the report is rewritten after
    every block and every finish (``"complete": false`` until the end), so a run cut
    short keeps its data.
    """
    spec = registry.bench_model(model)
    variants = check_variants(variants, device, model)
    if "B0" not in variants:
        variants = ["B0", *variants]  # speedups and exactness are against B0
    chunks = spec.default_chunks if chunks is None else chunks
    if chunks < 1 or blocks < 1 or warmup < 0:
        raise BenchError("--chunks and --blocks must be >= 1, --warmup >= 0")
    opts = dict(model=model, device=device, chunks=chunks, blocks=blocks, warmup=warmup, prompt_tokens=prompt_tokens,
                n_timesteps=n_timesteps, dtype=dtype, seed=seed, checkpoint=checkpoint, no_profile=not profile)
    spec.check_options(opts)
    worker_command = worker_command or (lambda v: worker_cmd(python, v, opts))
    say = progress or (lambda m: print(f"[cadence-fx bench] {m}", file=sys.stderr, flush=True))
    order = rotating_order(variants, blocks)
    meta = {
        "model": model, "gpu": None, "torch": None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(sys.argv), "device": device, **spec.meta(opts),
        "chunks": chunks, "blocks": blocks, "warmup": warmup, "seed": seed,
        "order": [f"{b}:{v}" for b, v in order], "deterministic_protocol": device.startswith("cuda"),
        "budget_ms": spec.budget_ms, "setup": "concurrent (all workers at once)",
    }
    stem = spec.stem(out, opts) if out else None
    log_dir = os.path.join(out, "logs") if out else tempfile.mkdtemp(prefix="cadence-fx-bench-")
    meta["logs"] = log_dir
    names = [*variants, B0_REPLICA]
    done: dict[str, list[dict]] = {n: [] for n in names}
    finals: dict[str, dict] = {}

    def current_report(complete: bool) -> dict[str, Any]:
        ready = [w.ready for w in fleet.workers.values() if w.ready]
        meta.update(gpu=next((r.get("gpu") for r in ready), None),
                    torch=next((r.get("torch") for r in ready), None),
                    failures=fleet.failures(), complete=complete, elapsed_s=round(fleet.elapsed(), 1))
        recs = {v: [{**_setup_fields(fleet.workers[v].ready), **finals.get(v, {}), **r} for r in done[v]]
                for v in variants if done[v]}
        return summarize(recs, meta, b0_replica=done[B0_REPLICA])

    say(f"starting {len(names)} workers ({', '.join(names)}); logs in {log_dir}")
    fleet = WorkerFleet({n: worker_command("B0" if n == B0_REPLICA else n) for n in names}, worker_env(),
                        log_dir, say)
    try:
        fleet.wait_ready(setup_timeout)
        for b in range(blocks):
            for name in [v for bb, v in order if bb == b] + [B0_REPLICA]:
                msg = fleet.ask(name, f"block {b}", block_timeout)
                if msg is None:
                    continue
                done[name].append(msg)
                say(f"block {b + 1}/{blocks} {name}: p50 {statistics.median(msg['chunk_ms']):.1f} ms "
                    f"[{fleet.elapsed():.0f} s]")
            if stem:
                write_report(current_report(False), stem, with_plot=False)
        for v in [v for v in variants if v in fleet.live()]:
            msg = fleet.finish(v, block_timeout)
            if msg is not None:
                finals[v] = {k: x for k, x in msg.items() if k not in ("event", "variant")}
                peak = msg.get("peak_bytes")
                say(f"{v} finished: kernel {fmt(msg.get('kernel_ms'), '.1f')} ms, peak "
                    f"{fmt(None if peak is None else peak / 2**20, '.0f')} MiB [{fleet.elapsed():.0f} s]")
                if stem:  # a run cut short keeps every finish it got
                    write_report(current_report(False), stem, with_plot=False)
    finally:
        fleet.close()
    report = current_report(True)
    if stem:
        write_report(report, stem, with_plot=True)
    say(f"done in {fleet.elapsed():.0f} s")
    return report


def _setup_fields(ready: dict | None) -> dict[str, Any]:
    """What a ready message says about the variant (until its finish says more)."""
    return {k: ready[k] for k in ("build_s", "setup_s", "setup_peak_bytes") if k in ready} if ready else {}


def add_bench_args(p: argparse.ArgumentParser) -> None:
    """The ``bench`` options (for wiring into the ``cadence-fx`` CLI)."""
    p.add_argument("--variants", default="B0,S",
                   help="comma-separated; " + "; ".join(
                       f"{m}: {','.join(spec.variants())} (CUDA only: {','.join(spec.cuda_only())})"
                       for m, spec in ((n, registry.bench_model(n)) for n in registry.names(lambda s: s.bench))))
    p.add_argument("--out", default=None, help="directory for the JSON, markdown, PNG (with matplotlib) and "
                                               "the workers' logs")
    p.add_argument("--json", action="store_true", help="last stdout line: the report as JSON")
    p.add_argument("--setup-timeout", type=float, default=SETUP_TIMEOUT_S,
                   help=f"seconds for every worker to be ready (default {SETUP_TIMEOUT_S:.0f})")
    p.add_argument("--block-timeout", type=float, default=BLOCK_TIMEOUT_S,
                   help=f"seconds for one block (and for the finish) of one worker (default {BLOCK_TIMEOUT_S:.0f})")
    model_args(p)


def cmd_bench(args) -> int:
    # SIGTERM (``timeout``, a job scheduler) unwinds like Ctrl-C, so the workers are killed too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        report = run_bench([v.strip() for v in args.variants.split(",") if v.strip()], model=args.model,
                           device=args.device,
                           chunks=args.chunks, blocks=args.blocks, warmup=args.warmup,
                           prompt_tokens=args.prompt_tokens, n_timesteps=args.n_timesteps, dtype=args.dtype,
                           seed=args.seed, checkpoint=args.checkpoint, out=args.out, profile=not args.no_profile,
                           setup_timeout=args.setup_timeout, block_timeout=args.block_timeout)
    except BenchError as e:
        print(f"cadence-fx bench: {e}", file=sys.stderr)
        return 2
    print(report_markdown(report))
    if report.get("json"):
        print(f"\nJSON: {report['json']}  markdown: {report['md']}" +
              (f"  PNG: {report['png']}" if report.get("png") else "  (no PNG: matplotlib not importable)"))
    if args.json:
        print(json.dumps(report))
    ok = not report["failures"] and all(v["exact"] is not False for v in report["variants"].values())
    return 0 if ok else 1

