"""What every optimized drop-in shares: its rules, its executables, its default session.

A family's drop-in (``OptimizedToken2Wav``, ``OptimizedMimi``, ``OptimizedVibeVoice``)
stands in for the stock class and keeps its API.  ``DropIn`` holds what they all do
the same way: the rules checked against the device, compiled executables cached by
the family's key (Token2Wav: one per prompt length; the frame codecs: one; at most
``max_executables``, least recently used out first: a configuration seen again after
that is specialized again, seconds, from the symbolic programs the model keeps), and the
default session that the drop-in API drives (replaced by a new stream, read by
``state``/``stats``, closed by ``close``).  ``OneExecutableDropIn`` adds what the frame
codecs share: one adapter, one executable, and ``reset()`` for a new stream.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any, Callable, Hashable

import torch

from ..adapter import StreamingAdapter
from ..compiler import check_rules, compile_executable, open_session
from ..errors import CadenceError, RulesError
from ..programs import ProgramStore, open_disk_cache
from ..runtime.pending import CONFIGURATION, OFF_CATALOG, Build, BuildQueue
from ..runtime.variants import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_POLICY, check_policy
from ..step import Rules
from .frames import FrameSession

#: executables (stream configurations: Token2Wav's prompt lengths) a drop-in keeps.  Each
#: holds its graphs (~170,000 Python objects for Token2Wav at 5 steps, walked by every full
#: garbage collection) and its folded constants; sessions keep their own alive.
DEFAULT_MAX_EXECUTABLES = 32


def check_background(value: bool) -> bool:
    if not isinstance(value, bool):
        raise CadenceError(f"background={value!r} must be True or False (build a new stream configuration's "
                           f"graphs on a worker thread while its stream runs eagerly)")
    return value


def check_max_executables(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CadenceError(f"max_executables={value!r} must be an int >= 1 (executables kept, one per stream "
                           f"configuration, e.g. Token2Wav's prompt length)")
    return value


class DropIn:
    """Base of the drop-ins; a subclass calls ``__init__`` first and opens its streams
    with ``_replace_session``."""

    def __init__(self, rules: str, device: torch.device, progress: Callable[[str], None] | None = None,
                 cache: "bool | str | os.PathLike" = True, off_catalog: str = DEFAULT_POLICY,
                 max_specializations: int = DEFAULT_MAX_ENTRIES, max_specialization_bytes: int = DEFAULT_MAX_BYTES,
                 max_executables: int = DEFAULT_MAX_EXECUTABLES, background: bool = False):
        self.rules = check_rules(rules, device)  # as given ("S", "SRc", ...): reports print it
        #: build a new stream configuration, and off-catalog programs, on a worker thread while
        #: the stream runs eagerly (``_executable_or_build``, ``runtime.pending``, ``runtime.variants``)
        self.background = check_background(background)
        check_policy(off_catalog, max_specializations, max_specialization_bytes)
        self.max_executables = check_max_executables(max_executables)
        self.executables_evicted = 0  # least recently used out, over max_executables
        #: what a chunk the catalog does not hold does (``compile_executable``'s ``off_catalog``)
        self.off_catalog = (off_catalog, max_specializations, max_specialization_bytes)
        self.progress = progress
        self.session = None
        self._opened = 0  # sessions opened by open_session (for their names)
        self._executables: "collections.OrderedDict[Hashable, Any]" = collections.OrderedDict()
        self._builds: dict[Hashable, Build] = {}  # configurations being built on the worker
        #: configurations whose background build failed, with why: their next set-up builds here
        self.foreground_only: dict[Hashable, str] = {}
        self._worker: BuildQueue | None = None
        self._worker_lock = threading.Lock()  # creating the worker (a leaf: nothing is taken inside)
        self._exe_lock = threading.RLock()  # the two dicts above and _executables, shared with the worker
        #: symbolic steps shared by every stream configuration of this model (one trace
        #: per catalog entry serves every prompt length: see ``compile_executable``), read
        #: from and written to the disk cache ``cache`` names (``programs.open_disk_cache``)
        self.programs = ProgramStore(disk=open_disk_cache(cache, progress))

    @property
    def stable_state(self) -> bool:
        """Rule S: each stream's state lives in one arena (else stock-managed state)."""
        return Rules.parse(self.rules).stable_state

    def _require_stable_state(self, family: str, why: str) -> None:
        if not self.stable_state:
            raise RulesError(f"rules {self.rules!r} (replay over stock-managed state) are not built for {family}: "
                             f"{why}; use S, SR or SRc")

    def _executable(self, key: Hashable, adapter: StreamingAdapter):
        """The executable for ``key``, compiled from ``adapter`` the first time it is held
        (traced once per model; specialized after), the least recently used dropped past
        ``max_executables``."""
        exe = self._held(key)
        if exe is not None:
            return exe
        policy, most, most_bytes = self.off_catalog
        exe = compile_executable(adapter, self.rules, self.progress, self.programs, policy, most, most_bytes)
        with self._exe_lock:
            self._keep(key, exe)
        return exe

    def _held(self, key: Hashable):
        """The executable held for ``key`` (now the most recently used), or None."""
        with self._exe_lock:
            exe = self._executables.get(key)
            if exe is not None:
                self._executables.move_to_end(key)
            return exe

    def _keep(self, key: Hashable, exe) -> None:
        if exe.variants is not None:  # its off-catalog programs build where the configuration's would
            exe.variants.background = self._submit_off_catalog if self.background else None
        self._executables[key] = exe
        self._executables.move_to_end(key)
        while len(self._executables) > self.max_executables:
            self._executables.popitem(last=False)  # a session on it keeps it alive while it lives
            self.executables_evicted += 1

    def _executable_or_build(self, key: Hashable, adapter: StreamingAdapter):
        """``(executable, None)``, compiled here if needed; or, with ``background`` on,
        for a configuration not held yet, ``(None, build)``: its build on the worker
        thread (started now, or the one already running), for a ``PendingSession``.
        A build needs the model's symbolic steps in memory (a stream configuration set
        up before, in this process): the first configuration compiles here, as does
        one whose background build failed (``foreground_only``)."""
        with self._exe_lock:
            exe = self._executables.get(key)
            if exe is not None:
                self._executables.move_to_end(key)
                return exe, None
            build = self._builds.get(key)
            if build is None and self.background and self.stable_state and len(self.programs) \
                    and key not in self.foreground_only:
                build = self._start_build(key, adapter)
        if build is not None:
            return None, build
        return self._executable(key, adapter), None

    def _submit(self, label: str, run: Callable[[], Any], rank: int = CONFIGURATION) -> Build:
        """A ``Build`` of ``run`` on this drop-in's worker thread (one at a time; a stream
        configuration's before an off-catalog program's: ``BuildQueue``), not started yet.
        Takes only ``_worker_lock`` (a leaf): ``Variants`` calls it holding its own lock."""
        with self._worker_lock:
            if self._worker is None:
                self._worker = BuildQueue()
            return Build(label, run, self._worker, rank)

    def _submit_off_catalog(self, label: str, run: Callable[[], Any]) -> Build:
        """``_submit`` at rank ``OFF_CATALOG``: what ``Variants`` builds in the background."""
        return self._submit(label, run, OFF_CATALOG)

    def _start_build(self, key: Hashable, adapter: StreamingAdapter) -> Build:
        """(Holding ``_exe_lock``.)  Compile ``key``'s executable on the worker thread."""
        policy, most, most_bytes = self.off_catalog

        def run():
            try:  # each entry's program goes to the streams waiting for it as soon as it is done
                exe = compile_executable(adapter, self.rules, self.progress, self.programs, policy, most, most_bytes,
                                         on_entry=build.publish)
            except BaseException as e:
                with self._exe_lock:
                    self._builds.pop(key, None)
                    self.foreground_only[key] = f"{type(e).__name__}: {e}"
                raise
            with self._exe_lock:
                self._keep(key, exe)
                self._builds.pop(key, None)
            return exe

        build = self._submit(str(key), run)
        self._builds[key] = build
        return build

    def wait_for_builds(self, timeout: float | None = None) -> bool:
        """Block until every background build held now (a configuration's, started here if
        no chunk started it yet, and every off-catalog program's) is done, or ``timeout``
        seconds passed; returns whether they are.  Streams take a finished build at their
        next chunk; nothing needs this but a caller that wants them ready."""
        with self._exe_lock:
            builds, exes = list(self._builds.values()), list(self._executables.values())
        builds += [h for exe in exes if exe.variants is not None for h in exe.variants.pending()]  # their own locks
        deadline = None if timeout is None else time.monotonic() + timeout
        return all(b.wait(None if deadline is None else max(0.0, deadline - time.monotonic())) for b in builds)

    def set_off_catalog(self, policy: str, max_specializations: int | None = None,
                        max_specialization_bytes: int | None = None) -> None:
        """What a chunk the catalog does not hold does, from now on, for every stream
        configuration (compiled already or not): ``"specialize"`` (its own program, built on
        first use), ``"repeat"`` (built the second time its shape comes) or ``"eager"`` (the
        exact eager path).  ``None`` keeps a bound as it is."""
        _, most, most_bytes = self.off_catalog
        most = most if max_specializations is None else max_specializations
        most_bytes = most_bytes if max_specialization_bytes is None else max_specialization_bytes
        check_policy(policy, most, most_bytes)
        self.off_catalog = (policy, most, most_bytes)
        for exe in self._executables.values():
            if exe.variants is not None:
                exe.variants.configure(policy, most, most_bytes)

    def set_background(self, on: bool) -> None:
        """From now on, build a new stream configuration (and an off-catalog chunk's program)
        on the worker thread while its stream runs eagerly (``True``), or at its set-up (on
        the chunk) (``False``); builds running go on."""
        self.background = check_background(on)
        with self._exe_lock:
            for exe in self._executables.values():
                if exe.variants is not None:
                    exe.variants.background = self._submit_off_catalog if on else None

    def _replace_session(self, session) -> None:
        """``session`` becomes the default stream; the one it replaces is closed (after the
        new one is fully set up, so a failed set-up leaves the old stream usable).  A
        replaced stream that never stepped hands its compile times to ``session``
        (``Session.adopt_setup``)."""
        if self.session is not None:
            self.session.close()
            session.adopt_setup(self.session)
        self.session = session

    @torch.inference_mode()  # as the family's steps run (see StreamSession.idle)
    def idle(self, seconds: float | None = None) -> list[int]:
        """Give the default stream time between chunks (``StreamSession.idle``): with
        ``background=True``, capture the entries a build handed over before a chunk needs
        them.  Returns the entries captured."""
        return self.session.idle(seconds) if self.session is not None else []

    def state(self) -> dict[str, torch.Tensor]:
        """Live views of the default stream's carried regions ({} before the first stream)."""
        return self.session.state() if self.session is not None else {}

    def stats(self) -> dict:
        """The default stream's counters (steps, graph runs, replays, fallbacks by reason)."""
        return self.session.stats() if self.session is not None else {}

    @property
    def arena_bytes(self) -> int:
        """Bytes of the default stream's arena (0 without one: rules R/Rc keep no arena)."""
        return self.session.arena.nbytes if self.session is not None and self.session.arena is not None else 0

    @property
    def state_bytes(self) -> int:
        """Device memory the default stream holds for its state (rule S: the arena)."""
        return self.session.state_bytes if self.session is not None else 0

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


