"""Moshi's Mimi decoder (``moshi==0.2.13``), one 80 ms frame per streaming step.

``MimiModel`` at the released configuration (``moshi.models.loaders``' config dicts;
8 codebooks, as ``CheckpointInfo.get_mimi`` builds it for Moshi).  Clocks: frame
12.5 Hz (1 code frame per step), latent 25 Hz (2 decoder-transformer steps per frame),
sample 24 kHz (1,920 samples per step).

moshi keeps streaming state in ``_streaming_state`` dataclasses on its modules (not
buffers) and updates it in place (``previous[:] = ...``, ``scatter_`` into the ring).
The step points those fields at the declared state tensors, so the traced graph
updates its state placeholders in place and ``state_rewrite`` makes them arena
views.  Every offset moshi computes with is a device tensor; the host-side
``offset_cpu`` counters are read only by weights-per-step layers, which Mimi has
none of (``check_declaration``), so every frame traces the same graph: one catalog
entry, before and after the ring wraps (250 slots, 2 per frame: frame 125).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from typing import Any, Mapping

import torch

from ...annotations import Clock, Fixed, Region, Ring, native_clock
from ..frames import FrameStream
from ..upstream import import_submodule, module_constants
from .inputs import CARDINALITY, N_Q, codes_tensor

UPSTREAM_DISTRIBUTION = "moshi"
UPSTREAM_VERSION = "0.2.13"  # the version these declarations and tests were checked against
FRAME_SAMPLES = 1920  # 24 kHz / 12.5 Hz
LAYERS, CONTEXT = 8, 250  # decoder transformer layers, RingKVCache capacity (released config)
DIMS = {"layers": LAYERS, "heads": 8, "head_dim": 64, "streaming_states": 39}
ATTN = "decoder_transformer.transformer.layers.{}.self_attn"
DECODE_PATH = ("upsample", "decoder_transformer", "decoder")  # top-level modules a decode runs
#: conv carries on the decode path: region, module, state field, shape (released config)
CONV_CARRIES = (
    ("upsample_partial", "upsample.convtr", "partial", (1, 512, 2)),
    ("dec_in_previous", "decoder.model.0", "previous", (1, 512, 6)),
    ("dec_up1_partial", "decoder.model.2", "partial", (1, 512, 8)),
    ("dec_res1_previous", "decoder.model.3.block.1", "previous", (1, 512, 2)),
    ("dec_up2_partial", "decoder.model.5", "partial", (1, 256, 6)),
    ("dec_res2_previous", "decoder.model.6.block.1", "previous", (1, 256, 2)),
    ("dec_up3_partial", "decoder.model.8", "partial", (1, 128, 5)),
    ("dec_res3_previous", "decoder.model.9.block.1", "previous", (1, 128, 2)),
    ("dec_up4_partial", "decoder.model.11", "partial", (1, 64, 4)),
    ("dec_res4_previous", "decoder.model.12.block.1", "previous", (1, 64, 2)),
    ("dec_out_previous", "decoder.model.14", "previous", (1, 64, 2)),
)

MIMI_DECLARATION = dict(
    clocks=[Clock("frame", hz=12.5, stride=1), Clock("latent", hz=25, stride=2),
            Clock("sample", hz=24000, stride=FRAME_SAMPLES)],
    regions=[
        Region("kv", clock="latent", shape=("layers", 2, 1, "heads", "T", "head_dim"), axis=4,
               retention=Ring(CONTEXT), doc="RingKVCache.cache (K|V) of each decoder-transformer layer"),
        Region("kv_end", clock="latent", shape=("layers", 1), dtype="int64",
               doc="RingKVCache.end_offset per layer: where the ring writes next (mod 250)"),
        Region("attn_offset", clock="latent", shape=("layers", 1), dtype="int64",
               doc="attention offset per layer: rope phase and causal mask"),
        Region("offsets", clock="latent", shape=(1,), dtype="int64", doc="StreamingTransformer offsets"),
        Region("exec_mask", clock="frame", shape=("streaming_states", 1), dtype="bool",
               doc="State.exec_mask of every streaming module on the decode path (read, never written)"),
        *[Region(name, clock="sample", shape=shape, retention=Fixed(), doc=f"{module}: {field}")
          for name, module, field, shape in CONV_CARRIES],
    ],
    step="stream",
    unit="one 80 ms frame: codes [1, 8, 1] -> 1,920 samples at 24 kHz",
)
CARRIED = tuple(r.name for r in MIMI_DECLARATION["regions"])


@functools.lru_cache(maxsize=None)
def upstream_modules() -> dict[str, Any]:
    """moshi's classes and config, without ``moshi/__init__`` or ``moshi/models/__init__``."""
    comp = import_submodule("moshi", "models.compression", bare=("models",))
    modules = import_submodule("moshi", "modules")
    compile_ = import_submodule("moshi", "utils.compile")
    return {"MimiModel": comp.MimiModel, "modules": modules, "quantization": import_submodule("moshi", "quantization"),
            "StreamingModule": import_submodule("moshi", "modules.streaming").StreamingModule,
            "config": module_constants("moshi", "models.loaders",
                                       ("_seanet_kwargs", "_quantizer_kwargs", "_transformer_kwargs")),
            # moshi's own switches: no torch.compile'd rope, no CUDAGraphed wrappers (eager, B0)
            "eager": lambda: _entered(compile_.no_compile(), compile_.no_cuda_graph()),
            "no_compile": compile_.no_compile}


