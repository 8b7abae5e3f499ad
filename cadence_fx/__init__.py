"""cadence_fx: exact, fast streaming for the token-to-audio tail of duplex speech models.

Mark model code with clocks and retention (``@native_clock``), call
``cadence_fx.optimize(model)``, and get the same PCM bytes from demand-sized state
at stable addresses (rule S) and, on CUDA, exact-shape graph replay (rule R).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from .annotations import ChunkPad, Clock, Fixed, Region, Ring, Unbounded, Window, get_declaration, native_clock
from .errors import (CadenceError, DeclarationError, InputError, PassError, PlanError, RulesError, SessionBroken,
                     SessionBusy, SessionClosed, TraceError)

__version__ = "0.1.0"


def optimize(model: Any, rules: str = "S", progress: Callable[[str], None] | None = None,
             cache: "bool | str | os.PathLike" = True) -> Any:
    """A drop-in replacement for ``model`` with the same streaming API and output bits.

    ``rules``: "S" (demand-sized state at stable addresses; CPU or CUDA) or, on
    CUDA, "R", "SR", "Rc", "SRc" (exact-shape CUDA-graph replay, per step or per
    chunk).  Graphs are built when a stream's configuration is first seen: with
    rules S, SR, SRc and a model whose adapter has symbolic dims (Token2Wav's prompt
    length) each catalog entry is traced once for every length and a new length is
    a specialization of that trace (``stats()["setup_s"]`` says which and how long).

    ``cache``: where traced programs are kept across processes (models whose
    adapter has symbolic dims, e.g. Token2Wav's prompt length): True, the default
    directory (``$CADENCE_FX_CACHE_DIR``, else ``$XDG_CACHE_HOME/cadence_fx`` or
    ``~/.cache/cadence_fx``); a path, that directory; False, nowhere.
    """
    from .integrations import factory_for
    get_declaration(model)  # a clear error if the model declares no clocks
    factory = factory_for(model)
    if factory is None:
        raise CadenceError(f"no cadence_fx integration for {type(model).__name__}; "
                           "see docs/annotating.md for writing an adapter")
    return factory(model, rules=rules, progress=progress, cache=cache)


__all__ = [
    "optimize", "native_clock", "get_declaration",
    "Clock", "Region", "Fixed", "Ring", "Window", "ChunkPad", "Unbounded",
    "CadenceError", "DeclarationError", "PlanError", "TraceError", "PassError", "InputError",
    "SessionClosed", "SessionBusy", "SessionBroken", "RulesError",
]
