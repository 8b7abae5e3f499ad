"""The optimized side of a one-stream decoder: an executable and one session at a time.

A subclass sets ``adapter`` and ``executable`` and defines ``_decode``; the
adapter's ``setup`` gives a new stream's state (``compiler.open_session``).
"""

from __future__ import annotations

import torch


class SessionStream:
    session = None

    @property
    def device(self) -> torch.device:
        return self.adapter.device

    def reset(self) -> None:
        """A new stream: a fresh arena (graphs captured on it under SR/SRc) holding the setup state."""
        from ..compiler import open_session
        session = open_session(self.executable, self.adapter)
        if self.session is not None:
            self.session.close()
        self.session = session

    def state(self) -> dict[str, torch.Tensor]:
        return self.session.state()

    def stats(self) -> dict:
        return self.session.stats()

    @property
    def arena_bytes(self) -> int:
        return self.session.arena.nbytes

    @property
    def state_bytes(self) -> int:
        """Device memory held for the stream's state (the arena)."""
        return self.session.state_bytes
