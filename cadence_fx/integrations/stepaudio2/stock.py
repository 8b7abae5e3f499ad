"""MiniCPM-o 4.5 / Step-Audio2 Token2Wav tail (``stepaudio2-minicpmo==0.1.1``).

Builds the upstream flow (UpsampleConformerEncoderV2 + CausalConditionalCFM over a
16-block DiT) and HiFT vocoder at the released configuration, declares their
streaming state, and restates upstream ``Token2wav.stream`` device-agnostically as
``stream_step`` (the stock reference and the step cadence_fx traces).

Clocks: token 25 Hz (25 tokens/step, +3 lookahead), mel 50 Hz (50 frames/step),
sample 24 kHz (24,000 samples/step).  After ``setup_cache`` on a prompt of P tokens
(+3 silence tokens) the attention caches hold ``prompt_frames = 2P`` mel frames;
each chunk prepends 50 frames (newest first in the DiT cache) and upstream trims to
``cache[:prompt_frames] ++ cache[-100:]`` once longer than ``prompt_frames + 100``:
a ``Window(retain=100, prefix=prompt_frames)`` on the mel clock, catalog width 3.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Mapping

import numpy as np
import torch

from ...annotations import Clock, Fixed, Region, Ring, Window, native_clock
from ..frames import speech_out
from ..upstream import import_submodule

UPSTREAM_DISTRIBUTION = "stepaudio2-minicpmo"
UPSTREAM_VERSION = "0.1.1"  # the version these declarations and tests were checked against
SILENCE_TOKEN = 4218
LOOKAHEAD_TOKENS = 3
CHUNK_TOKENS = 25
#: the most new tokens one step advances: a flush of up to 28 tokens (MiniCPM-o's turn end)
MAX_CHUNK_TOKENS = 28
MEL_PER_TOKEN = 2
SAMPLES_PER_MEL = 480
MEL_CACHE_LEN = 8  # upstream hard-codes 8 mel frames (160 ms) of vocoder carry
SOURCE_CACHE_LEN = MEL_CACHE_LEN * SAMPLES_PER_MEL  # 3,840 samples
RETAIN_FRAMES = 100  # upstream trims the attention caches to prompt + last 100 frames
VOCAB = 6561
PRE_LOOKAHEAD_CARRY = 2  # conformer frames the encoder's pre-lookahead conv carries (of its output)
UP_CARRY = 4  # frames the encoder's upsample conv carries (2 x its stride of 2)
RELEASED_CONFORMER_LAYERS = 10  # 6 conformer blocks + 4 after the upsampling


def conformer_layers(flow) -> int:
    """The encoder's blocks, each of which keeps one K|V cache layer (10 released)."""
    return len(flow.encoder.encoders) + len(flow.encoder.up_encoders)


def upstream_modules() -> dict[str, Any]:
    """The upstream classes, imported without ``stepaudio2/__init__`` (see upstream.py)."""
    flow = import_submodule("stepaudio2", "cosyvoice2.flow.flow")
    fm = import_submodule("stepaudio2", "cosyvoice2.flow.flow_matching")
    dit = import_submodule("stepaudio2", "cosyvoice2.flow.decoder_dit")
    enc = import_submodule("stepaudio2", "cosyvoice2.transformer.upsample_encoder_v2")
    hift = import_submodule("stepaudio2", "flashcosyvoice.modules.hifigan")
    return {
        "CausalMaskedDiffWithXvec": flow.CausalMaskedDiffWithXvec,
        "CausalConditionalCFM": fm.CausalConditionalCFM,
        "DiT": dit.DiT,
        "UpsampleConformerEncoderV2": enc.UpsampleConformerEncoderV2,
        "HiFTGenerator": hift.HiFTGenerator,
    }


