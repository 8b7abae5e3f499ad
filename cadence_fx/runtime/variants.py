"""Specializations for the chunks the catalog does not hold: shorter windows, flushes, and
the steps after them.

The catalog holds one signature per clock phase, for the step's usual inputs.  Real
traffic sends others: MiniCPM-o's duplex demo sends a shorter window at every turn's
end and a flush (``last_chunk=True``) of any length.  Such a chunk is keyed by what a
program is exact for (``VariantKey``: the state's extents, each input's shape, dtype
and strides, and the flags set) and, under the ``"specialize"`` policy, gets its own
program the first time the key is seen: specialized from the model's symbolic step
where the state is a catalog phase (traced symbolically first where none is held),
traced at its exact shapes otherwise, then the same passes as a catalog entry.  Its
next extents are the ones the step returned; where those are off the catalog, the
next step is keyed by them in turn.

``Variants`` is an executable's bounded cache of them: least recently used first out
past ``max_entries`` programs or ``max_bytes`` of their own constants (folded host
constants and graph constants; parameters are the model's and are not counted).  A key
whose build was refused (e.g. a next state past the arena's capacity) is remembered
with its reason and runs the exact eager path, counted.  Under the ``"eager"`` policy
nothing is built: every such chunk runs the eager path, as before.  Under ``"repeat"`` a
key's program is built the second time the key is seen: its first chunk runs the eager
path (``FIRST_SIGHT``, counted) and only the key is remembered (the last
``SEEN_MAX`` keys).  Real duplex traffic sends a turn-end window and a flush of a new
length at nearly every turn of every voice; on the H200, 39 such shapes of 8 paced
conversations were built in the background and none was run again (2026-12-02), each
build holding the host thread and the device lock away from the voices' own.

The build runs on the calling stream's thread, before the chunk: the first chunk of a
new shape waits for it (seconds; ``stats()["variants"]["build_s"]``), later chunks of
that shape run the program.  With ``background`` set (a drop-in built with
``background=True`` sets it: ``runtime.pending``) the build goes to the drop-in's worker
thread instead and the chunk runs the exact eager path (``BUILDING``); a later chunk of
that shape takes the program once it is done.  A background build that needs the
foreground (``NeedsForeground``: a trace, which runs the step for real) is not made on a
chunk while ``background`` is set: a stream with background builds never waits for a
trace (on the H200 a window's took 13 s), so that shape runs the exact eager path
(``NEEDS_FOREGROUND``, counted); with ``background`` unset again the next chunk of that
shape builds it on the calling thread.  Under rules SR/SRc each session captures a
variant's graphs on its own arena the first time it runs it.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any, Callable, Mapping

import torch

from ..errors import CadenceError, NeedsForeground, caused_by
from .arena import copy_strided

#: the reason of an off-catalog chunk that ran eagerly while its program builds in the background
BUILDING = "its program is building in the background"
#: the reason of an off-catalog chunk whose program needs a trace, which no chunk waits for in background mode
NEEDS_FOREGROUND = ("its program needs a trace on the stream's thread, which a chunk never waits for while "
                    "builds are in the background (background=False builds it on the next chunk of its shape)")

#: the reason of an off-catalog chunk run eagerly because its shape had not been seen before (policy "repeat")
FIRST_SIGHT = "the first chunk of its shape (policy 'repeat': its program is built if the shape comes again)"
#: how many keys seen once a ``Variants`` remembers under "repeat" (least recently seen out first)
SEEN_MAX = 4096

#: what an off-catalog chunk does: built and run by its own program (on first use, or the
#: second time its shape comes), or run eagerly
POLICIES = ("specialize", "repeat", "eager")
#: the library's default: a build waits seconds on the chunk that triggers it; eager is stock speed
DEFAULT_POLICY = "eager"
DEFAULT_MAX_ENTRIES = 32
DEFAULT_MAX_BYTES = 256 << 20


class VariantRefused(CadenceError):
    """No program can be built for a key (the reason is kept; its chunks run eagerly)."""


class RefusedForNow(VariantRefused):
    """No program for a key now because memory ran out: the reason is kept ``OOM_RETRY_S``
    seconds (its chunks run eagerly meanwhile), then the key is built again."""


#: seconds a refusal that out of memory caused is kept (memory a build needed comes back as
#: other work ends; a refusal for good would keep the key eager for the process's life)
OOM_RETRY_S = 30.0


class VariantBusy(CadenceError):
    """No program for a key now, nor a reason to remember: what it needs is being built for
    another stream (this chunk runs eagerly; the next chunk of the shape asks again)."""


@dataclasses.dataclass(frozen=True)
class VariantKey:
    """What a specialization is exact for: plain, hashable data.

    ``entry``: the catalog entry whose extents the state has (None: off the catalog);
    ``extents``: (region, extent) per carried region (None for a fixed-shape one);
    ``inputs``: (name, shape, dtype, strides) per input; ``flags``: (name, value) per flag set.
    """

    entry: int | None
    extents: tuple[tuple[str, int | None], ...]
    inputs: tuple[tuple[str, tuple[int, ...], str, tuple[int, ...]], ...]
    flags: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, entry: int | None, extents: Mapping[str, int | None], carried: tuple[str, ...],
           inputs: Mapping[str, torch.Tensor], names: tuple[str, ...], flags: Mapping[str, Any]) -> "VariantKey":
        """The key of a live call; ``VariantRefused`` for a flag value that cannot key a program."""
        set_flags = []
        for k, v in sorted(flags.items()):
            if not v:
                continue
            if v is not True and not isinstance(v, (int, str)):
                raise VariantRefused(f"flag {k}={v!r} ({type(v).__name__}) cannot key a program: only "
                                     f"True, ints and strings are traced as constants")
            set_flags.append((k, v))
        return cls(entry, tuple((r, extents.get(r)) for r in carried),
                   tuple((n, tuple(inputs[n].shape), str(inputs[n].dtype).removeprefix("torch."),
                          tuple(inputs[n].stride())) for n in names),
                   tuple(set_flags))

    @property
    def flag_values(self) -> dict[str, Any]:
        return dict(self.flags)

    def label(self) -> str:
        """How ``stats()`` names it: ``"entry 2 | token (1, 11), spk (1, 192)"``, ``"off-catalog
        estimator_att_cache=98,... | token (1, 28), spk (1, 192)"``, ``"... | last_chunk"``."""
        where = f"entry {self.entry}" if self.entry is not None else "off-catalog " + ",".join(
            f"{r}={e}" for r, e in self.extents if e is not None)
        shapes = ", ".join(f"{n} {shape}" for n, shape, _, _ in self.inputs)
        flags = ",".join(k if v is True else f"{k}={v}" for k, v in self.flags)
        return " | ".join(p for p in (where, shapes, flags) if p)


