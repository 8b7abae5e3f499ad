"""A synthetic stateless codec decoder shaped like Freeze-Omni's TiCodec tail.

Freeze-Omni decodes speech tokens to audio in chunks of 40 tokens with a 10-token
right lookahead and up to 10 tokens of left context: the decoder (stateless) runs on
the whole window ``[left (0 or 10)] + [40 new] + [10 lookahead]`` (50 tokens at the
first step, then 60) and the waveform is cropped to the new chunk's samples,
``wav[:, left * SPT : -LOOKAHEAD * SPT]``.  The only carried state is the left
context, the last 10 of the 40 new tokens: ``ChunkPad(chunk=40, pad=10)``, K = 2
(the paper's Table 3 Freeze-Omni row).

The real TiCodec runs 600 samples per token; this one runs ``SPT = 6`` and a few
channels so a step takes well under a millisecond on CPU.  Pure torch: the real
Freeze-Omni package is not installable here.

* ``ChunkPadDecoder``: embedding + two Conv1d over tokens, ConvTranspose1d upsampling
  by ``SPT``, one Conv1d over samples; seeded random weights (``make_decoder``).
* ``decode_step(decoder, inputs, state, last=False)``: the stock streaming step.
  ``inputs["tokens"]`` is ``[1, 50]`` (40 new + 10 lookahead); with ``last=True``
  (the final flush) it is ``[1, n]``, all new, nothing cropped on the right.
* ``ChunkPadAdapter``: its ``StreamingAdapter``; ``open_session`` starts a ``Session``
  as ``tests/toy_models.py`` does.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from cadence_fx import ChunkPad, Clock, Region, get_declaration, native_clock
from cadence_fx.adapter import StreamingAdapter
from cadence_fx.step import StepSignature
from cadence_fx.plan import ScopeVerdict, TensorSpec
from cadence_fx.runtime.arena import Arena
from cadence_fx.runtime.session import Executable, Session

CHUNK = 40  # new tokens decoded per step
LOOKAHEAD = 10  # right lookahead tokens (decoded, cropped off)
PAD = 10  # left context tokens carried to the next step
WINDOW = CHUNK + LOOKAHEAD  # tokens per step's input: 50
SPT = 6  # samples per token (TiCodec: 600)
VOCAB = 64
EMBED = 8
HIDDEN = 16
SAMPLE_CH = 4


def chunkpad_declaration() -> dict[str, Any]:
    """``native_clock`` arguments: one token clock, one ChunkPad region (K = 2)."""
    return dict(
        clocks=[Clock("token", hz=40, stride=CHUNK)],
        regions=[
            Region("left_tokens", clock="token", shape=(1, "T"), axis=1, dtype="int64",
                   retention=ChunkPad(chunk=CHUNK, pad=PAD),
                   doc="left context: the last 10 of the previous chunk's 40 new tokens"),
        ],
        step="decode_step",
        unit="40 new tokens (+10 lookahead) -> 40 x SPT samples",
    )


@native_clock(**chunkpad_declaration())
class ChunkPadDecoder(nn.Module):
    """tokens [1, W] int64 -> waveform [1, W * SPT] float32 (stateless: padded convs)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMBED)
        self.conv1 = nn.Conv1d(EMBED, HIDDEN, 5, padding=2)
        self.conv2 = nn.Conv1d(HIDDEN, HIDDEN, 3, padding=1)
        self.up = nn.ConvTranspose1d(HIDDEN, SAMPLE_CH, kernel_size=SPT, stride=SPT)
        self.post = nn.Conv1d(SAMPLE_CH, 1, 7, padding=3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens).transpose(1, 2)  # [1, EMBED, W]
        h = torch.nn.functional.gelu(self.conv1(h))
        h = h + torch.tanh(self.conv2(h))
        s = torch.nn.functional.leaky_relu(self.up(h), 0.1)  # [1, SAMPLE_CH, W * SPT]
        return torch.tanh(self.post(s))[:, 0]  # [1, W * SPT]


