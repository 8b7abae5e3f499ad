"""The models the command line knows, by name: the only place in the tools that names one.

Each name maps to a frozen ``ModelSpec``: how to build the stock model from the
command's options, its planning-only adapter, the dtypes it runs, what one chunk
is, and its bench and serve hooks.  ``register`` adds one (tests add small models).

A model registered in one process is unknown in the processes it starts (a serve-sim
check worker, a Ray replica) unless they import what registered it: the modules named in
``CADENCE_FX_MODELS`` (comma-separated, importable there) are imported when a name is
looked up or the names are listed, once each, and register their models on import.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any, Callable

from ..errors import CadenceError, InputError
from .bench import BenchError
from .bench.models import BenchModel, MimiBench, Token2WavBench


class UnknownModel(CadenceError, ValueError):
    """A model name no ``ModelSpec`` is registered under."""


@dataclasses.dataclass(frozen=True)
class TokenChunks:
    """A stream's chunk of speech tokens: ``new`` tokens plus the next chunk's first ``lookahead``."""

    vocab: int
    new: int
    lookahead: int


@dataclasses.dataclass(frozen=True)
class SeededFrames:
    """A stream of frames that are not token ids (VibeVoice: float latents): ``frame(seed,
    session, k)`` is frame ``k`` of session ``session``, the same on every call."""

    frame: Callable[[int, int, int], Any]


@dataclasses.dataclass(frozen=True)
class ServeHooks:
    """What ``serve-sim`` and ``soak`` need beyond a ``ModelSpec``: the token feed (a
    chunk's tokens, or a frame's codes), a session's prompt (None: the model takes none),
    the optimized model's weight bytes, and (``soak`` only; None where it does not run)
    a stock model loaded with (a copy of) a session's state, or emptied again."""

    tokens: Callable[[Any], "TokenChunks | SeededFrames"]  # (args) -> the feed's shape
    prompt: Callable[[Any, int, Any], tuple | None]  # (args, session index, device) -> prompt
    weights_bytes: Callable[[Any], int]
    load_stock_state: Callable[[Any, Any], None] | None  # (stock, session)
    clear_stock_state: Callable[[Any], None] | None


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model for the tools.  ``build(args)`` -> ``(stock, prompt)`` (prompt None where a
    stream needs none); ``start(model, prompt)`` begins a stream on the stock or optimized
    model; ``chunks(args, n, final)`` the seeded chunk sequence (``final``: a flush chunk of
    that many tokens, only where ``flush``); ``executable(optimized, prompt)`` the traced
    program a stream of ``prompt`` runs; ``config(args)`` the options a report records;
    ``prompt(args)`` the stream's prompt at ``args.prompt_tokens`` (None: the model's
    streams take no prompt, so ``--prompt-tokens`` does not apply to it)."""

    name: str
    dtypes: tuple[str, ...]
    unit: str  # what one chunk is called: "chunk", "frame"
    unit_seconds: float  # audio per chunk
    sample_rate: int
    build: Callable[[Any], tuple[Any, Any]]
    explain_adapter: Callable[[Any], Any]
    chunks: Callable[[Any, int, int], list]
    start: Callable[[Any, Any], None]
    executable: Callable[[Any, Any], Any]
    describe: Callable[[Any], str]  # the demo's words for the model and its options
    config: Callable[[Any], dict] = lambda args: {}
    optimize: Callable[..., Any] | None = None  # (stock, rules, progress); None: cadence_fx.optimize
    prompt: Callable[[Any], Any] | None = None
    flush: bool = False
    bench: type[BenchModel] | None = None
    serve: ServeHooks | None = None


_MODELS: dict[str, ModelSpec] = {}
#: the model a command runs without ``--model`` (and an old report without a "model" field was of)
DEFAULT_MODEL = "token2wav"


def register(spec: ModelSpec) -> ModelSpec:
    """Add (or replace) ``spec`` under ``spec.name``."""
    _MODELS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    _MODELS.pop(name, None)


#: modules that register models when imported (see the module's docstring)
PLUGINS_ENV = "CADENCE_FX_MODELS"
_IMPORTED: set[str] = set()


def _import_plugins() -> None:
    for module in (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",")):
        if module and module not in _IMPORTED:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise InputError(f"{PLUGINS_ENV}: cannot import {module!r} ({e}); it names modules that "
                                 f"register models, importable in this process") from e
            _IMPORTED.add(module)


def names(where: Callable[[ModelSpec], Any] = lambda s: True) -> tuple[str, ...]:
    _import_plugins()
    return tuple(n for n, s in _MODELS.items() if where(s))


def get(name: str) -> ModelSpec:
    if name not in _MODELS:
        _import_plugins()
    if name not in _MODELS:
        raise UnknownModel(f"unknown model {name!r}; choose from {', '.join(_MODELS)}")
    return _MODELS[name]


def bench_model(name: str) -> type[BenchModel]:
    spec = _MODELS.get(name)
    if spec is None or spec.bench is None:
        raise BenchError(f"unknown model {name!r}; choose from {', '.join(names(lambda s: s.bench))}")
    return spec.bench


# ------------------------------------------------------------------ reuse of built models
#: the full configuration a built model depends on (with the model's name and, optimized, the rules)
CONFIG_KEYS = ("seed", "checkpoint", "n_timesteps", "prompt_tokens", "dtype", "device")
_reuse: dict[tuple, Any] | None = None


def reuse_built_models(on: bool = True) -> None:
    """Keep every model the commands build, and its optimized form with the programs it
    traced, in this process, and hand them to the next command of the same configuration
    (``CONFIG_KEYS``) instead of building and tracing again.  Off (the default): every
    command builds its own.  For tests; ``False`` drops what was kept."""
    global _reuse
    _reuse = {} if on else None


def kept_models() -> list:
    """What ``reuse_built_models`` keeps now (stock models and optimized ones), oldest first."""
    return list(_reuse.values()) if _reuse else []


def _kept(key: tuple, make: Callable[[], Any]) -> Any:
    if _reuse is None:
        return make()
    if key not in _reuse:
        _reuse[key] = make()
    return _reuse[key]


def build(spec: ModelSpec, args) -> tuple[Any, Any]:
    """``spec.build(args)``, or the model an earlier command built for the same configuration."""
    return _kept((spec.name, *(getattr(args, k, None) for k in CONFIG_KEYS)), lambda: spec.build(args))


def optimize(spec: ModelSpec, stock, rules: str, progress=None):
    """``cadence_fx.optimize(stock, rules)`` (or the spec's own), kept like ``build``'s model."""
    def make():
        if spec.optimize is not None:
            return spec.optimize(stock, rules, progress)
        import cadence_fx
        return cadence_fx.optimize(stock, rules=rules, progress=progress)
    return _kept(("optimized", id(stock), rules), make)


def build_from_options(options: dict[str, Any]) -> tuple[ModelSpec, Any, Any]:
    """``(spec, args, stock)``: the stock model a command's plain options describe
    (``model`` and what ``spec.build`` reads: seed, checkpoint, n_timesteps, prompt_tokens,
    dtype, device), built in a process of its own (a check worker, a server replica),
    with the deterministic protocol set first on CUDA."""
    import argparse

    import torch
    args = argparse.Namespace(**options)
    spec = get(args.model)
    if torch.device(args.device).type == "cuda":
        from ..lockstep import deterministic_protocol
        deterministic_protocol()
    return spec, args, spec.build(args)[0]


def build_optimized(options: dict[str, Any]):
    """The optimized model (``options["rules"]``) on ``build_from_options``'s stock model:
    what a server replica calls once.  Picklable as ``functools.partial(build_optimized,
    options)`` (``cadence_fx.serving.ray.app``).  ``options["background"]`` (default
    False): a new voice's programs are built in the background (``set_background``), so
    its set-up never holds the replica's other conversations for a build."""
    spec, args, stock = build_from_options(options)
    opt = optimize(spec, stock, args.rules)
    if options.get("background", False):
        if not hasattr(opt, "set_background"):
            raise InputError(f"background=True: the optimized {spec.name} does not build in the background")
        opt.set_background(True)
    return opt


# ------------------------------------------------------------------------ the models
def _device(args):
    import torch
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available on this machine")
    return device


def _token2wav_build(args):
    from ..integrations import stepaudio2 as s2
    prompt = _token2wav_prompt_of(args)  # checks --prompt-tokens before anything is built
    if not 1 <= args.n_timesteps <= 16:
        raise SystemExit("--n-timesteps must be in 1..16 (upstream keeps 16 step slots)")
    device = _device(args)
    flow, hift = s2.build_modules(args.seed, args.checkpoint)
    tail = s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps,
                            float16=args.dtype == "float16")
    return tail, prompt


