"""What a decoder hands back per call, and the streams of a frame codec.

``speech_out`` is the one conversion every family's ``stream`` ends with: the float
waveform [1, samples] as a numpy array, or upstream's int16 PCM bytes
(``cadence_fx.pcm.pcm_bytes``).  ``PendingChunk`` is a submitted chunk or frame whose
speech may still be computing on its session's CUDA stream.  ``FrameStream`` is the
``stream`` of a codec decoder that takes one frame per call and has no flush step
(Mimi: 8 codes; VibeVoice: one latent), shared by the stock and the optimized decoder
of that family; ``FrameSession`` is one more stream on an optimized frame decoder's
weights (``open_session``), which can run on a CUDA stream of its own.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import numpy as np
import torch

from ..errors import InputError, SessionClosed
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
        self._refuse_flush(last_chunk)
        self.last_speech = self._decode(self._frame(frame))
        return speech_out(self.last_speech, return_waveform)

    def _refuse_flush(self, last_chunk: bool) -> None:
        if last_chunk:
            raise InputError(f"last_chunk=True: {self.family} has no flush step (every frame is one decode); "
                             f"send every frame with last_chunk=False")


@contextlib.contextmanager
def on_stream(stream, wait: bool = True):
    """``torch.cuda.stream(stream)`` after ``stream`` waits for the caller's current stream
    (``wait``), or nothing for None (CPU, or no stream given).

    The wait is PyTorch's own rule for a tensor handed from one stream to another: what
    the caller made on its stream (a frame it sent, a snapshot it restores) is complete
    before this session's stream reads it.  An event, no host wait.  Reading a chunk's own
    result back needs none (``PendingChunk.result``)."""
    if stream is None:
        yield
        return
    caller = torch.cuda.current_stream(stream.device)
    if wait and caller != stream:
        stream.wait_stream(caller)
    with torch.cuda.stream(stream):
        yield


class PendingChunk:
    """One submitted chunk: its speech is on the device, maybe still being computed."""

    def __init__(self, speech: torch.Tensor, stream):
        self.speech, self._stream = speech, stream

    def result(self, return_waveform: bool = False):
        """Wait for the chunk (its own CUDA stream only) and return PCM bytes or the waveform."""
        with on_stream(self._stream, wait=False):
            return speech_out(self.speech, return_waveform)


class StreamSession:
    """What every family's session shares (``Token2WavSession``, ``FrameSession``): the
    runtime ``session`` (its arena, clock, counters, graphs), the CUDA ``stream`` its
    steps launch on, ``snapshot``/``restore``, ``state``, ``stats`` (still readable
    after ``close``), ``arena_bytes`` and an idempotent ``close``.  ``_start`` is the
    state ``reset()`` restores (None: the session keeps none); a subclass sets it and
    ``_reopen`` (how to open a new session, for the closed-session message)."""

    _reopen = "open_session()"

    def __init__(self, session, device: torch.device, stream=None, name: str = "session"):
        self.session, self.device, self.name = session, device, name
        self.cuda_stream = stream if device.type == "cuda" else None
        if self.cuda_stream is not None:
            self.cuda_stream.wait_stream(torch.cuda.current_stream(device))  # setup ran on the current stream
        self.last_speech: torch.Tensor | None = None
        self._final_stats: dict | None = None
        self._start = None

    @property
    def closed(self) -> bool:
        return self.session is None

    def _restore_start(self) -> None:
        with on_stream(self.cuda_stream):
            self.session.restore(self._start)
        self.last_speech = None

    def snapshot(self):
        """A copy of the carried state and the clock position (see ``restore``)."""
        self._check_open("snapshot")
        with on_stream(self.cuda_stream):
            return self.session.snapshot()

    def restore(self, snapshot) -> None:
        """Put back a ``snapshot()`` of this session or of another one of the same executable
        (in place: the captured graphs stay valid)."""
        self._check_open("restore")
        with on_stream(self.cuda_stream):
            self.session.restore(snapshot)
        self.last_speech = None

    @torch.inference_mode()  # as the family's steps run: the arena and the build's tensors are inference tensors
    def idle(self, seconds: float | None = None) -> list[int]:
        """Give the session time between chunks: a session whose graphs a background build
        is making captures, now, the catalog entries that landed, so that no chunk pays
        their capture (``runtime.pending.PendingSession.idle``; never waits for a build).
        Returns the entries captured (none for a session set up in the foreground)."""
        self._check_open("idle")
        with on_stream(self.cuda_stream):
            return self.session.idle(seconds)

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
                self.cuda_stream.synchronize()  # its arena (and inputs it holds) are freed next
            self._final_stats = self.session.stats()
            self.session.close()
            self.session, self.last_speech, self._start = None, None, None

    def _check_open(self, what: str) -> None:
        if self.session is None:
            raise SessionClosed(f"{self.name} is closed (close() was called): {what}() needs an open session; "
                                f"open a new one with {self._reopen}")


class FrameSession(StreamSession, FrameStream):
    """One stream of an optimized frame decoder (``OptimizedMimi``/``OptimizedVibeVoice``
    ``.open_session()``): its own arena, graphs and counters on the shared weights.

    ``stream(frame)`` as the drop-in's; ``submit(frame)`` launches on this session's CUDA
    stream (``stream=``) and returns a ``PendingChunk`` without waiting, so several
    sessions' replays overlap; ``reset()`` starts a new stream from the state it was
    opened with (a device copy into the same arena: graphs stay valid); the rest as
    ``StreamSession``.  Frame codecs draw no random numbers.
    """

    def __init__(self, session, family: str, to_frame: Callable[[Any], torch.Tensor],
                 step: Callable[[Any, torch.Tensor], torch.Tensor], device: torch.device,
                 stream=None, name: str = "session"):
        super().__init__(session, device, stream, name)
        self.family, self._to_frame, self._step = family, to_frame, step
        self._start = session.snapshot()  # what reset() restores

    def _frame(self, value) -> torch.Tensor:
        return self._to_frame(value)

    @torch.inference_mode()
    def submit(self, frame: Any, last_chunk: bool = False) -> PendingChunk:
        """Launch one frame on this session's stream (CUDA) and return without waiting.
        The frame is checked on the host first: a bad one launches nothing.

        The frame's device tensor is made on this session's stream, and a tensor of the
        caller's that is used as it is (a VibeVoice latent on the device already) is marked
        as used by that stream: freed, either goes back to the allocator only once this
        stream is past it.  (Made on the caller's stream and freed when this returns, the
        next session's frame could take its memory before this stream had read it: a
        Mimi frame read as garbage codes on the H200, 2026-12-02.)"""
        self._check_open("submit")
        self._refuse_flush(last_chunk)
        with on_stream(self.cuda_stream):
            frame = self._frame(frame)
            if self.cuda_stream is not None and frame.is_cuda:
                frame.record_stream(self.cuda_stream)
            self.last_speech = self._step(self.session, frame)
        return PendingChunk(self.last_speech, self.cuda_stream)

    def stream(self, frame: Any, last_chunk: bool = False, return_waveform: bool = False):
        return self.submit(frame, last_chunk).result(return_waveform)

    @torch.inference_mode()
    def reset(self) -> None:
        """A new stream on this session: the state it was opened with, in place."""
        self._check_open("reset")
        self._restore_start()

    def __repr__(self) -> str:
        return f"FrameSession({self.family}, {self.name!r}, closed={self.closed})"
