"""One package per upstream family (stock < inputs < adapter < drop-in), and what they share.

``optimize`` finds the family of a model by its class: first among the classes given to
``register`` (class objects, searched along the model's MRO), then among the built-in
families (``BUILTIN``: module and qualified name, imported lazily so importing cadence_fx
imports no model package), and otherwise takes the generic path (``generic``: a step
method that takes its inputs and then one tensor per carried region).  Shared by the
families: ``upstream`` (importing upstream packages without their ``__init__``), ``ids``
(integer ids checked on the host), ``frames`` (a call's waveform or PCM; the stream of a
frame codec) and ``dropin`` (the drop-ins' executables and default session).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

#: built-in families: (module of the class, class qualname) -> (module, factory attribute)
BUILTIN: dict[tuple[str, str], tuple[str, str]] = {
    ("cadence_fx.integrations.stepaudio2.stock", "Token2WavTail"):
        ("cadence_fx.integrations.stepaudio2.dropin", "OptimizedToken2Wav"),
    ("cadence_fx.integrations.moshi.stock", "MimiDecoder"):
        ("cadence_fx.integrations.moshi.dropin", "OptimizedMimi"),
    ("cadence_fx.integrations.vibevoice.stock", "VibeVoiceDecoder"):
        ("cadence_fx.integrations.vibevoice.dropin", "OptimizedVibeVoice"),
    # the upstream objects users hold, their own APIs kept
    ("stepaudio2.token2wav", "Token2wav"):
        ("cadence_fx.integrations.stepaudio2.model_api", "OptimizedUpstreamToken2wav"),
    ("moshi.models.compression", "MimiModel"):
        ("cadence_fx.integrations.moshi.model_api", "OptimizedMimiModel"),
    ("vibevoice.modular.modular_vibevoice_tokenizer", "VibeVoiceAcousticTokenizerModel"):
        ("cadence_fx.integrations.vibevoice.model_api", "OptimizedAcousticTokenizer"),
}

_REGISTERED: dict[type, Callable[..., Any]] = {}
_LOCK = threading.Lock()


def register(cls: type, factory: Callable[..., Any]) -> None:
    """``optimize(model)`` of an instance of ``cls`` (or of a subclass) calls
    ``factory(model, rules=..., progress=..., cache=...)``; a later ``register`` of the
    same class replaces the factory.  For families whose step is not one method (write
    a ``StreamingAdapter`` and a drop-in); a step in the generic form needs none."""
    from ..errors import CadenceError
    if not isinstance(cls, type):
        raise CadenceError(f"register(cls, factory) takes a class, got {type(cls).__name__} {cls!r}")
    if not callable(factory):
        raise CadenceError(f"register({cls.__qualname__}, factory): the factory must be callable, got "
                           f"{type(factory).__name__}")
    with _LOCK:
        _REGISTERED[cls] = factory


def unregister(cls: type) -> None:
    """Forget ``register(cls, ...)`` (a class never registered is ignored)."""
    with _LOCK:
        _REGISTERED.pop(cls, None)


def unknown_options(factory: Callable[..., Any], options: dict[str, Any]) -> list[str]:
    """The names in ``options`` that ``factory`` does not take (none if it takes ``**kwargs``)."""
    import inspect
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    return [k for k in options if k not in params]


def factory_for(model: Any) -> Callable[..., Any] | None:
    """The registered or built-in factory for ``model``'s class, else ``None`` (the generic path)."""
    import importlib
    for cls in type(model).__mro__:
        with _LOCK:
            hit = _REGISTERED.get(cls)
        if hit is not None:
            return hit
        builtin = BUILTIN.get((cls.__module__, cls.__qualname__))
        if builtin is not None:
            return getattr(importlib.import_module(builtin[0]), builtin[1])
    return None
