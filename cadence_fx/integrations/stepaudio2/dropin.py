"""``OptimizedToken2Wav``: the drop-in for ``Token2WavTail`` that ``cadence_fx.optimize`` builds."""

from __future__ import annotations

import threading

import torch

from ...compiler import build_plan, open_pending_session, open_session
from ...errors import CadenceError, RulesError, SpecializationRefused
from ...programs import setup_section
from ...runtime.binding import rebind_buffers
from ...step import Rules
from ...runtime.variants import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_POLICY, off_catalog_section
from ..dropin import DEFAULT_MAX_EXECUTABLES, DropIn
from ..frames import speech_out
from .adapter import STOCK_BUFFERS, Token2WavAdapter, module_buffer
from .inputs import SPK_DIM, check_prompt
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

    ``capacity`` (rules with S; architecture item 4): prompt lengths in mel frames, e.g.
    ``(256, 512)``.  A prompt of ``s`` frames then runs the graphs of the smallest capacity
    ``C >= s`` that serves it (``capacity_executable``: one set of graphs per capacity,
    built the first time, for every prompt length up to it; windows and flushes share
    graphs the same way): a new voice costs a set-up and a check at its length, no
    specialization, and its arena is laid out at ``C``.  Attention over padded keys runs
    masked where the device's probe finds each call bit-equal to the step's own at every
    length up to ``C`` (the CPU's is not: exact there), else exact.  A length in another
    branch class (Token2Wav: one token length in 25) runs on a capacity of its own class, the
    largest length up to ``C`` in it (``class_capacity``: the class's graphs, built once).  A length no capacity serves (past
    the largest, or in another branch class of the model's code) is built for its own
    length as without ``capacity``; ``capacity_stats()`` says which and why.
    ``prepare_capacity`` builds the capacities' graphs (their classes' too) and their window
    and flush shapes before any voice comes.
    ``shared_captures=True`` (with ``capacity``, under SR/SRc): each capacity's graphs are
    captured once, on a working arena of the capacity, for every voice (``runtime.working``:
    a voice's state is copied onto it before each chunk and back after, one chunk at a time),
    not on each voice's own arena at its set-up and first window or flush.
    """

    def __init__(self, tail: Token2WavTail, rules: str = "S", progress=None, cache=True,
                 off_catalog: str = DEFAULT_POLICY, max_specializations: int = DEFAULT_MAX_ENTRIES,
                 max_specialization_bytes: int = DEFAULT_MAX_BYTES,
                 max_executables: int = DEFAULT_MAX_EXECUTABLES, background: bool = False,
                 capacity: "int | tuple[int, ...] | None" = None, shared_captures: bool = False):
        super().__init__(rules, tail.device, progress, cache, off_catalog, max_specializations,
                         max_specialization_bytes, max_executables, background)
        self.capacity = check_capacity(capacity, self.rules)
        self.shared_captures = check_shared_captures(shared_captures, self.capacity, self.rules)
        self._capacities: dict = {}  # (capacity, spk shape, dtype) -> CapacityExecutable, or why none
        self._capacity_lock = threading.RLock()  # building one (a capacity held is read without it)
        self.capacity_refused: dict[int, str] = {}  # prompt frames -> why no capacity serves it
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
        exe = self._at_capacity(prompt_frames, spk, adapter) if self.capacity else None
        build = None
        if exe is None:
            exe, build = self._executable_or_build(self._key(prompt_frames, spk), adapter)
        if build is not None:  # background: eager chunks until its executable is built
            return open_pending_session(adapter, self.rules, build, prompt_tokens, prompt_mels, spk), spk
        return open_session(exe, adapter, prompt_tokens, prompt_mels, spk), spk

    def _at_capacity(self, prompt_frames: int, spk: torch.Tensor, adapter: Token2WavAdapter):
        """The executable of a stream of ``prompt_frames`` on the smallest capacity that
        serves it (held by length as any executable), or None (why: ``capacity_refused``).
        Whatever fails on the way (a capacity's build, its check at this length) is kept as
        the reason and the stream is built for its own length: never a crash of the set-up."""
        from ...capacity_executable import at_length
        capacities = self.capacity  # once: set_capacity may run beside this
        key = self._key(prompt_frames, spk)
        exe = self._held(key)
        if exe is not None:
            return exe
        if not capacities:
            return None
        whys = []
        for cap in (c for c in capacities if c >= prompt_frames):
            cexe = self._capacity(cap, spk, None)
            if isinstance(cexe, str):
                whys.append(f"capacity {cap}: {cexe}")
                continue
            try:
                exe = at_length(cexe, adapter, True, *self.off_catalog)
            except Exception as e:  # noqa: BLE001 - kept as the reason; the length is built for itself
                whys.append(f"capacity {cap}: {type(e).__name__}: {e}")
                exe = self._in_class(cap, spk, adapter, whys) if isinstance(e, SpecializationRefused) else None
                if exe is None:
                    continue
            with self._exe_lock:
                self._keep(key, exe)
            with self._capacity_lock:
                self.capacity_refused.pop(prompt_frames, None)
            return exe
        with self._capacity_lock:
            self.capacity_refused[prompt_frames] = "; ".join(whys) or f"past the largest capacity {max(capacities)}"
        return None

    def _capacity(self, cap: int, spk: torch.Tensor, steps):
        """The capacity executable at ``cap`` frames (built now if none is held: from ``steps``,
        or the steps serving ``cap``), or why none can be.  Only a build holds the lock: a
        capacity held is never waited for."""
        from ...capacity_executable import capacity_executable
        ckey = (cap,) + self._key(cap, spk)[1:] + (self.shared_captures,)
        cexe = self._capacities.get(ckey)
        if cexe is not None:
            return cexe
        with self._capacity_lock:
            cexe = self._capacities.get(ckey)
            if cexe is None:
                if self.progress:
                    self.progress(f"building the graphs of every prompt length up to {cap} mel frames")
                try:
                    cexe = capacity_executable(self.adapter_for(cap, spk), steps, "probe", programs=self.programs,
                                               say=self.progress, rules=self.rules,
                                               shared_captures=self.shared_captures)
                except Exception as e:  # noqa: BLE001 - kept as the capacity's reason (capacity_stats)
                    cexe = f"{type(e).__name__}: {e}"
                self._capacities[ckey] = cexe
        return cexe

    def _in_class(self, cap: int, spk: torch.Tensor, adapter: Token2WavAdapter, whys: list):
        """A stream that capacity ``cap``'s graphs refuse (another branch class of the model's
        code, say): the executable on the capacity of its own class below ``cap``
        (``class_capacity``), or None."""
        from ...capacity_executable import at_length
        try:
            c, cexe = self._class_capacity(cap, spk, adapter)
            if isinstance(cexe, str):
                whys.append(f"capacity {c} (its class): {cexe}")
                return None
            return at_length(cexe, adapter, True, *self.off_catalog)
        except Exception as e:  # noqa: BLE001 - kept as the reason; the length is built for itself
            whys.append(f"its class below {cap}: {type(e).__name__}: {e}")
            return None

    def _class_capacity(self, cap: int, spk: torch.Tensor, adapter: Token2WavAdapter) -> tuple:
        """``(c, executable or why none)``: the capacity of ``adapter``'s branch class below
        ``cap`` (``class_capacity``), built now if none is held (``_capacity``): what a voice of
        that class runs on (``_in_class``) and what ``prepare_capacity`` builds ahead of it."""
        from ...capacity_class import class_capacity
        c, steps = class_capacity(adapter, self.programs, cap, self.progress)
        return c, self._capacity(c, spk, steps)

    def set_capacity(self, capacity: "int | tuple[int, ...] | None", shared_captures: "bool | None" = None) -> None:
        """From now on, a new voice runs on these capacities (see the class doc; ``None``: each
        prompt length its own executable), its captures shared or not (``shared_captures``;
        None: as before, off without a capacity).  On a change, the executables held for lengths on capacity graphs
        are let go (sessions keep theirs): a voice set up after runs as the new setting says.
        Capacities built stay, for a setting that names them again."""
        new = check_capacity(capacity, self.rules)
        shared = self.shared_captures and bool(new) if shared_captures is None else \
            check_shared_captures(shared_captures, new, self.rules)
        with self._exe_lock:  # a set-up beside this keeps no executable of the old setting
            if new != self.capacity or shared != self.shared_captures:
                for key in [k for k, exe in self._executables.items() if exe.notes.get("capacity")]:
                    del self._executables[key]
            self.capacity, self.shared_captures = new, shared

    @torch.inference_mode()
    def prepare_capacity(self, windows=range(4, 29), flushes=range(1, 29), spk_dtype=torch.float32,
                         prompt_tokens=None, classes_first: bool = False) -> dict:
        """Before any voice arrives (a server's start): each capacity's graphs, and the shared
        graphs of a window of each token length in ``windows`` (lookahead included) and a flush
        of each length in ``flushes`` at the steady state, where a turn ends: a voice's first
        window or flush of those lengths then builds nothing.  ``spk_dtype``: the speaker
        vectors' dtype the voices will bring (capacities are kept per dtype).

        ``prompt_tokens``: the voice prompt lengths (tokens) the voices will bring (default:
        every length upstream streams, up to the largest capacity).  A length whose capacity's
        catalog graphs refuse it (another branch class of the model's code: Token2Wav's
        steady chunk refuses one prompt length in 25) runs on its class's capacity
        (``class_capacity``): that capacity's graphs are built here too, its window and flush
        shapes prepared (and captured) as the capacity's, so that voice's set-up and turn
        ends build nothing either.  Each class is traced once at one of its lengths and
        serves the rest of the class.

        With ``progress``, a line per shape.  Returns, per capacity (the classes' included),
        ``{shape: how}`` (``capacity_prepare.prepare``: held, built in S s, or why none
        serves), or why that capacity has no graphs; under ``"classes"``, per capacity, the
        prompt lengths (mel frames) its catalog refuses and where each runs (``"on C mel
        frames"``) or why none serves it (it is then built for its own length when it comes).
        With shared captures (``shared_captures=True`` under SR/SRc) every catalog entry's
        graph and every shape's is also captured on each capacity's working arena
        (``capacity_prepare.capture``), reported under ``"captured"``: ``{capacity: {label:
        how}}``; a voice then captures nothing.

        ``classes_first`` changes the order of the work only, not what is built: each capacity's
        class capacities before its own shapes (processes that share the program cache and
        prepare in parallel, ``traffic --prepare-shard``, then trace different symbolic programs
        at once instead of waiting for one another's)."""
        from ...capacity_prepare import chunk_inputs
        if not self.capacity:
            raise CadenceError("prepare_capacity: no capacity is set (optimize(..., capacity=...) or set_capacity)")
        lengths = {}
        for name, values in (("windows", windows), ("flushes", flushes)):
            values = list(values)
            if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in values):
                raise CadenceError(f"prepare_capacity: {name} must be token lengths (ints >= 1); got {values!r}")
            lengths[name] = values
        if not isinstance(classes_first, bool):
            raise CadenceError(f"prepare_capacity: classes_first={classes_first!r} must be True or False")
        if spk_dtype not in (torch.float32, self.dtype):
            raise CadenceError(f"prepare_capacity: spk_dtype={spk_dtype!r}; voices bring float32 or the flow's "
                               f"{self.dtype} speaker vectors")
        frames = self._prompt_frames(prompt_tokens)
        spk = torch.zeros(1, SPK_DIM, device=self.device, dtype=spk_dtype)

        def shapes(cexe) -> list:
            return ([(chunk_inputs(cexe.adapter, {"chunk_tokens": n}), {}) for n in lengths["windows"]] +
                    [(chunk_inputs(cexe.adapter, {"chunk_tokens": n}), {"last_chunk": True})
                     for n in lengths["flushes"]])
        out: dict = {}
        capacities = self.capacity  # once: set_capacity may run beside this
        for i, cap in enumerate(capacities):
            cexe = self._capacity(cap, spk, None)
            if isinstance(cexe, str):
                out[f"{cap} mel frames"] = cexe
                continue
            below = capacities[i - 1] if i else 0
            mine = [f for f in frames if below < f <= cap]
            if not classes_first:
                self._prepare_at(out, cexe, shapes(cexe))
            self._prepare_classes(out, cap, cexe, mine, spk, shapes)
            if classes_first:
                self._prepare_at(out, cexe, shapes(cexe))
        return out

    def _prompt_frames(self, prompt_tokens) -> list:
        """``prepare_capacity``'s ``prompt_tokens`` as prompt lengths in mel frames (checked)."""
        from .inputs import MAX_PROMPT_TOKENS as most, MIN_PROMPT_TOKENS
        from .stock import MEL_PER_TOKEN
        if prompt_tokens is None:
            prompt_tokens = range(MIN_PROMPT_TOKENS, min(most, max(self.capacity) // MEL_PER_TOKEN) + 1)
        values = list(prompt_tokens)
        if any(isinstance(n, bool) or not isinstance(n, int) or not MIN_PROMPT_TOKENS <= n <= most for n in values):
            raise CadenceError(f"prepare_capacity: prompt_tokens must be prompt lengths upstream streams (ints in "
                               f"{MIN_PROMPT_TOKENS}..{most}); got {values!r}")
        return sorted({MEL_PER_TOKEN * n for n in values})

    def _prepare_at(self, out: dict, cexe, shapes: list) -> None:
        """One capacity's shapes built (and, with shared captures, captured) into ``out``."""
        from ...capacity_prepare import capture, prepare
        cap = int(next(iter(cexe.dims.values())))
        out[f"{cap} mel frames"] = prepare(cexe, shapes, say=self.progress)
        if cexe.working() is not None:
            out.setdefault("captured", {})[f"{cap} mel frames, shared captures"] = capture(cexe, shapes,
                                                                                         say=self.progress)

    def _prepare_classes(self, out: dict, cap: int, cexe, frames: list, spk: torch.Tensor, shapes) -> None:
        """The capacities of the branch classes of ``frames`` (prompt lengths whose smallest
        capacity is ``cap``) that ``cap``'s catalog graphs refuse, each built and prepared as
        a voice of it would need (``_in_class``'s, found held when the voice comes)."""
        from ...capacity_prepare import catalog_lengths
        served = catalog_lengths(cexe)
        if served is None:  # more than one symbolic dim: no lengths to enumerate
            return
        (d,) = cexe.dims
        served = {v[d] for v in served}
        todo = [f for f in frames if f not in served]
        where = out.setdefault("classes", {}).setdefault(f"{cap} mel frames", {})
        while todo:
            s = todo.pop(0)
            if self.progress:
                self.progress(f"prompts of {s} mel frames: capacity {cap}'s graphs refuse them (another branch "
                              f"class); building their class's capacity")
            try:
                c, ccexe = self._class_capacity(cap, spk, self.adapter_for(s, spk))
            except Exception as e:  # noqa: BLE001 - reported; such a voice is built for its own length
                where[f"{s} mel frames"] = f"{type(e).__name__}: {e}"
                continue
            if isinstance(ccexe, str):
                where[f"{s} mel frames"] = f"capacity {c} (its class): {ccexe}"
                continue
            mine = {v[d] for v in catalog_lengths(ccexe)}
            where.update({f"{f} mel frames": f"on {c} mel frames" for f in [s] + todo if f in mine})
            if s not in mine:
                where[f"{s} mel frames"] = f"capacity {c} (its class) does not serve it"
            todo = [f for f in todo if f not in mine]
            self._prepare_at(out, ccexe, shapes(ccexe))

    def capacity_stats(self) -> dict:
        """Per capacity built: its shared off-catalog graphs (``CapacityExecutable.stats``) or
        why it has none (``"<C> mel frames"``; with shared captures ``"<C> mel frames, shared
        captures"``, its working arena's stats among them); and the prompt lengths no
        capacity served, with why."""
        with self._capacity_lock:
            built, refused = dict(self._capacities), dict(self.capacity_refused)
        return {"capacity": list(self.capacity or ()), "shared_captures": self.shared_captures,
                "built": {f"{k[0]} mel frames" + (", shared captures" if k[-1] else ""):
                          v if isinstance(v, str) else v.stats() for k, v in built.items()},
                "refused": refused}

    @torch.inference_mode()
    def open_session(self, prompt_tokens: torch.Tensor, prompt_mels: torch.Tensor, spk: torch.Tensor,
                     *, stream=None, keep_setup: bool = True) -> Token2WavSession:
        """A new stream on these weights: ``set_stream_cache`` without replacing any other stream.

        ``stream`` (CUDA only; ignored on CPU): a ``torch.cuda.Stream`` this session's
        steps are launched on, so several sessions' replays may overlap on one GPU
        (``Token2WavSession.submit``; not with shared captures: one chunk at a time runs on a
        capacity's working arena).  ``keep_setup``: keep a copy of the post-prompt
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


def check_shared_captures(shared_captures, capacity, rules: str) -> bool:
    """``shared_captures`` checked: a bool, True only with a capacity (``CadenceError``) and
    rules that replay (``RulesError``: SR or SRc)."""
    if not isinstance(shared_captures, bool):
        raise CadenceError(f"shared_captures={shared_captures!r} must be True or False")
    if shared_captures and not capacity:
        raise CadenceError("shared_captures=True shares each capacity's captures among its voices: it needs "
                           "capacity=... too")
    if shared_captures and not Rules.parse(rules).replays:
        raise RulesError(f"shared_captures=True shares captured CUDA graphs: rules SR or SRc (rules {rules!r} "
                         f"capture nothing)")
    return shared_captures


def check_capacity(capacity, rules: str) -> "tuple[int, ...] | None":
    """``capacity`` as sorted prompt lengths (mel frames), or None; ``CadenceError`` naming a
    bad value, ``RulesError`` for rules without S (capacity graphs keep the state in the arena)."""
    if capacity is None:
        return None
    values = (capacity,) if isinstance(capacity, int) else capacity
    if not isinstance(values, (tuple, list)) or not values or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise CadenceError(f"capacity={capacity!r} must be a prompt length in mel frames (an int >= 1) or a "
                           f"non-empty tuple of them")
    if not Rules.parse(rules).stable_state:
        raise RulesError(f"capacity={capacity!r} keeps each voice's state in an arena laid out at the capacity: it "
                         f"needs rule S (S, SR or SRc; rules {rules!r} keep stock's own state)")
    return tuple(sorted(set(values)))
