"""One stream of an optimized Token2Wav: ``Token2WavSession`` and its submitted chunks.

``OptimizedToken2Wav.open_session`` makes a session; its drop-in API
(``set_stream_cache``/``stream``) drives a default one through the same ``step_chunk``.
"""

from __future__ import annotations

import torch

from ...errors import InputError, SessionClosed
from ..frames import PendingChunk, StreamSession, on_stream
from .inputs import check_chunk, tokens_tensor


class Token2WavSession(StreamSession):
    """One stream of an ``OptimizedToken2Wav``: ``open_session(...)`` makes it.

    Per session: the arena (every carried region and scratch; rules R/Rc: copies of
    the carried state), the clock position (region extents), the counters and, under
    replay rules, the captured graphs (SR/SRc bind this arena by address) in their own
    memory pool, with the generator state they draw from; with shared captures
    (``shared_captures=True``) those are the capacity's, bound to its working arena, onto
    which this arena is copied for each chunk, one chunk at a time (``runtime.working``).  Shared by all sessions: the
    weights and the executables (one per prompt length), and the global random
    generators each draw starts from (HiFT draws noise, as upstream does), so a
    session's output depends on the generator state at each call; seed before each
    chunk for reproducible output.  ``snapshot``/``restore``, ``state``, ``stats``,
    ``arena_bytes`` and ``close``: ``StreamSession``.
    """

    _reopen = "OptimizedToken2Wav.open_session(prompt_tokens, prompt_mels, spk)"

    def __init__(self, session, spk: torch.Tensor, prompt_frames: int, device: torch.device,
                 stream=None, name: str = "session", keep_setup: bool = True):
        super().__init__(session, device, stream, name)
        self.spk, self.prompt_frames = spk, prompt_frames
        #: the state right after the prompt's set-up, for ``reset`` (a turn of the same voice)
        self._start = session.snapshot() if keep_setup else None

    @torch.inference_mode()
    def submit(self, tokens, last_chunk: bool = False) -> PendingChunk:
        """Launch one chunk on this session's stream (CUDA) and return without waiting.

        Every check (token ids, chunk length, closed session) runs on the host first:
        a rejected chunk launches nothing and leaves the state as it was.
        """
        self._check_open("stream")
        with on_stream(self.cuda_stream):
            self.last_speech = step_chunk(self.session, self.spk, self.device, tokens, last_chunk)
        return PendingChunk(self.last_speech, self.cuda_stream)

    def stream(self, tokens, last_chunk: bool = False, return_waveform: bool = False):
        """Upstream's ``Token2wav.stream`` for this session: PCM bytes (or the waveform)."""
        return self.submit(tokens, last_chunk).result(return_waveform)

    @torch.inference_mode()
    def reset(self) -> None:
        """A new turn of the same voice: the state right after the prompt's set-up again.

        What MiniCPM-o's duplex demo does at every turn (it restores a clone of the
        post-prompt caches): a device copy from the snapshot kept when the session was
        opened, into the same arena, so the captured graphs stay valid; the prompt's
        set-up and the capture do not run again.  Bit-exact against stock set up with the
        same prompt again.  Needs the session opened with ``keep_setup=True`` (the
        default; ``setup_bytes`` is what that snapshot holds).
        """
        self._check_open("reset")
        if self._start is None:
            raise InputError(f"{self.name} was opened with keep_setup=False, so there is no post-prompt state "
                             f"to reset to; open it with keep_setup=True (the default), or keep your own "
                             f"snapshot() after set-up and restore() it")
        self._restore_start()

    @property
    def setup_bytes(self) -> int:
        """Bytes of the post-prompt snapshot ``reset`` restores (0 with ``keep_setup=False``)."""
        return 0 if self._start is None else self._start.nbytes

    def __repr__(self) -> str:
        return f"Token2WavSession({self.name!r}, prompt_frames={self.prompt_frames}, closed={self.closed})"


def step_chunk(session, spk: torch.Tensor, device, tokens, last_chunk: bool) -> torch.Tensor:
    """Check a chunk on the host (``inputs``), then run one step of ``session``; the speech tensor."""
    if session.closed:
        raise SessionClosed("the stream is closed (close() was called); start a new one with "
                            "set_stream_cache(prompt_tokens, prompt_mels, spk) or open_session(...)")
    token = tokens_tensor(tokens, device)
    check_chunk(token.shape[1], last_chunk, session.state())
    return session.step({"token": token, "spk": spk}, last_chunk=last_chunk)["speech"]
