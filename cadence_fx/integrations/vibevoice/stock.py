"""VibeVoice's acoustic decoder (``vibevoice==0.0.1``), one 7.5 Hz latent frame per step.

The sigma-VAE decoder of ``VibeVoiceAcousticTokenizerModel`` at the released
configuration (VibeVoice-1.5B's ``acoustic_tokenizer_config``, which is upstream's
config defaults): a [1, 64, 1] latent -> 3,200 samples at 24 kHz, through a stem conv,
seven stages of depthwise-conv blocks and six transposed-conv upsamplers
(8, 5, 5, 4, 2, 2).  Clocks: one per stage, ``latent`` 7.5 Hz (1 frame per step) up to
``sample`` 24 kHz (3,200 per step).

Upstream streams with ``decode(latent, cache=VibeVoiceTokenizerStreamingCache(),
sample_indices=..., use_cache=True)``: the cache is a dict keyed by (layer id, sample)
and every conv replaces its entry each step with a slice of a freshly concatenated
input, so all 34 carries move every step.  Each is a declared region: a causal conv
keeps its last 6 input frames (``Fixed``; upstream starts from zeros, which is the
arena's initial state), a transposed conv its last 2r - 1 input frames, starting
empty: ``Window(retain=2r - 1)`` on the clock of its input (the first upsampler grows
one frame a step to 15: 16 catalog entries).  The step runs upstream's ``decode`` with
``ArenaCache``, a cache whose ``get`` returns the step's state tensor and whose ``set``
records the next state, so the traced graph is ``(latent, state) -> (audio,
next_state)`` and ``state_rewrite`` makes the state arena views.  The model holds no
streaming state, so the stock and the optimized decoders share one model.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, NamedTuple

import torch

from ...annotations import Clock, Declaration, Fixed, Region, Window, get_declaration, native_clock
from ...errors import DeclarationError
from ..frames import FrameStream
from ..upstream import import_submodule
from .inputs import VAE_DIM, latent_tensor

UPSTREAM_DISTRIBUTION = "vibevoice"
UPSTREAM_VERSION = "0.0.1"  # the version these declarations and tests were checked against
#: VibeVoice-1.5B's acoustic_tokenizer_config (upstream's defaults); the decoder reads the
#: decoder_* keys, the encoder (off the decode path) the encoder_* ones
RELEASED_CONFIG = dict(vae_dim=64, causal=True, mixer_layer="depthwise_conv", conv_norm="none",
                       pad_mode="constant", disable_last_norm=True, layernorm="RMSNorm", layernorm_eps=1e-5,
                       conv_bias=True, layer_scale_init_value=1e-6, weight_init_value=1e-2, fix_std=0.5,
                       std_dist_type="gaussian", encoder_n_filters=32, encoder_ratios=[8, 5, 5, 4, 2, 2],
                       encoder_depths="3-3-3-3-3-3-8", decoder_n_filters=32, decoder_ratios=[8, 5, 5, 4, 2, 2],
                       decoder_depths=None)
RATIOS = (8, 5, 5, 4, 2, 2)  # transposed-conv upsampling into stages 1..6: 3,200 samples per latent frame
DEPTHS = (8, 3, 3, 3, 3, 3, 3)  # Block1D per stage (the encoder's "3-3-3-3-3-3-8" reversed)
CONTEXT = 6  # stem, depthwise mixers and head: causal kernel 7, stride 1


class Carry(NamedTuple):
    """One streaming conv's cache entry as a region."""

    region: str
    module: str  # path in VibeVoiceAcousticTokenizerModel
    clock: str  # the clock of the frames it holds (the conv's input)
    shape: tuple  # (1, channels symbol, frames)
    retention: Fixed | Window
    step_frames: int  # input frames the conv takes per step


def clock_names(stages: int) -> tuple[str, ...]:
    return ("latent", *[f"stage{i}" for i in range(1, stages - 1)], "sample")


