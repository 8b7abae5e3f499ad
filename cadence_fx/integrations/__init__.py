"""One module per upstream family; each declares its state and adapts its step.

``optimize`` finds the family of a model by its class through ``FACTORIES``.
Families register lazily so importing cadence_fx imports no model package.
"""

from __future__ import annotations

from typing import Any, Callable

FACTORIES: dict[str, tuple[str, str]] = {
    # class qualname -> (module, factory attribute)
    "Token2WavTail": ("cadence_fx.integrations.stepaudio2", "OptimizedToken2Wav"),
    "MimiDecoder": ("cadence_fx.integrations.moshi", "OptimizedMimi"),
    "VibeVoiceDecoder": ("cadence_fx.integrations.vibevoice", "OptimizedVibeVoice"),
}


def factory_for(model: Any) -> Callable[..., Any] | None:
    import importlib
    for cls in type(model).__mro__:
        hit = FACTORIES.get(cls.__qualname__)
        if hit is not None:
            return getattr(importlib.import_module(hit[0]), hit[1])
    return None
