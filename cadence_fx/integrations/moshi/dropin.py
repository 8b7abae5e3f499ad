"""``OptimizedMimi``: the drop-in for ``MimiDecoder`` that ``cadence_fx.optimize`` builds."""

from __future__ import annotations

import torch

from ...runtime.variants import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_POLICY
from ..dropin import DEFAULT_MAX_EXECUTABLES, OneExecutableDropIn
from .adapter import MimiAdapter
from .stock import MimiDecoder, MimiStream, streaming_twin


class OptimizedMimi(MimiStream, OneExecutableDropIn):
    """Drop-in for ``MimiDecoder`` built by ``cadence_fx.optimize``: the step is traced
    once; each stream (``reset()``) keeps its state in one arena, bound to a twin of
    the module tree that shares the stock model's parameters."""

    def __init__(self, decoder: MimiDecoder, rules: str = "S", progress=None, cache=True,
                 off_catalog: str = DEFAULT_POLICY, max_specializations: int = DEFAULT_MAX_ENTRIES,
                 max_specialization_bytes: int = DEFAULT_MAX_BYTES,
                 max_executables: int = DEFAULT_MAX_EXECUTABLES):
        super().__init__(rules, decoder.device, progress, cache, off_catalog, max_specializations,
                         max_specialization_bytes, max_executables)
        self._require_stable_state("Mimi", "moshi keeps its state in streaming dataclasses, not module buffers")
        self.mimi = streaming_twin(decoder.mimi)  # after the stock's warm-up: shares its _embedding
        self._compile(MimiAdapter(self.mimi, decoder.device))

    def _step_on(self, session, codes: torch.Tensor) -> torch.Tensor:
        return session.step({"codes": codes})["pcm"]