def build_modules(seed: int = 0, checkpoint: str | None = None, *, encoder_blocks: tuple[int, int] = (6, 4),
                  dit_depth: int = 16, hift_channels: int = 512) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Flow and HiFT at the released configuration (fp32, CPU, eval mode).

    Weights: ``checkpoint`` (a directory holding upstream's flow.pt and hift.pt) or
    seeded random.  Upstream zero-initialises the DiT adaLN and final layers, which
    makes the estimator output exactly zero; we re-randomise them so every kernel
    does real work.  ``encoder_blocks`` (conformer blocks before and after the
    upsampling), ``dit_depth`` and ``hift_channels`` (HiFT's base channels) give other
    sizes of upstream's architecture (the released ones by default); the DiT's width,
    heads and cache buffers stay upstream's, which hard-codes them.
    """
    up = upstream_modules()
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        encoder = up["UpsampleConformerEncoderV2"](
            input_size=512, output_size=512, pre_lookahead_len=3, num_blocks=encoder_blocks[0],
            num_up_blocks=encoder_blocks[1], up_stride=2, up_scale_factor=2, attention_heads=8,
            pos_enc_layer_type="rel_pos_espnet", selfattention_layer_type="rel_selfattn",
            key_bias=True, linear_units=2048, dropout_rate=0.1,
            positional_dropout_rate=0.1, attention_dropout_rate=0.1,
            normalize_before=True, activation_type="swish",
        )
        estimator = up["DiT"](in_channels=320, out_channels=80, mlp_ratio=4.0, depth=dit_depth,
                              num_heads=8, head_dim=64, hidden_size=512)
        decoder = up["CausalConditionalCFM"](estimator=estimator, inference_cfg_rate=0.7)
        flow = up["CausalMaskedDiffWithXvec"](
            input_size=512, output_size=80, spk_embed_dim=192, output_type="mel",
            vocab_size=VOCAB, encoder=encoder, decoder=decoder,
        )
        hift = up["HiFTGenerator"](base_channels=hift_channels)
        if checkpoint is None:
            with torch.no_grad():
                for block in estimator.blocks:
                    torch.nn.init.normal_(block.adaLN_modulation[-1].weight, std=0.02)
                    torch.nn.init.normal_(block.adaLN_modulation[-1].bias, std=0.02)
                fl = estimator.final_layer
                for p in (fl.adaLN_modulation[-1].weight, fl.adaLN_modulation[-1].bias,
                          fl.linear.weight, fl.linear.bias):
                    torch.nn.init.normal_(p, std=0.02)
        else:
            flow.load_state_dict(torch.load(f"{checkpoint}/flow.pt", map_location="cpu", weights_only=True), strict=True)
            sd = torch.load(f"{checkpoint}/hift.pt", map_location="cpu", weights_only=True)
            hift.load_state_dict({k.replace("generator.", ""): v for k, v in sd.items()}, strict=True)
    finally:
        torch.random.set_rng_state(gen_state)
    return flow.eval(), hift.eval()


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """What one streaming step depends on besides modules and tensors."""

    prompt_frames: int  # mel frames of the prompt (2 x prompt tokens)
    n_timesteps: int
    float16: bool
    device_type: str


def autocast_for(cfg: StepConfig):
    """Upstream runs the flow under ``torch.amp.autocast("cuda", dtype=fp16|fp32)``."""
    dtype = torch.float16 if cfg.float16 else torch.float32
    if cfg.device_type == "cuda":
        return torch.amp.autocast("cuda", dtype=dtype)
    if cfg.float16:
        return torch.amp.autocast(cfg.device_type, dtype=dtype)
    return contextlib.nullcontext()  # fp32 autocast is a no-op; CPU autocast rejects fp32


def fade_in_out(fade_in: torch.Tensor, fade_out: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Upstream's Hamming crossfade (``window`` is float64, as upstream builds it)."""
    n = int(window.shape[0] / 2)
    fade_in = fade_in.clone()
    fade_in[..., :n] = fade_in[..., :n] * window[:n] + fade_out[..., -n:] * window[n:]
    return fade_in


def trim_window(cache: torch.Tensor, dim: int, prompt_frames: int) -> torch.Tensor:
    """Upstream's trim: keep ``[:prompt_frames]`` and the last 100 frames along ``dim``."""
    if cache.shape[dim] > prompt_frames + RETAIN_FRAMES:
        return torch.cat([cache.narrow(dim, 0, prompt_frames),
                          cache.narrow(dim, cache.shape[dim] - RETAIN_FRAMES, RETAIN_FRAMES)], dim=dim)
    return cache


CARRIED = ("conformer_cnn_cache", "conformer_att_cache", "estimator_cnn_cache",
           "estimator_att_cache", "hift_mel", "hift_source", "hift_speech")


def stream_step(flow, hift, window, cfg: StepConfig, inputs: Mapping[str, torch.Tensor],
                state: Mapping[str, torch.Tensor], last_chunk: bool = False):
    """One chunk of upstream ``Token2wav.stream`` as a function.

    inputs: ``token`` int32 [1, 25+3], ``spk`` float [1, 192].
    state: the seven ``CARRIED`` tensors.  Returns ``({"speech": [1, samples]}, new_state)``;
    ``speech`` is 24,000 samples per steady chunk (20,160 on the first, which has no
    crossfade partner), the float waveform upstream turns into PCM.
    """
    cache = {k: state[k] for k in CARRIED[:4]}
    with autocast_for(cfg):
        chunk_mel, cache = flow.inference_chunk(token=inputs["token"], spk=inputs["spk"], cache=cache,
                                                last_chunk=last_chunk, n_timesteps=cfg.n_timesteps)
    new_state = dict(cache)
    new_state["estimator_att_cache"] = trim_window(cache["estimator_att_cache"], 4, cfg.prompt_frames)
    new_state["conformer_att_cache"] = trim_window(cache["conformer_att_cache"], 3, cfg.prompt_frames)

    mel = torch.concat([state["hift_mel"], chunk_mel], dim=2)
    speech, source = hift(mel, state["hift_source"])
    if state["hift_speech"].shape[-1] > 0:
        speech = fade_in_out(speech, state["hift_speech"], window)
    new_state["hift_mel"] = mel[..., -MEL_CACHE_LEN:].clone().detach()
    new_state["hift_source"] = source[:, :, -SOURCE_CACHE_LEN:].clone().detach()
    new_state["hift_speech"] = speech[:, -SOURCE_CACHE_LEN:].clone().detach()
    if not last_chunk:
        speech = speech[:, :-SOURCE_CACHE_LEN]
    return {"speech": speech}, new_state


def setup_step(flow, cfg: StepConfig, prompt_tokens: torch.Tensor, prompt_mels: torch.Tensor,
               spk: torch.Tensor) -> dict[str, torch.Tensor]:
    """Upstream ``set_stream_cache`` from features: prompt + 3 silence tokens, run as
    upstream runs it, outside autocast.  With fp16 weights ``setup_cache`` needs fp16
    features, so the prompt mels and speaker vector are cast to half here (upstream's
    own class needs them so; fp16 users of it, e.g. llama.cpp-omni's token2wav, patch
    ``setup_cache`` to ``.half()`` them); the chunks keep the speaker vector as given."""
    pad = torch.full((1, LOOKAHEAD_TOKENS), SILENCE_TOKEN, dtype=prompt_tokens.dtype, device=prompt_tokens.device)
    if cfg.float16:
        prompt_mels, spk = prompt_mels.half(), spk.half()
    cache = flow.setup_cache(torch.cat([prompt_tokens, pad], dim=1), prompt_mels, spk, n_timesteps=cfg.n_timesteps)
    dev = prompt_mels.device
    state = dict(cache)
    state["hift_mel"] = torch.zeros(1, prompt_mels.shape[2], 0, device=dev)
    state["hift_source"] = torch.zeros(1, 1, 0, device=dev)
    state["hift_speech"] = torch.zeros(1, 0, device=dev)
    return state


TOKEN2WAV_DECLARATION = dict(
    # max_stride: a flush of up to 28 tokens (56 mel frames) and a turn's last window of up to
    # 27 + 3 (54) advance past the 25-token chunk; the arena holds them, so they run programs too
    clocks=[Clock("token", hz=25, stride=CHUNK_TOKENS, max_stride=MAX_CHUNK_TOKENS),
            Clock("mel", hz=50, stride=CHUNK_TOKENS * MEL_PER_TOKEN, max_stride=MAX_CHUNK_TOKENS * MEL_PER_TOKEN),
            Clock("sample", hz=24000, stride=CHUNK_TOKENS * MEL_PER_TOKEN * SAMPLES_PER_MEL,
                  max_stride=MAX_CHUNK_TOKENS * MEL_PER_TOKEN * SAMPLES_PER_MEL)],
    regions=[
        # float32 even when the flow runs in fp16: upstream cats an fp16 conv carry with
        # an fp32 one (interpolate is not autocast), which promotes.
        # Ring: replaced whole every chunk (K = 1); declared on an axis because a chunk of one
        # conformer frame (a 1-token flush) leaves upstream 1 + 4 frames: the arena holds 6,
        # the live view what upstream left (no chunk can follow it, inputs.check_chunk)
        Region("conformer_cnn_cache", clock="mel", shape=(1, 512, "T"), axis=2,
               retention=Ring(PRE_LOOKAHEAD_CARRY + UP_CARRY), dtype="float32",
               doc="pre-lookahead (2) + upsample (4) conv carry of the encoder"),
        Region("conformer_att_cache", clock="mel", shape=("conformer_layers", 1, 8, "T", 128), axis=3,
               retention=Window(retain=RETAIN_FRAMES, prefix="prompt_frames"),
               doc="encoder K|V per conformer block (6 + 4 released); trimmed by the stream loop"),
        Region("estimator_cnn_cache", clock="mel", shape=("n_timesteps", 16, 2, 1024, 2),
               retention=Fixed(), buffers=("flow.decoder.cnn_cache_buffer",),
               doc="DiT conv carry per flow step; stock keeps 16 steps"),
        Region("estimator_att_cache", clock="mel", shape=("n_timesteps", 16, 2, 8, "T", 128), axis=4,
               retention=Window(retain=RETAIN_FRAMES, prefix="prompt_frames"),
               buffers=("flow.decoder.att_cache_buffer",),
               doc="DiT K|V per flow step and block, newest chunk first; stock buffer 16x16x2x8x1000x128"),
        Region("dit_att_scratch", clock="mel", shape=(16, 2, 8, "T", 128), axis=3,
               retention=Window(retain=RETAIN_FRAMES, prefix="prompt_frames"),
               buffers=("flow.decoder.estimator.att_cache_buffer",), carried=False,
               doc="one DiT call's K|V before the CFM copies it per step; stock 16x2x8x1000x128"),
        Region("dit_cnn_scratch", clock="mel", shape=(16, 2, 1024, 2), retention=Fixed(),
               buffers=("flow.decoder.estimator.cnn_cache_buffer",), carried=False,
               doc="one DiT call's conv carry"),
        Region("hift_mel", clock="mel", shape=(1, 80, "T"), axis=2, dtype="float32",
               retention=Window(retain=MEL_CACHE_LEN), doc="vocoder mel carry (8 frames)"),
        Region("hift_source", clock="sample", shape=(1, 1, "T"), axis=2, dtype="float32",
               retention=Window(retain=SOURCE_CACHE_LEN), doc="NSF source carry (3,840 samples)"),
        Region("hift_speech", clock="sample", shape=(1, "T"), axis=1, dtype="float32",
               retention=Window(retain=SOURCE_CACHE_LEN), doc="crossfade tail (3,840 samples)"),
    ],
    step="stream",
    unit="chunk of 25 tokens (+3 lookahead) -> 50 mel frames -> 24,000 samples",
)


class FlowPlacement:
    """``device`` and ``dtype`` of a tail holding ``flow`` and ``float16`` (stock and optimized alike)."""

    @property
    def device(self) -> torch.device:
        return next(self.flow.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float16 if self.float16 else torch.float32


@native_clock(**TOKEN2WAV_DECLARATION)
class Token2WavTail(FlowPlacement):
    """The stock streaming tail: upstream ``Token2wav.stream`` on features.

    ``set_stream_cache(prompt_tokens, prompt_mels, spk)`` replaces upstream's
    ``set_stream_cache(prompt_wav)`` (the audio front end, s3tokenizer and CAMPPlus,
    is outside the tail); ``stream(tokens, last_chunk, return_waveform)`` is upstream's.
    """

    def __init__(self, flow, hift, *, n_timesteps: int = 5, float16: bool = False):
        if n_timesteps < 1 or n_timesteps > 16:
            raise ValueError(f"n_timesteps must be in 1..16 (upstream keeps 16 step slots), got {n_timesteps}")
        self.flow, self.hift = flow, hift
        self.n_timesteps = n_timesteps
        self.float16 = float16
        if float16:
            self.flow.half()
        self.speech_window = torch.from_numpy(np.hamming(2 * SOURCE_CACHE_LEN)).to(self.device)
        self.stream_state: dict[str, torch.Tensor] | None = None
        self.spk: torch.Tensor | None = None
        self.prompt_frames: int | None = None

    def to(self, device) -> "Token2WavTail":
        self.flow.to(device)
        self.hift.to(device)
        self.speech_window = self.speech_window.to(device)
        return self

    def config(self) -> StepConfig:
        if self.prompt_frames is None:
            raise RuntimeError("call set_stream_cache(prompt_tokens, prompt_mels, spk) first")
        return StepConfig(self.prompt_frames, self.n_timesteps, self.float16, self.device.type)

    @torch.inference_mode()
    def set_stream_cache(self, prompt_tokens: torch.Tensor, prompt_mels: torch.Tensor, spk: torch.Tensor) -> None:
        self.prompt_frames = int(prompt_mels.shape[1])
        self.spk = spk
        self.stream_state = setup_step(self.flow, self.config(), prompt_tokens, prompt_mels, spk)

    @torch.inference_mode()
    def stream(self, generated_speech_tokens, last_chunk: bool = False, return_waveform: bool = False):
        if self.stream_state is None:
            raise ValueError("stream_cache is not set")
        token = torch.tensor([list(generated_speech_tokens)], dtype=torch.int32, device=self.device)
        out, self.stream_state = stream_step(self.flow, self.hift, self.speech_window, self.config(),
                                             {"token": token, "spk": self.spk}, self.stream_state, last_chunk)
        self.last_speech = out["speech"]
        return speech_out(self.last_speech, return_waveform)

    def state(self) -> dict[str, torch.Tensor]:
        """The carried state after the last call (views of stock buffers where upstream keeps them)."""
        return dict(self.stream_state or {})


def synthetic_prompt(prompt_tokens: int = 50, seed: int = 0, device="cpu", dtype=torch.float32):
    """A seeded stand-in for the audio front end: tokens, a mel (2 frames/token), a speaker vector."""
    g = torch.Generator().manual_seed(10_000 + seed)
    tokens = torch.randint(0, VOCAB, (1, prompt_tokens), generator=g, dtype=torch.int32)
    mels = torch.randn(1, prompt_tokens * MEL_PER_TOKEN, 80, generator=g) * 2.0 - 5.0
    spk = torch.randn(1, 192, generator=g)
    return tokens.to(device), mels.to(device=device, dtype=dtype), spk.to(device=device, dtype=dtype)


def synthetic_chunks(n_chunks: int, seed: int = 0, final_tokens: int | None = None) -> list[tuple[list[int], bool]]:
    """Token chunks of the duplex protocol: 25 + 3 lookahead, advancing by 25.

    With ``final_tokens`` the stream ends with a flush chunk of that many tokens
    (``last_chunk=True``), as a turn's end does.
    """
    g = torch.Generator().manual_seed(20_000 + seed)
    total = CHUNK_TOKENS * n_chunks + max(LOOKAHEAD_TOKENS, final_tokens or 0)
    toks = torch.randint(0, VOCAB, (total,), generator=g).tolist()
    chunks = [(toks[CHUNK_TOKENS * c: CHUNK_TOKENS * c + CHUNK_TOKENS + LOOKAHEAD_TOKENS], False)
              for c in range(n_chunks)]
    if final_tokens:
        start = CHUNK_TOKENS * n_chunks
        chunks.append((toks[start:start + final_tokens], True))
    return chunks