def conv_carries(ratios=RATIOS, depths=DEPTHS) -> tuple[Carry, ...]:
    """Every streaming conv of the decoder, in call order.  A causal conv keeps its last
    6 input frames; a transposed conv of ratio r its last 2r - 1, none before the first step."""
    clocks, frames = clock_names(len(depths)), [math.prod(ratios[:i]) for i in range(len(depths))]
    out = [Carry("stem", "decoder.upsample_layers.0.0", clocks[0], (1, "vae_dim", CONTEXT), Fixed(), 1)]
    for i, depth in enumerate(depths):
        if i:
            out.append(Carry(f"up{i}", f"decoder.upsample_layers.{i}.0", clocks[i - 1], (1, f"ch{i - 1}", "T"),
                             Window(retain=2 * ratios[i - 1] - 1), frames[i - 1]))
        out += [Carry(f"stage{i}_block{j}", f"decoder.stages.{i}.{j}.mixer.conv", clocks[i], (1, f"ch{i}", CONTEXT),
                      Fixed(), frames[i]) for j in range(depth)]
    return (*out, Carry("head", "decoder.head", clocks[-1], (1, f"ch{len(depths) - 1}", CONTEXT), Fixed(), frames[-1]))


def vibevoice_declaration(ratios=RATIOS, depths=DEPTHS) -> dict:
    """Clocks (one per stage: the latent's 7.5 Hz times the ratios so far) and one region per carry."""
    return dict(
        clocks=[Clock(name, hz=7.5 * math.prod(ratios[:i]), stride=math.prod(ratios[:i]))
                for i, name in enumerate(clock_names(len(depths)))],
        regions=[Region(c.region, clock=c.clock, shape=c.shape, axis=None if isinstance(c.retention, Fixed) else 2,
                        retention=c.retention, doc=f"{c.module}: its last input frames (streaming cache entry)")
                 for c in conv_carries(ratios, depths)],
        step="stream",
        unit=f"one 7.5 Hz latent frame: [1, {VAE_DIM}, 1] -> {math.prod(ratios):,} samples",
    )


def stage_dims(n_filters: int = 32, stages: int = len(DEPTHS), vae_dim: int = VAE_DIM) -> dict[str, int]:
    """The declaration's symbols: latent channels and each stage's width (n_filters x 2^(stages-1-i))."""
    return {"vae_dim": vae_dim, **{f"ch{i}": n_filters * 2 ** (stages - 1 - i) for i in range(stages)}}


@functools.lru_cache(maxsize=None)
def upstream_modules() -> dict[str, Any]:
    """vibevoice's tokenizer classes, imported without running ``vibevoice/__init__``.

    Both package ``__init__`` files are empty in 0.0.1; the bare import keeps it that
    way should a later version fill them (the inference model pulls diffusers and
    the Qwen2 LM).  The submodule itself imports transformers (PreTrainedModel,
    ACT2FN, AutoModel): hence transformers==4.51.3, upstream's pin, in the
    ``models`` extra.  Upstream logs at import whether apex's fused RMSNorm is
    available; that line is kept out of the user's console.
    """
    log = logging.getLogger(f"{UPSTREAM_DISTRIBUTION}.modular.modular_vibevoice_tokenizer")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        tok = import_submodule("vibevoice", "modular.modular_vibevoice_tokenizer", bare=("modular",))
    finally:
        log.setLevel(level)
    return {"Model": tok.VibeVoiceAcousticTokenizerModel, "Config": tok.VibeVoiceAcousticTokenizerConfig,
            "Cache": tok.VibeVoiceTokenizerStreamingCache, "SConv1d": tok.SConv1d,
            "SConvTranspose1d": tok.SConvTranspose1d}


def build_acoustic_tokenizer(seed: int = 0, checkpoint: str | None = None, **config: Any):
    """``VibeVoiceAcousticTokenizerModel`` at the released config (fp32, CPU, eval).

    ``config`` overrides entries of ``RELEASED_CONFIG`` (tests build a smaller decoder of
    the same classes: fewer filters, fewer and shorter stages).  Weights: ``checkpoint``
    (a ``.safetensors`` file or a ``torch.save``d state dict of the tokenizer; a
    ``model.acoustic_tokenizer.`` prefix, as in VibeVoice's shards, is stripped) or
    seeded random: upstream's own init, then every block's layer scales (upstream
    inits them to 1e-6, which would leave the blocks out of the output's bits) drawn
    from N(0, 0.1).
    """
    up = upstream_modules()
    unknown = sorted(set(config) - set(RELEASED_CONFIG))
    if unknown:
        raise ValueError(f"unknown acoustic tokenizer config keys {unknown}; see RELEASED_CONFIG")
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = up["Model"](up["Config"](**{**RELEASED_CONFIG, **config})).eval()
        if checkpoint is None:
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if name.endswith("gamma"):
                        p.normal_(0.0, 0.1)
        else:
            if checkpoint.endswith(".safetensors"):
                from safetensors.torch import load_file  # transformers' dependency
                sd = load_file(checkpoint)
            else:
                sd = torch.load(checkpoint, map_location="cpu", weights_only=True)
            model.load_state_dict({k.removeprefix("model.acoustic_tokenizer."): v for k, v in sd.items()})
    finally:
        torch.random.set_rng_state(gen_state)
    return model


