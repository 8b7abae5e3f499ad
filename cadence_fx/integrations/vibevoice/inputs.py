"""What VibeVoice's decoders accept per call: one latent frame, checked before it runs.

``latent_tensor`` is the one contract of ``stream`` (stock and optimized): a dense
tensor [1, 64, 1] (or [1, 1, 64], as VibeVoice's ``generate`` passes it) of the
decoder's dtype, on its device.  Values are not checked: any float is a latent, and a
NaN decodes as upstream decodes it.  Everything else (not a tensor, another shape,
dtype or device, a sparse tensor) is an ``InputError`` before anything runs.
"""

from __future__ import annotations

import torch

from ...errors import InputError

VAE_DIM = 64  # latent channels (released config)


def latent_tensor(latent, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One latent frame as ``decode`` takes it: [1, 64, 1] (or [1, 1, 64]), of the decoder's
    dtype and device -> [1, 64, 1] (contiguous)."""
    if not isinstance(latent, torch.Tensor):
        raise InputError(f"a VibeVoice latent is a tensor [1, {VAE_DIM}, 1]; got {type(latent).__name__}")
    if latent.layout != torch.strided:
        raise InputError(f"the latent is a {latent.layout} tensor; send a dense (strided) [1, {VAE_DIM}, 1]")
    if tuple(latent.shape) not in ((1, VAE_DIM, 1), (1, 1, VAE_DIM)):
        raise InputError(f"one VibeVoice step decodes one latent frame [1, {VAE_DIM}, 1] (or [1, 1, {VAE_DIM}]); "
                         f"got shape {tuple(latent.shape)}")
    if latent.dtype != dtype:
        raise InputError(f"the latent is {latent.dtype}; this decoder runs {dtype}: cast it first")
    if latent.device != device:
        raise InputError(f"the latent is on {latent.device}; this decoder runs on {device}: move it first")
    return latent.reshape(1, VAE_DIM, 1).contiguous()
