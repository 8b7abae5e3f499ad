"""Fail closed on a wrong declaration, before and after the first chunks.

``probe`` runs the stock step eagerly (generators forked, private buffers, a copy of the
state) through every catalog phase once before anything is traced: each state it
returns must have the shape and dtype the declaration gives the next step, the
outputs must keep one structure, and no module buffer the declaration does not name
may change.  ``differences`` is what the shadow check (``GenericSession``) compares after
each of a session's first chunks: every output and every carried region, bit for bit.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ...annotations import Declaration
from ...errors import DeclarationError
from ...plan import TensorSpec, make_plan
from .adapter import check_state
from .form import StepForm


@torch.no_grad()
def probe(model: torch.nn.Module, twin: torch.nn.Module, form: StepForm, declaration: Declaration,
          dims: Mapping[str, int], inputs: Mapping[str, torch.Tensor], state0: Mapping[str, torch.Tensor],
          dtype: torch.dtype, device: torch.device) -> tuple[tuple[str, ...], str]:
    """(output names, "dict" or "tuple"), or ``DeclarationError`` naming the step, the
    region and the shapes that disagree.  ``twin``: the model on private buffers."""
    specs = {k: TensorSpec.of(v) for k, v in inputs.items()}
    plan = make_plan(declaration, dims, specs, dtype=str(dtype).removeprefix("torch."), device=str(device))
    declared = {p for r in declaration.regions for p in r.buffers}
    before = {n: b.detach().clone() for n, b in model.named_buffers() if n not in declared}
    state = {r: t.clone() for r, t in state0.items()}
    names: tuple[str, ...] | None = None
    how = ""
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for k in range(len(plan.catalog) + 1):
                value = getattr(twin, form.method)(*[inputs[n].clone() for n in form.inputs],
                                                   *[state[r] for r in form.carried])
                outputs, state, kind = form.split(value)
                if names is None:
                    names, how = tuple(outputs), kind
                elif (tuple(outputs), kind) != (names, how):
                    raise DeclarationError(f"{form.where()} returned outputs {list(outputs)} ({kind}) at step {k} "
                                           f"and {list(names)} ({how}) at step 0; a step returns one structure")
                nxt = plan.entry_for_step(k + 1)
                check_state(f"{form.where()} step {k} (catalog entry {plan.entry_for_step(k).index}) returned a "
                            f"next state that does not fit step {k + 1}",
                            state, {r: nxt.regions[r] for r in form.carried}, declaration, dims)
    finally:
        changed = [n for n, b in model.named_buffers() if n in before and not torch.equal(b, before[n])]
        for n in changed:  # the caller's model keeps its buffers
            model.get_buffer(n).copy_(before[n])
    if changed:
        raise DeclarationError(
            f"{form.where()} writes module buffer(s) {changed}, which no region declares: state the arena would "
            f"not carry. Declare each as Region(..., buffers=({changed[0]!r},)) or pass it through the step's "
            f"arguments and return value")
    return names, how


def differences(outputs: Mapping[str, torch.Tensor], stock_outputs: Mapping[str, torch.Tensor],
                state: Mapping[str, torch.Tensor], stock_state: Mapping[str, torch.Tensor]) -> list[str]:
    """What differs, bit for bit: ``["output 'y'", "region 'kv' (shape (2, 32, 8) vs (2, 32, 12))"]``."""
    out = []
    for name, want in stock_outputs.items():
        got = outputs.get(name)
        if got is None or not _equal(got, want):
            out.append(f"output {name!r}" + _shapes(got, want))
    for name, want in stock_state.items():
        got = state.get(name)
        if got is None or not _equal(got, want):
            out.append(f"region {name!r}" + _shapes(got, want))
    return out


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def _shapes(got: Any, want: torch.Tensor) -> str:
    if isinstance(got, torch.Tensor) and got.shape != want.shape:
        return f" (shape {tuple(got.shape)}, stock {tuple(want.shape)})"
    if isinstance(got, torch.Tensor) and got.dtype != want.dtype:
        return f" (dtype {got.dtype}, stock {want.dtype})"
    return ""
