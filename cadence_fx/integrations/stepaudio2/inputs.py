"""What the optimized Token2Wav accepts: one contract per entry point, checked on the host.

Every check runs before any work or tracing, and accepts exactly what upstream's stream
runs *and can continue from*; the rest is an ``InputError`` that names the argument and
says what to send.  Stock fails on what is refused here, at the call or one call later:

* a chunk that is not last with fewer than 5 tokens: with 4, the encoder's pre-lookahead
  conv (kernel 4) yields one frame, its carry keeps 1 frame instead of 2, and upstream's
  next ``forward_chunk`` asserts on the 5-frame ``conformer_cnn_cache``; with 3 or fewer
  the conv has no output at all;
* a first chunk that is not last with fewer than 7 tokens: under 8 mel frames the
  vocoder's crossfade tail holds under 3,840 samples, and the next chunk's
  ``fade_in_out`` fails on the size mismatch;
* any chunk after a chunk that left either carry short (a 1-token flush; a first flush of
  under 4 tokens): a flush may be that short, since nothing need follow it;
* a chunk or prompt that grows the attention caches past upstream's 1,000-frame buffers;
* a prompt of fewer than 2 tokens (its pre-lookahead carry is short, as above);
* prompt mels or a speaker vector that is not float32 (or the model's float16), or not
  dense, finite and of the right shape.
"""

from __future__ import annotations

from typing import Mapping

import torch

from ...errors import InputError
from ..ids import host_ids
from .stock import (CHUNK_TOKENS, LOOKAHEAD_TOKENS, MEL_CACHE_LEN, MEL_PER_TOKEN, PRE_LOOKAHEAD_CARRY,
                    SOURCE_CACHE_LEN, UP_CARRY, VOCAB)