def decode_step(decoder: ChunkPadDecoder, inputs: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor],
                last: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The stock streaming step.

    inputs: ``tokens`` [1, 50] (40 new + 10 lookahead), or [1, n] all new when ``last``;
    state: ``left_tokens`` [1, 0] at the first step, then [1, 10].
    Returns ``({"pcm": [1, new * SPT]}, {"left_tokens": [1, 10]})``.
    """
    tokens, left = inputs["tokens"], state["left_tokens"]
    n_left = left.shape[1]
    lookahead = 0 if last else LOOKAHEAD
    new = tokens.shape[1] - lookahead
    window = torch.cat([left, tokens], dim=1)  # [1, left + new + lookahead]
    wav = decoder(window)
    pcm = wav[:, n_left * SPT: wav.shape[1] - lookahead * SPT]  # the new tokens' samples only
    end = n_left + new
    next_left = window[:, max(end - PAD, 0): end].clone()  # the last 10 new tokens, a fresh tensor
    return {"pcm": pcm}, {"left_tokens": next_left}


def make_decoder(seed: int = 0) -> ChunkPadDecoder:
    """A seeded ChunkPadDecoder in eval mode (the caller's generator is left untouched)."""
    gen = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return ChunkPadDecoder().eval()
    finally:
        torch.random.set_rng_state(gen)


def token_stream(n_chunks: int, seed: int = 1, final: int = 23) -> list[torch.Tensor]:
    """``n_chunks`` step inputs [1, 50] overlapping as a real stream does (each chunk's
    10 lookahead tokens are the next chunk's first 10 new ones), then the final flush
    [1, final + 10]: the last lookahead plus ``final`` new tokens."""
    g = torch.Generator().manual_seed(seed)
    total = n_chunks * CHUNK + LOOKAHEAD + final
    seq = torch.randint(0, VOCAB, (1, total), generator=g)
    # Fresh row-major tensors: a plain slice of ``seq`` has strides (total, 1), which
    # torch calls contiguous but the admission gate (exact strides) refuses.
    fresh = dict(memory_format=torch.contiguous_format)
    chunks = [seq[:, i * CHUNK: i * CHUNK + WINDOW].clone(**fresh) for i in range(n_chunks)]
    return chunks + [seq[:, n_chunks * CHUNK:].clone(**fresh)]


class ChunkPadAdapter(StreamingAdapter):
    """ChunkPadDecoder + ``decode_step``: no buffers bound, one carried region."""

    signature = StepSignature(inputs=("tokens",), regions=("left_tokens",), outputs=("pcm",))

    def __init__(self, decoder: ChunkPadDecoder):
        self.decoder = decoder
        self.declaration = get_declaration(decoder)

    def dims(self) -> dict[str, int]:
        return {}

    @property
    def dtype(self) -> torch.dtype:
        return next(self.decoder.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.decoder.parameters()).device

    def input_specs(self) -> dict[str, TensorSpec]:
        return {"tokens": TensorSpec.contiguous((1, WINDOW), "int64", str(self.device))}

    def example_inputs(self) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        return {"tokens": torch.randint(0, VOCAB, (1, WINDOW), generator=g).to(self.device)}

    def bind(self, buffers: Mapping[str, torch.Tensor]):
        if buffers:
            raise ValueError(f"ChunkPadDecoder binds no buffers; got {sorted(buffers)}")

        def step(inputs, state, last: bool = False):
            return decode_step(self.decoder, inputs, state, last)
        return step

    def fallback(self, inputs, state, last: bool = False):
        """Any step eagerly (stateless: nothing to size)."""
        return decode_step(self.decoder, inputs, state, last)

    def callable_verdicts(self) -> tuple:
        return (ScopeVerdict("decode_step", "callable", "in",
                             "50 tokens per step (window 50, then 60): traced per catalog entry"),
                ScopeVerdict("decode_step(last=True)", "callable", "out",
                             "final flush of fewer tokens: runs eagerly, counted"))

    def stock_state_bytes(self) -> int:
        """The stock path carries only the left context: 10 int64 tokens."""
        return PAD * torch.empty((), dtype=torch.int64).element_size()

    def open_session(self, executable: Executable) -> Session:
        """A session on a fresh arena; the left context starts empty (extent 0)."""
        arena = Arena(executable.plan.layout, self.device)
        session = Session(executable, arena, self.fallback, {"left_tokens": 0})
        session.prepare_replay(self.example_inputs())  # rules R: capture on this arena (no-op for S)
        return session
