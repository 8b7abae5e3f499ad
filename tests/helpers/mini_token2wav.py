"""A smaller Token2Wav of the released architecture, for the tests of mechanisms.

The mechanics tests (background builds, many sessions, serving and Ray, serve-sim and
soak, traffic, turns, short chunks, the CLI's registry, prompt-length specialization,
shared steps, ten flow steps with a flush, the region walk) check what the library does
around a model: when it traces, specializes, falls back, resets, batches and routes,
every chunk against the stock tail. None of that depends on the model's depth or widths,
only on its streaming structure, which this model keeps: upstream's own classes
(``stepaudio2-minicpmo``), the encoder's pre-lookahead and 2x upsampling, the DiT's
width, heads and cache buffers (upstream hard-codes them), HiFT's rates and iSTFT; so
the same clocks, frame arithmetic, catalog, trims and branch classes of the prompt
length. ``MINI`` is what it changes: one conformer block on each side of the upsampling
(the declaration reads the count from the model), two DiT blocks of sixteen and narrower
HiFT channels, which make a CPU chunk several times cheaper. The released configuration
itself is what the model's own tests check (test_token2wav but its ten-step test,
test_disk_cache, test_misuse, every CUDA test, the demo).

Built by ``s2.build_modules`` at ``MINI``'s sizes, seeded as the released one is (the
DiT's zero-initialised adaLN and final layers re-randomised, so every kernel does real
work).  ``MODEL`` is the mini model's name in the tools' registry (``register()``; in a
process the tests start, through ``CADENCE_FX_MODELS=helpers.mini_models``).
"""

from __future__ import annotations

import dataclasses

import torch

from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.tools import registry

#: what this model changes from the released configuration (``s2.build_modules``'s sizes)
MINI = {"encoder_blocks": (1, 1), "dit_depth": 2, "hift_channels": 64}
MODEL = "token2wav-mini"


def build_mini_modules(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    return s2.build_modules(seed, **MINI)


def mini_tail(n_timesteps: int = 2, seed: int = 0) -> s2.Token2WavTail:
    flow, hift = build_mini_modules(seed)
    return s2.Token2WavTail(flow, hift, n_timesteps=n_timesteps)


def _build(args):
    if args.checkpoint is not None or args.dtype != "float32" or torch.device(args.device).type != "cpu":
        raise SystemExit(f"{MODEL}: seeded random weights, float32, on the CPU only")
    return mini_tail(args.n_timesteps, args.seed), s2.synthetic_prompt(args.prompt_tokens, args.seed)


def register() -> None:
    """``MODEL`` in this process's registry: the token2wav spec on the mini modules."""
    if MODEL not in registry.names():
        registry.register(dataclasses.replace(registry.get("token2wav"), name=MODEL, build=_build, bench=None))


def catalog_steps(opt, prompt_tokens: int = 40) -> dict:
    """The symbolic steps (variant 0) of each catalog entry an optimized mini Token2Wav holds:
    entry index -> step, symbolic in the prompt length alone (an off-catalog chunk's steps,
    which other tests on a shared model may have traced, carry its length too: left out).
    Traced here, at ``prompt_tokens``, where the model holds none yet."""
    steps = opt.programs.entry_steps(["prompt_frames"])
    if len(steps) < 3:
        opt.set_stream_cache(*s2.synthetic_prompt(prompt_tokens, seed=1))
        steps = opt.programs.entry_steps(["prompt_frames"])
    return steps
