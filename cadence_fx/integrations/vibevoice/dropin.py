"""``OptimizedVibeVoice``: the drop-in for ``VibeVoiceDecoder`` that ``cadence_fx.optimize`` builds."""

from __future__ import annotations

import torch

from ...runtime.variants import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_POLICY
from ..dropin import DEFAULT_MAX_EXECUTABLES, OneExecutableDropIn
from .adapter import VibeVoiceAdapter
from .stock import VibeVoiceDecoder, VibeVoiceStream


class OptimizedVibeVoice(VibeVoiceStream, OneExecutableDropIn):
    """Drop-in for ``VibeVoiceDecoder`` built by ``cadence_fx.optimize``: the step is traced
    once per catalog entry; each stream (``reset()``) keeps every carry in one arena.
    The model is shared with the stock decoder: upstream keeps no state on it."""

    def __init__(self, decoder: VibeVoiceDecoder, rules: str = "S", progress=None, cache=True,
                 off_catalog: str = DEFAULT_POLICY, max_specializations: int = DEFAULT_MAX_ENTRIES,
                 max_specialization_bytes: int = DEFAULT_MAX_BYTES,
                 max_executables: int = DEFAULT_MAX_EXECUTABLES):
        super().__init__(rules, decoder.device, progress, cache, off_catalog, max_specializations,
                         max_specialization_bytes, max_executables)
        self._require_stable_state("VibeVoice", "upstream's cache hands every conv a new tensor each step, so no "
                                   "stock state sits at fixed addresses to replay over")
        self.model = decoder.model
        self._compile(VibeVoiceAdapter(self.model, decoder.device))

    @property
    def dtype(self) -> torch.dtype:
        return self.adapter.dtype

    def _step_on(self, session, latent: torch.Tensor) -> torch.Tensor:
        return session.step({"latent": latent})["audio"]
