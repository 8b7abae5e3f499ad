"""The bench's statistics: percentiles and paired speedups (no numpy)."""

from __future__ import annotations

import statistics
from typing import Any, Sequence


def percentile(xs: Sequence[float], q: float) -> float:
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

