"""``ProgramStore``: one optimized model's symbolic steps, and how each entry got its graph."""

from __future__ import annotations

import contextlib
import threading
from typing import Hashable, Mapping, Sequence

from ..passes.trace_symbolic import SymbolicStep
from .disk import DiskCache, key_parts


def symbolic_key(entry_index: int, entry_steps: str, inputs: Mapping[str, tuple], fixed_dims: Mapping[str, int],
                 dtype: str, device: str, placement: str, flags: Mapping[str, object] | None = None) -> tuple:
    """What a symbolic step depends on besides its symbolic dims (plain, hashable data);
    ``flags``: the step's flags (a flush), set only for off-catalog chunks."""
    key = (entry_index, entry_steps, tuple(sorted((n, tuple(s), str(d)) for n, (s, d) in inputs.items())),
           tuple(sorted(fixed_dims.items())), dtype, device, placement)
    return key + (("flags",) + tuple(sorted(flags.items())),) if flags else key


class ProgramStore:
    """Symbolic steps by ``symbolic_key``; a key whose symbolic trace failed is remembered
    (with its reason) so the next configuration does not try again.  Thread-safe.

    With ``disk`` (a ``DiskCache``), a step not in memory is looked up on disk and a
    new one is written through; both need the ``adapter`` (its ``modules()`` and
    ``cache_identity()``; without one the store stays in memory).
    """

    def __init__(self, disk: DiskCache | None = None):
        self.disk = disk
        self._steps: dict[Hashable, SymbolicStep] = {}
        self._refused: dict[Hashable, str] = {}
        self._from_disk: set[Hashable] = set()
        self._lock = threading.Lock()
        #: a symbolic trace of this model's step rebound no module tensor: one in this process,
        #: or the one that wrote a disk entry loaded here (a trace that rebinds is refused, never
        #: kept).  ``programs.entry``: only then may a background build trace beside a stream
        self.traced_clean = False

    def lookup(self, key: Hashable, adapter=None, prepare=None) -> tuple[SymbolicStep | None, str]:
        """``(step, where)``: where is "memory", "disk", "not cached", or "rejected: <why>"
        (a disk entry that cannot serve this model; the caller traces and ``put`` replaces it).
        ``prepare``: see ``DiskCache.fetch``."""
        with self._lock:
            step = self._steps.get(key)
        if step is not None:
            return step, "memory"
        if self.disk is None or adapter is None:
            return None, "not cached"
        step, why = self.disk.fetch(key_parts(adapter, key), adapter.modules(), prepare)
        if step is None:
            return None, "not cached" if why is None else f"rejected: {why}"
        with self._lock:
            step = self._steps.setdefault(key, step)
            self._from_disk.add(key)
        self.traced_clean = True  # its writer traced it cleanly (a trace that rebinds is never kept)
        return step, "disk"

    def tracing(self, key: Hashable, adapter=None, what: str = ""):
        """A context held while ``key`` is looked up again and traced: the disk cache's
        lock on its entry (processes sharing the directory trace it once), else nothing.
        Yields whether it waited for another holder."""
        if self.disk is None or adapter is None:
            return contextlib.nullcontext(False)
        return self.disk.claim(key_parts(adapter, key), what)

    def on_disk(self, key: Hashable, adapter=None) -> bool:
        return self.disk is not None and adapter is not None and self.disk.exists(key_parts(adapter, key))

    def get(self, key: Hashable, adapter=None) -> SymbolicStep | None:
        return self.lookup(key, adapter)[0]

    def put(self, key: Hashable, step: SymbolicStep, adapter=None) -> None:
        with self._lock:
            self._steps[key] = step
            self._from_disk.discard(key)
        if self.disk is not None and adapter is not None:
            self.disk.save(key_parts(adapter, key), step, adapter.modules())

    def refuse(self, key: Hashable, reason: str) -> None:
        with self._lock:
            self._refused[key] = reason

    def refused(self, key: Hashable) -> str | None:
        with self._lock:
            return self._refused.get(key)

    def __len__(self) -> int:
        return len(self._steps)

    def items(self) -> list[tuple[Hashable, SymbolicStep]]:
        with self._lock:
            return list(self._steps.items())

    def entry_steps(self, dims: Sequence[str], variant: int = 0) -> dict[int, SymbolicStep]:
        """Each catalog entry's symbolic step of ``variant`` (``programs.entry``'s key suffix),
        free in exactly ``dims``: entry index -> step.  An off-catalog chunk's steps (flags, or
        symbolic in its length too) are left out."""
        want = set(dims)
        with self._lock:
            return {key[0]: step for key, step in self._steps.items()
                    if key[-1] == ("variant", variant) and set(step.dims) == want
                    and not any(isinstance(x, tuple) and x[:1] == ("flags",) for x in key)}

    def describe(self) -> list[str]:
        """One line per key: its symbolic step (", loaded from disk" for one read from the
        disk cache), or why its entry is traced per configuration."""
        with self._lock:
            return [f"entry {k[0]} ({k[1]}): {s.describe()}{', loaded from disk' if k in self._from_disk else ''}"
                    for k, s in self._steps.items()] + \
                   [f"entry {k[0]} ({k[1]}): traced per configuration: {why}" for k, why in self._refused.items()]


def setup_section(symbolic_dims: Sequence[str], store: "ProgramStore | None" = None) -> str:
    """The ``Setup`` section of a plan's printout: how each catalog entry gets its graph
    for a model whose adapter declares ``symbolic_dims`` (and, given the model's
    ``store``, the symbolic steps it holds)."""
    lines = ["Setup (how each catalog entry gets its graph)"]
    if symbolic_dims:
        dims = ", ".join(symbolic_dims)
        lines += [f"  symbolic: {dims}",
                  f"  rules S, SR, SRc: each catalog entry is traced once for every {dims} and specialized per "
                  f"stream configuration;",
                  f"  a value of {dims} that the trace's guards exclude is traced at its own shapes (with the reason); "
                  f"rules R, Rc trace per configuration"]
    else:
        lines.append("  symbolic: none: each catalog entry is traced once per stream configuration")
    if store is not None:
        held = store.describe()
        lines += ["  programs held: " + ("none yet (nothing traced)" if not held else f"{len(held)}")]
        lines += [f"    {line}" for line in held]
        if store.disk is not None and symbolic_dims:
            lines.append(f"  program cache on disk: {store.disk.directory} (a new process loads these, not traces)")
    return "\n".join(lines)

