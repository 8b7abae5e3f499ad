"""The generic step form: what a model's declared methods take and return.

A model on the generic path declares ``step`` and ``initial_state``.  Its step method
takes its inputs, then one tensor per carried region (named as the region, in
declaration order), and returns its outputs followed by the next value of each carried
region (a tuple), or a dict holding the outputs and one entry per carried region::

    def stream(self, x, ctx, kv):            # inputs: x; carried regions: ctx, kv
        ...
        return y, ctx, kv                    # or {"y": y, "ctx": ctx, "kv": kv}

``initial_state(*args)`` returns the carried state before the first step (a dict by
region, or a tuple in declaration order).  ``StepForm`` reads this off the model and
turns the calls into the ``(inputs, state) -> (outputs, state)`` step the compiler
traces; every mismatch is a ``DeclarationError`` that names the method and the fix.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Mapping

import torch

from ...annotations import Declaration, Unbounded
from ...errors import DeclarationError, InputError

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclasses.dataclass(frozen=True)
class StepForm:
    """The model's step method and initial-state method, as the generic path calls them."""

    owner: str  # the model's class name, for messages
    method: str
    initial: str
    inputs: tuple[str, ...]  # the step's input parameters
    carried: tuple[str, ...]  # carried regions, in declaration order
    flags: tuple[str, ...]  # keyword parameters after the carried regions (e.g. last=False)

    @classmethod
    def of(cls, model: Any, declaration: Declaration) -> "StepForm":
        """Read the form off ``model``; ``DeclarationError`` naming what does not fit."""
        owner = type(model).__name__
        if declaration.initial_state is None:
            raise DeclarationError(
                f"{owner} has no adapter and its declaration names no initial_state method: add "
                f"initial_state='<method>' to native_clock(...) (the method returns the state before the first "
                f"step), or register an adapter for it (cadence_fx.register; docs/annotating.md)")
        for kind, name in (("step", declaration.step), ("initial_state", declaration.initial_state)):
            if not callable(getattr(model, name, None)):
                raise DeclarationError(f"{owner} has no method {name!r} (declared {kind}={name!r})")
        unbounded = [r.name for r in declaration.regions if isinstance(r.retention, Unbounded)]
        if unbounded:
            raise DeclarationError(
                f"{owner}: region(s) {unbounded} are Unbounded(): they grow every step, so no finite catalog "
                f"of shapes exists and no arena can hold them. Declare what the model keeps (Window(retain=N) "
                f"for a cache trimmed to its last N frames, ChunkPad, Ring), or run this model without "
                f"cadence_fx.optimize")
        scratch = [r.name for r in declaration.regions if not r.carried and not r.buffers]
        if scratch:
            raise DeclarationError(f"{owner}: region(s) {scratch} are carried=False without buffers=...: scratch "
                                   f"state replaces a module buffer; name it (buffers=('path.to.buffer',))")
        carried = tuple(r.name for r in declaration.regions if r.carried)
        params = list(inspect.signature(getattr(model, declaration.step)).parameters.values())
        if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params):
            raise DeclarationError(f"{owner}.{declaration.step} takes *args; the generic path needs its inputs and "
                                   f"regions as named parameters: ({', '.join(('<inputs>',) + carried)})")
        positional = [p.name for p in params if p.kind in _POSITIONAL]
        flags = tuple(p.name for p in params if p.kind == inspect.Parameter.KEYWORD_ONLY
                      or (p.kind in _POSITIONAL and p.default is not inspect.Parameter.empty
                          and p.name not in carried))
        positional = [n for n in positional if n not in flags]
        n = len(carried)
        if len(positional) < n or (n and tuple(positional[-n:]) != carried):
            want = ", ".join(["<inputs>", *carried])
            raise DeclarationError(
                f"{owner}.{declaration.step}({', '.join(positional)}) must take its inputs and then one tensor per "
                f"carried region, named as the region and in declaration order: ({want}); rename the parameters, "
                f"reorder the regions, or register an adapter")
        return cls(owner, declaration.step, declaration.initial_state, tuple(positional[:len(positional) - n]),
                   carried, flags)

    def where(self) -> str:
        return f"{self.owner}.{self.method}"

    def state_of(self, value: Any, what: str) -> dict[str, torch.Tensor]:
        """``initial_state()``'s value as ``{region: tensor}``."""
        if isinstance(value, Mapping):
            missing = [r for r in self.carried if r not in value]
            extra = [k for k in value if k not in self.carried]
            if missing or extra:
                raise DeclarationError(f"{self.owner}.{self.initial}() returned keys {sorted(value)}; the carried "
                                       f"regions are {list(self.carried)}" + (f" (missing {missing})" if missing else "")
                                       + (f" (not declared: {extra})" if extra else ""))
            state = {r: value[r] for r in self.carried}
        elif isinstance(value, (tuple, list)) and len(value) == len(self.carried):
            state = dict(zip(self.carried, value))
        else:
            raise DeclarationError(f"{self.owner}.{self.initial}() must return the carried state, a dict by region "
                                   f"or a tuple in declaration order {list(self.carried)}; got {_kind(value)}")
        _tensors(state, f"{what}: {self.owner}.{self.initial}()")
        return state

    def split(self, value: Any) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], str]:
        """A step's return value as ``(outputs, next state, how)``; ``how`` is "dict" or
        "tuple" (outputs ``out0``, ``out1``, ... in order)."""
        n = len(self.carried)
        if isinstance(value, Mapping):
            missing = [r for r in self.carried if r not in value]
            if missing:
                raise DeclarationError(f"{self.where()} returned a dict without the carried region(s) {missing}; "
                                       f"return each carried region's next value under its name")
            outputs = {k: v for k, v in value.items() if k not in self.carried}
            state = {r: value[r] for r in self.carried}
            how = "dict"
        elif isinstance(value, (tuple, list)) and len(value) >= n:
            outputs = {f"out{i}": v for i, v in enumerate(value[:len(value) - n])}
            state = dict(zip(self.carried, value[len(value) - n:]))
            how = "tuple"
        else:
            raise DeclarationError(f"{self.where()} must return its outputs and then the next value of each carried "
                                   f"region ({', '.join(self.carried)}), as a tuple or a dict; got {_kind(value)}")
        _tensors({**outputs, **state}, f"{self.where()}'s return value")
        return outputs, state, how

    def call_args(self, inputs: tuple) -> dict[str, torch.Tensor]:
        """The caller's positional inputs by name; ``InputError`` if they do not fit."""
        if len(inputs) != len(self.inputs):
            raise InputError(f"{self.where()} takes {len(self.inputs)} input(s) ({', '.join(self.inputs)}), "
                             f"got {len(inputs)}; the state is kept by the session")
        named = dict(zip(self.inputs, inputs))
        bad = {k: type(v).__name__ for k, v in named.items() if not isinstance(v, torch.Tensor)}
        if bad:
            raise InputError(f"{self.where()}: input(s) {bad} are not tensors; the generic path takes tensor inputs")
        return named

    def check_flags(self, flags: Mapping[str, Any]) -> None:
        unknown = [k for k in flags if k not in self.flags]
        if unknown:
            raise InputError(f"{self.where()} has no keyword parameter(s) {unknown}"
                             + (f" (it takes {list(self.flags)})" if self.flags else ""))


def render(outputs: Mapping[str, torch.Tensor], how: str) -> Any:
    """Outputs as the stock step returns them, less the state: a dict, one tensor, or a tuple."""
    if how == "dict":
        return dict(outputs)
    values = tuple(outputs[f"out{i}"] for i in range(len(outputs)))
    return values[0] if len(values) == 1 else values


def _tensors(named: Mapping[str, Any], where: str) -> None:
    bad = {k: _kind(v) for k, v in named.items() if not isinstance(v, torch.Tensor)}
    if bad:
        raise DeclarationError(f"{where}: {bad} are not tensors; outputs and carried state must be tensors")


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__
