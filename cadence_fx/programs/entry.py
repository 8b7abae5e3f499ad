"""One catalog entry's graph from the model's symbolic steps: specialized, or ``None``.

``specialized_entry`` is what the compiler asks first for every entry under the rules
with S when the adapter has ``symbolic_dims()``.  A symbolic step records the guards
under which it is the step; a prompt length outside them takes another branch of the
model's code (Token2Wav: one in 25 prompt lengths, where a length divides evenly).  So a
key holds up to ``MAX_VARIANTS`` symbolic steps, each traced at the first length the
earlier ones refused: every branch class is traced once, and each later length is
specialized from the variant whose guards it meets.  Where none serves and no variant
is left, or a fresh variant refuses its own dims, the compiler traces the entry at its
exact shapes; ``setup["reason"]`` says why.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.fx as fx

from ..errors import NeedsForeground, SpecializationRefused, TraceError
from ..foreground import forked_rng, in_background
from ..passes.specialize import specialize
from ..passes.trace_symbolic import ModuleStateChanged, SymbolicStep, trace_symbolic
from ..plan import CatalogEntry, Plan
from ..runtime import device_work
from ..runtime.arena import empty_of, zeros_of
from .shapes import NotAffine, symbolic_shapes
from .store import ProgramStore, symbolic_key

#: symbolic steps per entry key (branch classes of the dims); beyond: concrete traces
MAX_VARIANTS = 4
#: the same for an off-catalog chunk whose input length is symbolic too (more branch classes:
#: Token2Wav's flush on the CPU has one at 3-16 tokens and one at 17-18)
MAX_CHUNK_VARIANTS = 8


def run_once(adapter, entry: CatalogEntry, by_region: dict, device: torch.device,
             inputs: dict | None = None, flags: dict | None = None) -> None:
    """The step once, eagerly, on the scratch arena at the entry's shapes (generators forked);
    ``inputs``/``flags``: an off-catalog chunk's (default: the adapter's example inputs, no flags)."""
    state = {r: zeros_of(entry.regions[r], device) for r in adapter.signature.regions}
    bound = {p: by_region[r.name] for r in adapter.declaration.regions for p in r.buffers if r.name in by_region}
    devices = [device] if device.type == "cuda" else []
    with torch.no_grad(), forked_rng(devices, f"entry {entry.index + 1}'s run on the scratch arena"):
        adapter.bind(bound)(adapter.example_inputs() if inputs is None else inputs, state, **(flags or {}))


def _trace(adapter, plan_at: Callable, plan: Plan, entry: CatalogEntry, by_region: dict, symbolic: tuple,
           dims: dict, inputs: dict, device: torch.device, say, flags: dict, prepare,
           off_catalog: bool, programs: ProgramStore) -> SymbolicStep:
    """The symbolic trace of one entry.  On a background build's thread it runs the step's
    Python beside the stream's eager chunks, on the same modules: a step that rebinds a
    module tensor while it runs (a table built or moved on first use) would show the
    stream a fake tensor until the trace puts it back.  So a build traces only once a
    trace of this model rebound nothing (``ProgramStore.traced_clean``: in this process's
    foreground, where a first use is run for real and traced again, or in the process that
    wrote a disk entry loaded here); else ``NeedsForeground``, and the build fails without
    touching the model: its stream stays eager, its configuration's next set-up compiles
    in the foreground.  (A background build starts after its stream's set-up and first
    chunk ran the step for real: first uses are done by then.)"""
    if in_background() and not programs.traced_clean:
        raise NeedsForeground("a symbolic trace on a build's thread runs the step beside the stream's chunks: only "
                              "after a trace of this model has rebound no module tensor (here, or the one that wrote "
                              "a disk entry loaded here)")
    sig = adapter.signature
    planned = tuple(d for d in symbolic if d in adapter.symbolic_dims())  # the plan's dims (not an input's)
    plan_dims = {d: v for d, v in dims.items() if d in adapter.dims()}
    state_shapes, slot_shapes = symbolic_shapes(plan_at, plan_dims, planned, entry.index, tuple(sig.regions),
                                                tuple(by_region))
    what = f" with {_describe(inputs, flags)}" if off_catalog else ""
    say(f"tracing catalog entry {entry.index + 1}/{len(plan.catalog)} (steps {entry.steps}){what} once for "
        f"every {', '.join(symbolic)}")
    buffers = {r: (slot_shapes[r], by_region[r].dtype, adapter.declaration.region(r).buffers) for r in by_region}
    state = {r: (state_shapes[r], getattr(torch, entry.regions[r].dtype)) for r in sig.regions}
    watch = tuple(adapter.modules().values())

    def bind(buffers, dims=None):
        step = adapter.bind(buffers, None if dims is None else {d: v for d, v in dims.items() if d in plan_dims})
        return (lambda i, s: step(i, s, **flags)) if flags else step

    def trace() -> SymbolicStep:
        with device_work.host_only():  # fake tensors: a build lets streams capture meanwhile
            return trace_symbolic(bind, sig, {d: dims[d] for d in symbolic}, inputs, state, buffers, device,
                                  watch, memo_methods=adapter.memo_methods())
    try:
        sym = trace()
    except ModuleStateChanged as e:
        # a lazily built table (e.g. moved to the device on first use): run the step once for
        # real on the scratch arena, which does that first use, and trace again
        programs.traced_clean = False
        say(f"entry {entry.index + 1}: {e}; running the step once and tracing again")
        prepare()
        sym = trace()
    programs.traced_clean = True  # this trace rebound nothing (ModuleStateChanged otherwise)
    return sym


def _describe(inputs: dict, flags: dict) -> str:
    shapes = ", ".join(f"{n} ({', '.join(str(x[0] if isinstance(x, tuple) else x) for x in s)})"
                       for n, (s, _) in inputs.items())
    return shapes + "".join(f", {k}={v}" for k, v in flags.items())


def specialized_entry(adapter, plan_at: Callable[[dict], Plan], plan: Plan, entry: CatalogEntry, by_region: dict,
                      programs: ProgramStore, setup: dict, say, example_inputs: dict | None = None,
                      flags: dict | None = None, share=None) -> "fx.GraphModule | None":
    """The entry's graph specialized from one of the model's symbolic steps (traced here
    if none serves and a variant is left); ``None`` (with ``setup["reason"]``) where none
    can: the caller traces concretely.  ``setup`` gets ``how``, ``trace_s``,
    ``specialize_s``, ``program`` (memory, disk, not cached, rejected: ...) and ``variant``,
    and ``waited_s`` where another process sharing the disk cache was tracing it.

    ``example_inputs``/``flags``: an off-catalog chunk at this entry's state (another
    input shape, a flush): its own symbolic steps, keyed by those shapes (the axes
    ``adapter.symbolic_inputs()`` names symbolic, so one trace serves every length) and flags.
    ``share``: ``specialize``'s (the adapter's ``repeated_calls()``, or None: unrolled)."""
    device = torch.device(adapter.device)
    example = adapter.example_inputs() if example_inputs is None else dict(example_inputs)
    tensors = {f"in_{n}": t for n, t in example.items()}
    tensors.update({f"state_{r}": empty_of(entry.regions[r], device) for r in adapter.signature.regions})  # shapes only

    def use(sym: SymbolicStep, at: dict) -> fx.GraphModule:
        return specialize(sym, at, tensors, by_region, recompile=False, share=share)
    return symbolic_entry(adapter, plan_at, plan, entry, by_region, programs, setup, say, use, example_inputs, flags)


def symbolic_entry(adapter, plan_at: Callable[[dict], Plan], plan: Plan, entry: CatalogEntry, by_region: dict,
                   programs: ProgramStore, setup: dict, say, use: Callable[[SymbolicStep, dict], object],
                   example_inputs: dict | None = None, flags: dict | None = None):
    """``use(step, dims)`` of the first of the entry's symbolic steps (looked up, or traced
    here where none serves and a variant is left) that it does not refuse
    (``SpecializationRefused``), at ``dims`` (the adapter's symbolic dims and, for an
    off-catalog chunk, its input lengths); ``None`` (with ``setup["reason"]``) where none
    serves.  ``specialized_entry`` uses a step by specializing it; a capacity form
    (``capacity_executable``) by binding its chunk length and holding the rest at a capacity."""
    device = torch.device(adapter.device)
    symbolic = tuple(adapter.symbolic_dims())
    dims = dict(adapter.dims())
    fixed = {d: v for d, v in dims.items() if d not in symbolic}
    example = adapter.example_inputs() if example_inputs is None else dict(example_inputs)
    flags = dict(flags or {})
    inputs = {n: (tuple(t.shape), t.dtype) for n, t in example.items()}
    if example_inputs is not None:  # an off-catalog chunk: its varying input sizes are symbolic too
        for n, axes in adapter.symbolic_inputs().items():
            shape = list(inputs[n][0])
            for axis, d in axes.items():
                if shape[axis] >= 2:  # sizes 0 and 1 are specialized by the tracer: keyed as they are
                    dims[d] = shape[axis]
                    shape[axis] = (d, 1, 0)
                    symbolic += (d,)
            inputs[n] = (tuple(shape), inputs[n][1])
    base = symbolic_key(entry.index, entry.steps, inputs, fixed, str(adapter.dtype), str(device),
                        ",".join(sorted(by_region)), flags)
    why = programs.refused(base)
    if why is not None:
        setup["reason"] = why
        return None
    at = {d: dims[d] for d in symbolic}
    prepare = lambda: run_once(adapter, entry, by_region, device, example, flags)  # noqa: E731 - a table moved on first use
    refusals = []
    for variant in range(MAX_CHUNK_VARIANTS if len(symbolic) > len(adapter.symbolic_dims()) else MAX_VARIANTS):
        key = base + (("variant", variant),)
        # memory, disk, "not cached", "rejected: ..."
        sym, setup["program"] = programs.lookup(key, adapter, prepare)
        fresh = sym is None
        if fresh:
            # one process traces a key: another sharing the disk cache waits, then loads it
            t_claim = time.perf_counter()
            with programs.tracing(key, adapter, f"entry {entry.index + 1} variant {variant}") as waited:
                if waited:
                    setup["waited_s"] = round(time.perf_counter() - t_claim, 3)
                if waited or (setup["program"] == "not cached" and programs.on_disk(key, adapter)):
                    sym, setup["program"] = programs.lookup(key, adapter, prepare)
                    fresh = sym is None
                if fresh:
                    try:
                        sym = _trace(adapter, plan_at, plan, entry, by_region, symbolic, dims, inputs, device, say,
                                     flags, prepare, example_inputs is not None, programs)
                    except (NotAffine, TraceError) as e:
                        programs.refuse(base, f"{type(e).__name__}: {e}")
                        setup["reason"] = f"{type(e).__name__}: {e}"
                        return None
                    programs.put(key, sym, adapter)  # and on disk, with the model's disk cache
        t0 = time.perf_counter()
        try:
            gm = use(sym, at)
        except SpecializationRefused as e:
            refusals.append(f"variant {variant}: {e}")
            if fresh:
                break  # traced at these very dims and still refused: trace them concretely
            continue
        setup["how"] = "traced symbolic, specialized" if fresh else "specialized"
        setup["trace_s"] = sym.trace_s if fresh else 0.0
        setup["specialize_s"] = round(time.perf_counter() - t0, 3)
        setup["variant"] = variant
        if refusals:
            setup["refused_by"] = refusals
        return gm
    setup["how"], setup["reason"] = "traced", "; ".join(refusals) or "no symbolic variant left"
    say(f"entry {entry.index + 1}: no symbolic step serves {dims} ({setup['reason']}); tracing these shapes")
    return None
