"""VibeVoice's adapter: the decode step over ``ArenaCache``, one latent frame a step."""

from __future__ import annotations

from typing import Mapping

import torch

from ...adapter import StreamingAdapter
from ...annotations import get_declaration
from ...plan import ScopeVerdict, TensorSpec
from ...step import StepSignature
from .cache import check_declaration, decode_step
from .inputs import VAE_DIM
from .stock import (CONTEXT, VibeVoiceDecoder, conv_carries, declaration_for, dims_of, layer_carries,
                    stage_dims, synthetic_latents)


class VibeVoiceAdapter(StreamingAdapter):
    """The decode step over ``ArenaCache`` (``model=None``: planning only, released config
    in ``dtype``)."""

    def __init__(self, model, device="cpu", dtype: torch.dtype = torch.float32):
        self.model, self._device, self._dtype = model, torch.device(device), dtype
        if model is None:
            self.declaration, self._dims = get_declaration(VibeVoiceDecoder), stage_dims()
            self.carries = conv_carries()
        else:
            check_declaration(model)
            self.declaration, self._dims = declaration_for(model), dims_of(model)
            self.layers = layer_carries(model)
            self.carries = tuple(self.layers.values())
            self._indices = torch.zeros(1, dtype=torch.int64, device=self._device)
        self.signature = StepSignature(inputs=("latent",), regions=tuple(c.region for c in self.carries),
                                       outputs=("audio",))

    def dims(self) -> dict[str, int]:
        return dict(self._dims)

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype if self.model is None else next(self.model.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return self._device

    def input_specs(self) -> dict[str, TensorSpec]:
        return {"latent": TensorSpec.contiguous((1, VAE_DIM, 1), str(self.dtype).removeprefix("torch."),
                                                 str(self.device))}

    def example_inputs(self) -> dict[str, torch.Tensor]:
        return {"latent": synthetic_latents(1, dtype=self.dtype, device=self.device)[0][0]}

    def bind(self, buffers: Mapping[str, torch.Tensor]):
        def step(inputs, state):
            audio, next_state = decode_step(self.model, self.layers, inputs["latent"], state, self._indices)
            return {"audio": audio}, next_state
        return step

    def setup(self, buffers: Mapping[str, torch.Tensor]) -> None:
        """Zeros at catalog entry 0: upstream's zero context, every window empty."""
        return None

    def fallback(self, inputs, state, **flags):
        """Any step, eagerly, on the arena state (upstream allocates the next state; the session copies it in)."""
        return self.bind({})(inputs, state)

    def step_boundary(self):
        """Rules SR: one decode is one step, so a step's graph is the frame's graph (as SRc)."""
        return lambda node: "decode"

    def callable_verdicts(self) -> tuple:
        k = max(c.retention.catalog_width(c.step_frames) for c in self.carries)
        return (ScopeVerdict("decode", "callable", "in", f"latent [1, 64, 1]: every shape is a function of the "
                             f"step index ({k} phases while the first upsampler's carry fills)"),
                ScopeVerdict("encode", "callable", "out", "not declared: the encoder's cache is off the decode path"))

    def stock_state_bytes(self) -> int:
        """What upstream's cache keeps alive at steady state: each entry is a slice of its
        step's concatenated input, so a conv pins channels x (context + step frames)."""
        kept = sum(self._dims[c.shape[1]] * (getattr(c.retention, "retain", CONTEXT) + c.step_frames)
                   for c in self.carries)
        return kept * torch.empty((), dtype=self.dtype).element_size()


def explain_adapter(device="cpu", dtype: torch.dtype = torch.float32) -> VibeVoiceAdapter:
    """An adapter good for planning only: ``cadence-fx explain --model vibevoice`` builds no model."""
    return VibeVoiceAdapter(None, device, dtype)
