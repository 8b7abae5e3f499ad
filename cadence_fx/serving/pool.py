"""``SessionPool``: sessions spread over local devices, one optimized model per device."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from ..errors import CadenceError, InputError
from .tick import run_tick


class PoolFull(CadenceError, RuntimeError):
    """Every device of a ``SessionPool`` holds its maximum number of sessions."""


class SessionPool:
    """Sessions spread over local devices: one optimized model (one copy of the
    weights) per device; each new session goes to the device with the fewest open
    sessions (ties: the first listed).  ``max_per_device`` (e.g. the largest N that
    ``serve-sim --sweep`` found holding the cadence) makes ``open`` raise
    ``PoolFull`` instead of overloading a device: admission control.
    """

    def __init__(self, models: Sequence[Any], max_per_device: int | None = None):
        if not models:
            raise InputError("a SessionPool needs at least one model")
        self.models = list(models)
        self.max_per_device = max_per_device
        self._open: list[list[Any]] = [[] for _ in self.models]

    @classmethod
    def on_devices(cls, make_model: Callable[[Any], Any], devices: Sequence[str], **kw) -> "SessionPool":
        """``make_model(device)`` per device, e.g. ``lambda d: optimize(tail_on(d), rules)``."""
        import torch
        return cls([make_model(torch.device(d)) for d in devices], **kw)

    def load(self) -> list[int]:
        """Open sessions per model (closed ones are forgotten here)."""
        self._open = [[s for s in group if not s.closed] for group in self._open]
        return [len(group) for group in self._open]

    def warm(self, prompt_tokens: Iterable[int], spk_dim: int = 192) -> None:
        """Trace every model for these prompt lengths now, not on a conversation's first chunk."""
        import torch
        for model in self.models:
            for p in prompt_tokens:
                model.executable(2 * p, torch.zeros(1, spk_dim, device=model.device))

    def open(self, prompt_tokens, prompt_mels, spk, **kw):
        """A session on the least-loaded model; the prompt is moved to its device."""
        load = self.load()
        idx = min(range(len(load)), key=lambda i: load[i])
        if self.max_per_device is not None and load[idx] >= self.max_per_device:
            raise PoolFull(f"every device holds {self.max_per_device} sessions (load {load}); close one, add a "
                           f"device, or raise max_per_device if serve-sim shows it holds the cadence")
        model = self.models[idx]
        dev = model.device
        session = model.open_session(prompt_tokens.to(dev), prompt_mels.to(dev), spk.to(dev), **kw)
        session.device_index = idx
        self._open[idx].append(session)
        return session

    def tick(self, work: Sequence[tuple], before_submit: Callable[[int], None] | None = None,
             return_waveform: bool = False) -> list[Any]:
        """``run_tick`` over this pool's sessions: every chunk launched (each session on its
        own stream and device), then collected."""
        return run_tick(work, before_submit, return_waveform)
