"""declare -> plan -> trace -> rewrite -> partition -> lower -> Executable (the compile-time driver).

Each stage is a function of the previous stage's plain output:
``build_plan(adapter)`` (``make_plan`` of the adapter's declaration) -> ``Plan``; per
catalog entry ``trace_step`` -> ``GraphModule``; ``rewrite_pipeline(bindings, rules)``,
one ``PassManager`` -> ``GraphModule``:

- always: ``PruneDead``, ``FoldHostConstants``, ``PruneDead``;
- rule S: ``StateRewrite``, ``EarlyWriteback``, ``PruneDead`` (state into the arena);
- rule R: ``IstftWithoutHostRead`` (istft's per-call host read dropped where it
  cannot change), ``Partition`` (per chunk, or per model step at the adapter's
  ``step_boundary``) and ``LowerCudaGraph``, which wraps each capturable piece in the
  runtime's ``CapturedRegion`` (handed in here: passes never import the runtime).

Each entry's graph becomes an ``EntryProgram`` of one ``Executable`` (``compile_executable``);
``open_session`` gives it a ``Session`` (its arena, its captured graphs).  Rules are a
``step.Rules`` (``check_rules``/``compile_executable`` also take the paper's spelling,
"S", "SRc"...).  Only this module imports both the passes and the runtime.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Mapping

import torch
import torch.fx as fx

from .adapter import StreamingAdapter
from .annotations import Declaration
from .errors import DeclarationError, RulesError, TraceError
from .foreground import fenced, working
from .passes.base import PassManager, this_before_that
from .passes.early_writeback import EarlyWriteback
from .passes.fold_host_constants import FoldHostConstants
from .passes.istft_check import IstftWithoutHostRead
from .passes.lower_cudagraph import LowerCudaGraph
from .passes.partition import Partition
from .passes.prune_dead import PruneDead
from .passes.state_rewrite import RegionBinding, StateRewrite
from .passes.trace import trace_step
from . import step as meta
from .plan import CatalogEntry, Plan, TensorSpec, make_plan
from .programs import ProgramStore
from .programs.entry import specialized_entry
from .runtime.arena import Arena, copy_strided, zeros_of
from .runtime.counters import COMPILE_KEYS
from .runtime import collector, graphs as runtime_graphs, interpret
from .runtime.graphs import CapturedRegion
from .runtime.pending import Build, PendingSession
from .runtime.session import EntryProgram, Executable, Session
from .runtime.stock_session import StockStateSession
from .runtime.working import WorkingSession
from .runtime.variants import (DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_POLICY, VariantKey, VariantRefused,
                               Variants, check_policy)
from .step import Rules

RULES = Rules.NAMES


def check_rules(rules: "str | Rules", device: torch.device) -> "str | Rules":
    """Raise ``RulesError`` unless ``rules`` (a name or a ``Rules``) can run on ``device``.

    Returns ``rules`` as given, so a caller keeps its own spelling.
    """
    parsed = Rules.parse(rules)
    if parsed.replays:
        if device.type != "cuda" or not torch.cuda.is_available():
            raise RulesError(f"rules {str(parsed)!r} replay CUDA graphs and need a CUDA device; this model is on "
                             f"{device} (CUDA available: {torch.cuda.is_available()}). Use rules='S' here.")
    return rules


def _rules(rules: "str | Rules") -> Rules:
    """``Rules.parse``, plus ``""``: no rule (stock-managed state, eager kernels; for tests)."""
    return Rules.STOCK if isinstance(rules, str) and rules == "" else Rules.parse(rules)


def build_plan(adapter: StreamingAdapter, dims: "dict[str, int] | None" = None) -> Plan:
    """The adapter's plan (at ``dims`` instead of ``adapter.dims()`` when given)."""
    return make_plan(adapter.declaration, adapter.dims() if dims is None else dims, adapter.input_specs(),
                     dtype=str(adapter.dtype).removeprefix("torch."), device=str(adapter.device),
                     stock_state_bytes=adapter.stock_state_bytes(),
                     extra_verdicts=adapter.callable_verdicts())


