"""A server's start on capacity graphs: window and flush graphs built before any voice sends them.

``chunk_inputs`` makes a chunk of a given length from a model's example inputs;
``prepare(cexe, shapes)`` builds a capacity executable's shared graph of each shape
(``capacity_executable.shared_variant``), as a stream's first sight of it would;
``capture(cexe, shapes)``, with shared captures (``runtime.working``), captures each
catalog entry's graph and each shape's on the capacity's working arena, as the first
stream's set-up and first window or flush would: a voice then captures nothing.
``OptimizedToken2Wav.prepare_capacity`` and ``cadence-fx traffic --prepare`` call them.
"""

from __future__ import annotations

import functools
import time
from typing import Callable, Mapping

import torch

from . import step as meta
from .capacity_executable import CapacityExecutable, SharedGraph, _label, _shape, at_stream, shared_variant
from .compiler import program_kind
from .errors import CadenceError, SpecializationRefused
from .passes.capacity import check_dims
from .passes.capacity_ops import _guards, sizes_function
from .runtime import device_work
from .runtime.variants import VariantBusy, VariantKey, VariantRefused


def chunk_inputs(adapter, lengths: Mapping[str, int]) -> dict:
    """The adapter's example inputs with each axis ``adapter.symbolic_inputs()`` names at the
    length ``lengths`` gives its dim (Token2Wav: ``{"chunk_tokens": 11}``: an 11-token
    window), their values the examples' tiled (valid ids for a token input), contiguous."""
    named = {d for axes in adapter.symbolic_inputs().values() for d in axes.values()}
    if set(lengths) - named:
        raise CadenceError(f"chunk_inputs: {sorted(set(lengths) - named)} is no input axis of this model "
                           f"(its symbolic input axes: {sorted(named) or 'none'})")
    out = {}
    for name, t in adapter.example_inputs().items():
        for axis, d in adapter.symbolic_inputs().get(name, {}).items():
            if d in lengths:
                n = int(lengths[d])
                if n < 1:
                    raise CadenceError(f"{d}={n}: a chunk's length is at least 1")
                t = t.index_select(axis, torch.arange(n, device=t.device) % t.shape[axis])
        out[name] = t.contiguous()
    return out


def prepare(cexe: CapacityExecutable, shapes, entry: int | None = None,
            say: Callable[[str], None] | None = None) -> dict:
    """Build the shared graphs of ``shapes`` before any stream sends them (a server's start:
    each turn-end window and flush length it will see), at catalog entry ``entry``'s state
    (default: the steady one, where a turn's window and flush come).  ``shapes``: ``(inputs,
    flags)`` pairs (``chunk_inputs`` makes the inputs).  Returns ``{label: how}``: ``"held"``
    (built before), ``"built in S s"``, ``"loaded from disk in S s"`` (the model's program cache
    held it: ``capacity_build``), or why none serves (also remembered, as a stream's
    first sight of it would be); with one symbolic dim, a graph built or held adds which of
    the lengths up to the capacity it serves (``served``: ``"; serves N of M lengths"``, M
    those the catalog serves), and one that serves fewer than half of them is said through
    ``say`` (the capacity sits in a branch class of that shape's code few lengths share: a
    voice of another length traces a program of its own for it on its chunk).  One shape at
    a time, each reported through ``say``; each build waits for one a stream started
    (``VariantBusy``) and holds the device's work lock (``runtime.device_work``: no capture
    beside it)."""
    say = say or cexe.say
    plan = cexe.plan
    index = _entry_index(plan, entry, "prepare")
    sig = cexe.signature
    shapes = list(shapes)
    own = {n: tuple(t.shape) for n, t in cexe.adapter.example_inputs().items()}
    lengths = catalog_lengths(cexe)
    out = {}
    for i, (inputs, flags) in enumerate(shapes):
        key = VariantKey.of(index, {}, (), inputs, sig.inputs, flags)
        label = _label(_shape(key))
        if not key.flags and all(tuple(inputs[n].shape) == own[n] for n in sig.inputs):
            out[label] = "the catalog's own chunk"
            continue
        with cexe._lock:
            held = isinstance(cexe.shared.get(_shape(key)), SharedGraph)
        if held:
            out[label] = "held" + _served(cexe, key, lengths, label, say)
            continue
        say(f"shared graph {i + 1}/{len(shapes)}: {label}")
        t0 = time.perf_counter()
        while True:
            try:
                with device_work.held():
                    got = shared_variant(cexe, key, inputs)
                out[label] = (f"{'loaded from disk' if got.loaded else 'built'} in {time.perf_counter() - t0:.1f} s"
                              + _served(cexe, key, lengths, label, say))
            except VariantBusy:  # a stream's build of another shape: wait for it, then this one
                with cexe._building:
                    pass
                continue
            except VariantRefused as e:
                out[label] = str(e)
            break
    return out


