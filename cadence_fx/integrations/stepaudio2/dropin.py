"""``OptimizedToken2Wav``: the drop-in for ``Token2WavTail`` that ``cadence_fx.optimize`` builds."""

from __future__ import annotations

import torch

from ...compiler import build_plan, open_pending_session, open_session
from ...programs import setup_section
from ...runtime.binding import rebind_buffers
from ...runtime.variants import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_POLICY, off_catalog_section
from ..dropin import DEFAULT_MAX_EXECUTABLES, DropIn
from ..frames import speech_out
from .adapter import STOCK_BUFFERS, Token2WavAdapter, module_buffer
from .inputs import check_prompt
from .session import Token2WavSession, step_chunk
from .stock import FlowPlacement, StepConfig, Token2WavTail


class OptimizedToken2Wav(FlowPlacement, DropIn):
    """Drop-in for ``Token2WavTail`` built by ``cadence_fx.optimize``.

    Shares the stock tail's parameters and ``rand_noise``.  With rule S it does not
    share its state buffers: it keeps a module shell whose four over-provisioned
    buffers are empty, and each stream's state lives in one arena sized from the
    plan.  Rules R/Rc (replay over stock-managed state) keep private stock-sized
    buffers instead, as a second stock model would.  Graphs are built on the first
    ``set_stream_cache`` for a prompt length and reused for later streams of that
    length.  With ``background=True`` (rules with S) a prompt length after the first
    is built on a worker thread instead: ``set_stream_cache`` returns once the prompt
    is set up, the stream's chunks run the exact eager path until the build is done,
    and replay from the next chunk on (``runtime.pending``; ``stats()["background"]``).

    Many streams on one set of weights: ``open_session(...)`` returns a
    ``Token2WavSession`` with its own state (arena, or under R/Rc its own copies),
    clock position, counters and captured graphs; the executables are shared by
    prompt length.  The drop-in API (``set_stream_cache``/``stream``) drives one
    default session.  Under R/Rc the sessions share the model's stock-sized buffers
    as scratch, so they must not step concurrently.  Both APIs check their arguments
    first (``inputs``) and copy the speaker vector: the caller may reuse its tensor.
    """

    def __init__(self, tail: Token2WavTail, rules: str = "S", progress=None, cache=True,
                 off_catalog: str = DEFAULT_POLICY, max_specializations: int = DEFAULT_MAX_ENTRIES,
                 max_specialization_bytes: int = DEFAULT_MAX_BYTES,
                 max_executables: int = DEFAULT_MAX_EXECUTABLES, background: bool = False):
        super().__init__(rules, tail.device, progress, cache, off_catalog, max_specializations,
                         max_specialization_bytes, max_executables, background)
        self.n_timesteps, self.float16 = tail.n_timesteps, tail.float16
        flow_paths = [p.removeprefix("flow.") for p in STOCK_BUFFERS]
        self._stock_buffer_bytes = sum(module_buffer(tail.flow, p).nbytes for p in flow_paths)
        if self.stable_state:
            own = {p: torch.empty(0, device=tail.device) for p in flow_paths}  # the shell: no stock buffers
        else:
            own = {p: torch.zeros_like(module_buffer(tail.flow, p)) for p in flow_paths}
        self.flow = rebind_buffers(tail.flow, own)
        self.hift = tail.hift
        self.speech_window = tail.speech_window
        self.spk = None
        self.prompt_frames = None

    def adapter_for(self, prompt_frames: int, spk: torch.Tensor) -> Token2WavAdapter:
        """The adapter for streams of ``prompt_frames`` (its executable's key, with ``spk``'s spec)."""
        cfg = StepConfig(prompt_frames, self.n_timesteps, self.float16, self.device.type)
        return Token2WavAdapter(self.flow, self.hift, self.speech_window, cfg, spk, self._stock_buffer_bytes)

    _adapter = adapter_for  # the name cadence_fx/cli.py calls (until it moves to adapter_for)

    def executable(self, prompt_frames: int, spk: torch.Tensor):
        """The executable for prompts of ``prompt_frames`` mel frames (traced on first use)."""
        return self._executable(self._key(prompt_frames, spk), self.adapter_for(prompt_frames, spk))

    @staticmethod
    def _key(prompt_frames: int, spk: torch.Tensor) -> tuple:
        return prompt_frames, tuple(spk.shape), spk.dtype

    def explain(self, prompt_frames: int) -> str:
        """The plan for prompts of ``prompt_frames`` mel frames (nothing is traced), and its
        Setup section: what is traced once for every prompt length, and what this model's
        ``programs`` hold so far."""
        adapter = self.adapter_for(prompt_frames, torch.zeros(1, 192, device=self.device))
        held = {f"prompt of {key[0]} mel frames": exe.variants for key, exe in self._executables.items()
                if key[0] == prompt_frames and exe.variants is not None}
        return (build_plan(adapter).explain() + "\n\n" + setup_section(adapter.symbolic_dims(), self.programs) +
                "\n\n" + off_catalog_section(*self.off_catalog, held))

    def _new_session(self, prompt_tokens: torch.Tensor, prompt_mels: torch.Tensor, spk: torch.Tensor):
        """A set-up runtime session and its own copy of ``spk`` (both APIs construct sessions here only)."""
        check_prompt(prompt_tokens, prompt_mels, spk, self.device, self.dtype)
        spk = spk.clone(memory_format=torch.contiguous_format)  # the caller's tensor may change after
        prompt_frames = int(prompt_mels.shape[1])
        adapter = self.adapter_for(prompt_frames, spk)
        exe, build = self._executable_or_build(self._key(prompt_frames, spk), adapter)
        if build is not None:  # background: eager chunks until its executable is built
            return open_pending_session(adapter, self.rules, build, prompt_tokens, prompt_mels, spk), spk
        return open_session(exe, adapter, prompt_tokens, prompt_mels, spk), spk

    @torch.inference_mode()
    def open_session(self, prompt_tokens: torch.Tensor, prompt_mels: torch.Tensor, spk: torch.Tensor,
                     *, stream=None, keep_setup: bool = True) -> Token2WavSession:
        """A new stream on these weights: ``set_stream_cache`` without replacing any other stream.

        ``stream`` (CUDA only; ignored on CPU): a ``torch.cuda.Stream`` this session's
        steps are launched on, so several sessions' replays may overlap on one GPU
        (``Token2WavSession.submit``).  ``keep_setup``: keep a copy of the post-prompt
        state, which ``Token2WavSession.reset()`` restores at every new turn (its size is
        ``setup_bytes``: the prompt's caches; ``False`` saves it when turns never reset).
        """
        session, spk = self._new_session(prompt_tokens, prompt_mels, spk)
        self._opened += 1
        return Token2WavSession(session, spk, int(prompt_mels.shape[1]), self.device,
                                stream=stream, name=f"session {self._opened}", keep_setup=keep_setup)

    @torch.inference_mode()
    def set_stream_cache(self, prompt_tokens: torch.Tensor, prompt_mels: torch.Tensor, spk: torch.Tensor) -> None:
        session, spk = self._new_session(prompt_tokens, prompt_mels, spk)
        self._replace_session(session)  # the current stream stays usable until the new one is set up
        self.spk, self.prompt_frames = spk, int(prompt_mels.shape[1])

    @torch.inference_mode()
    def stream(self, generated_speech_tokens, last_chunk: bool = False, return_waveform: bool = False):
        if self.session is None:
            raise ValueError("stream_cache is not set: call set_stream_cache(prompt_tokens, prompt_mels, spk) first")
        self.last_speech = step_chunk(self.session, self.spk, self.device, generated_speech_tokens, last_chunk)
        return speech_out(self.last_speech, return_waveform)

    @property
    def state_bytes(self) -> int:
        """Device memory held for stream state: the arena (rule S), or the private
        stock-sized buffers plus the session's state copies (rules R/Rc)."""
        held = super().state_bytes
        return held if self.stable_state else held + self._stock_buffer_bytes
