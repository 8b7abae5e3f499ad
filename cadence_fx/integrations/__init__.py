"""One package per upstream family (stock < inputs < adapter < drop-in), and what they share.

``optimize`` finds the family of a model by its class through ``FACTORIES``.
Families register lazily so importing cadence_fx imports no model package.  Shared by
the families: ``upstream`` (importing upstream packages without their ``__init__``),
``ids`` (integer ids checked on the host), ``frames`` (a call's waveform or PCM; the
stream of a frame codec) and ``dropin`` (the drop-ins' executables and default session).
"""

from __future__ import annotations

from typing import Any, Callable

FACTORIES: dict[str, tuple[str, str]] = {
    # class qualname -> (module, factory attribute)
    "Token2WavTail": ("cadence_fx.integrations.stepaudio2.dropin", "OptimizedToken2Wav"),
    "MimiDecoder": ("cadence_fx.integrations.moshi.dropin", "OptimizedMimi"),
    "VibeVoiceDecoder": ("cadence_fx.integrations.vibevoice.dropin", "OptimizedVibeVoice"),
}


def factory_for(model: Any) -> Callable[..., Any] | None:
    import importlib
    for cls in type(model).__mro__:
        hit = FACTORIES.get(cls.__qualname__)
        if hit is not None:
            return getattr(importlib.import_module(hit[0]), hit[1])
    return None