def catalog_lengths(cexe: CapacityExecutable) -> "list[dict] | None":
    """Each value up to the capacity of its one symbolic dim at which every catalog entry's
    graph serves (``check_dims``, read as ``serving`` reads it), as dims; None with more than
    one dim (not enumerated)."""
    if len(cexe.dims) != 1:
        return None
    ((d, cap),) = cexe.dims.items()
    checks = [serving(cplan, sym) for _, cplan, sym in cexe.graphs.values()]
    return [{d: v} for v in range(1, int(cap) + 1) if all(serves({d: v}) for serves in checks)]


def served(shared: SharedGraph, lengths: "list[dict]") -> int:
    """How many of ``lengths`` (dims) ``shared`` serves (``serving``)."""
    serves = serving(shared.plan, shared.sym)
    return sum(serves(dims) for dims in lengths)


def serving(plan, sym) -> Callable[[Mapping[str, int]], bool]:
    """``dims -> bool``: ``check_dims``'s verdict, its guards read as Python functions once
    (``_guard_functions``: microseconds a length, where sympy's substitution takes about a
    millisecond: 48 shapes at 250 lengths would add ~11 s to a prepare), ``check_dims``
    itself where one cannot be read so.  For reports only: every stream's own
    ``check_dims`` still decides what runs."""
    names = tuple(str(sym.symbols[d]) for d in sym.dims)
    fns = _guard_functions(names, tuple(str(g) for g in sym.guards))
    caps = [int(plan.capacity[d]) for d in sym.dims]
    try:  # the extents as one function (``sizes_function``), and their sizes at the capacity once
        extents = sizes_function(tuple(plan.extents), names)
        at_caps = _ints(extents(*caps))
    except Exception:  # noqa: BLE001 - not readable so: check_dims decides every length
        fns = None

    def slow(dims) -> bool:
        try:
            check_dims(plan, sym, dims)
            return True
        except SpecializationRefused:
            return False

    def serves(dims) -> bool:
        values = [int(dims[d]) for d in sym.dims]
        if fns is None or set(dims) != set(plan.capacity) or not all(0 <= v <= c for v, c in zip(values, caps)):
            return slow(dims)
        try:
            return all(bool(f(*values)) for f in fns) and all(
                0 <= v <= c for v, c in zip(_ints(extents(*values)), at_caps))
        except Exception:  # noqa: BLE001 - one Python cannot evaluate: check_dims decides
            return slow(dims)
    return serves


def _ints(sizes: tuple) -> tuple:
    if any(type(v) is not int for v in sizes):
        raise ValueError(f"sizes {sizes} are not all ints")
    return sizes


@functools.lru_cache(maxsize=256)
def _guard_functions(names: tuple, guards: tuple) -> "tuple | None":
    """The guards as Python functions of the dims' values: ``check_dims``'s own reading of
    them (``capacity_ops._guards``), each through ``sympy.lambdify``; None where one cannot
    be made."""
    import sympy
    try:
        symbols, exprs = _guards(names, guards)
        return tuple(sympy.lambdify(symbols, e, modules="math") for e in exprs)
    except Exception:  # noqa: BLE001
        return None