#: mel frames upstream's fixed attention buffers hold (``att_cache_buffer[..., :1000, :]``)
STOCK_CACHE_FRAMES = 1000
#: the shortest chunk that is not last: its lookahead plus the pre-lookahead conv's carry
MIN_CHUNK_TOKENS = LOOKAHEAD_TOKENS + PRE_LOOKAHEAD_CARRY
#: the shortest first chunk that is not last: enough mel frames for the vocoder's carry
MIN_FIRST_CHUNK_TOKENS = LOOKAHEAD_TOKENS + -(-MEL_CACHE_LEN // MEL_PER_TOKEN)
MIN_PROMPT_TOKENS = PRE_LOOKAHEAD_CARRY
#: the longest prompt upstream streams: its mel frames leave room for the shortest chunk (a 1-token flush)
MAX_PROMPT_TOKENS = (STOCK_CACHE_FRAMES - MEL_PER_TOKEN) // MEL_PER_TOKEN
SPK_DIM, MEL_BINS = 192, 80
SEND_TOKENS = (f"a list of ints in [0, {VOCAB}) or an integer tensor of shape (n,) or (1, n), "
               f"{CHUNK_TOKENS} + {LOOKAHEAD_TOKENS} per chunk")
NEW_STREAM = "start a new stream with set_stream_cache(prompt_tokens, prompt_mels, spk) or open_session(...)"


def tokens_tensor(tokens, device) -> torch.Tensor:
    """Upstream's ``torch.tensor([tokens], dtype=int32)``, with the checks a server needs.

    ``tokens``: a sequence of int ids, or a tensor of any integer dtype on any device with
    data, strided or not, of shape (n,) or (1, n) (``ids.host_ids``: read out to the host,
    a copy, so the caller may reuse or change it afterwards).  -> int32 [1, n] on ``device``.
    """
    ids, shape = host_ids(tokens, "speech tokens", VOCAB, SEND_TOKENS)
    if isinstance(tokens, torch.Tensor) and not (len(shape) == 1 or (len(shape) == 2 and shape[0] == 1)):
        raise InputError(f"a speech token tensor must be of shape (n,) or (1, n); got {shape}")
    if not ids:
        raise InputError("empty token chunk: a chunk needs at least one speech token")
    return torch.tensor([ids], dtype=torch.int32, device=device)


def check_chunk(n_tokens: int, last_chunk: bool, state: Mapping[str, torch.Tensor]) -> None:
    """The chunk lengths upstream runs and can continue from, given the stream's ``state``.

    The catalog holds 25 + 3 tokens (not last); any other accepted length runs eagerly,
    bit exact, counted as a fallback (and the next steps too, until the caches are
    trimmed back onto the catalog).  A flush (``last_chunk``) of any length >= 1 runs;
    a chunk that is not last must leave the stream able to take the next one.
    """
    cnn_frames = state["conformer_cnn_cache"].shape[2]
    tail = state["hift_speech"].shape[1]
    if cnn_frames != PRE_LOOKAHEAD_CARRY + UP_CARRY or tail not in (0, SOURCE_CACHE_LEN):
        short = (f"the encoder's conv carry {cnn_frames} frames (upstream needs {PRE_LOOKAHEAD_CARRY + UP_CARRY})"
                 if cnn_frames != PRE_LOOKAHEAD_CARRY + UP_CARRY else
                 f"the vocoder's crossfade tail {tail} samples (upstream needs {SOURCE_CACHE_LEN})")
        raise InputError(f"this stream cannot take another chunk: its last chunk (a short flush) left {short}, "
                         f"and upstream fails on the next chunk; {NEW_STREAM}")
    if not last_chunk and n_tokens < MIN_CHUNK_TOKENS:
        raise InputError(f"a chunk that is not last needs at least {MIN_CHUNK_TOKENS} tokens ({PRE_LOOKAHEAD_CARRY} "
                         f"past its {LOOKAHEAD_TOKENS} lookahead tokens, the encoder's conv carry); got {n_tokens}: "
                         f"upstream cannot run the chunk after it. Send {CHUNK_TOKENS} + {LOOKAHEAD_TOKENS}, "
                         f"or pass last_chunk=True")
    mel = state["hift_mel"].shape[2] + MEL_PER_TOKEN * (n_tokens - LOOKAHEAD_TOKENS)
    if not last_chunk and mel < MEL_CACHE_LEN:
        raise InputError(f"the first chunk that is not last needs at least {MIN_FIRST_CHUNK_TOKENS} tokens "
                         f"({MEL_CACHE_LEN} mel frames past the lookahead, the vocoder's carry); got {n_tokens}: "
                         f"upstream cannot crossfade the chunk after it. Send {CHUNK_TOKENS} + "
                         f"{LOOKAHEAD_TOKENS}, or pass last_chunk=True")
    cache_frames = state["estimator_att_cache"].shape[4]
    new_frames = MEL_PER_TOKEN * (n_tokens if last_chunk else n_tokens - LOOKAHEAD_TOKENS)
    if cache_frames + new_frames > STOCK_CACHE_FRAMES:
        most = (STOCK_CACHE_FRAMES - cache_frames) // MEL_PER_TOKEN + (0 if last_chunk else LOOKAHEAD_TOKENS)
        raise InputError(f"a chunk of {n_tokens} tokens would grow the attention caches from {cache_frames} to "
                         f"{cache_frames + new_frames} mel frames; upstream's buffers hold {STOCK_CACHE_FRAMES} "
                         f"(stock fails on it): send at most {most} tokens in this chunk")


def check_prompt(prompt_tokens, prompt_mels, spk, device: torch.device, dtype: torch.dtype) -> None:
    """``set_stream_cache``/``open_session``'s arguments, as upstream's ``setup_cache`` takes them.

    prompt_tokens: int32/int64 [1, P], 2 <= P <= 499, ids in [0, 6561); prompt_mels:
    [1, 2P, 80]; spk: [1, 192]; mels and spk float32 (or ``dtype``, the flow's), dense,
    finite, all three on the model's ``device``.
    """
    floats = sorted({torch.float32, dtype}, key=str)
    for name, t in (("prompt_tokens", prompt_tokens), ("prompt_mels", prompt_mels), ("spk", spk)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise InputError(f"{name} is a {t.layout} tensor; send a dense (strided) one")
        if t.device != device:
            raise InputError(f"{name} is on {t.device}; the model is on {device}: move it there first")
    if prompt_tokens.dim() != 2 or prompt_tokens.shape[0] != 1 or prompt_tokens.dtype not in (torch.int32, torch.int64):
        raise InputError(f"prompt_tokens must be int32/int64 of shape (1, P); got {prompt_tokens.dtype} {tuple(prompt_tokens.shape)}")
    n = prompt_tokens.shape[1]
    most = MAX_PROMPT_TOKENS
    if not MIN_PROMPT_TOKENS <= n <= most:
        raise InputError(f"prompt_tokens holds {n} tokens; upstream streams from {MIN_PROMPT_TOKENS} to {most} "
                         f"(fewer leave the encoder's conv carry short, more fill its {STOCK_CACHE_FRAMES}-frame "
                         f"attention buffers): send a prompt of {MIN_PROMPT_TOKENS}..{most} tokens")
    if not bool(((prompt_tokens >= 0) & (prompt_tokens < VOCAB)).all()):
        raise InputError(f"prompt_tokens must be ids in [0, {VOCAB})")
    if prompt_mels.dim() != 3 or prompt_mels.shape[0] != 1 or prompt_mels.shape[2] != MEL_BINS:
        raise InputError(f"prompt_mels must be (1, 2P, {MEL_BINS}); got {tuple(prompt_mels.shape)}")
    if prompt_mels.shape[1] != MEL_PER_TOKEN * n:
        raise InputError(f"prompt_mels has {prompt_mels.shape[1]} frames; {n} prompt tokens "
                         f"need exactly {MEL_PER_TOKEN * n}")
    if tuple(spk.shape) != (1, SPK_DIM):
        raise InputError(f"spk must be (1, {SPK_DIM}); got {tuple(spk.shape)}")
    for name, t in (("prompt_mels", prompt_mels), ("spk", spk)):
        if t.dtype not in floats:
            raise InputError(f"{name} is {t.dtype}; the flow takes {' or '.join(map(str, floats))}: cast it first")
        if not torch.isfinite(t).all():
            raise InputError(f"{name} holds NaN or inf")
