"""PCM as the upstream families write it: float waveform in [-1, 1] -> int16 bytes."""

from __future__ import annotations

import numpy as np


def pcm_bytes(wave: np.ndarray) -> bytes:
    """Clip to [-1, 1], scale by 32767, int16 little-endian (Token2Wav's, Mimi's and
    VibeVoice's servers all write this)."""
    return (np.clip(wave, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
