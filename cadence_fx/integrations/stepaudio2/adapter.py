"""Token2Wav's adapter: the stock step on modules whose state buffers are arena views.

``Token2WavAdapter`` is one stream configuration (prompt length, flow steps, dtype,
device): it traces ``stock.stream_step`` with the four over-provisioned DiT buffers
rebound to declared regions (``STOCK_BUFFERS``), sets a stream up from its prompt,
runs any chunk eagerly on private buffers (``fallback``) and marks each DiT call
(``scope("estimator")``) where per-step replay cuts its graphs.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np
import torch

from ...adapter import StreamingAdapter
from ...annotations import get_declaration
from ...plan import ScopeVerdict, TensorSpec
from ...runtime.binding import rebind_buffers
from ...step import StepSignature, scope, scopes
from .stock import (CARRIED, CHUNK_TOKENS, LOOKAHEAD_TOKENS, MEL_CACHE_LEN, MEL_PER_TOKEN,
                    RELEASED_CONFORMER_LAYERS, RETAIN_FRAMES, SOURCE_CACHE_LEN, UPSTREAM_DISTRIBUTION,
                    UPSTREAM_VERSION, VOCAB, StepConfig, Token2WavTail, conformer_layers, setup_step, stream_step)

#: the module buffers upstream over-provisions, each bound to a declared region
STOCK_BUFFERS = ("flow.decoder.att_cache_buffer", "flow.decoder.cnn_cache_buffer",
                 "flow.decoder.estimator.att_cache_buffer", "flow.decoder.estimator.cnn_cache_buffer")
SIGNATURE = StepSignature(inputs=("token", "spk"), regions=CARRIED, outputs=("speech",))


def _flow_buffers(buffers: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {path.removeprefix("flow."): t for path, t in buffers.items()}


class Token2WavAdapter(StreamingAdapter):
    """Token2Wav for one stream configuration (prompt length, flow steps, dtype, device)."""

    signature = SIGNATURE

    def __init__(self, flow, hift, window, cfg: StepConfig, spk: torch.Tensor, stock_buffer_bytes: int):
        self.flow, self.hift, self.window, self.cfg, self.spk = flow, hift, window, cfg, spk
        self.declaration = get_declaration(Token2WavTail)
        self._stock_buffer_bytes = stock_buffer_bytes

    def dims(self) -> dict[str, int]:
        layers = RELEASED_CONFORMER_LAYERS if self.flow is None else conformer_layers(self.flow)  # explain: released
        return {"prompt_frames": self.cfg.prompt_frames, "n_timesteps": self.cfg.n_timesteps, "conformer_layers": layers}

    @property
    def dtype(self) -> torch.dtype:
        return torch.float16 if self.cfg.float16 else torch.float32

    @property
    def device(self) -> torch.device:
        return getattr(self, "_device", None) or self.spk.device

    def input_specs(self) -> dict[str, TensorSpec]:
        dev = str(self.device)
        return {"token": TensorSpec.contiguous((1, CHUNK_TOKENS + LOOKAHEAD_TOKENS), "int32", dev),
                "spk": TensorSpec.contiguous(tuple(self.spk.shape), str(self.spk.dtype).removeprefix("torch."), dev)}


    def example_inputs(self) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        token = torch.randint(0, VOCAB, (1, CHUNK_TOKENS + LOOKAHEAD_TOKENS), generator=g, dtype=torch.int32)
        return {"token": token.to(self.device), "spk": self.spk}

    def symbolic_dims(self) -> tuple[str, ...]:
        """A voice prompt's length varies between streams: one trace serves every length."""
        return ("prompt_frames",)

    def symbolic_inputs(self) -> dict[str, dict[int, str]]:
        """A window or flush of any length: one trace per catalog entry and flag serves them all."""
        return {"token": {1: "chunk_tokens"}}

    def bind(self, buffers: Mapping[str, torch.Tensor], dims: Mapping[str, int] | None = None):
        flow = rebind_buffers(self.flow, _flow_buffers(buffers))
        _mark_estimator_calls(flow)
        cfg = dataclasses.replace(self.cfg, **dims) if dims else self.cfg

        def step(inputs, state, last_chunk: bool = False):
            return stream_step(flow, self.hift, self.window, cfg, inputs, state, last_chunk)
        return step

    def memo_methods(self) -> tuple[str, ...]:
        """Upstream calls its DiT, its blocks and the encoder's layers through ``forward_chunk``."""
        return ("forward", "forward_chunk")

    def modules(self) -> dict[str, torch.nn.Module]:
        """The flow (the drop-in's twin: its parameters are the stock tail's, by identity) and HiFT."""
        return {"flow": self.flow, "hift": self.hift}

    def cache_identity(self) -> dict:
        return {"upstream": UPSTREAM_DISTRIBUTION, "version": UPSTREAM_VERSION}

    def stock_buffers(self) -> dict[str, torch.Tensor]:
        return {p: module_buffer(self.flow, p.removeprefix("flow.")) for p in STOCK_BUFFERS}

    def setup(self, buffers: Mapping[str, torch.Tensor], prompt_tokens, prompt_mels, spk) -> dict[str, torch.Tensor]:
        flow = rebind_buffers(self.flow, _flow_buffers(buffers))
        return setup_step(flow, self.cfg, prompt_tokens, prompt_mels, spk)

    def fallback(self, inputs, state, last_chunk: bool = False):
        """Any chunk, eagerly, on private buffers sized for this call (freed after)."""
        att = state["estimator_att_cache"]
        frames = att.shape[4] + MEL_PER_TOKEN * inputs["token"].shape[1]
        dev, dt = att.device, att.dtype
        n = self.cfg.n_timesteps
        buffers = {
            "flow.decoder.att_cache_buffer": torch.zeros((n, 16, 2, 8, frames, 128), dtype=dt, device=dev),
            "flow.decoder.cnn_cache_buffer": torch.zeros((n, 16, 2, 1024, 2), dtype=dt, device=dev),
            "flow.decoder.estimator.att_cache_buffer": torch.zeros((16, 2, 8, frames, 128), dtype=dt, device=dev),
            "flow.decoder.estimator.cnn_cache_buffer": torch.zeros((16, 2, 1024, 2), dtype=dt, device=dev),
        }
        return self.bind(buffers)(inputs, state, last_chunk)

    def step_boundary(self):
        """Per-step graphs (rules R/SR): one per DiT estimator call, one per stretch between."""
        return lambda node: "estimator" in scopes(node)

    def repeated_calls(self):
        """Each flow step's estimator call (steps 1..n-1 record the same ops)."""
        return lambda node: "estimator" in scopes(node)

    def callable_verdicts(self) -> tuple:
        return (
            ScopeVerdict("stream", "callable", "in", "one chunk of 25+3 tokens: traced per catalog entry"),
            ScopeVerdict("setup_cache", "callable", "out", "one-shot prompt of any length: runs eagerly, "
                         "writing straight into the arena-bound buffers"),
            ScopeVerdict("stream(last_chunk=True)", "callable", "out", "flush chunk: its length is outside the "
                         "catalog; runs eagerly on the arena state, counted as a fallback"),
        )

    def stock_state_bytes(self) -> int:
        """Stock buffers (at their fixed sizes) + carried state outside them at steady state."""
        item = 2 if self.cfg.float16 else 4
        t = self.cfg.prompt_frames + RETAIN_FRAMES
        layers = self.dims()["conformer_layers"]
        carried = (1 * 512 * 6 + layers * 8 * t * 128) * item + (80 * MEL_CACHE_LEN + 2 * SOURCE_CACHE_LEN) * 4
        return self._stock_buffer_bytes + carried