def _token2wav_prompt_of(args):
    """The seeded prompt of ``--prompt-tokens`` P tokens: (tokens [1, P], mels [1, 2P, 80], spk [1, 192])."""
    from ..integrations import stepaudio2 as s2
    if args.prompt_tokens < 1:
        raise SystemExit("--prompt-tokens must be >= 1")
    return s2.synthetic_prompt(args.prompt_tokens, args.seed, device=_device(args))


def _token2wav_explain(args):
    import torch
    from ..integrations import stepaudio2 as s2
    return s2.explain_adapter(args.prompt_tokens, args.n_timesteps, args.dtype == "float16", torch.device(args.device))


def _token2wav_chunks(args, n, final):
    from ..integrations import stepaudio2 as s2
    return s2.synthetic_chunks(n, args.seed, final_tokens=final or None)


def _token2wav_describe(args):
    from ..integrations import stepaudio2 as s2
    return (f"Token2Wav tail (stepaudio2-minicpmo {s2.UPSTREAM_VERSION}), released config, seeded random weights, "
            f"{args.n_timesteps} flow steps")


def _token2wav_weights(model) -> int:
    return sum(p.nbytes for m in (model.flow, model.hift) for p in m.parameters())


def _token2wav_load_state(tail, session) -> None:
    """Give a stock tail a stream holding copies of the session's carried state.

    Upstream's stream loop reads only the live state: the first ``n_timesteps`` step
    slots and the first ``T`` frames of its buffers, which a copy holds exactly.
    """
    tail.prompt_frames, tail.spk = session.prompt_frames, session.spk
    tail.stream_state = {k: v.clone() for k, v in session.state().items()}


