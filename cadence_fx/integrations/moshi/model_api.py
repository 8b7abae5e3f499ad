"""``optimize(mimi)`` on moshi's own ``MimiModel``: the object users already hold, its API kept.

    mimi = cadence_fx.optimize(mimi)               # moshi.models.compression.MimiModel
    with mimi.streaming(1):                        # or mimi.streaming_forever(1), as moshi.server does
        pcm = mimi.decode(codes)                   # codes [1, 8, 1] -> [1, 1, 1920], moshi's own bits

Inside ``streaming(1)`` (or after ``streaming_forever(1)``) each ``decode`` of one frame
runs the optimized step (``OptimizedMimi``: the traced decode over one arena);
``reset_streaming()`` or a new ``streaming(1)`` starts a new stream.  Everything else
(``encode``, a decode outside streaming, attributes such as ``sample_rate``) is the
upstream object's own, and the upstream object itself is left as it was given: its
streaming state is its own (entered beside ours, so ``encode`` streams as it would).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ...errors import CadenceError, InputError
from .dropin import OptimizedMimi
from .inputs import N_Q
from .stock import MimiDecoder


class OptimizedMimiModel:
    """moshi's ``MimiModel`` with its streaming decode optimized (see the module docstring)."""

    def __init__(self, mimi, rules: str = "S", progress=None, cache=True):
        if mimi.is_streaming:
            raise CadenceError("optimize(mimi) needs a MimiModel that is not streaming: call it before "
                               "mimi.streaming(...) / streaming_forever(...), or after leaving it")
        if getattr(mimi.quantizer, "num_codebooks", N_Q) != N_Q:
            raise CadenceError(f"the optimized Mimi decodes {N_Q} codebooks (as Moshi runs it); this MimiModel "
                               f"uses {mimi.quantizer.num_codebooks}: call mimi.set_num_codebooks({N_Q}) first")
        stock = MimiDecoder(mimi)  # moshi's own warm-up decode, then the stream is given back
        mimi._stop_streaming()
        self.mimi = mimi
        self.optimized = OptimizedMimi(stock, rules, progress, cache)
        self._streaming = False

    @property
    def is_streaming(self) -> bool:
        return self._streaming

    @contextlib.contextmanager
    def streaming(self, batch_size: int) -> Iterator[None]:
        """A new stream for the block: its decodes run the optimized step."""
        self._check_batch(batch_size)
        with self.mimi.streaming(batch_size):
            self.optimized.reset()
            self._streaming = True
            try:
                yield
            finally:
                self._streaming = False

    def streaming_forever(self, batch_size: int) -> None:
        """Start a stream that lasts until ``reset_streaming`` (moshi.server's way)."""
        self._check_batch(batch_size)
        self.mimi.streaming_forever(batch_size)
        self.optimized.reset()
        self._streaming = True

    def reset_streaming(self) -> None:
        """A new stream (the upstream object's streaming state too)."""
        self.mimi.reset_streaming()
        self.optimized.reset()

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """moshi's ``decode``: [B, 8, T] codes -> [B, 1, T * 1920] samples.  Streaming: one
        frame per call ([1, 8, 1]), run by the optimized step."""
        if not self._streaming:
            return self.mimi.decode(codes)
        if not isinstance(codes, torch.Tensor) or codes.dim() != 3 or tuple(codes.shape) != (1, N_Q, 1):
            shape = tuple(codes.shape) if isinstance(codes, torch.Tensor) else type(codes).__name__
            raise InputError(f"streaming decode takes one frame of codes [1, {N_Q}, 1] per call (moshi.server's "
                             f"cadence); got {shape}: send the frames one at a time")
        return self.optimized._decode(self.optimized._frame(codes))[None]

    def stats(self) -> dict:
        """The current stream's counters (``Session.stats``)."""
        return self.optimized.stats()

    def state(self) -> dict[str, torch.Tensor]:
        return self.optimized.state()

    def __getattr__(self, name: str) -> Any:
        if name in ("mimi", "optimized"):  # not set yet: __init__ failed part-way
            raise AttributeError(name)
        return getattr(self.mimi, name)

    @staticmethod
    def _check_batch(batch_size: int) -> None:
        if batch_size != 1:
            raise CadenceError(f"the optimized Mimi streams one conversation per stream (batch_size=1), as "
                               f"moshi.server runs it; got batch_size={batch_size}: open one stream per "
                               f"conversation")