def region_bindings(plan: Plan, entry: CatalogEntry,
                    extents_out: "dict[str, int | None] | None" = None) -> list[RegionBinding]:
    """What ``state_rewrite`` needs of the plan for one entry (plain data).  The next
    extents are the next catalog entry's, or ``extents_out`` where given (an off-catalog
    chunk's, from its trace)."""
    nxt = plan.entry_for_step(entry.phase + 1)
    out = []
    for slot in plan.layout.slots:
        region = plan.declaration.region(slot.name)
        ext_in = ext_out = None
        if slot.axis is not None:
            ext_in = entry.regions[slot.name].shape[slot.axis]
            ext_out = nxt.regions[slot.name].shape[slot.axis]
            if extents_out is not None and slot.name in extents_out:
                ext_out = extents_out[slot.name]
        out.append(RegionBinding(slot.name, tuple(slot.shape), slot.dtype, slot.axis, ext_in, ext_out,
                                 region.carried))
    return out


def rewrite_pipeline(bindings: list[RegionBinding], rules: "str | Rules" = "S", device_type: str = "cpu",
                     boundary=None, debug: bool = False, region=CapturedRegion,
                     let_go: bool = False, keep_folds: bool = False, code: bool = True) -> PassManager:
    """The passes for ``rules``: S rewrites state into the arena, R partitions and lowers.

    ``rules=""`` (no rule) keeps stock-managed state and eager kernels: the traced
    graph over the model's own buffers, what rules R replay.  ``region`` wraps each
    capturable piece (rule R).  ``let_go``: the graph partition replaced (the input's,
    rewritten) is unlinked once the pipeline succeeds (``interpret.let_go_module``): a
    build's caller never reads it again, and unlinked it is freed by reference count.
    ``keep_folds``: ``FoldHostConstants(keep_recipe=True)`` (a graph to be stored on disk);
    ``code=False``: the result's Python code is not generated (``PassManager.code``)."""
    rules = _rules(rules)
    passes = [PruneDead(), FoldHostConstants(keep_recipe=keep_folds), PruneDead()]
    if rules.stable_state:
        # early_writeback frees the next state's source before the vocoder and proves the
        # hazard check on the graph that runs (so state_rewrite need not run it too: one
        # execution of the step per entry); prune_dead then drops the rebound buffers' constants
        passes += [StateRewrite(bindings, check_hazards=False), EarlyWriteback(bindings), PruneDead()]
    if rules.replays:
        passes += _replay_passes(rules, device_type, boundary, region)
    return PassManager(passes,
                       constraints=[this_before_that(FoldHostConstants, StateRewrite),
                                    this_before_that(StateRewrite, EarlyWriteback),
                                    this_before_that(EarlyWriteback, Partition),
                                    this_before_that(IstftWithoutHostRead, Partition),
                                    this_before_that(Partition, LowerCudaGraph)],
                       checks=[lambda gm: gm.graph.lint()], debug=debug,
                       let_go=interpret.let_go_module if let_go and not KEEP_GRAPHS else None, code=code)


def _replay_passes(rules: Rules, device_type: str, boundary, region, length_free: bool = False) -> list:
    # istft's per-call host read would split a chunk around an eager island
    # a shared step's calls apart: each call's region replays one graph (runtime.graphs.SHARE_CALLS)
    return [IstftWithoutHostRead(), Partition(device_type, rules.replay, boundary, calls_apart=runtime_graphs.SHARE_CALLS,
                                              length_free=length_free),
            LowerCudaGraph(region)]


