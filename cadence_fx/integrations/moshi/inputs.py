"""What Mimi's decoders accept per call: one frame of 8 codes, checked on the host.

``codes_tensor`` is the one contract of ``stream`` (stock and optimized): 8 integer
codes in [0, 2048) as a list, a numpy array or a tensor of shape (8,), (1, 8) or
decode's own [1, 8, 1] (batch, codebooks, frames), of any integer dtype, on any device
with data.  Everything else (None, a string, bool or float codes, a sparse or meta
tensor, a shape that only happens to hold 8 codes, such as [1, 1, 8]: 8 frames of one
codebook) is an ``InputError`` before anything runs.
"""

from __future__ import annotations

import torch

from ...errors import InputError
from ..ids import host_ids

N_Q, CARDINALITY = 8, 2048  # codebooks decoded, ids per codebook (released config)
FRAME_SHAPES = ((N_Q,), (1, N_Q), (1, N_Q, 1))
SEND_CODES = (f"one frame: {N_Q} integer codes in [0, {CARDINALITY}), as a list or a tensor of shape "
              f"{' or '.join(map(str, FRAME_SHAPES))}")


def codes_tensor(codes, device) -> torch.Tensor:
    """One frame of codes -> int64 [1, 8, 1] on ``device`` (an out-of-range id is a CUDA assert)."""
    ids, shape = host_ids(codes, "Mimi codes", CARDINALITY, SEND_CODES)
    if shape not in FRAME_SHAPES:
        raise InputError(f"Mimi codes of shape {shape}; send {SEND_CODES}")
    return torch.tensor(ids, dtype=torch.int64, device=device).reshape(1, N_Q, 1)