def _entered(*contexts) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for c in contexts:
        stack.enter_context(c)
    return stack


def build_mimi(seed: int = 0, checkpoint: str | None = None):
    """``MimiModel`` as ``loaders.get_mimi`` builds it (fp32, CPU, eval, 8 codebooks).

    Weights: ``checkpoint`` (moshi's ``.safetensors`` or a ``torch.save``d state dict)
    or seeded random.  The codebooks are EMA buffers whose ``embedding_sum`` starts at
    zero (every code would decode to one latent): seeded weights fill them too.
    """
    up = upstream_modules()
    cfg, mods = up["config"], up["modules"]
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        encoder = mods.SEANetEncoder(**cfg["_seanet_kwargs"])
        mimi = up["MimiModel"](
            encoder, mods.SEANetDecoder(**cfg["_seanet_kwargs"]),
            up["quantization"].SplitResidualVectorQuantizer(**cfg["_quantizer_kwargs"]),
            channels=1, sample_rate=24000, frame_rate=12.5, encoder_frame_rate=24000 / encoder.hop_length,
            causal=True, resample_method="conv",
            encoder_transformer=mods.transformer.ProjectedTransformer(device="cpu", **cfg["_transformer_kwargs"]),
            decoder_transformer=mods.transformer.ProjectedTransformer(device="cpu", **cfg["_transformer_kwargs"]),
        ).eval()
        if checkpoint is None:
            with torch.no_grad():
                for name, buf in mimi.named_buffers():
                    if name.endswith("embedding_sum"):
                        buf.normal_()
        elif checkpoint.endswith(".safetensors"):
            from safetensors.torch import load_file  # only for moshi's released checkpoint
            mimi.load_state_dict(load_file(checkpoint))
        else:
            mimi.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
    finally:
        torch.random.set_rng_state(gen_state)
    mimi.set_num_codebooks(N_Q)
    return mimi


# ------------------------------------------------ where moshi keeps the decode's state
def decode_streaming_modules(mimi) -> list[tuple[str, Any]]:
    """(name, module) of every streaming module a decode touches, in module order."""
    streaming = upstream_modules()["StreamingModule"]
    return [(n, m) for n, m in mimi.named_modules()
            if isinstance(m, streaming) and (n == "" or n.split(".")[0] in DECODE_PATH)]


def _state_fields(mimi) -> dict[str, tuple | list]:
    """Region -> the (dataclass, field) it backs, or a list of them (one per leading index)."""
    states = {n: m._streaming_state for n, m in decode_streaming_modules(mimi)}
    attn = [states[ATTN.format(i)] for i in range(LAYERS)]
    return {"kv": [(a.kv_cache, "cache") for a in attn], "kv_end": [(a.kv_cache, "end_offset") for a in attn],
            "attn_offset": [(a, "offset") for a in attn],
            "offsets": (states["decoder_transformer.transformer"], "offsets"),
            "exec_mask": [(s, "exec_mask") for s in states.values()],
            **{name: (states[module], field) for name, module, field, _ in CONV_CARRIES}}


def bind_state(mimi, state: Mapping[str, torch.Tensor]) -> None:
    """Point moshi's state dataclasses at ``state`` (region name -> tensor) and its slices."""
    for region, target in _state_fields(mimi).items():
        for i, (obj, field) in enumerate(target if isinstance(target, list) else [target]):
            setattr(obj, field, state[region][i] if isinstance(target, list) else state[region])


def read_state(mimi) -> dict[str, torch.Tensor]:
    """The declared regions as moshi holds them (per-layer tensors stacked: copies)."""
    return {region: torch.stack([getattr(*t) for t in target]) if isinstance(target, list) else getattr(*target)
            for region, target in _state_fields(mimi).items()}