def lowered_copy(gm: fx.GraphModule, rules: "str | Rules", device_type: str, boundary=None,
                 region=CapturedRegion, length_free: bool = False) -> fx.GraphModule:
    """A rule-S graph (after ``rewrite_pipeline``'s S passes) lowered for ``rules``' replay, on a
    copy: ``gm`` stays as it was (its constants shared), for what walks the unpartitioned graph
    (``capacity_executable``'s per-length hazard check).  ``gm`` itself where ``rules`` do not replay.
    ``length_free``: a capacity graph's pieces that serve every length (``Partition``'s), for
    captures shared by the streams of a capacity (``runtime.working``)."""
    rules = _rules(rules)
    if not rules.replays:
        return gm
    copy = _graph_copy(gm)
    copy.meta.update(gm.meta)
    out, _ = PassManager(_replay_passes(rules, device_type, boundary, region, length_free),
                         checks=[lambda g: g.graph.lint()])(copy)
    _compact(out, rules)
    return out


def _graph_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with a graph of its own (nodes copied, meta with them), its constants shared."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return fx.GraphModule(gm, graph)


def program_kind(rules: Rules) -> str:
    """An ``EntryProgram``'s ``kind`` under ``rules``: ``"cudagraph"`` where they replay."""
    return "cudagraph" if rules.replays else "graph"


def shared_calls(adapter: StreamingAdapter, rules: Rules):
    """The calls ``specialize`` keeps as one shared step (``adapter.repeated_calls()``), or
    None.  Every rule: partition puts a call in a region like an op, and a capture
    records its kernels where the call stands."""
    return adapter.repeated_calls()


def buffer_bindings(declaration: Declaration, arena: Arena) -> dict[str, torch.Tensor]:
    """Module buffer path -> the arena region that replaces it."""
    return {path: arena.full(r.name) for r in declaration.regions for path in r.buffers if r.name in arena.regions}


def region_buffers(declaration: Declaration, arena: Arena) -> dict[str, torch.Tensor]:
    """Region -> its arena slot, for each region bound to module buffers (what a trace tags)."""
    return {r.name: arena.full(r.name) for r in declaration.regions if r.buffers and r.name in arena.regions}


def compile_executable(adapter: StreamingAdapter, rules: "str | Rules" = "S",
                       progress: Callable[[str], None] | None = None,
                       programs: ProgramStore | None = None, off_catalog: str = DEFAULT_POLICY,
                       max_specializations: int = DEFAULT_MAX_ENTRIES,
                       max_specialization_bytes: int = DEFAULT_MAX_BYTES,
                       on_entry: Callable[[int, EntryProgram], None] | None = None) -> Executable:
    """Trace, rewrite and lower every catalog entry of ``adapter``'s plan.

    ``programs``: the model's ``ProgramStore``.  With one, and an adapter with
    ``symbolic_dims()``, rules with S trace each entry once symbolically and every
    configuration after the first is a specialization (seconds); without one, or where
    a symbolic trace or its guards refuse, the entry is traced at its exact shapes.
    ``notes["setup"]`` says per entry which happened, why, and what it cost (and, for a
    symbolic step, ``"program"``: found in "memory", on "disk", "not cached", or "rejected: <why>").

    ``off_catalog`` (rules with S): what a chunk the catalog does not hold does (a
    shorter window, a flush, the steps after them): ``"eager"`` runs the exact eager
    path, counted; ``"specialize"`` builds it a program on first use, ``"repeat"`` the
    second time its shape comes (``runtime.variants``:
    at most ``max_specializations`` programs and ``max_specialization_bytes`` of their
    constants per executable, least recently used out first).

    ``on_entry(index, program)``: called as each entry's program is done, before the
    executable is (a background build hands them to a stream that is already running:
    ``runtime.pending``).  With it, the steady entry (the catalog's last: every chunk
    from the third on until a turn's end) is built first, then the others in order.
    """
    device = torch.device(adapter.device)
    check_rules(rules, device)
    check_policy(off_catalog, max_specializations, max_specialization_bytes)
    return _compile(adapter, rules, progress, programs,
                    (off_catalog, max_specializations, max_specialization_bytes), on_entry)


