"""The contract between model code and the compiler.

An adapter names its step's inputs, carried regions and outputs (``StepSignature``),
may mark sub-calls with ``scope`` (where per-step replay cuts its graphs), and is
compiled under a ``Rules`` value.  The compiler stages leave what they learn about a
traced graph in its ``meta`` dicts; the keys live here, each with a small typed
accessor (``role``/``tag``, ``signature``, ``arena_inputs``, ``capturable``...), so no
stage spells a key.  Nothing here imports a pass or the runtime, so model code
(integrations) and every compiler stage can depend on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
from typing import TYPE_CHECKING, Any, Iterator

from .errors import RulesError

if TYPE_CHECKING:  # annotations only: model code imports this module without torch.fx
    import torch
    import torch.fx as fx


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
            node.meta[SCOPE] = scopes(node) + (name,)
            node = node.next


def scopes(node: "fx.Node") -> tuple[str, ...]:
    """The ``scope`` names a node was traced inside, outermost last (``()``: none)."""
    return node.meta.get(SCOPE, ())


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


# ------------------------------------------------------------------ graph metadata
# The keys, in one place.  Values are plain data (strings, tuples, a StepSignature).
TAG = "cadence"  # node.meta: {"role": Role, ...role-specific fields}
SCOPE = "cadence_scope"  # node.meta: tuple of scope names (``scope``)
SIGNATURE = "cadence_signature"  # gm.meta: the StepSignature the graph was traced for (trace)
EXAMPLE_INPUTS = "cadence_example_inputs"  # gm.meta: input tensors to run the graph with (trace)
DEVICE = "cadence_device"  # gm.meta: the torch.device it was traced on (trace)
ARENA_INPUTS = "cadence_arena_inputs"  # gm.meta: regions bound to arena placeholders, in order (state_rewrite)
CAPTURABLE = "cadence_capturable"  # a partitioned child's meta: may it be one CUDA graph (partition)
SYM = "cadence_sym"  # node.meta: the sympy expression a symbolic trace's int/bool node computes (trace_symbolic)


class Role(str, enum.Enum):
    """What a node is to the compiler (``node.meta["cadence"]["role"]``; equal to its string)."""

    INPUT = "input"  # placeholder: a per-step input; field ``name`` (trace)
    STATE = "state"  # placeholder: carried state; ``name`` (trace; state_rewrite removes it)
    BUFFER = "buffer"  # get_attr: a module buffer bound to ``region`` (trace; state_rewrite removes it)
    #   (a placeholder in a symbolic trace; specialize makes it the get_attr)
    DIM = "dim"  # placeholder of a symbolic trace: its size is dim ``name`` (trace_symbolic; specialize removes it)
    FOLDED = "folded"  # get_attr: a host constant evaluated once, ``from`` the node it replaced
    ARENA = "arena"  # placeholder: ``region``'s whole arena view (state_rewrite)
    STATE_VIEW = "state_view"  # the old state of ``region``, a view of its arena (state_rewrite)
    WRITEBACK = "writeback"  # a node copying the next state into ``region`` (state_rewrite)


def tag(node: "fx.Node", role: Role, **fields: Any) -> None:
    """Set a node's role and its fields (``name``, ``region`` or ``from``: see ``Role``)."""
    node.meta[TAG] = {"role": role, **fields}


def tag_of(node: "fx.Node") -> dict[str, Any]:
    """A node's role and fields (``{}`` if untagged)."""
    return node.meta.get(TAG, {})


def role(node: "fx.Node") -> Role | None:
    r = tag_of(node).get("role")
    return r if r is None or type(r) is Role else Role(r)  # a Role already (Role(r) is slow Python)


def region(node: "fx.Node") -> str | None:
    """The region a tagged node belongs to (a state placeholder's is its ``name``)."""
    t = tag_of(node)
    return t.get("region", t.get("name") if t.get("role") == Role.STATE else None)


def signature(gm: "fx.GraphModule") -> StepSignature | None:
    return gm.meta.get(SIGNATURE)


def arena_inputs(gm: "fx.GraphModule") -> tuple[str, ...]:
    """The regions whose arena views follow the step's inputs as placeholders (``()``: none)."""
    return tuple(gm.meta.get(ARENA_INPUTS, ()))


def example_inputs(gm: "fx.GraphModule") -> "list[torch.Tensor] | None":
    return gm.meta.get(EXAMPLE_INPUTS)


def traced_device(gm: "fx.GraphModule") -> "torch.device":
    import torch
    return gm.meta.get(DEVICE, torch.device("cpu"))


def attr(module: Any, target: str) -> Any:
    """What a ``get_attr`` node of ``target`` (a dotted path) reads from ``module``."""
    for part in target.split("."):
        module = getattr(module, part)
    return module


def value(gm: Any, node: "fx.Node") -> Any:
    """``node``'s recorded value (``meta["val"]``), or for a ``get_attr`` without one the
    tensor it reads from ``gm``: torch 2.5.1's make_fx records no value on a constant's
    ``get_attr`` (2.13 does), so a check of shapes would otherwise skip the constant."""
    val = node.meta.get("val")
    if val is None and node.op == "get_attr":
        return attr(gm, node.target)
    return val


def byte_interval(t: "torch.Tensor") -> tuple[int, int]:
    """[lo, hi) bytes of ``t``'s storage that ``t`` can touch (the aliasing check's
    accesses; the runtime's test that a read does not overlap a write)."""
    if t.numel() == 0:
        return (0, 0)
    item = t.element_size()
    lo = t.storage_offset()
    hi = lo + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)
    return (lo * item, (hi + 1) * item)


def capturable(module: Any) -> bool | None:
    """A partitioned child's verdict: True/False, or None for a module partition did not make."""
    meta = getattr(module, "meta", None)
    return meta.get(CAPTURABLE) if isinstance(meta, dict) else None
