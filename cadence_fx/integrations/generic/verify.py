"""``cadence_fx.verify(model, inputs)``: stock against optimized for a model in the generic step form.

The stock stream is the model's own ``initial_state`` and step method, called as the
model author would (on private copies of its declared buffers); the optimized stream is
``optimize(model, rules, check_chunks=0)``.  Before each chunk both start from the same
generator state (``lockstep.chunk_seed(seed, i)`` with a seed), so random draws match.
Every output and every carried region is compared with ``torch.equal``; the report is
``lockstep.compare_streams``'s (``exact``, ``per_chunk`` rows with the route each chunk
took, ``mismatches``, SHA-256 of every output byte of each stream).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import Any, Callable

import torch

from ...annotations import get_declaration
from ...lockstep import ChunkReport, chunk_route, chunk_seed, rng_state, set_rng_state, sync
from ...runtime.binding import rebind_buffers
from .adapter import private_buffers
from .dropin import OptimizedModule
from .form import StepForm
from .probe import differences


def as_chunks(inputs: Any) -> list[tuple[torch.Tensor, ...]]:
    """``inputs`` (one entry per chunk: a tensor or a tuple of tensors) as tuples."""
    chunks = []
    for x in inputs:
        chunks.append((x,) if isinstance(x, torch.Tensor) else tuple(x))
    if not chunks:
        from ...errors import InputError
        raise InputError("verify needs at least one chunk of inputs")
    return chunks


def verify_model(model: torch.nn.Module, inputs: Any, rules: str = "S", seed: int | None = 0,
                 setup_args: tuple = (), progress: Callable[[str], None] | None = None,
                 optimized: OptimizedModule | None = None, **options: Any) -> dict[str, Any]:
    """The lockstep report of ``model`` over ``inputs`` (see the module docstring).
    ``optimized``: an ``OptimizedModule`` of ``model`` to use instead of a new one."""
    chunks = as_chunks(inputs)
    form = StepForm.of(model, get_declaration(model))
    opt = optimized or OptimizedModule(model, rules=rules, check_chunks=0, cache=False, **options)
    device = opt.device
    twin = rebind_buffers(model, private_buffers(opt.declaration, model))
    rng = rng_state(device)
    with torch.no_grad():
        stock_state = form.state_of(getattr(twin, form.initial)(*setup_args), "verify")
    set_rng_state(rng, device)
    session = opt.open_session(*setup_args)
    rows: list[ChunkReport] = []
    sha = {"stock": hashlib.sha256(), "optimized": hashlib.sha256()}
    for i, args in enumerate(chunks):
        if seed is not None:
            torch.manual_seed(chunk_seed(seed, i))
        rng = rng_state(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            value = getattr(twin, form.method)(*args, *[stock_state[r] for r in form.carried])
        stock_out, stock_state, how = form.split(value)
        sync(device)
        t1 = time.perf_counter()
        before = session.stats()
        set_rng_state(rng, device)
        t2 = time.perf_counter()
        session.step(*args)
        sync(device)
        t3 = time.perf_counter()
        after = session.stats()
        opt_out = session.last_outputs
        diff = differences(opt_out, stock_out, session.state(), stock_state)
        for name, out in (("stock", stock_out), ("optimized", opt_out)):
            for t in out.values():
                sha[name].update(_bytes(t))
        outputs_equal = not any(d.startswith("output") for d in diff)
        mismatched = [d.split("'")[1] for d in diff if d.startswith("region")]
        first = next(iter(opt_out.values()), None)
        rows.append(ChunkReport(i, False, chunk_route(before, after),
                                int(first.numel()) if first is not None else 0, outputs_equal, outputs_equal,
                                not mismatched, mismatched, hashlib.sha256(b"".join(_bytes(t) for t in opt_out.values()))
                                .hexdigest(), (t1 - t0) * 1e3, (t3 - t2) * 1e3))
        if progress:
            progress(f"chunk {i + 1}/{len(chunks)}: {rows[-1].route}, "
                     f"{'equal' if not diff else 'DIFFERS: ' + ', '.join(diff)}")
    stats = session.stats()
    session.close()
    exact = all(r.wave_equal and r.state_equal for r in rows)
    return {
        "model": type(model).__name__, "rules": rules, "device": str(opt.device), "seed": seed,
        "exact": exact, "chunks": len(rows),
        "mismatches": [dataclasses.asdict(r) for r in rows if not (r.wave_equal and r.state_equal)],
        "pcm_sha256_stock": sha["stock"].hexdigest(), "pcm_sha256_optimized": sha["optimized"].hexdigest(),
        "per_chunk": [dataclasses.asdict(r) for r in rows],
        "stats": stats, "fallbacks": stats.get("fallback_total", 0), "fallback_reasons": stats.get("fallbacks", {}),
        "setup_s": stats.get("setup_s"), "torch": torch.__version__,
    }


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""