def _compile(adapter: StreamingAdapter, rules: "str | Rules",
             progress: Callable[[str], None] | None = None,
             programs: ProgramStore | None = None,
             off_catalog: tuple = (DEFAULT_POLICY, DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES),
             on_entry: Callable[[int, EntryProgram], None] | None = None) -> Executable:
    """``compile_executable`` without the device check (``rules=""``: stock-state graphs, for
    tests), with Python's collector held through the build (``runtime/collector.py``: its
    garbage is collected young, before any of it is promoted)."""
    with collector.held():
        return _build(adapter, rules, progress, programs, off_catalog, on_entry)


def _build(adapter: StreamingAdapter, rules: "str | Rules", progress: Callable[[str], None] | None,
           programs: ProgramStore | None, off_catalog: tuple,
           on_entry: Callable[[int, EntryProgram], None] | None) -> Executable:
    rules = _rules(rules)
    device = torch.device(adapter.device)
    plan = build_plan(adapter)
    say = progress or (lambda msg: None)
    sig = adapter.signature
    check_signature(adapter.declaration, sig, plan)
    if rules.stable_state:
        # Trace on a scratch arena of the same layout: tracing runs the step for real,
        # and must not touch any live session's state or the caller's generators.
        scratch = Arena(plan.layout, device)
        step = adapter.bind(buffer_bindings(adapter.declaration, scratch))
        by_region = region_buffers(adapter.declaration, scratch)
    else:
        # Stock-managed state: the graphs write the model's own buffers, as stock does.
        scratch, by_region = None, {}
        step = adapter.bind(adapter.stock_buffers())
    entries, notes = {}, {"trace_s": {}, "rewrite": {}, "setup": {}}
    carried = tuple(r for r in sig.regions)
    devices = [device] if device.type == "cuda" else []
    stock_off_axis: dict[str, tuple[tuple[int, ...], str]] = {}  # rules R/Rc: see _stock_state_drift
    order = list(plan.catalog)
    if on_entry is not None and rules.stable_state:  # the steady entry first (see compile_executable)
        order = order[-1:] + order[:-1]
    for entry in order:
        t0 = time.perf_counter()
        setup = {"how": "traced", "trace_s": 0.0, "specialize_s": 0.0}
        gm = None
        if rules.stable_state and programs is not None and adapter.symbolic_dims():
            gm = specialized_entry(adapter, lambda d: build_plan(adapter, d), plan, entry, by_region, programs,
                                   setup, say, share=shared_calls(adapter, rules))
        what = f"tracing catalog entry {entry.index + 1}/{len(plan.catalog)}"
        with fenced(devices, what, runs_for_real=gm is None):
            for attempt in range(3):
                if gm is not None:
                    break
                say(f"tracing catalog entry {entry.index + 1}/{len(plan.catalog)} (steps {entry.steps})")
                specs = _state_specs(plan, entry, carried, stock_off_axis)
                example_state = {r: zeros_of(specs[r], device) for r in carried}
                t_trace = time.perf_counter()
                gm = trace_step(step, sig, adapter.example_inputs(), example_state, by_region)
                setup["trace_s"] += round(time.perf_counter() - t_trace, 3)
                drift = {} if rules.stable_state else _stock_state_drift(gm, plan, specs)
                if not drift:
                    break
                if attempt == 2:
                    raise TraceError(f"stock-managed state does not settle on one shape: the step still "
                                     f"returns {drift} after tracing with {stock_off_axis}")
                say(f"stock-managed state differs from its declaration off the growth axis: {drift}; re-tracing")
                stock_off_axis.update(drift)
                gm = None
            specs = _state_specs(plan, entry, carried, stock_off_axis)
            t_passes = time.perf_counter()
            bindings = region_bindings(plan, entry)
            pipeline = rewrite_pipeline(bindings, rules, device.type, adapter.step_boundary(), let_go=True)
            gm, results = pipeline(gm)
            setup["passes_s"] = round(time.perf_counter() - t_passes, 3)
        notes["trace_s"][entry.index] = round(time.perf_counter() - t0, 3)
        notes["setup"][entry.index] = setup
        notes["rewrite"][entry.index] = "; ".join(f"{type(p).__name__}: {r.record}"
                                                   for p, r in zip(pipeline.passes, results))
        nxt = {b.name: b.extent_out for b in bindings if b.carried}
        kind = program_kind(rules)
        _compact(gm, rules)
        entries[entry.index] = EntryProgram(entry, gm, meta.arena_inputs(gm), nxt, kind,
                                            None if rules.stable_state else specs)
        if on_entry is not None:
            on_entry(entry.index, entries[entry.index])
    del step
    entries = dict(sorted(entries.items()))  # catalog order, whatever order they were built in
    for key in ("trace_s", "setup", "rewrite"):
        notes[key] = dict(sorted(notes[key].items()))
    notes["setup_s"] = _setup_totals(notes["setup"])
    variants = None
    if rules.stable_state:
        variants = Variants(_variant_builder(adapter, plan, rules, programs, say), *off_catalog)
    return Executable(plan, entries, sig.inputs, sig.outputs, carried, rules, notes, spare_arena=scratch,
                      variants=variants)


