"""``optimize(t2w)`` on stepaudio2's own ``Token2wav``: the object users hold, its API kept.

Upstream's streaming protocol, as MiniCPM-o's and Step-Audio2's services call it::

    t2w = cadence_fx.optimize(Token2wav(model_dir, float16=..., n_timesteps=...), rules="SRc")
    stream_cache, hift_cache = t2w.set_stream_cache(prompt_wav)    # upstream's own prompt front end
    t2w.stream_cache, t2w.hift_cache_dict = stream_cache, hift_cache
    saved = copy.deepcopy(stream_cache), copy.deepcopy(hift_cache)  # the post-prompt caches
    pcm = t2w.stream(tokens, prompt_wav, last_chunk=False)          # 25 + 3 tokens -> PCM bytes
    t2w.stream_cache, t2w.hift_cache_dict = copy.deepcopy(saved[0]), copy.deepcopy(saved[1])  # a new turn

``set_stream_cache`` runs upstream's ``_prepare_prompt`` (s3tokenizer, CAMPPlus, mel) and
opens a ``Token2WavSession`` on its features; the dicts it returns hold live views of that
session's state (no copies).  Assigning ``stream_cache`` / ``hift_cache_dict`` anything
else (a deep copy saved earlier) puts that state back into the session before the next
chunk, in place (the captured graphs stay valid).  ``stream`` returns what upstream's
returns (PCM bytes, or the float waveform).  Every other attribute and method
(``__call__``, ``flow``, ``cache``...) is the upstream object's own.  Upstream runs on
CUDA only, and so does this.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ...errors import CadenceError, InputError, RulesError
from ...runtime.snapshot import SessionSnapshot
from ...runtime.variants import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_POLICY
from .dropin import OptimizedToken2Wav
from .stock import CARRIED, Token2WavTail

FLOW = CARRIED[:4]
HIFT = {"mel": "hift_mel", "source": "hift_source", "speech": "hift_speech"}  # upstream's keys -> regions
_OWN = ("upstream", "optimized", "session", "_handles", "_pending")


class OptimizedUpstreamToken2wav:
    """stepaudio2's ``Token2wav`` with its streaming tail optimized (see the module docstring)."""

    def __init__(self, t2w, rules: str = "SRc", progress=None, cache=True,
                 off_catalog: str = DEFAULT_POLICY, max_specializations: int = DEFAULT_MAX_ENTRIES,
                 max_specialization_bytes: int = DEFAULT_MAX_BYTES):
        device = next(t2w.flow.parameters()).device
        if device.type != "cuda":
            raise RulesError(f"stepaudio2's Token2wav streams on CUDA only (its stream builds CUDA tensors); this "
                             f"one's flow is on {device}. On a CPU, optimize Token2WavTail(flow, hift) instead "
                             f"(docs/backends.md)")
        tail = Token2WavTail(t2w.flow, t2w.hift, n_timesteps=t2w.n_timesteps, float16=t2w.float16)
        object.__setattr__(self, "upstream", t2w)
        object.__setattr__(self, "optimized", OptimizedToken2Wav(tail, rules, progress, cache, off_catalog,
                                                                 max_specializations, max_specialization_bytes))
        object.__setattr__(self, "session", None)
        object.__setattr__(self, "_handles", (None, None))
        object.__setattr__(self, "_pending", {})

    # -------------------------------------------------------------- upstream API
    def set_stream_cache(self, prompt_wav) -> tuple[dict, dict]:
        """Upstream's prompt front end, then a new stream: ``(stream_cache, hift_cache_dict)``."""
        feats = self.upstream._prepare_prompt(prompt_wav)
        self.upstream.cache = feats  # as upstream keeps them (stream() reads them)
        tokens, _, spk, mels, _ = feats
        session = self.optimized.open_session(tokens, mels, spk)
        if self.session is not None:
            self.session.close()
        object.__setattr__(self, "session", session)
        object.__setattr__(self, "_pending", {})
        live = session.state()
        handles = ({k: live[k] for k in FLOW}, {k: live[r] for k, r in HIFT.items()})
        object.__setattr__(self, "_handles", handles)
        return handles

    def stream(self, generated_speech_tokens, prompt_wav=None, last_chunk: bool = False,
               return_waveform: bool = False):
        """Upstream's ``stream``: one chunk -> PCM bytes (or the float waveform)."""
        if self.session is None:
            raise ValueError("stream_cache is not set")  # upstream's own words
        self._apply_pending()
        return self.session.stream(generated_speech_tokens, last_chunk=last_chunk, return_waveform=return_waveform)

    @property
    def stream_cache(self) -> dict | None:
        return None if self.session is None else {k: v for k, v in self.session.state().items() if k in FLOW}

    @stream_cache.setter
    def stream_cache(self, value) -> None:
        self._assign("stream_cache", value, FLOW, {k: k for k in FLOW}, self._handles[0])

    @property
    def hift_cache_dict(self) -> dict | None:
        if self.session is None:
            return None
        live = self.session.state()
        return {k: live[r] for k, r in HIFT.items()}

    @hift_cache_dict.setter
    def hift_cache_dict(self, value) -> None:
        self._assign("hift_cache_dict", value, tuple(HIFT), HIFT, self._handles[1])

    def stats(self) -> dict:
        """The current stream's counters (``Token2WavSession.stats``)."""
        return {} if self.session is None else self.session.stats()

    def __getattr__(self, name: str) -> Any:
        if name in _OWN:
            raise AttributeError(name)
        return getattr(self.upstream, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("stream_cache", "hift_cache_dict"):
            object.__setattr__(self, name, value)  # the properties
        else:
            setattr(self.upstream, name, value)  # e.g. t2w.cache = None, as services do

    # ------------------------------------------------------------------ private
    def _assign(self, what: str, value, keys, regions: Mapping[str, str], handle) -> None:
        if self.session is None:
            raise InputError(f"{what} can be set once set_stream_cache(prompt_wav) opened a stream")
        if value is handle:
            self._pending.pop(what, None)
            return
        if not isinstance(value, Mapping) or set(value) != set(keys):
            raise InputError(f"{what} must be a dict with keys {list(keys)} (what set_stream_cache returned, or a "
                             f"copy of it); got {type(value).__name__}"
                             + (f" with keys {sorted(value)}" if isinstance(value, Mapping) else ""))
        live = self.session.state()
        for k in keys:
            t, want = value[k], live[regions[k]]
            if not isinstance(t, torch.Tensor) or t.dtype != want.dtype or t.device != want.device \
                    or t.dim() != want.dim():
                raise InputError(f"{what}[{k!r}] must be a {want.dtype} tensor of {want.dim()} dims on {want.device} "
                                 f"(as set_stream_cache returned it); got "
                                 + (f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor)
                                    else type(t).__name__))
        self._pending[what] = {regions[k]: value[k].clone() for k in keys}

    def _apply_pending(self) -> None:
        """Put assigned caches back into the session (in place) before the next chunk."""
        if not self._pending:
            return
        state = dict(self.session.state())  # live views: restore leaves a region already in place as it is
        for part in self._pending.values():
            state.update(part)
        runtime = self.session.session
        extents = runtime.extents_of(state)
        try:
            self.session.restore(SessionSnapshot(runtime.executable.plan, runtime.executable.stable_state,
                                                 {r: state[r] for r in runtime.executable.carried}, extents))
        except CadenceError as e:
            raise InputError(f"the assigned stream_cache / hift_cache_dict do not fit this stream: {e}") from e
        object.__setattr__(self, "_pending", {})