# ------------------------------------------------------- the decoder's structure
def structure_of(model) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ratios, depths) of ``model``'s decoder: what the regions and clocks follow."""
    ratios, depths = tuple(model.decoder.ratios), tuple(model.decoder.depths)
    if len(depths) != len(ratios) + 1:
        raise DeclarationError(f"VibeVoice decoder with ratios {list(ratios)} and depths {list(depths)}: "
                               f"upstream builds one stage per ratio plus the first")
    return ratios, depths


def declaration_for(model) -> Declaration:
    """The released declaration (``VibeVoiceDecoder``'s), or the one for a smaller decoder's
    structure (tests build one with fewer, shorter stages: fewer carries and catalog entries)."""
    structure = structure_of(model)
    if structure == (RATIOS, DEPTHS):
        return get_declaration(VibeVoiceDecoder)
    return Declaration(**vibevoice_declaration(*structure))


def dims_of(model) -> dict[str, int]:
    return stage_dims(model.decoder.n_filters, len(model.decoder.depths), model.decoder.dimension)


def layer_carries(model) -> dict[str, Carry]:
    """Upstream's cache key (``layer_id``, from the module's id) of each declared conv -> its carry."""
    return {model.get_submodule(c.module).layer_id: c for c in conv_carries(*structure_of(model))}


def synthetic_latents(n_frames: int, seed: int = 0, dtype=torch.float32,
                      device="cpu") -> list[tuple[torch.Tensor, bool]]:
    """``n_frames`` seeded latent frames [1, 64, 1] (standard normal), as (latent, last) pairs."""
    g = torch.Generator().manual_seed(40_000 + seed)
    return [(torch.randn(1, VAE_DIM, 1, generator=g).to(device=device, dtype=dtype), False) for _ in range(n_frames)]


class VibeVoiceStream(FrameStream):
    """What the stock and optimized decoders share: one latent frame in, 3,200 samples out."""

    family = "VibeVoice's decoder"

    def _frame(self, latent) -> torch.Tensor:
        return latent_tensor(latent, self.dtype, self.device)  # [1, 64, 1]


@native_clock(**vibevoice_declaration())
class VibeVoiceDecoder(VibeVoiceStream):
    """The stock streaming decoder: ``model.decode(latent, cache=..., use_cache=True)``
    with upstream's ``VibeVoiceTokenizerStreamingCache``, one latent frame a call.

    ``stream(latent)`` takes [1, 64, 1] and returns 3,200 samples (int16 PCM bytes, or
    the float waveform with ``return_waveform``); ``reset()`` starts a new stream.  A
    decoder of another structure (ratios, depths) carries its own declaration.
    """

    def __init__(self, model):
        self.model = model
        if structure_of(model) != (RATIOS, DEPTHS):
            native_clock(**vibevoice_declaration(*structure_of(model)))(self)
        self.reset()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def reset(self) -> None:
        self.cache = upstream_modules()["Cache"]()
        self._indices = torch.zeros(1, dtype=torch.int64, device=self.device)

    @torch.no_grad()
    def _decode(self, latent: torch.Tensor) -> torch.Tensor:
        return self.model.decode(latent, cache=self.cache, sample_indices=self._indices, use_cache=True)[0]

    def state(self) -> dict[str, torch.Tensor]:
        """The declared regions as upstream's cache holds them (sample 0, batch dim restored)."""
        entries = {layer: t for (layer, _), t in self.cache.cache.items()}
        return {c.region: entries[layer][None] for layer, c in layer_carries(self.model).items() if layer in entries}

    def state_storage_bytes(self) -> int:
        """Bytes the cache keeps alive: each entry is a view of its step's whole concatenated input."""
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in self.cache.cache.values()}.values())