def _variant_builder(adapter: StreamingAdapter, plan: Plan, rules: Rules, programs: ProgramStore | None, say):
    """``build(key, inputs) -> (EntryProgram, bytes, how)`` for ``runtime.variants``: a chunk the
    catalog does not hold, at the state ``key`` names, specialized from the model's symbolic
    step where the state is a catalog entry's (and the adapter has symbolic dims), else
    traced at its exact shapes on a scratch arena; then the rewrite pipeline of ``rules``."""
    device = torch.device(adapter.device)
    sig = adapter.signature
    devices = [device] if device.type == "cuda" else []

    def build(key: VariantKey, inputs: dict[str, torch.Tensor]):
        with collector.held():  # as _compile's
            return _build_variant(key, inputs)

    def _build_variant(key: VariantKey, inputs: dict[str, torch.Tensor]):
        flags = key.flag_values
        entry = variant_entry(plan, key)
        example = {n: copy_strided(inputs[n]) for n in sig.inputs}
        scratch = Arena(plan.layout, device)
        by_region = region_buffers(adapter.declaration, scratch)
        setup = {"how": "traced", "trace_s": 0.0, "specialize_s": 0.0}
        gm = None
        if key.entry is not None and programs is not None and adapter.symbolic_dims():
            gm = specialized_entry(adapter, lambda d: build_plan(adapter, d), plan, plan.catalog[key.entry],
                                   by_region, programs, setup, say, example_inputs=example, flags=flags,
                                   share=shared_calls(adapter, rules))
        with fenced(devices, f"tracing the off-catalog chunk {key.label()}", runs_for_real=gm is None):
            if gm is None:
                say(f"tracing the off-catalog chunk {key.label()} at its exact shapes")
                step = adapter.bind(buffer_bindings(adapter.declaration, scratch))
                fn = (lambda i, s: step(i, s, **flags)) if flags else step
                state = {r: zeros_of(entry.regions[r], device) for r in sig.regions}
                t0 = time.perf_counter()
                gm = trace_step(fn, sig, example, state, by_region)
                setup["trace_s"] = round(time.perf_counter() - t0, 3)
            bindings = region_bindings(plan, entry, traced_extents(gm, plan))
            gm, _ = rewrite_pipeline(bindings, rules, device.type, adapter.step_boundary(), let_go=True)(gm)
        nxt = {b.name: b.extent_out for b in bindings if b.carried}
        program = EntryProgram(entry, gm, meta.arena_inputs(gm), nxt, program_kind(rules))
        size = own_bytes(gm, adapter)
        _compact(gm, rules)
        return program, size, setup["how"]
    return build


#: keep a replayed program's pieces' graphs (debugging: ``CADENCE_FX_KEEP_GRAPHS=1``, read at import)
KEEP_GRAPHS = os.environ.get("CADENCE_FX_KEEP_GRAPHS", "0") == "1"


