"""``serve-sim --check-workers K``: the sweep's stock streams in K processes at once.

A stock chunk is host-bound (thousands of small launches from Python: ~340 ms for
Token2Wav at 5 steps on the H200), and a sweep to N = 80 speaks hundreds of chunks,
so ``check_sweep`` in one process would take longer than the sweep.  Each worker
process builds the model once from the command's own options (same weights: the
model is built from its seed), sets the deterministic protocol and the parent's
torch thread count, and replays whole sessions with ``sim.stock_prefixes``, one
stream at a time, exactly as the parent would.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable

from .. import registry
from .sim import SimConfig, stock_prefixes

_WORKER: dict[str, Any] = {}


def plain_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options a worker (or a Ray replica) needs to build the same model (callables dropped)."""
    return {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, type(None)))}


def _init(options: dict[str, Any], cfg: SimConfig, threads: int) -> None:
    import torch
    torch.set_num_threads(threads)  # CPU bits depend on it: the parent's count
    spec, args, tail = registry.build_from_options(options)
    _WORKER.update(args=args, device=torch.device(args.device), spec=spec, cfg=cfg, tokens=spec.serve.tokens(args),
                   tail=tail)


def _job(job: tuple[int, int]) -> dict[int, str]:
    w, (i, upto) = _WORKER, job
    return stock_prefixes(w["tail"], w["spec"].serve.prompt(w["args"], i, w["device"]), w["cfg"], w["tokens"], i, upto)


def in_processes(args: argparse.Namespace, cfg: SimConfig, workers: int,
                 say=None) -> Callable[[list[tuple[int, int]]], list[dict[int, str]]]:
    """``run_jobs`` for ``check_sweep``: the jobs spread over ``workers`` spawned processes."""
    import concurrent.futures
    import multiprocessing

    import torch

    threads = torch.get_num_threads()
    if torch.device(args.device).type == "cpu":
        # CPU bits depend on the thread count, so each worker keeps the parent's; more
        # workers than cores // threads would oversubscribe (spinning OpenMP threads:
        # measured 20x slower with 2 workers of 2 threads on 2 cores)
        workers = max(1, min(workers, (os.cpu_count() or 1) // threads))

    def run_jobs(jobs: list[tuple[int, int]]) -> list[dict[int, str]]:
        if say:
            say(f"exactness: {len(jobs)} sessions ({sum(u for _, u in jobs)} chunks) on stock models alone, "
                f"in {workers} processes")
        out: list[dict[int, str] | None] = [None] * len(jobs)
        ctx = multiprocessing.get_context("spawn")  # a CUDA parent cannot fork
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init,
                                                    initargs=(plain_options(args), cfg, threads)) as pool:
            futures = {pool.submit(_job, job): n for n, job in enumerate(jobs)}
            for done, fut in enumerate(concurrent.futures.as_completed(futures), 1):
                out[futures[fut]] = fut.result()
                if say:
                    i, upto = jobs[futures[fut]]
                    say(f"exactness: session {i + 1} done ({upto} chunks; {done}/{len(jobs)})")
        return out  # type: ignore[return-value]

    return run_jobs