def _served(cexe: CapacityExecutable, key: VariantKey, lengths, label: str, say) -> str:
    with cexe._lock:
        shared = cexe.shared.get(_shape(key))
    if lengths is None or not isinstance(shared, SharedGraph):
        return ""
    n = served(shared, lengths)
    if 2 * n < len(lengths):
        say(f"{label}: its graph serves {n} of the {len(lengths)} lengths up to the capacity the catalog serves "
            f"(the capacity sits in a branch class of this shape's code few lengths share): a voice of another "
            f"length traces a program of its own for it on its chunk; a capacity in the shape's common class "
            f"serves them (docs/serving.md, choosing a capacity)")
    return f"; serves {n} of {len(lengths)} lengths"


def _entry_index(plan, entry, who: str) -> int:
    """The catalog index ``entry`` names (None: the steady entry, the catalog's last)."""
    if entry is not None and (isinstance(entry, bool) or not isinstance(entry, int)
                              or not 0 <= entry < len(plan.catalog)):
        raise CadenceError(f"{who}: entry={entry!r} is no catalog entry (0..{len(plan.catalog) - 1})")
    return plan.catalog[-1].index if entry is None else plan.catalog[entry].index


def capture(cexe: CapacityExecutable, shapes=(), entry: int | None = None,
            say: Callable[[str], None] | None = None) -> dict:
    """With shared captures (``capacity_executable(..., shared_captures=True)`` under SR/SRc):
    each catalog entry's graph and the shared graph of each of ``shapes`` held (as ``prepare``
    takes them; a shape with none held is passed over) captured on the capacity's working
    arena now, at the capacity's own length (the pieces serve every length), so no voice's
    set-up, window or flush captures.  Returns ``{label: how}``: ``"captured in S s"``,
    ``"held"`` (captured before), ``"no shared graph held"`` (``prepare`` it first), or what
    failed (its regions then run eagerly, counted in each session's stats; a failure is
    tried again by the next stream that needs it).  ``CadenceError`` where the captures are
    not shared, or for an ``entry`` that is no catalog entry."""
    working = cexe.working()
    if working is None:
        raise CadenceError("capture: this capacity's graphs are captured per session (shared_captures=False)")
    say = say or cexe.say
    plan, sig = cexe.plan, cexe.signature
    index = _entry_index(plan, entry, "capture")
    lengths = {d: torch.tensor(v, device=cexe.device) for d, v in cexe.dims.items()}
    kind = program_kind(cexe.rules)
    todo = [(f"entry {e.index}", cexe.graphs[e.index][0], cexe.graphs[e.index][2], e,
             cexe.adapter.example_inputs()) for e in plan.catalog]
    out = {}
    for inputs, flags in shapes:
        key = VariantKey.of(index, {}, (), inputs, sig.inputs, flags)
        with cexe._lock:
            held = cexe.shared.get(_shape(key))
        if isinstance(held, SharedGraph):
            todo.append((_label(_shape(key)), held.gm, held.sym, plan.catalog[index], inputs))
        else:
            out[_label(_shape(key))] = "no shared graph held (prepare it first)"
    for i, (label, gm, sym, at, inputs) in enumerate(todo):
        program = at_stream(gm, cexe.dims, [lengths[d] for d in sym.dims], at, meta.arena_inputs(gm), {}, kind)
        if working.holds(program):
            out[label] = "held"
            continue
        say(f"capture {i + 1}/{len(todo)}: {label}")
        t0 = time.perf_counter()
        with device_work.held(), torch.no_grad():
            _, failed, error = working.capture(program, inputs, sig.inputs)
        out[label] = (f"capture failed: {error}" if error is not None else
                      f"captured in {time.perf_counter() - t0:.2f} s" +
                      (f" ({len(failed)} regions eager: {next(iter(failed.values()))})" if failed else ""))
    return out


__all__ = ["capture", "catalog_lengths", "chunk_inputs", "prepare", "served", "serving"]