def _compact(gm: fx.GraphModule, rules: Rules) -> None:
    """A replayed program keeps its pieces' step lists, not their graphs (``graphs.compact_entry``)."""
    if rules.replays and not KEEP_GRAPHS:
        runtime_graphs.compact_entry(gm)


def variant_entry(plan: Plan, key: VariantKey) -> CatalogEntry:
    """The signature an off-catalog chunk's program is exact for (what the gate checks):
    its inputs, and every region as the arena view at the key's extents (regions the step
    does not carry, per-step scratch, as at the catalog entry, or the steady one)."""
    base = plan.catalog[key.entry] if key.entry is not None else plan.catalog[-1]
    extents = dict(key.extents)
    regions = {}
    for name, spec in base.regions.items():
        axis = plan.layout.slot(name).axis
        if axis is not None and extents.get(name) is not None:
            shape = list(spec.shape)
            shape[axis] = extents[name]
            spec = TensorSpec(tuple(shape), spec.dtype, spec.stride, spec.device)
        regions[name] = spec
    inputs = {n: TensorSpec(shape, dtype, stride, base.inputs[n].device) for n, shape, dtype, stride in key.inputs}
    return CatalogEntry(index=base.index, phase=base.phase, steps=(), regions=regions, inputs=inputs)


def traced_extents(gm: fx.GraphModule, plan: Plan) -> dict[str, int | None]:
    """Each carried region's extent in the next state a traced step returns; ``VariantRefused``
    where it does not fit the region's arena slot (off the growth axis, or past its capacity)."""
    sig = meta.signature(gm)
    (outputs,) = [n.args[0] for n in gm.graph.nodes if n.op == "output"]
    shapes = {}
    for r, node in zip(sig.regions, outputs[len(sig.outputs):]):
        val = meta.value(gm, node) if isinstance(node, fx.Node) else None
        if not isinstance(val, torch.Tensor):
            raise VariantRefused(f"the step's next {r} has no recorded shape")
        shapes[r] = tuple(val.shape)
    return extents_in_slots(shapes, plan)


def extents_in_slots(shapes: Mapping[str, tuple], plan: Plan) -> dict[str, int | None]:
    """Each carried region's extent in a next state of these ``shapes``; ``VariantRefused``
    where one does not fit the region's arena slot (off the growth axis, or past its capacity)."""
    out = {}
    for r, shape in shapes.items():
        slot = plan.layout.slot(r)
        off = len(shape) != len(slot.shape) or any(a != b for d, (a, b) in enumerate(zip(shape, slot.shape))
                                                   if d != slot.axis)
        if off or (slot.axis is not None and shape[slot.axis] > slot.shape[slot.axis]):
            raise VariantRefused(f"the step returns {r} of shape {shape}; its arena slot holds {tuple(slot.shape)}"
                                 f"{'' if slot.axis is None else f' (growth axis {slot.axis})'}: the declared "
                                 f"retention does not cover this chunk")
        out[r] = None if slot.axis is None else shape[slot.axis]
    return out


def own_bytes(gm: fx.GraphModule, adapter: StreamingAdapter) -> int:
    """Bytes of the tensors a program holds that are not the model's (folded host constants,
    graph constants): what a specialization adds to memory besides its captured graphs."""
    shared = {t.untyped_storage().data_ptr() for root in adapter.modules().values() for m in root.modules()
              for t in (*m._parameters.values(), *m._buffers.values(), *vars(m).values())
              if isinstance(t, torch.Tensor)}  # the model's own (parameters, buffers, tables it keeps)
    seen, total = set(), 0
    for mod in gm.modules():
        tensors = [*mod._buffers.values(), *mod._parameters.values(),
                   *(v for v in vars(mod).values() if isinstance(v, torch.Tensor))]
        for t in tensors:
            if t is None or isinstance(t, torch.nn.Parameter) or t.device.type == "meta":
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr in shared or ptr in seen:
                continue
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
    return total


