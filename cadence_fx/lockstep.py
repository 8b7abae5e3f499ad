"""Stock vs optimized, chunk by chunk, bit for bit.

Both paths run in one process from the same seeds, in lockstep: before each chunk
the CPU and CUDA generators are set to the same state for both, so random draws
(HiFT's ``rand``/``randn``) match; with a ``seed`` that state is
``torch.manual_seed(chunk_seed(seed, i))`` for chunk ``i``, so the PCM is the same
in every run whatever ran before in the process.  Each chunk compares the float waveform
(``torch.equal``), the SHA-256 of its PCM bytes, and every carried state tensor
(``torch.equal`` of the optimized arena view against the stock tensor's live extent).
On CUDA the deterministic protocol is on: ``torch.use_deterministic_algorithms(True)``
with ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (stock eager is not bit-reproducible on
GPU without it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from typing import Any, Callable

import torch


def deterministic_protocol() -> None:
    """Must run before the first cuBLAS call of the process."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


@dataclasses.dataclass
class ChunkReport:
    chunk: int
    last: bool
    route: str  # "entry N", "fallback: reason"
    samples: int
    wave_equal: bool
    pcm_equal: bool
    state_equal: bool
    mismatched: list[str]
    pcm_sha256: str
    stock_ms: float
    opt_ms: float


def chunk_seed(seed: int, chunk: int) -> int:
    """The generator seed before chunk ``chunk`` (0-based) of a stream seeded ``seed``
    (the bench seeds its workers' chunks the same way)."""
    return seed * 1000 + chunk


def rng_state(device: torch.device):
    """The CPU generator's state and, on CUDA, ``device``'s (for ``set_rng_state``)."""
    cpu = torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return cpu, cuda


def set_rng_state(state, device: torch.device) -> None:
    torch.random.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def live_extent(stock: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The part of a stock tensor an arena region holds (e.g. the first n of 16 step slots)."""
    return stock[tuple(slice(0, s) for s in like.shape)]


def state_mismatches(stock_state: dict, state: dict) -> list[str]:
    """The carried tensors of ``stock_state`` that ``state`` (an optimized session's, at
    its live extents) lacks or holds with other bits (``torch.equal``)."""
    return [name for name, t in stock_state.items()
            if name not in state or not torch.equal(live_extent(t, state[name]), state[name])]


def compare_streams(stock, optimized, chunks: list[tuple[list[int], bool]], device: torch.device,
                    progress: Callable[[str], None] | None = None, keep_pcm: bool = False,
                    seed: int | None = None) -> dict[str, Any]:
    """Stream ``chunks`` through both (already set up) and compare everything.

    With ``keep_pcm`` the report also holds ``"pcm": {"stock": bytes, "optimized": bytes}``.
    With ``seed`` the generators are seeded before every chunk (``chunk_seed``); without
    it both paths draw from wherever the process's generators stand.
    """
    from .pcm import pcm_bytes  # upstream's PCM conversion, shared by both paths
    rows: list[ChunkReport] = []
    pcm_all: dict[str, list[bytes]] = {"stock": [], "optimized": []}
    pcm_stock, pcm_opt = hashlib.sha256(), hashlib.sha256()
    for i, (tokens, last) in enumerate(chunks):
        if seed is not None:
            torch.manual_seed(chunk_seed(seed, i))  # the CUDA generators too
        rng = rng_state(device)
        sync(device)
        t0 = time.perf_counter()
        wave_s = stock.stream(tokens, last_chunk=last, return_waveform=True)
        sync(device)
        t1 = time.perf_counter()
        before = optimized.stats()
        set_rng_state(rng, device)
        t2 = time.perf_counter()
        wave_o = optimized.stream(tokens, last_chunk=last, return_waveform=True)
        sync(device)
        t3 = time.perf_counter()
        after = optimized.stats()
        route = chunk_route(before, after)
        ps, po = pcm_bytes(wave_s), pcm_bytes(wave_o)
        pcm_stock.update(ps)
        pcm_opt.update(po)
        if keep_pcm:
            pcm_all["stock"].append(ps)
            pcm_all["optimized"].append(po)
        mismatched = state_mismatches(stock.state(), optimized.state())
        wave_equal = torch.equal(stock.last_speech, optimized.last_speech)
        rows.append(ChunkReport(i, last, route, int(wave_s.shape[-1]), wave_equal, ps == po, not mismatched,
                                mismatched, hashlib.sha256(po).hexdigest(), (t1 - t0) * 1e3, (t3 - t2) * 1e3))
        if progress:
            r = rows[-1]
            progress(f"chunk {i + 1}/{len(chunks)}: {route}, wave {'equal' if r.wave_equal else 'DIFFERS'}, "
                     f"state {'equal' if r.state_equal else 'DIFFERS: ' + ', '.join(mismatched)}")
    exact = all(r.wave_equal and r.pcm_equal and r.state_equal for r in rows)
    extra = {"pcm": {k: b"".join(v) for k, v in pcm_all.items()}} if keep_pcm else {}
    return {
        **extra,
        "exact": exact,
        "chunks": len(rows),
        "mismatches": [dataclasses.asdict(r) for r in rows if not (r.wave_equal and r.pcm_equal and r.state_equal)],
        "pcm_sha256_stock": pcm_stock.hexdigest(),
        "pcm_sha256_optimized": pcm_opt.hexdigest(),
        "per_chunk": [dataclasses.asdict(r) for r in rows],
    }


def chunk_route(before: dict, after: dict) -> str:
    """How one chunk ran, from a session's ``stats()`` before and after it: "fallback:
    <reason>", "replay entry N", "graph entry N", "replay specialization <label>" (an
    off-catalog chunk's own program, ``runtime.variants``), ... (or "?")."""
    for reason, n in after.get("fallbacks", {}).items():
        if n > before.get("fallbacks", {}).get(reason, 0):
            return f"fallback: {reason}"
    for kind in ("replays", "graph_runs"):
        for entry, n in after.get(kind, {}).items():
            if n > before.get(kind, {}).get(entry, 0):
                what = f"entry {entry}" if entry.isdigit() else f"specialization {entry}"
                return f"{'replay' if kind == 'replays' else 'graph'} {what}"
    return "?"


def format_table(report: dict[str, Any]) -> str:
    lines = [f"{'chunk':>5} {'route':<44} {'samples':>7} {'wave':>5} {'pcm':>4} {'state':>5} "
             f"{'stock ms':>9} {'opt ms':>8}  pcm sha256"]
    for r in report["per_chunk"]:
        lines.append(f"{r['chunk']:>5} {r['route'][:44]:<44} {r['samples']:>7} "
                     f"{'=' if r['wave_equal'] else 'DIFF':>5} {'=' if r['pcm_equal'] else 'DIFF':>4} "
                     f"{'=' if r['state_equal'] else 'DIFF':>5} {r['stock_ms']:>9.1f} {r['opt_ms']:>8.1f}  "
                     f"{r['pcm_sha256'][:16]}")
    return "\n".join(lines)