class OneExecutableDropIn(DropIn):
    """A drop-in whose streams all run one executable (Mimi, VibeVoice): set ``adapter``
    with ``_compile``, which traces the step once and opens the first stream."""

    def _compile(self, adapter: StreamingAdapter) -> None:
        self.adapter = adapter
        self.executable = self._executable("step", adapter)
        self.reset()

    @property
    def device(self) -> torch.device:
        return self.adapter.device

    def reset(self) -> None:
        """A new stream: a fresh arena (graphs captured on it under SR/SRc) holding the setup state."""
        self._replace_session(open_session(self.executable, self.adapter))

    def open_session(self, *, stream=None) -> FrameSession:
        """Another stream on these weights, beside the default one (``FrameSession``).

        ``stream`` (CUDA only; ignored on CPU): the ``torch.cuda.Stream`` its frames are
        launched on, so several sessions' replays may overlap (``FrameSession.submit``).
        Rules R/Rc replay over the stock model's own buffers, which every stream
        shares: open sessions under S, SR or SRc."""
        self._require_stable_state(self.family, "every session would share the stock model's own buffers")
        self._opened += 1
        return FrameSession(open_session(self.executable, self.adapter), self.family, self._frame, self._step_on,
                            self.device, stream=stream, name=f"session {self._opened}")

    def _decode(self, frame: torch.Tensor) -> torch.Tensor:
        return self._step_on(self.session, frame)

    def _step_on(self, session, frame: torch.Tensor) -> torch.Tensor:
        """One step of ``session`` on one frame tensor: the speech (the family names its I/O)."""
        raise NotImplementedError
