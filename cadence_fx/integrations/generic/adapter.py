"""``GenericAdapter``: the ``StreamingAdapter`` of a model in the generic step form.

Built per stream configuration (its dims, its input shapes) by ``OptimizedModule``
from what ``probe`` found: the output names, how the step returns them, and that the
declaration describes what the step does at every catalog shape.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from ...adapter import StreamingAdapter
from ...annotations import Declaration, Window
from ...errors import DeclarationError
from ...plan import ScopeVerdict, TensorSpec, make_plan
from ...runtime.binding import rebind_buffers
from ...step import StepSignature
from .form import StepForm


def module_device_dtype(model: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    """Where the model's tensors live and its floating dtype (float32 without one)."""
    tensors = list(model.parameters()) + list(model.buffers())
    device = tensors[0].device if tensors else torch.device("cpu")
    floats = [t.dtype for t in tensors if t.is_floating_point()]
    return device, floats[0] if floats else torch.float32


def declared_buffers(declaration: Declaration, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's own buffer at every path a region declares (``Region(buffers=...)``)."""
    owned = dict(model.named_buffers())
    missing = [p for r in declaration.regions for p in r.buffers if p not in owned]
    if missing:
        raise DeclarationError(f"{type(model).__name__} has no buffer(s) {missing} (declared in Region(buffers=...)); "
                               f"its buffers: {sorted(owned)[:8]}")
    return {p: owned[p] for r in declaration.regions for p in r.buffers}


def private_buffers(declaration: Declaration, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Fresh copies of the declared buffers: a stock stream of its own (``rebind_buffers``)."""
    return {p: t.clone() for p, t in declared_buffers(declaration, model).items()}


def resolve_dims(model: Any, declaration: Declaration, given: Mapping[str, int] | None,
                 state: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """Values of the declaration's symbols: ``given`` first, then an int attribute of the
    model of that name, then what the initial state says (an off-axis size, or a
    ``Window`` prefix: the growth axis's extent before the first step)."""
    dims = dict(given or {})
    inferred: dict[str, tuple[int, str]] = {}
    for r in declaration.regions:
        if not r.carried or r.name not in state:
            continue
        shape = tuple(state[r.name].shape)
        if len(shape) != len(r.shape):
            continue  # the entry-0 check names it
        for i, v in enumerate(r.shape):
            if isinstance(v, str) and i != r.axis:
                inferred.setdefault(v, (shape[i], f"{r.name}.shape[{i}]"))
        if isinstance(r.retention, Window) and isinstance(r.retention.prefix, str) and r.axis is not None:
            inferred.setdefault(r.retention.prefix, (shape[r.axis], f"{r.name}'s extent before the first step"))
    symbols = dict.fromkeys(s for r in declaration.regions for s in r.symbols())
    for s in symbols:
        if s in dims:
            continue
        attr = getattr(model, s, None)
        if isinstance(attr, int) and not isinstance(attr, bool):
            dims[s] = attr
        elif s in inferred:
            dims[s] = inferred[s][0]
    missing = [s for s in symbols if s not in dims]
    if missing:
        raise DeclarationError(f"{type(model).__name__}: no value for the declaration's symbol(s) {missing}; pass "
                               f"optimize(model, dims={{{', '.join(repr(m) + ': ...' for m in missing)}}}) or give "
                               f"the model an int attribute of that name")
    return dims


def check_state(where: str, state: Mapping[str, torch.Tensor], specs: Mapping[str, TensorSpec],
                declaration: Declaration, dims: Mapping[str, int]) -> None:
    """Each carried region's shape and dtype as the catalog entry ``specs`` declares it."""
    for name, spec in specs.items():
        if name not in state:
            continue
        got = state[name]
        dtype = str(got.dtype).removeprefix("torch.")
        if tuple(got.shape) != tuple(spec.shape) or dtype != spec.dtype:
            r = declaration.region(name)
            raise DeclarationError(
                f"{where}: region {name!r} is {tuple(got.shape)} {dtype}, but its declaration "
                f"(shape {r.shape}, {r.retention}, dims {dict(dims)}) says {tuple(spec.shape)} {spec.dtype} there; "
                f"fix the declaration (or the model) so they agree")


class GenericAdapter(StreamingAdapter):
    """The generic step form of one model at one stream configuration."""

    def __init__(self, model: torch.nn.Module, form: StepForm, declaration: Declaration, dims: Mapping[str, int],
                 example_inputs: Mapping[str, torch.Tensor], outputs: tuple[str, ...]):
        self.model, self.form, self.declaration = model, form, declaration
        self._dims = dict(dims)
        self._device, self._dtype = module_device_dtype(model)
        self._examples = {k: v.detach().clone() for k, v in example_inputs.items()}
        self.signature = StepSignature(inputs=form.inputs, regions=form.carried, outputs=outputs)
        self._stock = declared_buffers(declaration, model)

    def dims(self) -> dict[str, int]:
        return dict(self._dims)

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self._device

    def input_specs(self) -> dict[str, TensorSpec]:
        return {k: TensorSpec.of(v) for k, v in self._examples.items()}

    def example_inputs(self) -> dict[str, torch.Tensor]:
        return dict(self._examples)

    def plan(self):
        return make_plan(self.declaration, self._dims, self.input_specs(), dtype=str(self._dtype).removeprefix("torch."),
                         device=str(self._device))

    def twin(self, buffers: Mapping[str, torch.Tensor]) -> torch.nn.Module:
        """The model with its declared buffers replaced (shares everything else)."""
        return rebind_buffers(self.model, buffers) if buffers else self.model

    def bind(self, buffers: Mapping[str, torch.Tensor], dims=None):
        twin = self.twin(buffers)
        method = getattr(twin, self.form.method)

        def step(inputs, state, **flags):
            value = method(*[inputs[n] for n in self.form.inputs], *[state[r] for r in self.form.carried], **flags)
            outputs, new, _ = self.form.split(value)
            return outputs, new
        return step

    def setup(self, buffers: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state``: what the model's ``initial_state(*args)`` returned, run once by the
        session (so its random draws, if any, are the caller's); loaded into the arena."""
        return {r: t.clone() for r, t in state.items()}

    def fallback(self, inputs, state, **flags):
        """Any step, eagerly, on private copies of the declared buffers."""
        return self.bind(private_buffers(self.declaration, self.model))(inputs, state, **flags)

    def stock_buffers(self) -> dict[str, torch.Tensor]:
        return dict(self._stock)

    def step_boundary(self):
        """Rules SR: the generic step is one method call, so a step's graph is the chunk's (as SRc)."""
        return lambda node: "step"

    def callable_verdicts(self) -> tuple:
        return (ScopeVerdict(self.form.method, "callable", "in",
                             "the generic step form: traced per catalog entry at the first step's input shapes"),)

    def stock_state_bytes(self) -> int:
        """The declared buffers plus the steady state the step carries."""
        steady = self.plan().catalog[-1]
        carried = sum(math.prod(s.shape) * torch.empty((), dtype=getattr(torch, s.dtype)).element_size()
                      for r, s in steady.regions.items() if r in self.form.carried)
        return sum(t.nbytes for t in self._stock.values()) + carried
