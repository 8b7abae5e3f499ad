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

from ..annotations import Clock, Fixed, Region, Window, native_clock
from .upstream import import_submodule

UPSTREAM_DISTRIBUTION = "stepaudio2-minicpmo"
UPSTREAM_VERSION = "0.1.1"  # the version these declarations and tests were checked against
SILENCE_TOKEN = 4218
LOOKAHEAD_TOKENS = 3
CHUNK_TOKENS = 25
MEL_PER_TOKEN = 2
SAMPLES_PER_MEL = 480
MEL_CACHE_LEN = 8  # upstream hard-codes 8 mel frames (160 ms) of vocoder carry
SOURCE_CACHE_LEN = MEL_CACHE_LEN * SAMPLES_PER_MEL  # 3,840 samples
RETAIN_FRAMES = 100  # upstream trims the attention caches to prompt + last 100 frames
VOCAB = 6561


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


def build_modules(seed: int = 0, checkpoint: str | None = None) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Flow and HiFT at the released configuration (fp32, CPU, eval mode).

    Weights: ``checkpoint`` (a directory holding upstream's flow.pt and hift.pt) or
    seeded random.  Upstream zero-initialises the DiT adaLN and final layers, which
    makes the estimator output exactly zero; we re-randomise them so every kernel
    does real work.
    """
    up = upstream_modules()
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        encoder = up["UpsampleConformerEncoderV2"](
            input_size=512, output_size=512, pre_lookahead_len=3, num_blocks=6,
            num_up_blocks=4, up_stride=2, up_scale_factor=2, attention_heads=8,
            pos_enc_layer_type="rel_pos_espnet", selfattention_layer_type="rel_selfattn",
            key_bias=True, linear_units=2048, dropout_rate=0.1,
            positional_dropout_rate=0.1, attention_dropout_rate=0.1,
            normalize_before=True, activation_type="swish",
        )
        estimator = up["DiT"](in_channels=320, out_channels=80, mlp_ratio=4.0, depth=16,
                              num_heads=8, head_dim=64, hidden_size=512)
        decoder = up["CausalConditionalCFM"](estimator=estimator, inference_cfg_rate=0.7)
        flow = up["CausalMaskedDiffWithXvec"](
            input_size=512, output_size=80, spk_embed_dim=192, output_type="mel",
            vocab_size=VOCAB, encoder=encoder, decoder=decoder,
        )
        hift = up["HiFTGenerator"]()
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
    """Upstream ``set_stream_cache`` from features: prompt + 3 silence tokens."""
    pad = torch.full((1, LOOKAHEAD_TOKENS), SILENCE_TOKEN, dtype=prompt_tokens.dtype, device=prompt_tokens.device)
    with autocast_for(cfg):
        cache = flow.setup_cache(torch.cat([prompt_tokens, pad], dim=1), prompt_mels, spk,
                                 n_timesteps=cfg.n_timesteps)
    dev = prompt_mels.device
    state = dict(cache)
    state["hift_mel"] = torch.zeros(1, prompt_mels.shape[2], 0, device=dev)
    state["hift_source"] = torch.zeros(1, 1, 0, device=dev)
    state["hift_speech"] = torch.zeros(1, 0, device=dev)
    return state


def pcm_bytes(speech: np.ndarray) -> bytes:
    """Upstream's PCM: clip to [-1, 1], scale by 32767, int16 little-endian."""
    return (np.clip(speech, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


TOKEN2WAV_DECLARATION = dict(
    clocks=[Clock("token", hz=25, stride=CHUNK_TOKENS),
            Clock("mel", hz=50, stride=CHUNK_TOKENS * MEL_PER_TOKEN),
            Clock("sample", hz=24000, stride=CHUNK_TOKENS * MEL_PER_TOKEN * SAMPLES_PER_MEL)],
    regions=[
        # float32 even when the flow runs in fp16: upstream cats an fp16 conv carry with
        # an fp32 one (interpolate is not autocast), which promotes.
        Region("conformer_cnn_cache", clock="mel", shape=(1, 512, 6), retention=Fixed(), dtype="float32",
               doc="pre-lookahead (2) + upsample (4) conv carry of the encoder"),
        Region("conformer_att_cache", clock="mel", shape=(10, 1, 8, "T", 128), axis=3,
               retention=Window(retain=RETAIN_FRAMES, prefix="prompt_frames"),
               doc="encoder K|V for 6 + 4 conformer blocks; trimmed by the stream loop"),
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


@native_clock(**TOKEN2WAV_DECLARATION)
class Token2WavTail:
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

    @property
    def device(self) -> torch.device:
        return next(self.flow.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float16 if self.float16 else torch.float32

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
        wav = out["speech"].cpu().numpy()
        return wav if return_waveform else pcm_bytes(wav)

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


# --------------------------------------------------------------------------- adapter
from ..adapter import StreamingAdapter  # noqa: E402
from ..annotations import get_declaration  # noqa: E402
from ..step import StepSignature  # noqa: E402
from ..plan import TensorSpec  # noqa: E402
from ..runtime.binding import rebind_buffers  # noqa: E402

#: the module buffers upstream over-provisions, each bound to a declared region
STOCK_BUFFERS = ("flow.decoder.att_cache_buffer", "flow.decoder.cnn_cache_buffer",
                 "flow.decoder.estimator.att_cache_buffer", "flow.decoder.estimator.cnn_cache_buffer")
SIGNATURE = StepSignature(inputs=("token", "spk"), regions=CARRIED, outputs=("speech",))


def _flow_buffers(buffers: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {path.removeprefix("flow."): t for path, t in buffers.items()}


class Token2WavAdapter(StreamingAdapter):
    """Token2Wav for one stream configuration (prompt length, flow steps, dtype, device)."""

    signature = SIGNATURE

    def __init__(self, flow, hift, window, cfg: StepConfig, spk: torch.Tensor, stock_buffer_bytes: int):
        self.flow, self.hift, self.window, self.cfg, self.spk = flow, hift, window, cfg, spk
        self.declaration = get_declaration(Token2WavTail)
        self._stock_buffer_bytes = stock_buffer_bytes

    def dims(self) -> dict[str, int]:
        return {"prompt_frames": self.cfg.prompt_frames, "n_timesteps": self.cfg.n_timesteps}

    @property
    def dtype(self) -> torch.dtype:
        return torch.float16 if self.cfg.float16 else torch.float32

    @property
    def device(self) -> torch.device:
        return getattr(self, "_device", None) or self.spk.device

    def input_specs(self) -> dict[str, TensorSpec]:
        dev = str(self.device)
        return {"token": TensorSpec.contiguous((1, CHUNK_TOKENS + LOOKAHEAD_TOKENS), "int32", dev),
                "spk": TensorSpec.contiguous(tuple(self.spk.shape), str(self.spk.dtype).removeprefix("torch."), dev)}


    def example_inputs(self) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        token = torch.randint(0, VOCAB, (1, CHUNK_TOKENS + LOOKAHEAD_TOKENS), generator=g, dtype=torch.int32)
        return {"token": token.to(self.device), "spk": self.spk}

    def bind(self, buffers: Mapping[str, torch.Tensor]):
        flow = rebind_buffers(self.flow, _flow_buffers(buffers))
        _mark_estimator_calls(flow)

        def step(inputs, state, last_chunk: bool = False):
            return stream_step(flow, self.hift, self.window, self.cfg, inputs, state, last_chunk)
        return step

    def stock_buffers(self) -> dict[str, torch.Tensor]:
        return {p: _buffer(self.flow, p.removeprefix("flow.")) for p in STOCK_BUFFERS}

    def setup(self, buffers: Mapping[str, torch.Tensor], prompt_tokens, prompt_mels, spk) -> dict[str, torch.Tensor]:
        flow = rebind_buffers(self.flow, _flow_buffers(buffers))
        return setup_step(flow, self.cfg, prompt_tokens, prompt_mels, spk)

    def fallback(self, inputs, state, last_chunk: bool = False):
        """Any chunk, eagerly, on private buffers sized for this call (freed after)."""
        att = state["estimator_att_cache"]
        frames = att.shape[4] + MEL_PER_TOKEN * inputs["token"].shape[1]
        dev, dt = att.device, att.dtype
        n = self.cfg.n_timesteps
        buffers = {
            "flow.decoder.att_cache_buffer": torch.zeros((n, 16, 2, 8, frames, 128), dtype=dt, device=dev),
            "flow.decoder.cnn_cache_buffer": torch.zeros((n, 16, 2, 1024, 2), dtype=dt, device=dev),
            "flow.decoder.estimator.att_cache_buffer": torch.zeros((16, 2, 8, frames, 128), dtype=dt, device=dev),
            "flow.decoder.estimator.cnn_cache_buffer": torch.zeros((16, 2, 1024, 2), dtype=dt, device=dev),
        }
        return self.bind(buffers)(inputs, state, last_chunk)

    def step_boundary(self):
        """Per-step graphs (rules R/SR): one per DiT estimator call, one per stretch between."""
        return lambda node: "estimator" in node.meta.get("cadence_scope", ())

    def callable_verdicts(self) -> tuple:
        from ..plan import ScopeVerdict
        return (
            ScopeVerdict("stream", "callable", "in", "one chunk of 25+3 tokens: traced per catalog entry"),
            ScopeVerdict("setup_cache", "callable", "out", "one-shot prompt of any length: runs eagerly, "
                         "writing straight into the arena-bound buffers"),
            ScopeVerdict("stream(last_chunk=True)", "callable", "out", "flush chunk: its length is outside the "
                         "catalog; runs eagerly on the arena state, counted as a fallback"),
        )

    def stock_state_bytes(self) -> int:
        """Stock buffers (at their fixed sizes) + carried state outside them at steady state."""
        item = 2 if self.cfg.float16 else 4
        t = self.cfg.prompt_frames + RETAIN_FRAMES
        carried = (1 * 512 * 6 + 10 * 8 * t * 128) * item + (80 * MEL_CACHE_LEN + 2 * SOURCE_CACHE_LEN) * 4
        return self._stock_buffer_bytes + carried


#: upstream's buffer shapes (0.1.1), for planning without building the model
STOCK_BUFFER_SHAPES = {
    "flow.decoder.att_cache_buffer": (16, 16, 2, 8, 1000, 128),
    "flow.decoder.cnn_cache_buffer": (16, 16, 2, 1024, 2),
    "flow.decoder.estimator.att_cache_buffer": (16, 2, 8, 1000, 128),
    "flow.decoder.estimator.cnn_cache_buffer": (16, 2, 1024, 2),
}


def explain_adapter(prompt_tokens: int, n_timesteps: int, float16: bool, device) -> Token2WavAdapter:
    """An adapter good for planning only (no modules): ``cadence-fx explain`` needs no weights."""
    item = 2 if float16 else 4
    stock = sum(int(np.prod(s)) * item for s in STOCK_BUFFER_SHAPES.values())
    cfg = StepConfig(prompt_tokens * MEL_PER_TOKEN, n_timesteps, float16, torch.device(device).type)
    spk = torch.empty((1, 192), device="meta")
    adapter = Token2WavAdapter(None, None, None, cfg, spk, stock)
    adapter._device = torch.device(device)
    return adapter


def _mark_estimator_calls(flow) -> None:
    """Tag the nodes of each DiT call (on the twin's own estimator copy only)."""
    from ..step import scope
    est = flow.decoder.estimator
    inner = type(est).forward_chunk.__get__(est)

    def forward_chunk(*args, **kwargs):
        with scope("estimator"):
            return inner(*args, **kwargs)
    est.forward_chunk = forward_chunk


def _buffer(root: torch.nn.Module, path: str) -> torch.Tensor:
    owner, _, name = path.rpartition(".")
    return root.get_submodule(owner)._buffers[name]


class OptimizedToken2Wav:
    """Drop-in for ``Token2WavTail`` built by ``cadence_fx.optimize``.

    Shares the stock tail's parameters and ``rand_noise``.  With rule S it does not
    share its state buffers: it keeps a module shell whose four over-provisioned
    buffers are empty, and each stream's state lives in one arena sized from the
    plan.  Rules R/Rc (replay over stock-managed state) keep private stock-sized
    buffers instead, as a second stock model would.  Graphs are built on the first
    ``set_stream_cache`` for a prompt length and reused for later streams of that
    length.

    Many streams on one set of weights: ``open_session(...)`` returns a
    ``Token2WavSession`` with its own state (arena, or under R/Rc its own copies),
    clock position, counters and captured graphs; the executables are shared by
    prompt length.  The drop-in API (``set_stream_cache``/``stream``) drives one
    default session.  Under R/Rc the sessions share the model's stock-sized buffers
    as scratch, so they must not step concurrently.
    """

    def __init__(self, tail: Token2WavTail, rules: str = "S", progress=None):
        from ..compiler import check_rules
        self.rules = check_rules(rules, tail.device)
        self.n_timesteps, self.float16 = tail.n_timesteps, tail.float16
        flow_paths = [p.removeprefix("flow.") for p in STOCK_BUFFERS]
        self._stock_buffer_bytes = sum(_buffer(tail.flow, p).nbytes for p in flow_paths)
        if "S" in rules:
            own = {p: torch.empty(0, device=tail.device) for p in flow_paths}  # the shell: no stock buffers
        else:
            own = {p: torch.zeros_like(_buffer(tail.flow, p)) for p in flow_paths}
        self.flow = rebind_buffers(tail.flow, own)
        self.hift = tail.hift
        self.speech_window = tail.speech_window
        self.progress = progress
        self._executables: dict[tuple, Any] = {}
        self.session = None
        self.spk = None
        self.prompt_frames = None
        self._opened = 0  # sessions opened by open_session (for their names)

    @property
    def device(self) -> torch.device:
        return next(self.flow.parameters()).device

    def _adapter(self, prompt_frames: int, spk: torch.Tensor) -> Token2WavAdapter:
        cfg = StepConfig(prompt_frames, self.n_timesteps, self.float16, self.device.type)
        return Token2WavAdapter(self.flow, self.hift, self.speech_window, cfg, spk, self._stock_buffer_bytes)

    def executable(self, prompt_frames: int, spk: torch.Tensor):
        from ..compiler import compile_executable
        key = (prompt_frames, tuple(spk.shape), spk.dtype)
        if key not in self._executables:
            self._executables[key] = compile_executable(self._adapter(prompt_frames, spk), self.rules, self.progress)
        return self._executables[key]

    def explain(self, prompt_frames: int) -> str:
        from ..compiler import build_plan
        spk = torch.zeros(1, 192, device=self.device)
        return build_plan(self._adapter(prompt_frames, spk)).explain()

    def _new_session(self, prompt_tokens: torch.Tensor, prompt_mels: torch.Tensor, spk: torch.Tensor):
        """A set-up runtime session (both APIs construct sessions here only)."""
        from ..compiler import open_session
        _check_prompt(prompt_tokens, prompt_mels, spk, self.device)
        prompt_frames = int(prompt_mels.shape[1])
        exe = self.executable(prompt_frames, spk)
        return open_session(exe, self._adapter(prompt_frames, spk), prompt_tokens, prompt_mels, spk)

    @torch.inference_mode()
    def open_session(self, prompt_tokens: torch.Tensor, prompt_mels: torch.Tensor, spk: torch.Tensor,
                     *, stream=None) -> "Token2WavSession":
        """A new stream on these weights: ``set_stream_cache`` without replacing any other stream.

        ``stream`` (CUDA only; ignored on CPU): a ``torch.cuda.Stream`` this session's
        steps are launched on, so several sessions' replays may overlap on one GPU
        (``Token2WavSession.submit``).  The speaker vector is copied: the caller may
        reuse its tensor.
        """
        session = self._new_session(prompt_tokens, prompt_mels, spk)
        self._opened += 1
        return Token2WavSession(session, spk.clone(), int(prompt_mels.shape[1]), self.device,
                                stream=stream, name=f"session {self._opened}")

    @torch.inference_mode()
    def set_stream_cache(self, prompt_tokens: torch.Tensor, prompt_mels: torch.Tensor, spk: torch.Tensor) -> None:
        # the current stream stays usable until the new one is fully set up
        session = self._new_session(prompt_tokens, prompt_mels, spk)
        if self.session is not None:
            self.session.close()
        self.spk, self.prompt_frames = spk, int(prompt_mels.shape[1])
        self.session = session

    @torch.inference_mode()
    def stream(self, generated_speech_tokens, last_chunk: bool = False, return_waveform: bool = False):
        if self.session is None:
            raise ValueError("stream_cache is not set: call set_stream_cache(prompt_tokens, prompt_mels, spk) first")
        self.last_speech = step_chunk(self.session, self.spk, self.device, generated_speech_tokens, last_chunk)
        wav = self.last_speech.cpu().numpy()
        return wav if return_waveform else pcm_bytes(wav)

    def state(self) -> dict[str, torch.Tensor]:
        return self.session.state() if self.session is not None else {}

    def stats(self) -> dict:
        return self.session.stats() if self.session is not None else {}

    @property
    def arena_bytes(self) -> int:
        """Bytes of the current stream's arena (0 under rules R/Rc, which keep no arena)."""
        return self.session.arena.nbytes if self.session is not None and self.session.arena is not None else 0

    @property
    def state_bytes(self) -> int:
        """Device memory held for stream state: the arena (rule S), or the private
        stock-sized buffers plus the session's state copies (rules R/Rc)."""
        held = self.session.state_bytes if self.session is not None else 0
        return held if "S" in self.rules else held + self._stock_buffer_bytes

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


class PendingChunk:
    """One submitted chunk: its speech is on the device, maybe still being computed."""

    def __init__(self, speech: torch.Tensor, stream):
        self.speech, self._stream = speech, stream

    def result(self, return_waveform: bool = False):
        """Wait for the chunk (its own CUDA stream only) and return PCM bytes or the waveform."""
        with _on_stream(self._stream):
            wav = self.speech.cpu().numpy()
        return wav if return_waveform else pcm_bytes(wav)


class Token2WavSession:
    """One stream of an ``OptimizedToken2Wav``: ``open_session(...)`` makes it.

    Per session: the arena (every carried region and scratch; rules R/Rc: copies of
    the carried state), the clock position (region extents), the counters and, under
    replay rules, the captured graphs (SR/SRc bind this arena by address) in their own
    memory pool.  Shared by all sessions: the
    weights and the executables (one per prompt length).  Not shared, and not held
    per session: the random generators (HiFT draws noise from the global ones, as
    upstream does), so a session's output depends on the generator state at each
    call; seed before each chunk for reproducible output.
    """

    def __init__(self, session, spk: torch.Tensor, prompt_frames: int, device: torch.device,
                 stream=None, name: str = "session"):
        self.session, self.spk, self.prompt_frames, self.device = session, spk, prompt_frames, device
        self.name = name
        self.cuda_stream = stream if device.type == "cuda" else None
        if self.cuda_stream is not None:
            self.cuda_stream.wait_stream(torch.cuda.current_stream(device))  # setup ran on the current stream
        self.last_speech: torch.Tensor | None = None
        self._final_stats: dict | None = None

    @property
    def closed(self) -> bool:
        return self.session is None

    @torch.inference_mode()
    def submit(self, tokens, last_chunk: bool = False) -> PendingChunk:
        """Launch one chunk on this session's stream (CUDA) and return without waiting.

        Every check (token ids, chunk length, closed session) runs on the host first:
        a rejected chunk launches nothing and leaves the state as it was.
        """
        self._check_open("stream")
        with _on_stream(self.cuda_stream):
            self.last_speech = step_chunk(self.session, self.spk, self.device, tokens, last_chunk)
        return PendingChunk(self.last_speech, self.cuda_stream)

    def stream(self, tokens, last_chunk: bool = False, return_waveform: bool = False):
        """Upstream's ``Token2wav.stream`` for this session: PCM bytes (or the waveform)."""
        return self.submit(tokens, last_chunk).result(return_waveform)

    def state(self) -> dict[str, torch.Tensor]:
        """Live views of the carried regions (no copies)."""
        self._check_open("state")
        return self.session.state()

    def stats(self) -> dict:
        """Counters (steps, graph runs, replays, fallbacks by reason); still readable after close."""
        return self._final_stats if self.session is None else self.session.stats()

    @property
    def arena_bytes(self) -> int:
        """Bytes of this session's state: its arena (rules R/Rc: its state copies)."""
        return 0 if self.session is None else self.session.state_bytes

    def close(self) -> None:
        """Release the arena and graphs (once nothing else holds them); idempotent."""
        if self.session is not None:
            if self.cuda_stream is not None:
                self.cuda_stream.synchronize()  # its arena and speaker vector are freed next
            self._final_stats = self.session.stats()
            self.session.close()
            self.session = None
            self.last_speech = None

    def _check_open(self, what: str) -> None:
        from ..errors import SessionClosed
        if self.session is None:
            raise SessionClosed(f"{self.name} is closed (close() was called): {what}() needs an open session; "
                                f"open a new one with OptimizedToken2Wav.open_session(prompt_tokens, prompt_mels, spk)")

    def __repr__(self) -> str:
        return f"Token2WavSession({self.name!r}, prompt_frames={self.prompt_frames}, closed={self.closed})"


def _on_stream(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


#: mel frames upstream's fixed attention buffers hold (``att_cache_buffer[..., :1000, :]``)
STOCK_CACHE_FRAMES = 1000


def step_chunk(session, spk: torch.Tensor, device, tokens, last_chunk: bool) -> torch.Tensor:
    """Check a chunk on the host, then run one step of ``session``; the speech tensor."""
    from ..errors import SessionClosed
    if session.closed:
        raise SessionClosed("the stream is closed (close() was called); start a new one with "
                            "set_stream_cache(prompt_tokens, prompt_mels, spk) or open_session(...)")
    token = tokens_tensor(tokens, device)
    check_chunk_length(token.shape[1], last_chunk, int(session.state()["estimator_att_cache"].shape[4]))
    return session.step({"token": token, "spk": spk}, last_chunk=last_chunk)["speech"]


def check_chunk_length(n_tokens: int, last_chunk: bool, cache_frames: int) -> None:
    """The chunk lengths upstream can run; any of them streams exactly.

    The catalog holds 25 + 3 tokens (not last); any other length runs eagerly, bit
    exact, counted as a fallback (and the next steps too, until the caches are
    trimmed back onto the catalog).  Rejected, because upstream fails on them: a
    chunk that is not last with no token past the 3 lookahead tokens (a conv error
    upstream), and a chunk that would grow the attention caches past upstream's
    1,000-frame buffers (an out-of-bounds write upstream).
    """
    from ..errors import InputError
    if not last_chunk and n_tokens <= LOOKAHEAD_TOKENS:
        raise InputError(f"a chunk that is not last needs more than its {LOOKAHEAD_TOKENS} lookahead tokens; "
                         f"got {n_tokens} (send {CHUNK_TOKENS} + {LOOKAHEAD_TOKENS}, or pass last_chunk=True)")
    new_frames = MEL_PER_TOKEN * (n_tokens if last_chunk else n_tokens - LOOKAHEAD_TOKENS)
    if cache_frames + new_frames > STOCK_CACHE_FRAMES:
        most = (STOCK_CACHE_FRAMES - cache_frames) // MEL_PER_TOKEN + (0 if last_chunk else LOOKAHEAD_TOKENS)
        raise InputError(f"a chunk of {n_tokens} tokens would grow the attention caches from {cache_frames} to "
                         f"{cache_frames + new_frames} mel frames; upstream's buffers hold {STOCK_CACHE_FRAMES} "
                         f"(stock fails on it): send at most {most} tokens in this chunk")


def tokens_tensor(tokens, device) -> torch.Tensor:
    """Upstream's ``torch.tensor([tokens], dtype=int32)``, with the checks a server needs.

    An out-of-vocabulary id is an out-of-range embedding index: on CUDA that is a
    device-side assert that kills the process and every other stream on it, so ids
    are checked on the host before anything launches.  A token tensor may be of any
    integer dtype, on any device with data, strided or not, of shape (n,) or (1, n):
    its values are read out (a copy), so the caller may reuse or change it afterwards.
    """
    from ..errors import InputError
    if isinstance(tokens, torch.Tensor):
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise InputError(f"speech tokens must be integers, got a {tokens.dtype} tensor")
        if tokens.device.type == "meta":
            raise InputError("the speech token tensor is on the meta device (it has no values)")
        if not (tokens.dim() == 1 or (tokens.dim() == 2 and tokens.shape[0] == 1)):
            raise InputError(f"a speech token tensor must be of shape (n,) or (1, n); got {tuple(tokens.shape)}")
        tokens = tokens.reshape(-1).tolist()
    tokens = list(tokens)
    if not tokens:
        raise InputError("empty token chunk: a chunk needs at least one speech token")
    bad = [t for t in tokens if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer))
           or not 0 <= int(t) < VOCAB]
    if bad:
        raise InputError(f"speech token ids must be ints in [0, {VOCAB}); got {bad[:5]}")
    return torch.tensor([tokens], dtype=torch.int32, device=device)


def _check_prompt(prompt_tokens, prompt_mels, spk, device) -> None:
    from ..errors import InputError
    for name, t in (("prompt_tokens", prompt_tokens), ("prompt_mels", prompt_mels), ("spk", spk)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a tensor")
        if t.device != device:
            raise InputError(f"{name} is on {t.device}; the model is on {device}")
    if prompt_tokens.dim() != 2 or prompt_tokens.shape[0] != 1 or prompt_tokens.dtype not in (torch.int32, torch.int64):
        raise InputError(f"prompt_tokens must be int32/int64 of shape (1, P); got {prompt_tokens.dtype} {tuple(prompt_tokens.shape)}")
    if prompt_tokens.numel() and not bool(((prompt_tokens >= 0) & (prompt_tokens < VOCAB)).all()):
        raise InputError(f"prompt_tokens must be ids in [0, {VOCAB})")
    if prompt_mels.dim() != 3 or prompt_mels.shape[0] != 1 or prompt_mels.shape[2] != 80:
        raise InputError(f"prompt_mels must be (1, 2P, 80); got {tuple(prompt_mels.shape)}")
    if prompt_mels.shape[1] != MEL_PER_TOKEN * prompt_tokens.shape[1]:
        raise InputError(f"prompt_mels has {prompt_mels.shape[1]} frames; {prompt_tokens.shape[1]} prompt tokens "
                         f"need exactly {MEL_PER_TOKEN * prompt_tokens.shape[1]}")
    if spk.shape != (1, 192):
        raise InputError(f"spk must be (1, 192); got {tuple(spk.shape)}")
    for name, t in (("prompt_mels", prompt_mels), ("spk", spk)):
        if not torch.isfinite(t).all():
            raise InputError(f"{name} holds NaN or inf")
