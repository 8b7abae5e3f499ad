"""Mimi's adapter: moshi's decode on a streaming twin whose state fields are the step's tensors."""

from __future__ import annotations

from typing import Mapping

import torch

from ...adapter import StreamingAdapter
from ...annotations import get_declaration
from ...compiler import build_plan
from ...errors import DeclarationError
from ...plan import ScopeVerdict, TensorSpec, make_plan
from ...step import StepSignature
from .inputs import N_Q, codes_tensor
from .stock import (ATTN, CARRIED, DIMS, LAYERS, UPSTREAM_VERSION, MimiDecoder, bind_state, read_state,
                    streaming_twin, synthetic_codes, upstream_modules)


def check_declaration(mimi) -> None:
    """Fail closed unless ``mimi``'s decode-path state is exactly the declared regions."""
    for i in range(LAYERS):
        attn = mimi.get_submodule(ATTN.format(i))
        if attn.weights_per_step or len(attn.in_projs) != 1:
            raise DeclarationError(f"{ATTN.format(i)} has weights per step: it reads the host-side "
                                   f"offset_cpu, a clock phase this declaration does not carry")
    # the declared shapes, exec_mask's count of streaming modules included
    slots = {s.name: s for s in build_plan(explain_adapter()).layout.slots}
    for region, t in read_state(streaming_twin(mimi)).items():
        want = (slots[region].shape, slots[region].dtype)
        if (tuple(t.shape), str(t.dtype).removeprefix("torch.")) != want:
            raise DeclarationError(f"Mimi's {region} is {t.dtype} {tuple(t.shape)}; the declaration (released "
                                   f"config, moshi {UPSTREAM_VERSION}) holds {want}: declare this config's shapes")


class MimiAdapter(StreamingAdapter):
    """The decode step on a streaming twin of the model (``mimi=None``: planning only)."""

    signature = StepSignature(inputs=("codes",), regions=CARRIED, outputs=("pcm",))

    def __init__(self, mimi, device="cpu"):
        self.declaration = get_declaration(MimiDecoder)
        self.mimi, self._device = mimi, torch.device(device)
        if mimi is not None:
            check_declaration(mimi)
            self._eager = upstream_modules()["eager"]
            with torch.no_grad(), self._eager():  # the codebooks' lazy _embedding, before any trace
                mimi.quantizer.decode(torch.zeros(1, N_Q, 1, dtype=torch.int64, device=self._device))

    def dims(self) -> dict[str, int]:
        return dict(DIMS)

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def device(self) -> torch.device:
        return self._device

    def input_specs(self) -> dict[str, TensorSpec]:
        return {"codes": TensorSpec.contiguous((1, N_Q, 1), "int64", str(self.device))}

    def example_inputs(self) -> dict[str, torch.Tensor]:
        return {"codes": codes_tensor(synthetic_codes(1)[0][0], self.device)}

    def bind(self, buffers: Mapping[str, torch.Tensor]):
        def step(inputs, state):
            bind_state(self.mimi, state)
            with self._eager():
                pcm = self.mimi.decode(inputs["codes"])[0]
            return {"pcm": pcm}, dict(state)  # the state, updated in place
        return step

    def setup(self, buffers: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """moshi's initial streaming state (zeros, exec masks on), read from a fresh twin."""
        return read_state(streaming_twin(self.mimi))

    def fallback(self, inputs, state, **flags):
        """Any frame, eagerly, on the arena state itself (moshi updates it in place)."""
        return self.bind({})(inputs, state)

    def step_boundary(self):
        """Rules R/SR: one decode is one step, so a step's graph is the frame's graph (as SRc)."""
        return lambda node: "decode"

    def callable_verdicts(self) -> tuple:
        return (ScopeVerdict("decode", "callable", "in", "codes [1, 8, 1]: every offset is a device tensor, "
                             "so one graph serves every frame, before and after the ring wraps"),
                ScopeVerdict("encode", "callable", "out", "not declared: its state is off the decode path "
                             "(stock streaming allocates it, the optimized decoder does not)"))

    def stock_state_bytes(self) -> int:
        """What ``mimi.streaming(1)`` holds for the same decode-path state (already demand-sized)."""
        return sum(s.nbytes for s in make_plan(self.declaration, self.dims(), self.input_specs()).layout.slots)


def explain_adapter(device="cpu") -> MimiAdapter:
    """An adapter good for planning only: ``cadence-fx explain --model mimi`` builds no model."""
    return MimiAdapter(None, device)
