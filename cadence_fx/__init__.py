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
             cache: "bool | str | os.PathLike" = True, **options: Any) -> Any:
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

    A model of a registered family (``register``, or the built-in Token2Wav, Mimi and
    VibeVoice tails, and the upstream objects moshi's ``MimiModel`` and VibeVoice's
    ``VibeVoiceAcousticTokenizerModel``, their APIs kept) gets its family's drop-in.  Any other declared model takes the
    generic path (``integrations.generic.OptimizedModule``): its ``native_clock`` names a
    ``step`` method taking its inputs and then one tensor per carried region, and an
    ``initial_state`` method.  Its ``options``: ``dims`` (values of the declaration's
    symbols not readable from the model or its initial state) and ``check_chunks``
    (how many first steps of each session run the stock step beside the optimized one
    and raise ``DeclarationError`` on any difference; default: max(8, twice the catalog)).
    """
    from .integrations import factory_for, unknown_options
    factory = factory_for(model)
    if factory is None:
        get_declaration(model)  # a clear error if the model declares no clocks
        from .integrations.generic import OptimizedModule
        factory = OptimizedModule
    unknown = unknown_options(factory, options)
    if unknown:
        raise CadenceError(f"optimize({type(model).__name__}) got option(s) {unknown} that its integration "
                           f"({getattr(factory, '__qualname__', factory)}) does not take")
    return factory(model, rules=rules, progress=progress, cache=cache, **options)


def register(cls: type, factory: Callable[..., Any]) -> None:
    """``optimize`` on an instance of ``cls`` calls ``factory(model, rules=, progress=,
    cache=, **options)``: for families whose step is not one method (an adapter and a
    drop-in; docs/annotating.md).  Keyed by the class object, searched along the MRO."""
    from .integrations import register as _register
    _register(cls, factory)


def verify(model: Any, inputs: Any, rules: str = "S", seed: int | None = 0, setup_args: tuple = (),
           **options: Any) -> dict:
    """Stock vs optimized, chunk by chunk, for a model in the generic step form: every
    output and carried state tensor compared with ``torch.equal`` (``report["exact"]``);
    the same report ``cadence-fx verify`` prints.  ``inputs``: one entry per chunk (a
    tensor, or a tuple of the step's inputs); ``options`` go to ``optimize``."""
    from .integrations.generic.verify import verify_model
    return verify_model(model, inputs, rules=rules, seed=seed, setup_args=setup_args, **options)


__all__ = [
    "optimize", "register", "verify", "native_clock", "get_declaration",
    "Clock", "Region", "Fixed", "Ring", "Window", "ChunkPad", "Unbounded",
    "CadenceError", "DeclarationError", "PlanError", "TraceError", "PassError", "InputError",
    "SessionClosed", "SessionBusy", "SessionBroken", "RulesError",
]
