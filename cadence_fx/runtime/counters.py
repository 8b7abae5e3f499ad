"""Per-session counters: what ran, and why anything ran eagerly."""

from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass
class SessionStats:
    steps: int = 0
    graph_runs: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # entry -> n
    replays: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # entry -> n
    fallbacks: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # reason -> n

    def count_fallback(self, reason: str) -> None:
        self.fallbacks[reason] += 1

    def to_json(self) -> dict:
        return {
            "steps": self.steps,
            "graph_runs": {str(k): v for k, v in sorted(self.graph_runs.items())},
            "replays": {str(k): v for k, v in sorted(self.replays.items())},
            "fallbacks": dict(self.fallbacks),
            "fallback_total": sum(self.fallbacks.values()),
        }