def streaming_twin(mimi):
    """A module tree sharing ``mimi``'s parameters and buffers but not its streaming
    state: the decode path gets its own, moshi-initialised, state dataclasses."""
    streaming = upstream_modules()["StreamingModule"]
    memo: dict[int, Any] = {}

    def twin(m):
        if id(m) not in memo:
            c = memo[id(m)] = copy.copy(m)
            c._modules = {k: None if v is None else twin(v) for k, v in m._modules.items()}
            c._parameters, c._buffers = dict(m._parameters), dict(m._buffers)
            if isinstance(m, streaming):
                c._streaming_state, c._cached_children = None, None
        return memo[id(m)]
    out = twin(mimi)
    for _, m in decode_streaming_modules(out):
        m._streaming_state = m._init_streaming_state(1)
    return out


def synthetic_codes(n_frames: int, seed: int = 0) -> list[tuple[list[int], bool]]:
    """``n_frames`` seeded frames of 8 codes, as (codes, last) pairs."""
    codes = torch.randint(0, CARDINALITY, (n_frames, N_Q), generator=torch.Generator().manual_seed(30_000 + seed))
    return [(row.tolist(), False) for row in codes]


class MimiStream(FrameStream):
    """What the stock and optimized decoders share: one frame of 8 codes in, 1,920 samples out."""

    family = "Mimi"

    def _frame(self, codes) -> torch.Tensor:
        return codes_tensor(codes, self.device)  # [1, 8, 1] int64


@native_clock(**MIMI_DECLARATION)
class MimiDecoder(MimiStream):
    """The stock streaming decoder: ``mimi.decode`` inside ``mimi.streaming(1)``, a frame a call.

    ``stream(codes)`` takes 8 codes and returns 1,920 samples (int16 PCM bytes, or
    the float waveform with ``return_waveform``); ``reset()`` starts a new stream.
    """

    def __init__(self, mimi):
        self.mimi, self._eager = mimi, upstream_modules()["eager"]
        self.reset()

    @property
    def device(self) -> torch.device:
        return next(self.mimi.parameters()).device

    def reset(self) -> None:
        if self.mimi.is_streaming:
            self.mimi._stop_streaming()
        self.mimi.streaming_forever(1)
        with torch.no_grad(), self._eager():  # the first decode registers the codebooks' _embedding
            self.mimi.quantizer.decode(torch.zeros(1, N_Q, 1, dtype=torch.int64, device=self.device))

    @torch.no_grad()
    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        with self._eager():
            return self.mimi.decode(codes)[0]

    def state(self) -> dict[str, torch.Tensor]:
        return read_state(self.mimi)


#: what moshi's CUDA graphs cover in ``MimiModel.decode`` (``_MimiState`` field -> module),
#: and what ``decode`` runs eagerly between them
VENDOR_GRAPHED = {"graphed_tr_dec": "decoder_transformer", "graphed_decoder": "decoder"}
VENDOR_EAGER = ("quantizer.decode", "upsample")


class VendorMimi(MimiDecoder):
    """moshi's own fast path, as ``moshi.server`` runs Mimi: ``mimi.decode`` inside
    ``streaming_forever(1)`` with moshi's switches at their defaults (a benchmark
    control, not the oracle: that is ``MimiDecoder``).

    On CUDA, ``MimiModel._init_streaming_state`` wraps ``decoder_transformer`` and
    ``decoder`` (SEANet) in ``CUDAGraphed``: each runs eagerly on its first call and is
    captured on its second, then replayed (its tensor arguments copied into static
    inputs).  ``decode`` runs the quantizer's decode and the upsample eagerly between
    them.  moshi's ``torch_compile_lazy`` also compiles ``apply_rope`` on CUDA;
    ``compile=False`` keeps it eager (moshi's ``no_compile()``: its graphs only).  On
    the CPU moshi disables both, so this is the stock eager path.
    """

    def __init__(self, mimi, compile: bool = True):
        self.compile = compile
        self.graph_calls = {"calls": 0, "replays": 0}
        super().__init__(mimi)

    def reset(self) -> None:
        super().reset()  # a fresh _MimiState: new CUDAGraphed wrappers, captured again
        state = self.mimi._streaming_state
        for field in VENDOR_GRAPHED:
            setattr(state, field, _CountedGraphed(getattr(state, field), self.graph_calls))

    @torch.no_grad()
    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        with contextlib.nullcontext() if self.compile else upstream_modules()["no_compile"]():
            return self.mimi.decode(codes)[0]


class _CountedGraphed:
    """Stands in for one of moshi's ``CUDAGraphed`` wrappers; counts calls and replays."""

    def __init__(self, graphed, counts: dict[str, int]):
        self.graphed, self.counts = graphed, counts

    def __call__(self, *args):
        self.counts["calls"] += 1
        self.counts["replays"] += self.graphed._graph is not None  # captured before this call: a replay
        return self.graphed(*args)
