"""The contract between model code and the compiler.

An adapter names its step's inputs, carried regions and outputs (``StepSignature``),
may mark sub-calls with ``scope`` (where per-step replay cuts its graphs), and is
compiled under a ``Rules`` value.  Nothing here imports a pass or the runtime, so
model code (integrations) and every compiler stage can depend on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

from .errors import RulesError


@dataclasses.dataclass(frozen=True)
class StepSignature:
    """Names, in placeholder/output order, of a step's inputs, carried regions and outputs."""

    inputs: tuple[str, ...]
    regions: tuple[str, ...]
    outputs: tuple[str, ...]


@contextlib.contextmanager
def scope(name: str) -> Iterator[None]:
    """Tag every node traced inside this block with ``meta["cadence_scope"]``.

    Adapters wrap a submodule call in it (e.g. each DiT estimator call) so that
    ``partition`` can cut per-step graphs there.  Outside tracing it does nothing.
    """
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    mode = get_proxy_mode()
    if mode is None:
        yield
        return
    graph = mode.tracer.graph
    start = graph._root.prev  # the last node before the block
    try:
        yield
    finally:
        node = start.next
        while node is not graph._root:
            node.meta["cadence_scope"] = node.meta.get("cadence_scope", ()) + (name,)
            node = node.next


@dataclasses.dataclass(frozen=True)
class Rules:
    """Which of the paper's rules a compiled executable applies.

    ``stable_state`` (S): carried state lives in a demand-sized arena at stable
    addresses.  ``replay`` (R): None (eager kernels), ``"step"`` (one CUDA graph per
    model step, e.g. per DiT call) or ``"chunk"`` (per streaming chunk).  Spelled as
    the paper spells them: "S", "R", "SR", "Rc", "SRc"; ``Rules.parse`` takes either
    form.  ``Rules.STOCK`` (no rule: stock-managed state, eager kernels) exists for
    tests and is not a public choice.
    """

    stable_state: bool
    replay: str | None = None

    NAMES = ("S", "R", "SR", "Rc", "SRc")

    def __post_init__(self):
        if self.replay not in (None, "step", "chunk"):
            raise RulesError(f"replay granularity {self.replay!r}; choose None, 'step' or 'chunk'")

    @classmethod
    def parse(cls, rules: "str | Rules") -> "Rules":
        if isinstance(rules, Rules):
            return rules
        if rules not in cls.NAMES:
            raise RulesError(f"unknown rules {rules!r}; choose one of {', '.join(cls.NAMES)}")
        replay = None if "R" not in rules else ("chunk" if rules.endswith("c") else "step")
        return cls("S" in rules, replay)

    @property
    def replays(self) -> bool:
        """Rule R: CUDA-graph replay (needs a CUDA device)."""
        return self.replay is not None

    def __str__(self) -> str:
        return ("S" if self.stable_state else "") + ("" if self.replay is None else
                                                     "R" + ("c" if self.replay == "chunk" else ""))


Rules.STOCK = Rules(False, None)
