"""Upstream's streaming conv cache over the step's state: which conv carries which region.

``check_declaration`` fails closed unless every streaming conv of a decoder is a
declared carry; ``ArenaCache`` (``arena_cache_class``) is upstream's
``VibeVoiceTokenizerStreamingCache`` whose ``get`` returns the step's state tensor and
whose ``set`` records (and checks) the next state; ``decode_step`` runs upstream's
streaming ``decode`` of one latent frame over it.
"""

from __future__ import annotations

import functools
from typing import Mapping

import torch

from ...errors import DeclarationError
from ...annotations import Window
from .stock import UPSTREAM_VERSION, Carry, conv_carries, dims_of, structure_of, upstream_modules


def check_declaration(model) -> None:
    """Fail closed unless every streaming conv of ``model``'s decoder is a declared carry
    with the declared channels, context and stride (and no other conv uses the cache)."""
    up = upstream_modules()
    carries, dims = conv_carries(*structure_of(model)), dims_of(model)
    convs = {f"decoder.{n}" for n, m in model.decoder.named_modules()
             if isinstance(m, (up["SConv1d"], up["SConvTranspose1d"]))}
    extra = sorted(convs - {c.module for c in carries})
    if extra:
        raise DeclarationError(f"VibeVoice's decoder has streaming convs {extra[:3]} that no region carries")
    for c in carries:
        try:
            conv = model.get_submodule(c.module)
        except AttributeError:
            raise DeclarationError(f"region {c.region!r}: VibeVoice's decoder has no {c.module}") from None
        window = isinstance(c.retention, Window)
        cls = "SConvTranspose1d" if window else "SConv1d"
        if not isinstance(conv, up[cls]):
            raise DeclarationError(f"region {c.region!r}: {c.module} is a {type(conv).__name__}, declared {cls}")
        got = (conv.in_channels, conv.context_size, conv.stride, bool(conv.causal))
        want = (dims[c.shape[1]], c.retention.retain if window else c.shape[2],
                (c.retention.retain + 1) // 2 if window else 1, True)
        if got != want:
            raise DeclarationError(f"region {c.region!r}: {c.module} has (in_channels, context_size, stride, causal) "
                                   f"= {got}, the declaration {want}: upstream's conv cache differs from vibevoice "
                                   f"{UPSTREAM_VERSION}'s; declare this version's carries")


@functools.lru_cache(maxsize=None)
def arena_cache_class():
    """``ArenaCache``: upstream's ``VibeVoiceTokenizerStreamingCache`` over one step's state."""

    class ArenaCache(upstream_modules()["Cache"]):
        """``get`` returns the region's tensor as given (an arena view: no stack, no copy);
        ``set`` records the next state in ``next_state``.  Each declared conv must write
        its region once, at the declared next extent (a ``Fixed`` carry keeps its shape,
        a ``Window`` grows by the step's input frames up to ``retain``); anything else
        is a ``DeclarationError`` naming the region, so a changed upstream fails closed."""

        def __init__(self, layers: Mapping[str, Carry], state: Mapping[str, torch.Tensor]):
            super().__init__()
            self.layers, self.state, self.next_state = layers, state, {}

        def _carry(self, layer_id: str) -> Carry:
            if layer_id not in self.layers:
                raise DeclarationError(f"VibeVoice's decoder used cache entry {layer_id!r}, no declared region's")
            return self.layers[layer_id]

        def get(self, layer_id, sample_indices):
            return self.state[self._carry(layer_id).region]

        def set(self, layer_id, sample_indices, states):
            c = self._carry(layer_id)
            old = tuple(self.state[c.region].shape)
            want = old
            if isinstance(c.retention, Window):  # grows by the step's input frames, up to retain
                want = (*old[:2], min(old[2] + c.step_frames, c.retention.retain))
            if c.region in self.next_state or tuple(states.shape) != want:
                twice = " twice" if c.region in self.next_state else ""
                raise DeclarationError(f"region {c.region!r}: upstream wrote {tuple(states.shape)}{twice} after a "
                                       f"step from {old}; the declaration holds {want}")
            self.next_state[c.region] = states

    return ArenaCache


def decode_step(model, layers: Mapping[str, Carry], latent: torch.Tensor, state: Mapping[str, torch.Tensor],
                sample_indices: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Upstream's streaming ``decode`` of one latent frame on ``state`` -> (audio [1, samples], next state).

    ``sample_indices`` ([0]) only satisfies upstream's checks; ``ArenaCache`` ignores it."""
    cache = arena_cache_class()(layers, state)
    audio = model.decode(latent, cache=cache, sample_indices=sample_indices, use_cache=True)
    missing = [c.region for c in layers.values() if c.region not in cache.next_state]
    if missing:
        raise DeclarationError(f"VibeVoice's decode wrote no cache entry for regions {missing[:3]}; upstream's "
                               f"streaming cache use differs from vibevoice {UPSTREAM_VERSION}'s")
    return audio[0], cache.next_state
