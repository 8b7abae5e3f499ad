"""What a decoder hands back per call, and the stream of a frame codec.

``speech_out`` is the one conversion every family's ``stream`` ends with: the float
waveform [1, samples] as a numpy array, or upstream's int16 PCM bytes
(``cadence_fx.pcm.pcm_bytes``).  ``FrameStream`` is the ``stream`` of a codec decoder
that takes one frame per call and has no flush step (Mimi: 8 codes; VibeVoice: one
latent), shared by the stock and the optimized decoder of that family.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..pcm import pcm_bytes


def speech_out(speech: torch.Tensor, return_waveform: bool) -> np.ndarray | bytes:
    """``speech`` [1, samples] as float32 numpy (``return_waveform``) or int16 PCM bytes.

    ``.float()`` is a no-op on float32 and widens a bfloat16/float16 waveform exactly."""
    wav = speech.float().cpu().numpy()
    return wav if return_waveform else pcm_bytes(wav)


class FrameStream:
    """``stream(frame)``: one frame in, its samples out (a subclass defines ``family``,
    ``_frame(value) -> tensor``, the family's input check, and ``_decode(tensor)``)."""

    family: str

    def stream(self, frame: Any, last_chunk: bool = False, return_waveform: bool = False):
        if last_chunk:
            raise InputError(f"last_chunk=True: {self.family} has no flush step (every frame is one decode); "
                             f"send every frame with last_chunk=False")
        self.last_speech = self._decode(self._frame(frame))
        return speech_out(self.last_speech, return_waveform)