@dataclasses.dataclass
class _Built:
    program: Any  # runtime.session.EntryProgram
    nbytes: int
    build_s: float
    how: str
    inputs: Any = None  # built ahead (``build_ahead``): inputs of its shapes, for a session's capture in idle time


class Variants:
    """One executable's specializations (LRU-bounded; thread-safe).

    ``build(key, inputs) -> (program, nbytes, how)`` is the compiler's: it raises
    ``VariantRefused`` (or anything else, kept as the reason) where no program can be
    built.  Only one build runs at a time: a session that needs a key another session is
    building runs that chunk eagerly rather than wait.
    """

    def __init__(self, build: Callable[[VariantKey, Mapping[str, torch.Tensor]], tuple],
                 policy: str = DEFAULT_POLICY, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES):
        check_policy(policy, max_entries, max_bytes)
        self._build = build
        self.policy, self.max_entries, self.max_bytes = policy, max_entries, max_bytes
        self._held: collections.OrderedDict[VariantKey, _Built] = collections.OrderedDict()
        self._refused: dict[VariantKey, str] = {}
        self._retry_at: dict[VariantKey, float] = {}  # a refusal out of memory caused: when it is tried again
        self._lock = threading.Lock()  # the tables
        self._building = threading.Lock()  # one build at a time
        self.built = 0
        self.evicted = 0
        self.build_s = 0.0  # every build, held or evicted since
        #: ``submit(label, fn) -> handle`` (start(), done(), wait(), error(), result(), times():
        #: ``runtime.pending.Build``): builds go to a worker thread; None: built on the calling
        #: thread (see the module docstring)
        self.background: Callable[[str, Callable[[], tuple]], Any] | None = None
        #: ``quick(key) -> bool``: a build cheap enough for the calling thread even while
        #: ``background`` is set (a capacity executable's check of a shared graph it holds)
        self.quick: Callable[[VariantKey], bool] | None = None
        #: ``ahead(seconds) -> int``: work a later chunk would otherwise pay, done in idle time
        #: (``work_ahead``; a capacity stream's checks of the shared graphs held, at its length);
        #: ``ahead_stats() -> dict``: what it did, and what chunks took from it
        self.ahead: Callable[[float | None], int] | None = None
        self.ahead_stats: Callable[[], dict] | None = None
        self._pending: dict[VariantKey, Any] = {}  # key -> its build's handle
        self._seen: collections.OrderedDict[VariantKey, None] = collections.OrderedDict()  # "repeat": seen once
        self.first_sights = 0  # chunks run eagerly as the first of their shape ("repeat")
        self._foreground_only: dict[VariantKey, str] = {}  # key -> why its background build could not run

    def get(self, key: VariantKey, inputs: Mapping[str, torch.Tensor]) -> tuple[Any | None, str | None]:
        """``(program, None)``, built now if need be, or ``(None, why not)``."""
        if self.policy == "eager" or self.max_entries == 0:
            return None, "off-catalog chunks run eagerly (policy 'eager')"
        with self._lock:
            hit = self._held.get(key)
            if hit is not None:
                self._held.move_to_end(key)
                return hit.program, None
            if key in self._refused:
                if self._retry_at.get(key, float("inf")) > time.monotonic():
                    return None, self._refused[key]
                del self._refused[key], self._retry_at[key]  # out of memory was why, and its time is up
            if self.policy == "repeat" and key not in self._pending and key not in self._foreground_only:
                if key not in self._seen:  # the first of its shape: remembered, not built
                    self._seen[key] = None
                    while len(self._seen) > SEEN_MAX:
                        self._seen.popitem(last=False)
                    self.first_sights += 1
                    return None, FIRST_SIGHT
                del self._seen[key]  # the second: built as under "specialize"
            if key in self._foreground_only:  # needs a trace: never on a chunk in background mode
                if self.background is not None:
                    return None, NEEDS_FOREGROUND
            elif key in self._pending or (self.background is not None
                                          and not (self.quick is not None and self.quick(key))):
                got = self._in_background(key, inputs)
                if got is not None:
                    return got
        if not self._building.acquire(blocking=False):
            return None, "another session is building a specialization"
        try:
            with self._lock:  # built while this one waited for the lock?
                if key in self._held:
                    return self._held[key].program, None
            t0 = time.perf_counter()
            try:
                program, nbytes, how = self._build(key, inputs)
            except VariantBusy as e:  # not a reason to keep: the next chunk of this shape asks again
                return None, str(e)
            except Exception as e:  # the reason is kept; the chunk runs eagerly, exact
                with self._lock:
                    return self._refuse(key, e)
            with self._lock:
                return self._take(key, _Built(program, int(nbytes), round(time.perf_counter() - t0, 3), how))
        finally:
            self._building.release()

    def _refuse(self, key: VariantKey, error: BaseException) -> tuple[None, str]:
        """(Holding ``_lock``.)  ``key`` runs eagerly from now on, ``error`` its reason."""
        why = str(error) if isinstance(error, VariantRefused) else f"{type(error).__name__}: {error}"
        self._refused[key] = why
        if isinstance(error, RefusedForNow) or caused_by(error, torch.OutOfMemoryError):
            self._retry_at[key] = time.monotonic() + OOM_RETRY_S  # built again after that
        return None, why

    def _take(self, key: VariantKey, built: _Built) -> tuple[Any | None, str | None]:
        """(Holding ``_lock``.)  A built program into the table: ``(program, None)``, or
        ``(None, why)`` where it is larger than the whole byte budget (never held, so never
        built again)."""
        self._held[key] = built
        self.built += 1
        self.build_s += built.build_s
        self._evict()
        if key not in self._held:
            why = f"its program holds {built.nbytes} bytes of constants, over max_bytes={self.max_bytes}"
            self._refused[key] = why
            return None, why
        return built.program, None

    def _in_background(self, key: VariantKey, inputs: Mapping[str, torch.Tensor]):
        """(Holding ``_lock``.)  ``key``'s program if its background build is done (taken into
        the table now), else ``(None, why)``: a build submitted now, or still running; or
        ``None`` where the build needed the calling thread and ``background`` is unset now (the
        caller builds it)."""
        handle = self._pending.get(key)
        if handle is None:
            copies = {n: copy_strided(t) for n, t in inputs.items()}  # the caller may reuse its tensors
            handle = self.background(key.label(), lambda: self._build(key, copies))
            handle.start()
            self._pending[key] = handle
            return None, BUILDING
        if not handle.done():
            return None, BUILDING
        del self._pending[key]
        error = handle.error()
        if isinstance(error, NeedsForeground):  # a trace: never on a chunk in background mode
            self._foreground_only[key] = str(error)
            return (None, NEEDS_FOREGROUND) if self.background is not None else None
        if error is not None:
            return self._refuse(key, error)
        program, nbytes, how = handle.result()
        build_s = handle.times()["build_s"] or 0.0
        return self._take(key, _Built(program, int(nbytes), build_s, f"{how}, in the background"))

    def work_ahead(self, seconds: float | None = None) -> int:
        """Idle time (``Session.idle``): ``ahead``'s work, ``seconds`` at most (None: no bound;
        checked between items, so one item may run past it).  Returns the items done; none
        where no ``ahead`` is set, under policy ``"eager"``, or with ``seconds`` <= 0."""
        if self.ahead is None or self.policy == "eager" or self.max_entries == 0 or (
                seconds is not None and seconds <= 0):
            return 0
        return self.ahead(seconds)

    def build_ahead(self, key: VariantKey, inputs: Mapping[str, torch.Tensor]) -> "float | None":
        """Idle time: ``key``'s program built now, on the calling thread, before any chunk asks
        for it (an ``ahead`` hook's: ``inputs`` are valid inputs of its shapes), and held as a
        chunk's build would be; even while builds go to the background (idle time is the
        foreground's: a build that needs it runs here).  Only under policy ``"specialize"`` (under
        ``"repeat"`` a shape is built the second time it comes; under ``"eager"`` never).  The
        seconds it took, or None where nothing was built: held, refused before, building in
        the background, another build running, or refused now (kept, as a chunk's would be)."""
        if self.policy != "specialize" or self.max_entries == 0:
            return None
        with self._lock:
            if key in self._held or key in self._refused or key in self._pending:
                return None
        if not self._building.acquire(blocking=False):
            return None
        try:
            with self._lock:
                if key in self._held:
                    return None
            t0 = time.perf_counter()
            copies = {n: copy_strided(t) for n, t in inputs.items()}  # built from, then kept for captures
            try:
                program, nbytes, how = self._build(key, copies)
            except (VariantBusy, NeedsForeground):  # not reasons to keep: its chunk (or a later idle) builds it
                return None
            except Exception as e:  # kept, as a chunk's build's would be: its chunk runs eagerly, exact
                with self._lock:
                    self._refuse(key, e)
                return None
            build_s = round(time.perf_counter() - t0, 3)
            with self._lock:
                self._foreground_only.pop(key, None)  # built in the foreground now
                self._take(key, _Built(program, int(nbytes), build_s, f"{how}, ahead in idle time", copies))
            return build_s
        finally:
            self._building.release()

    def built_ahead(self) -> list:
        """``(key, program, inputs)`` of each program held that ``build_ahead`` built (what a
        replaying session captures in its idle time: ``Session._work_ahead``)."""
        with self._lock:
            return [(k, b.program, b.inputs) for k, b in self._held.items() if b.inputs is not None]

    def settled(self, key: VariantKey) -> bool:
        """Whether ``key`` has a program held or a reason kept (nothing left to build for it)."""
        with self._lock:
            return key in self._held or key in self._refused

    def pending(self) -> list:
        """The handles of the background builds not taken yet (``DropIn.wait_for_builds``)."""
        with self._lock:
            return list(self._pending.values())

    def configure(self, policy: str, max_entries: int, max_bytes: int) -> None:
        """Another policy or bounds from now on (held programs past the new bounds go, oldest first)."""
        check_policy(policy, max_entries, max_bytes)
        with self._lock:
            self.policy, self.max_entries, self.max_bytes = policy, max_entries, max_bytes
            self._evict()

    def holds(self, key: VariantKey) -> bool:
        with self._lock:
            return key in self._held

    def _evict(self) -> None:
        while self._held and (len(self._held) > self.max_entries or self.nbytes > self.max_bytes):
            self._held.popitem(last=False)
            self.evicted += 1

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._held.values())

    def stats(self) -> dict:
        """Policy, bounds, what is held (label -> how it was built, seconds, bytes), refusals;
        ``ahead``: the work done in idle time, where ``ahead`` is set (``ahead_stats``)."""
        with self._lock:
            return {
                "policy": self.policy, "max_entries": self.max_entries, "max_bytes": self.max_bytes,
                "held": {k.label(): {"how": b.how, "build_s": b.build_s, "bytes": b.nbytes}
                         for k, b in self._held.items()},
                "bytes": self.nbytes, "built": self.built, "build_s": round(self.build_s, 3),
                "evicted": self.evicted, "first_sights": self.first_sights,
                "refused": {k.label(): why for k, why in self._refused.items()},
                "building": [k.label() for k in self._pending],
                "foreground_only": {k.label(): why for k, why in self._foreground_only.items()},
                **({"ahead": self.ahead_stats()} if self.ahead_stats is not None else {}),
            }

    def describe(self) -> list[str]:
        """Lines for ``explain``."""
        s = self.stats()
        lines = [f"off-catalog chunks: policy {s['policy']!r}, {len(s['held'])}/{s['max_entries']} "
                 f"specializations held, {s['bytes']}/{s['max_bytes']} bytes of constants, "
                 f"{s['built']} built, {s['evicted']} evicted (least recently used first)"]
        lines += [f"  {label}: {v['how']} in {v['build_s']:.2f} s" for label, v in s["held"].items()]
        lines += [f"  {label}: eager ({why})" for label, why in s["refused"].items()]
        return lines