def check_signature(declaration: Declaration, sig: meta.StepSignature, plan: Plan) -> None:
    """Every region the step carries is declared, carried and in the catalog (a finite
    retention); else ``DeclarationError`` naming it (never a bare ``KeyError`` later)."""
    declared = {r.name: r for r in declaration.regions}
    for name in sig.regions:
        region = declared.get(name)
        if region is None:
            raise DeclarationError(f"the step carries {name!r}, which the declaration lacks (regions: "
                                   f"{sorted(declared)}); declare Region({name!r}, ...)")
        if not region.carried:
            raise DeclarationError(f"the step carries {name!r}, declared carried=False (per-step scratch); "
                                   f"declare it carried=True or stop returning it")
        if name not in plan.catalog[0].regions:
            raise DeclarationError(f"region {name!r} is {region.retention}: its extent grows without bound, so "
                                   f"no finite catalog of shapes exists and no arena slot can hold it; declare "
                                   f"what the model keeps (Window, ChunkPad, Ring) or leave the model unoptimized")


def _setup_totals(per_entry: dict) -> dict:
    """Seconds spent tracing, specializing, in the passes and waiting for another process's
    trace (``COMPILE_KEYS``), over every entry."""
    out = {k: round(sum(e.get(k, 0.0) for e in per_entry.values()), 3) for k in COMPILE_KEYS}
    out["total_s"] = round(sum(out.values()), 3)
    return out


def _state_specs(plan: Plan, entry: CatalogEntry, carried: tuple[str, ...],
                 stock_off_axis: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, TensorSpec]:
    """The carried state an entry's step takes: the declared region at the entry's extent,
    or (stock-managed state) the stock shape off the growth axis."""
    out = {}
    for r in carried:
        spec = entry.regions[r]
        shape, dtype = tuple(spec.shape), spec.dtype
        if r in stock_off_axis:
            axis = plan.layout.slot(r).axis
            stock_shape, dtype = stock_off_axis[r]
            shape = tuple(shape[d] if d == axis else n for d, n in enumerate(stock_shape))
        out[r] = TensorSpec.contiguous(shape, dtype, spec.device)
    return out


def _stock_state_drift(gm: fx.GraphModule, plan: Plan, specs: dict[str, TensorSpec]
                       ) -> dict[str, tuple[tuple[int, ...], str]]:
    """Carried regions whose traced next state differs from the state it was traced
    with anywhere but the growth axis (shape or dtype): ``{region: (shape, dtype)}``.

    Stock-managed state need not have the declared shape: upstream Token2Wav returns
    its whole 16-slot conv-cache buffer as the next state, where rule S keeps only
    the ``n_timesteps`` slots the next step reads.  A step over stock state must take
    what the stock step returns, so rules R/Rc adopt it and trace again.
    """
    sig = meta.signature(gm)
    (outputs,) = [n.args[0] for n in gm.graph.nodes if n.op == "output"]
    drift = {}
    for r, node in zip(sig.regions, outputs[len(sig.outputs):]):
        val = meta.value(gm, node) if isinstance(node, fx.Node) else None
        if not isinstance(val, torch.Tensor):
            continue
        axis = plan.layout.slot(r).axis
        got, want = tuple(val.shape), tuple(specs[r].shape)
        dtype = str(val.dtype).removeprefix("torch.")
        off_axis = len(got) != len(want) or any(g != w for d, (g, w) in enumerate(zip(got, want)) if d != axis)
        if off_axis or dtype != specs[r].dtype:
            drift[r] = (got, dtype)
    return drift