def _token2wav_clear_state(tail) -> None:
    tail.stream_state = None


def _token2wav_prompt(args, i, device):
    """Session ``i``'s prompt: P tokens, its mel and a speaker vector, seeded by ``seed + i``."""
    from ..integrations import stepaudio2 as s2
    return s2.synthetic_prompt(args.prompt_tokens, args.seed + i, device=device)


def _token2wav_tokens(args=None) -> TokenChunks:
    from ..integrations import stepaudio2 as s2
    return TokenChunks(s2.VOCAB, s2.CHUNK_TOKENS, s2.LOOKAHEAD_TOKENS)


def _start_stream(model, prompt) -> None:
    model.set_stream_cache(*prompt)


def _reset(model, prompt) -> None:
    model.reset()


def _mimi_build(args):
    from ..integrations import moshi as mm
    return mm.MimiDecoder(mm.build_mimi(args.seed, args.checkpoint).to(_device(args))), None


def _mimi_explain(args):
    import torch
    from ..integrations import moshi as mm
    return mm.explain_adapter(torch.device(args.device))


def _mimi_chunks(args, n, final):
    from ..integrations import moshi as mm
    return mm.synthetic_codes(n, args.seed)


def _mimi_tokens(args=None) -> TokenChunks:
    from ..integrations import moshi as mm
    return TokenChunks(mm.CARDINALITY, mm.N_Q, 0)  # a frame: 8 codes, no lookahead