#: upstream's buffer shapes (0.1.1), for planning without building the model
STOCK_BUFFER_SHAPES = {
    "flow.decoder.att_cache_buffer": (16, 16, 2, 8, 1000, 128),
    "flow.decoder.cnn_cache_buffer": (16, 16, 2, 1024, 2),
    "flow.decoder.estimator.att_cache_buffer": (16, 2, 8, 1000, 128),
    "flow.decoder.estimator.cnn_cache_buffer": (16, 2, 1024, 2),
}


def explain_adapter(prompt_tokens: int, n_timesteps: int, float16: bool, device) -> Token2WavAdapter:
    """An adapter good for planning only (no modules): ``cadence-fx explain`` needs no weights."""
    item = 2 if float16 else 4
    stock = sum(int(np.prod(s)) * item for s in STOCK_BUFFER_SHAPES.values())
    cfg = StepConfig(prompt_tokens * MEL_PER_TOKEN, n_timesteps, float16, torch.device(device).type)
    spk = torch.empty((1, 192), device="meta")
    adapter = Token2WavAdapter(None, None, None, cfg, spk, stock)
    adapter._device = torch.device(device)
    return adapter


def _mark_estimator_calls(flow) -> None:
    """Tag the nodes of each DiT call (on the twin's own estimator copy only)."""
    est = flow.decoder.estimator
    inner = type(est).forward_chunk.__get__(est)

    def forward_chunk(*args, **kwargs):
        with scope("estimator"):
            return inner(*args, **kwargs)
    est.forward_chunk = forward_chunk


def module_buffer(root: torch.nn.Module, path: str) -> torch.Tensor:
    owner, _, name = path.rpartition(".")
    return root.get_submodule(owner)._buffers[name]


