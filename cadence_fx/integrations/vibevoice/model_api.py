"""``optimize(tokenizer)`` on VibeVoice's own ``VibeVoiceAcousticTokenizerModel``, its API kept.

    tokenizer = cadence_fx.optimize(tokenizer)
    cache = VibeVoiceTokenizerStreamingCache()          # upstream's class: one per stream
    idx = torch.tensor([0])
    audio = tokenizer.decode(latent, cache=cache, sample_indices=idx, use_cache=True)   # [1, 1, 3200]

A streaming ``decode`` (``use_cache=True`` with a cache) of one latent frame runs the
optimized step: each (cache object, sample index) is one stream, opened on its first
decode and kept while the cache object lives; the state is kept in that stream's arena,
not in the cache object (which stays empty).  A decode without a cache is the upstream
object's own, as are ``encode`` and every attribute.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ...compiler import open_session
from ...errors import InputError
from .dropin import OptimizedVibeVoice
from .inputs import VAE_DIM
from .stock import VibeVoiceDecoder


class OptimizedAcousticTokenizer:
    """VibeVoice's acoustic tokenizer with its streaming decode optimized (see the module docstring)."""

    def __init__(self, model, rules: str = "S", progress=None, cache=True):
        self.model = model
        self.optimized = OptimizedVibeVoice(VibeVoiceDecoder(model), rules, progress, cache)
        self._streams: "weakref.WeakKeyDictionary[Any, dict[int, Any]]" = weakref.WeakKeyDictionary()

    @torch.no_grad()
    def decode(self, latents, cache=None, sample_indices=None, use_cache: bool = False, debug: bool = False):
        """Upstream's ``decode``; streaming (``use_cache`` with a cache): one latent frame of
        one sample per call ([1, 64, 1] or [1, 1, 64]) -> [1, 1, 3200], run optimized."""
        if not use_cache or cache is None:
            return self.model.decode(latents, cache=cache, sample_indices=sample_indices, use_cache=use_cache,
                                     debug=debug)
        idx = self._index(sample_indices)
        frame = self.optimized._frame(latents)  # the shape, dtype and device checks of stream()
        sessions = self._streams.get(cache)
        if sessions is None:
            if getattr(cache, "cache", None):
                raise InputError("this streaming cache already holds upstream state (it was used with the "
                                 "unoptimized decoder); start the stream with a new VibeVoiceTokenizerStreamingCache()")
            sessions = self._streams.setdefault(cache, {})
        if idx not in sessions:
            sessions[idx] = open_session(self.optimized.executable, self.optimized.adapter)
        self.session = sessions[idx]
        return sessions[idx].step({"latent": frame})["audio"][None]

    def stats(self) -> dict:
        """The last decoded stream's counters (``Session.stats``)."""
        session = getattr(self, "session", None)
        return session.stats() if session is not None else {}

    def __getattr__(self, name: str) -> Any:
        if name in ("model", "optimized", "session"):
            raise AttributeError(name)
        return getattr(self.model, name)

    @staticmethod
    def _index(sample_indices) -> int:
        if sample_indices is None:
            raise InputError("a streaming decode needs sample_indices (e.g. torch.tensor([0])), as upstream's does")
        if not isinstance(sample_indices, torch.Tensor) or sample_indices.numel() != 1 \
                or sample_indices.dtype.is_floating_point:
            raise InputError(f"the optimized decoder streams one sample per call: sample_indices must be one "
                             f"integer index (e.g. torch.tensor([0])), got {sample_indices!r}")
        return int(sample_indices.reshape(()).item())


__all__ = ["OptimizedAcousticTokenizer", "VAE_DIM"]