def _mimi_weights(model) -> int:
    return sum(p.nbytes for p in model.mimi.parameters())


def _mimi_describe(args):
    from ..integrations import moshi as mm
    return f"Mimi decoder (moshi {mm.UPSTREAM_VERSION}), released config, seeded random weights"


def _vibevoice_build(args):
    """VibeVoice's acoustic decoder at the released configuration, seeded, in ``--dtype``
    (VibeVoice itself runs bfloat16 on GPU)."""
    import torch
    from ..integrations import vibevoice as vv
    model = vv.build_acoustic_tokenizer(args.seed, args.checkpoint)
    return vv.VibeVoiceDecoder(model.to(device=_device(args), dtype=getattr(torch, args.dtype))), None


def _vibevoice_explain(args):
    import torch
    from ..integrations import vibevoice as vv
    return vv.explain_adapter(torch.device(args.device), getattr(torch, args.dtype))


def _vibevoice_chunks(args, n, final):
    import torch
    from ..integrations import vibevoice as vv
    return vv.synthetic_latents(n, args.seed, getattr(torch, args.dtype), torch.device(args.device))


def _vibevoice_frames(args) -> SeededFrames:
    """Seeded standard-normal latents [1, 64, 1] in the decoder's dtype and device."""
    import torch
    from ..integrations import vibevoice as vv
    dtype, device = getattr(torch, args.dtype), torch.device(args.device)

    def frame(seed: int, session: int, k: int):
        g = torch.Generator().manual_seed(50_000 + seed * 10_007 + session * 100_003 + k)
        return torch.randn(1, vv.VAE_DIM, 1, generator=g).to(device=device, dtype=dtype)
    return SeededFrames(frame)


def _vibevoice_weights(model) -> int:
    return sum(p.nbytes for p in model.model.parameters())


def _vibevoice_describe(args):
    from ..integrations import vibevoice as vv
    return f"VibeVoice acoustic decoder (vibevoice {vv.UPSTREAM_VERSION}), released config, seeded random weights"


def _own_executable(model, prompt):
    return model.executable


register(ModelSpec(
    # Token2Wav's flow in fp32 or upstream's fp16; a chunk: 25 tokens (+ 3 lookahead), 1 s at 24 kHz
    "token2wav", ("float32", "float16"), "chunk", 1.0, 24000, _token2wav_build, _token2wav_explain,
    _token2wav_chunks, _start_stream, lambda opt, p: opt.executable(p[1].shape[1], p[2]), _token2wav_describe,
    config=lambda args: {"n_timesteps": args.n_timesteps, "prompt_tokens": args.prompt_tokens},
    prompt=_token2wav_prompt_of, flush=True, bench=Token2WavBench,
    serve=ServeHooks(_token2wav_tokens, _token2wav_prompt, _token2wav_weights, _token2wav_load_state,
                     _token2wav_clear_state)))
register(ModelSpec(
    # Mimi as moshi runs it (fp32); a frame: 8 codes -> 1,920 samples (80 ms)
    "mimi", ("float32",), "frame", 0.08, 24000, _mimi_build, _mimi_explain, _mimi_chunks, _reset,
    _own_executable, _mimi_describe, bench=MimiBench,
    serve=ServeHooks(_mimi_tokens, lambda args, i, device: None, _mimi_weights, None, None)))
register(ModelSpec(
    # VibeVoice's decoder in any dtype (VibeVoice itself runs bfloat16); a latent frame -> 3,200 samples
    "vibevoice", ("float32", "float16", "bfloat16"), "frame", 3200 / 24000, 24000, _vibevoice_build,
    _vibevoice_explain, _vibevoice_chunks, _reset, _own_executable, _vibevoice_describe,
    serve=ServeHooks(_vibevoice_frames, lambda args, i, device: None, _vibevoice_weights, None, None)))
