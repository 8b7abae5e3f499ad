"""Small streaming models in the generic step form (no adapter, no registration).

``CausalDecoder`` is the model issue "adopt in one line" tried: a causal conv whose left
context is cat-grown and trimmed to 8 frames, an attention K|V cache trimmed to 32
frames, and one ``torch.randn`` draw per chunk.  ``PromptDecoder`` attends over a prompt of
any length (a Fixed region whose size ``prompt_frames`` is read off the initial state) and a
cache kept in an over-provisioned module buffer it writes and returns a view of
(``Region.buffers``).
``factory`` is what ``cadence-fx verify --module tests.helpers.generic_models:factory`` loads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadence_fx import Clock, Region, Window, native_clock

CHANNELS, WIDTH, FRAMES = 16, 32, 4


def decoder_declaration(ctx_retain: int = 8, kv_retain: int = 32, **kw) -> dict:
    decl = dict(clocks=[Clock("frame", hz=50, stride=FRAMES)],
                regions=[Region("ctx", clock="frame", shape=(1, CHANNELS, "T"), axis=2,
                                retention=Window(retain=ctx_retain), doc="conv left context"),
                         Region("kv", clock="frame", shape=(2, WIDTH, "T"), axis=2,
                                retention=Window(retain=kv_retain), doc="K|V cache")],
                step="stream", initial_state="initial_state")
    decl.update(kw)
    return decl


@native_clock(**decoder_declaration())
class CausalDecoder(nn.Module):
    def __init__(self, kv_keep: int = 32):
        super().__init__()
        self.kv_keep = kv_keep
        self.conv = nn.Conv1d(CHANNELS, CHANNELS, 3)
        self.k, self.v, self.q = (nn.Linear(CHANNELS, WIDTH) for _ in range(3))
        self.out = nn.Linear(WIDTH, CHANNELS)

    def initial_state(self):
        device = self.out.weight.device
        return {"ctx": torch.zeros(1, CHANNELS, 0, device=device), "kv": torch.zeros(2, WIDTH, 0, device=device)}

    def stream(self, x, ctx, kv, last: bool = False):
        h = torch.cat([ctx, x], dim=2)
        y = self.conv(F.pad(h, (2, 0)))[:, :, -x.shape[2]:]
        ctx = h[:, :, -8:]
        t = y[0].transpose(0, 1)
        new = torch.stack([self.k(t), self.v(t)]).transpose(1, 2)
        kv = torch.cat([kv, new], dim=2)[:, :, -self.kv_keep:]
        att = torch.softmax(self.q(t) @ kv[0] / WIDTH ** 0.5, -1) @ kv[1].transpose(0, 1)
        y = self.out(att).transpose(0, 1)[None] + 0.01 * torch.randn(1, CHANNELS, x.shape[2], device=x.device)
        if last:
            y = y + 1.0  # the flush: runs eagerly, counted
        return y, ctx, kv


@native_clock(clocks=[Clock("frame", hz=50, stride=FRAMES)],
              regions=[Region("prompt", clock="frame", shape=(WIDTH, "prompt_frames"), doc="the voice prompt"),
                       Region("cache", clock="frame", shape=(WIDTH, "T"), axis=1, retention=Window(retain=8),
                              buffers=("buf",), doc="the last 8 frames, in an over-provisioned buffer")],
              step="stream", initial_state="initial_state")
class PromptDecoder(nn.Module):
    """A prompt of any length (``prompt_frames``, read off the initial state) and a cache kept
    as ``buf[:, :L]`` of a 64-frame buffer the step writes and returns a view of."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(CHANNELS, WIDTH)
        self.out = nn.Linear(WIDTH, CHANNELS)
        self.register_buffer("buf", torch.zeros(WIDTH, 64), persistent=False)

    def initial_state(self, prompt):
        return self.proj(prompt.transpose(0, 1)).transpose(0, 1), self.buf[:, :0]

    def stream(self, x, prompt, cache):
        new = self.proj(x.transpose(0, 1)).transpose(0, 1)  # [WIDTH, T]
        grown = torch.cat([cache, new], dim=1)
        length = grown.shape[1]
        self.buf[:, :length] = grown
        cache = self.buf[:, :length]
        keys = torch.cat([prompt, cache], dim=1)
        y = self.out(torch.softmax(new.transpose(0, 1) @ keys, -1) @ keys.transpose(0, 1)).transpose(0, 1)
        return {"y": y, "prompt": prompt, "cache": cache[:, -8:]}


def factory():
    """(model, inputs) for ``cadence-fx verify --module``: 24 chunks of a seeded CausalDecoder."""
    torch.manual_seed(0)
    model = CausalDecoder().eval()
    g = torch.Generator().manual_seed(1)
    return model, [torch.randn(1, CHANNELS, FRAMES, generator=g) for _ in range(24)]
