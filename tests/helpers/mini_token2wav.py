"""A smaller Token2Wav of the released architecture, for the tests of mechanisms.

The mechanics tests (background builds, many sessions, serving and Ray, serve-sim and
soak, traffic, turns, misuse) check what the library does around a model: when it
traces, specializes, falls back, resets, batches and routes, every chunk against the
stock tail.  None of that depends on the model's depth or widths, only on its streaming
structure, which this model keeps: upstream's own classes (``stepaudio2-minicpmo``),
the encoder's pre-lookahead and 2x upsampling, the DiT's width, heads and cache buffers
(upstream hard-codes them), HiFT's rates and iSTFT; so the same clocks, frame
arithmetic, catalog, trims and branch classes of the prompt length.  ``MINI`` is what
it changes: one conformer block on each side of the upsampling (the declaration reads
the count from the model), two DiT blocks of sixteen and narrower HiFT channels, which
make a CPU chunk several times cheaper.  The released configuration itself is what the
model's own tests check (test_token2wav, test_prompt_lengths, test_shared_steps,
test_upstream_token2wav, test_cli, test_disk_cache, the demo).

Seeded like ``s2.build_modules``: the DiT's zero-initialised adaLN and final layers are
re-randomised, so every kernel does real work.  ``MODEL`` is the mini model's name in
the tools' registry (``register()``; in a process the tests start, through
``CADENCE_FX_MODELS=helpers.mini_models``).
"""

from __future__ import annotations

import dataclasses

import torch

from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.integrations.stepaudio2 import stock
from cadence_fx.tools import registry

#: what this model changes from the released configuration (``s2.build_modules``)
MINI = {"encoder num_blocks": 1, "encoder num_up_blocks": 1, "DiT depth": 2, "HiFT base_channels": 64}
MODEL = "token2wav-mini"


def build_mini_modules(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    up = stock.upstream_modules()
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        encoder = up["UpsampleConformerEncoderV2"](
            input_size=512, output_size=512, pre_lookahead_len=3, num_blocks=MINI["encoder num_blocks"],
            num_up_blocks=MINI["encoder num_up_blocks"], up_stride=2, up_scale_factor=2, attention_heads=8,
            pos_enc_layer_type="rel_pos_espnet", selfattention_layer_type="rel_selfattn",
            key_bias=True, linear_units=2048, dropout_rate=0.1,
            positional_dropout_rate=0.1, attention_dropout_rate=0.1,
            normalize_before=True, activation_type="swish",
        )
        estimator = up["DiT"](in_channels=320, out_channels=80, mlp_ratio=4.0, depth=MINI["DiT depth"],
                              num_heads=8, head_dim=64, hidden_size=512)
        decoder = up["CausalConditionalCFM"](estimator=estimator, inference_cfg_rate=0.7)
        flow = up["CausalMaskedDiffWithXvec"](
            input_size=512, output_size=80, spk_embed_dim=192, output_type="mel",
            vocab_size=s2.VOCAB, encoder=encoder, decoder=decoder,
        )
        hift = up["HiFTGenerator"](base_channels=MINI["HiFT base_channels"])
        with torch.no_grad():
            for block in estimator.blocks:
                torch.nn.init.normal_(block.adaLN_modulation[-1].weight, std=0.02)
                torch.nn.init.normal_(block.adaLN_modulation[-1].bias, std=0.02)
            fl = estimator.final_layer
            for p in (fl.adaLN_modulation[-1].weight, fl.adaLN_modulation[-1].bias,
                      fl.linear.weight, fl.linear.bias):
                torch.nn.init.normal_(p, std=0.02)
    finally:
        torch.random.set_rng_state(state)
    return flow.eval(), hift.eval()


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
