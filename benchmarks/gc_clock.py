"""The garbage collector's time by generation, and what it found, between ``start`` and now.

A full collection walks every tracked object (0.5-1 s on a Token2Wav heap), and where one
lands is most of the spread between set-up rows of the same work; a build's young
collections walk its garbage.  Shared by ``setup_time.py`` and ``let_go_cost.py`` (each
imports it from this folder: a benchmark runs as a script, with this folder on its path).
"""

from __future__ import annotations

import gc
import time


class GcClock:
    """Seconds and counts of the collections (``gc.callbacks``) since ``start``, by
    generation, and the objects they found unreachable."""

    def __init__(self):
        self._t0: "float | None" = None
        self.start()
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            g = info["generation"]
            self.s[g] += time.perf_counter() - self._t0
            self.n[g] += 1
            self.found += info.get("collected", 0)
            self._t0 = None

    def start(self) -> None:
        self.s, self.n, self.found = [0.0, 0.0, 0.0], [0, 0, 0], 0

    @property
    def total_s(self) -> float:
        return sum(self.s)

    def report(self) -> dict:
        """``full_s``/``full_n``: the full collections' seconds and count; ``young_s``: the rest."""
        return {"full_s": round(self.s[2], 3), "full_n": self.n[2], "young_s": round(self.s[0] + self.s[1], 3)}