def open_session(executable: Executable, adapter: StreamingAdapter, *setup_args: Any) -> Session:
    """A new stream of ``executable``: its own state, its own graphs, then the model's setup.

    Rules with S: a zero-filled arena (the first session takes the one the entries
    were traced on); graphs are captured on it (rules SR/SRc; with a working arena, on that
    once for every session: ``runtime.working``), then
    ``adapter.setup`` runs on modules whose region-bound buffers are arena views and
    its state is loaded into the arena.  Rules R/Rc: a ``StockStateSession``; setup
    runs on the model's own buffers and the session keeps a copy of its state.
    """
    device = torch.device(adapter.device)
    if executable.stable_state:
        arena = executable.take_arena(device)
        if executable.working is not None:
            session = WorkingSession(executable, arena, adapter.fallback, {}, executable.working)
        else:
            session = Session(executable, arena, adapter.fallback, {})
        buffers = buffer_bindings(adapter.declaration, arena)
    else:
        session = StockStateSession(executable, _stock_fallback(adapter), device)
        buffers = adapter.stock_buffers()
    session.prepare_replay(adapter.example_inputs())  # rules R: capture on this session's memory
    return _set_up(session, adapter, buffers, setup_args)


def _set_up(session: Session, adapter: StreamingAdapter, buffers: dict, setup_args: tuple) -> Session:
    """``adapter.setup`` on ``buffers``, its state loaded into ``session``."""
    with torch.no_grad(), working():  # a background build steps aside meanwhile
        state = adapter.setup(buffers, *setup_args)
        if state is None:  # the stream starts from zeros at catalog entry 0's extents
            entry0 = session.executable.plan.catalog[0]
            state = {r: zeros_of(entry0.regions[r], adapter.device) for r in session.executable.carried}
        session.load_state(state)
    return session


def open_pending_session(adapter: StreamingAdapter, rules: "str | Rules", build: Build,
                         *setup_args: Any) -> PendingSession:
    """A new stream of ``adapter``'s configuration before its executable exists (rules
    with S): an arena of its plan (no trace needed), the model's setup loaded into it,
    eager chunks until ``build`` delivers the executable (``runtime.pending``)."""
    parsed = _rules(rules)
    if not parsed.stable_state:
        raise RulesError(f"a stream can start before its graphs only with its state in an arena (rules with S), "
                         f"not rules {rules!r}")
    plan = build_plan(adapter)
    sig = adapter.signature
    check_signature(adapter.declaration, sig, plan)
    shell = Executable(plan, {}, sig.inputs, sig.outputs, tuple(sig.regions), parsed, _compile_claimed=True)
    arena = Arena(plan.layout, torch.device(adapter.device))
    session = PendingSession(shell, arena, adapter.fallback, build, adapter.example_inputs())
    return _set_up(session, adapter, buffer_bindings(adapter.declaration, arena), setup_args)


def _stock_fallback(adapter: StreamingAdapter):
    """Rules R/Rc: the eager step on the model's own buffers, the ones their programs
    were traced over, so the state it leaves has the shapes the programs take.
    (``adapter.fallback`` sizes private buffers per call, as rule S needs: Token2Wav's
    DiT conv carry then holds ``n_timesteps`` slots where stock returns its 16, and
    after one eager step no program would take the state again.)"""
    def fallback(inputs, state, **flags):
        return adapter.bind(adapter.stock_buffers())(inputs, state, **flags)
    return fallback


def preview_partition(executable: Executable, granularity: str = "chunk", boundary=None,
                      length_free: bool = False) -> dict[int, object]:
    """What rules R would capture, per entry, from the rule-S graphs (no device needed):
    the replay pipeline's istft rewrite, then ``Partition``, on a copy of each graph.

    Placement is not checked (the graphs may have been traced on the CPU): the
    verdicts are the op-level ones (host syncs, data-dependent shapes, allow-list).
    """
    out = {}
    for idx, program in sorted(executable.programs.items()):
        if not isinstance(program.run, fx.GraphModule) or program.kind != "graph":
            continue
        copy = _graph_copy(program.run)  # the executable's graph stays
        IstftWithoutHostRead()(copy)
        out[idx] = Partition(None, granularity, boundary, length_free=length_free)(copy).record
    return out


def stderr_progress(prefix: str = "cadence-fx") -> Callable[[str], None]:
    def say(msg: str) -> None:
        print(f"[{prefix}] {msg}", file=sys.stderr, flush=True)
    return say
