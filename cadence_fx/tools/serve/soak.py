"""``soak``: one optimized session for many chunks; memory and a stock check at checkpoints."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from ...errors import InputError
from ..registry import ServeHooks
from .sim import TokenFeed, allocated, chunk_seed, ms_summary, rss_bytes, sync

def check_chunk_against_stock(tail, session, tokens: list[int], seed: int, hooks: ServeHooks) -> dict[str, Any]:
    """Run one chunk on ``session`` and on ``tail`` loaded with a copy of the session's
    state (``hooks.load_stock_state``), from the same generator state; compare waveform,
    PCM and every next state."""
    import torch
    from ...pcm import pcm_bytes
    from ...lockstep import state_mismatches
    hooks.load_stock_state(tail, session)
    torch.manual_seed(seed)
    wave_s = tail.stream(tokens, return_waveform=True)
    torch.manual_seed(seed)
    wave_o = session.stream(tokens, return_waveform=True)
    mismatched = state_mismatches(tail.state(), session.state())
    wave_equal = torch.equal(tail.last_speech, session.last_speech)
    ps, po = pcm_bytes(wave_s), pcm_bytes(wave_o)
    hooks.clear_stock_state(tail)  # the stock side keeps nothing between checkpoints
    return {"exact": wave_equal and ps == po and not mismatched, "wave_equal": wave_equal, "pcm_equal": ps == po,
            "mismatched": mismatched, "pcm_sha256": hashlib.sha256(po).hexdigest(), "pcm": po}


def soak(model, tail, prompt, hooks: ServeHooks, chunks: int, check_every: int, seed: int = 0,
         warmup_chunks: int = 3, say=None) -> dict[str, Any]:
    """One optimized session streams ``chunks`` chunks; a checkpoint every ``check_every``.

    At chunk ``c`` with ``c % check_every == 0`` (and at the last chunk) the chunk
    runs on the session and on the stock ``tail`` loaded with a copy of the session's
    state, from the same generator state (``check_chunk_against_stock``); then the
    memory allocated is recorded (CUDA: ``memory_allocated``; CPU: None, RSS for
    information).  Recording after the check counts the checker's own one-time
    allocations (e.g. its first chunk at the steady extent) at the checkpoint that
    makes them, so a later difference is growth.  Other chunks run on the session
    only.  ``memory_flat_bytes``: max - min of the allocated bytes over the
    checkpoints at chunk >= ``warmup_chunks`` (the caches reach their steady extent
    after the catalog's width of chunks).
    """
    import torch
    if chunks < 1 or check_every < 1:
        raise InputError(f"soak needs chunks >= 1 and check_every >= 1; got {chunks}, {check_every}")
    device = model.device
    session = model.open_session(*prompt)
    feed = TokenFeed(seed, 0, hooks.tokens(None))
    checkpoints, chunk_ms = [], []
    pcm_hash = hashlib.sha256()
    t_start = time.perf_counter()
    try:
        for c in range(chunks):
            k, tokens = feed.take()
            if c % check_every == 0 or c == chunks - 1:
                row = {"chunk": c, **check_chunk_against_stock(tail, session, tokens, chunk_seed(seed, 0, k), hooks)}
                sync(device)
                row.update(allocated_bytes=allocated(device), rss_bytes=rss_bytes())
                pcm_hash.update(row.pop("pcm"))
                checkpoints.append(row)
                if say:
                    say(f"soak chunk {c + 1}/{chunks}: exact {row['exact']}, allocated {row['allocated_bytes']}")
                continue
            torch.manual_seed(chunk_seed(seed, 0, k))
            sync(device)
            t0 = time.perf_counter()
            pcm = session.stream(tokens)
            sync(device)
            chunk_ms.append((time.perf_counter() - t0) * 1e3)
            pcm_hash.update(pcm)
        stats = session.stats()
        arena = session.arena_bytes
    finally:
        session.close()
    steady = [r["allocated_bytes"] for r in checkpoints if r["chunk"] >= warmup_chunks and r["allocated_bytes"] is not None]
    return {
        "chunks": chunks, "check_every": check_every, "device": str(device), "rules": model.rules,
        "all_exact": all(r["exact"] for r in checkpoints), "checkpoints": checkpoints,
        "memory_flat_bytes": (max(steady) - min(steady)) if steady else None,
        "memory_flat": (max(steady) == min(steady)) if steady else None,
        "arena_bytes": arena, "chunk_ms": ms_summary(chunk_ms), "fallbacks": stats["fallbacks"],
        "stats": stats, "pcm_sha256": pcm_hash.hexdigest(), "wall_s": round(time.perf_counter() - t_start, 2),
    }