def off_catalog_section(policy: str = DEFAULT_POLICY, max_entries: int = DEFAULT_MAX_ENTRIES,
                        max_bytes: int = DEFAULT_MAX_BYTES, held: "Mapping[str, Variants]" = {}) -> str:
    """The ``Off-catalog chunks`` section of a plan's printout: the policy, its bounds and,
    per compiled configuration (``held``: name -> its ``Variants``), what it holds."""
    does = {"specialize": "each gets its own program on first use, then runs it",
            "repeat": "a shape's first chunk runs the exact eager path, counted; its program is built if the shape "
                      "comes again",
            "eager": "each runs the exact eager path, counted"}.get(policy, "?")
    lines = ["Off-catalog chunks (other input shapes, flags such as a flush, the steps after them)",
             f"  policy: {policy!r} ({does}; optimize(..., off_catalog='specialize' | 'repeat' | 'eager'))",
             f"  bounds per configuration: {max_entries} programs, {max_bytes} bytes of their constants "
             f"(least recently used out first)"]
    for name, variants in held.items():
        lines += [f"  {name}: " + variants.describe()[0]] + [f"  {line}" for line in variants.describe()[1:]]
    return "\n".join(lines)


def check_policy(policy: str, max_entries: int, max_bytes: int) -> None:
    """``CadenceError`` naming a bad ``off_catalog`` / ``max_specializations`` / ``max_specialization_bytes``."""
    if policy not in POLICIES:
        raise CadenceError(f"off_catalog={policy!r}: use one of {list(POLICIES)} ('specialize': an off-catalog "
                           f"chunk gets its own program on first use; 'repeat': the second time its shape comes; "
                           f"'eager': it runs the exact eager path)")
    for name, v in (("max_specializations", max_entries), ("max_specialization_bytes", max_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise CadenceError(f"{name}={v!r} must be an int >= 0")
