"""One executable for every prompt length up to a capacity (architecture item 4; rules S, SR, SRc).

``capacity_executable(adapter_at_capacity, steps)`` builds each catalog entry once: its
symbolic step rewritten by ``passes.capacity.capacity_form`` at the adapter's dims (the
capacity), its buffers bound to a scratch arena laid out by the plan at the capacity,
then the compiler's own rule-S passes (``StateRewrite`` puts the state in the arena).
``at_length(executable, adapter)`` is that executable for a stream at another length: an
``Executable`` whose plan is the one at the stream's length (its catalog and extents: what
the session's state, snapshots and comparisons read) laid out as the capacity's arena, and
whose programs are the shared graphs, called with the stream's length (``at_stream``: the
host dims in ``capacity_ops.at_dims`` around each call, the device lengths as the graphs'
extra inputs).
``check_dims`` refuses a length the graphs do not serve (past the capacity, another branch
class).

A chunk the catalog does not hold at a catalog entry's state (a turn-end window, a flush)
has graphs of its own, shared the same way (``shared_variant``): the entry's symbolic step
for that input shape and those flags (traced once, the chunk's length symbolic too,
``programs.entry.symbolic_entry``), its chunk length bound (``specialize.bind_dims``) and
its prompt held at the capacity, then the rule-S passes; built the first time any stream
sends that shape, held by the capacity executable (``max_shared`` of them, least recently
used out first) and served to each stream as its executable's ``Variants``.  A stream
needs only the checks at its own length (``check_dims``, the hazard check) for each.  A
chunk whose state is off the catalog (after a window sent during the warm-up), or whose
shape's shared graph does not serve the stream's length (another branch class of the
model's code), gets a program traced at its exact shapes for that stream alone, as
``compile_executable``'s variants do.  Under SR/SRc each graph is lowered for replay too and
captured per session (``capacity_executable``'s ``rules``), or with ``shared_captures`` lowered
length-free and captured once, on the capacity's working arena, for every session
(``runtime.working``).  Each graph's rule-S form is built or, with the model's program cache
on disk, loaded (``capacity_build.capacity_graph``: a restarted process builds none).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import weakref
from typing import Any, Callable, Mapping

import torch
import torch.fx as fx

from . import step as meta
from .errors import (CadenceError, NeedsForeground, PassError, RulesError, SpecializationRefused, TraceError,
                     caused_by)
from .capacity_hazards import hazards_at, walk_plan
from .foreground import in_background
from .capacity_build import capacity_graph
from .compiler import (_variant_builder, build_plan, check_rules, extents_in_slots, lowered_copy, own_bytes,
                       program_kind, region_bindings, region_buffers, traced_extents, variant_entry)
from .passes.capacity import at_dims, check_dims
from .passes.capacity_plan import CapacityPlan
from .passes.specialize import _value
from .passes.trace_symbolic import SymbolicStep, SymTensor
from .programs.entry import symbolic_entry
from .runtime import collector
from .runtime.arena import Arena, copy_strided
from .runtime.session import EntryProgram, Executable
from .runtime.working import WorkingArena
from .runtime.variants import (DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, OOM_RETRY_S, RefusedForNow, VariantBusy, VariantKey,
                               VariantRefused, Variants)
from .step import Rules

#: off-catalog shapes' graphs a capacity executable holds (least recently used out first)
DEFAULT_MAX_SHARED = 64


@dataclasses.dataclass
class CapacityExecutable:
    """Each catalog entry's capacity-form graph (after the rule-S passes; under SR/SRc lowered
    for replay from a copy, the rule-S graph in ``checked``), at ``dims``."""

    plan: Any  # the plan at the capacity (its arena layout is every stream's)
    graphs: dict  # entry index -> (GraphModule, CapacityPlan, SymbolicStep)
    signature: meta.StepSignature
    dims: dict  # the capacity
    device: torch.device
    adapter: Any = None  # the model at the capacity: traces an off-catalog chunk's symbolic step
    programs: Any = None  # its ProgramStore (None: no shared off-catalog graphs)
    by_region: dict = dataclasses.field(default_factory=dict, repr=False)  # the scratch arena's bound regions
    masked_attention: Any = False
    say: Callable[[str], None] = dataclasses.field(default=lambda msg: None, repr=False)
    max_shared: int = DEFAULT_MAX_SHARED
    #: (entry, inputs, flags) of a ``VariantKey`` -> its ``SharedGraph``, or why none serves
    shared: collections.OrderedDict = dataclasses.field(default_factory=collections.OrderedDict, repr=False)
    built: int = 0
    loaded: int = 0  #: graphs (the catalog's and off-catalog shapes') loaded from the disk cache
    evicted: int = 0
    rules: Rules = dataclasses.field(default_factory=lambda: Rules.parse("S"))
    #: entry index -> its rule-S graph (what a stream's hazard check walks; ``graphs``' own
    #: where the rules do not replay, else ``graphs``' is lowered for replay from a copy of it)
    checked: dict = dataclasses.field(default_factory=dict, repr=False)
    #: under replay: every graph captured once on one working arena for all streams
    #: (``runtime.working``; its graphs lowered length-free), not on each session's own
    shared_captures: bool = False
    _working: Any = dataclasses.field(default=None, repr=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    _building: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    own_build_s: float = 0.0  #: a stream's own program's last build, s (idle time's estimate: ``work_ahead``)

    def working(self) -> "WorkingArena | None":
        """The working arena every stream's graphs run on (made on first need), or None where
        each session captures its own (``shared_captures`` off)."""
        if not self.shared_captures:  # (capacity_executable: only under rules that replay)
            return None
        with self._lock:
            if self._working is None:
                self._working = WorkingArena(self.plan.layout, self.device)
            return self._working

    def stats(self) -> dict:
        """The off-catalog graphs held (label -> how, seconds, bytes) and refused (label -> why);
        with shared captures, ``working_arena`` (``WorkingArena.stats``, or None before a stream)."""
        with self._lock:
            items = list(self.shared.items())
            working = self._working
        out = {"max_shared": self.max_shared, "built": self.built, "loaded_from_disk": self.loaded,
               "evicted": self.evicted,
               "held": {_label(k): {"how": v.how, "build_s": v.build_s, "bytes": v.nbytes}
                        for k, v in items if isinstance(v, SharedGraph)},
               "refused": {_label(k): v for k, v in items if isinstance(v, str)}}
        if self.shared_captures:
            out["working_arena"] = working.stats() if working is not None else None
        return out


@dataclasses.dataclass
class SharedGraph:
    """One off-catalog shape's capacity graph (after the rule-S passes; under SR/SRc lowered for
    replay, the rule-S graph in ``checked``), every stream's."""

    gm: fx.GraphModule
    plan: CapacityPlan
    sym: SymbolicStep  # its symbolic step with the chunk's length bound: free in the capacity's dims
    nbytes: int
    build_s: float
    how: str
    checked: fx.GraphModule  # its rule-S graph (the hazard check's); ``gm`` itself where the rules do not replay
    #: the inputs (by name) it was built with: valid inputs of its shape, for a stream of another
    #: branch class to build its own program of the shape ahead, in idle time (``work_ahead``)
    inputs: "dict | None" = dataclasses.field(default=None, repr=False)
    loaded: bool = False  #: loaded from the disk cache (``capacity_build``), not built


def at_stream(gm: fx.GraphModule, dims: Mapping[str, int], lengths: list, entry, arena_inputs, nxt,
              kind: str = "graph") -> EntryProgram:
    """A capacity graph as one stream's program: its device lengths inserted after the step's
    inputs (``EntryProgram.extra_inputs``: the same tensors at every call), its host dims set
    around every run and capture (``EntryProgram.context``: ``capacity_ops.at_dims``)."""
    dims = dict(dims)
    return EntryProgram(entry, gm, arena_inputs, nxt, kind, extra_inputs=tuple(lengths),
                        context=lambda: at_dims(dims))


def capacity_executable(adapter, steps: "Mapping[int, SymbolicStep] | None" = None, masked_attention=False,
                        programs=None, say: Callable[[str], None] | None = None,
                        max_shared: int = DEFAULT_MAX_SHARED, rules: "str | Rules" = "S",
                        shared_captures: bool = False) -> CapacityExecutable:
    """Every catalog entry of ``adapter`` (made at the capacity: its symbolic dims' values)
    from ``steps`` (entry index -> its symbolic step), under ``rules``; ``steps=None``: each entry's
    symbolic step that serves the capacity, looked up in ``programs`` or traced there
    (``programs.entry.symbolic_entry``: the branch class of the capacity's length).
    ``programs``: the model's ``ProgramStore``, where an off-catalog chunk's symbolic step
    is looked up or kept once traced (None: off-catalog chunks at a catalog entry's state
    run eagerly); ``say``: progress lines; ``max_shared``: off-catalog shapes' graphs held.
    ``masked_attention``: ``capacity_form``'s (False: attention over padded keys runs exact),
    or ``"probe"``: each call masked only where the device finds it bit-equal to the step's
    own call at every length up to the capacity (``attention_for``).
    ``rules``: S, or S with R (``SR``, ``SRc``): each graph is then lowered for replay too
    (``compiler.lowered_copy``): its capturable pieces are captured per session, on that
    session's arena, its host sizes (``capacity_ops.host_size``) and what reads them eager
    islands or baked into a piece whose replay checks them (one session: one length).
    ``shared_captures`` (with SR/SRc): each graph lowered length-free (``Partition(length_free=
    True)``: every node whose work depends on the length an eager island) and captured once,
    on the capacity's working arena, for every stream (``runtime.working``: a stream's state
    copied onto it before each program and back after, one chunk at a time).
    ``SpecializationRefused`` where a step does not serve the capacity itself."""
    if masked_attention not in (False, True, "probe") and not callable(masked_attention):
        raise CadenceError(f"masked_attention={masked_attention!r}: False, True, 'probe' or a probe")
    if isinstance(max_shared, bool) or not isinstance(max_shared, int) or max_shared < 0:
        raise CadenceError(f"max_shared={max_shared!r} must be an int >= 0")
    if not isinstance(shared_captures, bool):
        raise CadenceError(f"shared_captures={shared_captures!r} must be True or False")
    rules = Rules.parse(rules)
    if not rules.stable_state:
        raise RulesError(f"capacity graphs keep the state in the arena: rules {str(rules)!r} need S")
    if shared_captures and not rules.replays:
        raise RulesError(f"shared_captures=True shares captured CUDA graphs: rules SR or SRc, not {str(rules)!r}")
    check_rules(rules, torch.device(adapter.device))
    if steps is None and programs is None:
        raise CadenceError("capacity_executable needs the catalog's symbolic steps or the model's ProgramStore")
    device = torch.device(adapter.device)
    plan = build_plan(adapter)
    dims = {d: int(adapter.dims()[d]) for d in adapter.symbolic_dims()}
    scratch = Arena(plan.layout, device)
    by_region = region_buffers(adapter.declaration, scratch)
    say = say or (lambda msg: None)
    graphs, checked, loaded = {}, {}, []

    example = list(adapter.example_inputs().values())
    for entry in plan.catalog:
        def use(sym: SymbolicStep, at=None, entry=entry):  # built, or loaded from the disk cache (capacity_build)
            gm, cplan, sym, how = capacity_graph(adapter, sym, dims, {}, by_region, masked_attention, device, example,
                                               lambda g: region_bindings(plan, entry), programs, f"entry {entry.index}",
                                               say, run=not rules.replays)
            loaded.append(how == "loaded from disk")
            return sym, gm, cplan
        if steps is not None:
            sym, gm, cplan = use(steps[entry.index])
        else:
            setup: dict = {}
            got = symbolic_entry(adapter, lambda d: build_plan(adapter, d), plan, entry, by_region, programs, setup,
                                 say, use)
            if got is None:
                raise SpecializationRefused(f"no symbolic step of entry {entry.index} serves the capacity {dims}: "
                                            f"{setup.get('reason')}")
            sym, gm, cplan = got
        checked[entry.index] = gm
        walk_plan(gm)  # every stream's set-up walks it (at_length): plan that walk once, here
        graphs[entry.index] = (lowered_copy(gm, rules, device.type, adapter.step_boundary(),
                                            length_free=shared_captures), cplan, sym)
    return CapacityExecutable(plan, graphs, adapter.signature, dims, device, adapter, programs, by_region,
                              masked_attention, say, max_shared, rules=rules, checked=checked,
                              shared_captures=shared_captures, loaded=sum(loaded))


def at_length(cexe: CapacityExecutable, adapter, check_hazards: bool = True, off_catalog: str = "specialize",
              max_specializations: int = DEFAULT_MAX_ENTRIES,
              max_specialization_bytes: int = DEFAULT_MAX_BYTES) -> Executable:
    """``cexe`` for streams of ``adapter`` (the same model at another length of its symbolic
    dims); ``SpecializationRefused`` where a graph does not serve that length.  With
    ``check_hazards`` every read of old state after a write to the same bytes at this length
    is refused (``PassError``; an off-catalog shape's the first time this executable runs
    it): the rule-S passes proved it at the capacity only, and where a read and a write fall
    moves with the length (``hazards_at``: a walk of the region views at this length's host
    sizes, a run of the entry where the walk cannot follow).

    ``off_catalog``, ``max_specializations``, ``max_specialization_bytes``: the executable's
    ``Variants`` (``compile_executable``'s): under ``"specialize"`` (the default here: a
    shape's graph is built once for every stream) a window or flush at a catalog entry's
    state runs the shared graph of its shape (``shared_variant``, built on first use).  A
    stream's check of a shared graph already held that serves its length is quick
    (``Variants.quick``): it is made on the stream's thread even while builds go to the
    background, so the chunk runs the graph (and where the hazard check refuses it there, the
    chunk runs eagerly: no trace of the stream's own on a chunk).  A shape whose shared graph
    does not serve the length gets a program of the stream's own, traced; while builds go to
    the background that trace needs the foreground, so there the chunk runs eagerly, counted
    (``stats()["specializations"]["foreground_only"]``)."""
    plan_here = build_plan(adapter)
    dims = {d: int(adapter.dims()[d]) for d in cexe.dims}
    if [e.index for e in plan_here.catalog] != sorted(cexe.graphs):
        raise ValueError(f"the catalog at {dims} has entries {[e.index for e in plan_here.catalog]}, "
                         f"the capacity's {sorted(cexe.graphs)}")
    programs = {}
    device_lengths = {d: torch.tensor(v, device=cexe.device) for d, v in dims.items()}  # read only: every program's
    scratch: dict = {}  # the hazard walks' regions, one set for every entry (values never read)
    with collector.held():  # the walks make tens of thousands of views: no collection among them (a new voice waits)
        for entry in plan_here.catalog:
            gm, cplan, sym = cexe.graphs[entry.index]
            check_dims(cplan, sym, dims)
            lengths = [device_lengths[d] for d in sym.dims]
            if check_hazards:
                problems = _hazards(cexe.checked[entry.index], cexe, list(adapter.example_inputs().values()), dims,
                                    lengths, scratch)
                if problems:
                    raise PassError(f"entry {entry.index} at {dims}: the arena's state is overwritten before it is "
                                    f"read: {problems[0]}")
            nxt = {b.name: b.extent_out for b in region_bindings(plan_here, entry) if b.carried}
            programs[entry.index] = at_stream(gm, dims, lengths, entry, meta.arena_inputs(gm), nxt,
                                              program_kind(cexe.rules))
        del scratch
    sig = cexe.signature
    plan = dataclasses.replace(plan_here, layout=cexe.plan.layout)  # the capacity's arena, this length's extents
    builder = _StreamBuilder(cexe, adapter, plan, dims, device_lengths, check_hazards)
    variants = builder.variants = Variants(builder, off_catalog, max_specializations, max_specialization_bytes)
    variants.quick, variants.ahead, variants.ahead_stats = builder.quick, builder.work_ahead, builder.ahead_stats
    return Executable(plan, programs, sig.inputs, sig.outputs, tuple(sig.regions), cexe.rules,
                      {"capacity": dict(cexe.dims), "at": dims}, variants=variants, working=cexe.working())


class _StreamBuilder:
    """``Variants``' ``build(key, inputs)`` for one stream: the shared graph of the key's shape
    (at a catalog entry's state), checked at this stream's length; a state off the catalog,
    or a shape whose shared graph does not serve this length (another branch class of the
    model's code, say: Token2Wav's 7-token flush at one prompt length in 7): a program of
    this stream's own (``compiler._variant_builder``, traced at its exact shapes on the
    capacity's arena layout: a symbolic step's buffers are laid out at the length it is
    specialized at, the arena's at the capacity, so none would serve, and each try would
    trace another symbolic variant into the model's store).  ``variants``: the ``Variants``
    it builds for (set after), whose ``background`` says where builds go.  Each shared
    graph's hazard check at this length is made once (kept by its rule-S graph, weakly: a
    graph the capacity lets go takes its result along), on the first chunk of its shape or
    ahead of it, in idle time (``work_ahead``)."""

    def __init__(self, cexe: CapacityExecutable, adapter, plan, dims: Mapping[str, int], device_lengths: Mapping,
                 check_hazards: bool):
        self.cexe, self.plan, self.dims, self.device_lengths = cexe, plan, dims, device_lengths
        self.check_hazards = check_hazards
        self.own = _variant_builder(adapter, plan, cexe.rules, None, cexe.say)
        self.variants: "Variants | None" = None
        # checked graph -> (problems, made ahead?); or None: not checked ahead (another branch
        # class, or only a run can tell: its chunk checks it)
        self._checked: "weakref.WeakKeyDictionary[fx.GraphModule, tuple | None]" = weakref.WeakKeyDictionary()
        self._checks_lock = threading.Lock()  # chunks' builds may run on a worker thread
        self._ahead = {"checked": 0, "left_to_chunks": 0, "s": 0.0, "taken_by_chunks": 0, "built": 0}
        self._others: "dict[tuple, tuple]" = {}  # a shape of another branch class here -> (inputs, build_s)
        self._idle = threading.local()  # .on: building ahead, in idle time (the foreground)

    def __call__(self, key: VariantKey, inputs: Mapping[str, torch.Tensor]):
        if key.entry is None:
            return self.own(key, inputs)
        try:
            return self.on_shared(key, inputs)
        except VariantRefused as e:
            why = str(e)
        if self.variants is not None and self.variants.background is not None and not in_background() \
                and not getattr(self._idle, "on", False):
            # the quick path (a held graph that serves this length, then refused by the hazard
            # check here): a trace of this stream's own would make the chunk wait for it
            raise VariantRefused(f"{why}; a program of this stream's own is not traced on a chunk while builds go "
                                 f"to the background")
        t0 = time.perf_counter()
        try:
            program, nbytes, how = self.own(key, inputs)
            self.cexe.own_build_s = time.perf_counter() - t0
        except NeedsForeground:
            raise
        except Exception as e:
            raise VariantRefused(f"{why}; nor a program of this stream's own: {type(e).__name__}: {e}") from e
        return program, nbytes, f"this stream's own ({how}): {why}"

    def on_shared(self, key: VariantKey, inputs: Mapping[str, torch.Tensor]):
        cexe, dims = self.cexe, self.dims
        shared = shared_variant(cexe, key, inputs)
        nxt = self.serves(key, shared)
        lengths = [self.device_lengths[d] for d in shared.sym.dims]
        if self.check_hazards:
            with self._checks_lock:
                hit = self._checked.get(shared.checked)
                if hit is not None:
                    self._checked[shared.checked] = (hit[0], False)  # taken: the next build is not counted
            if hit is not None:
                problems = hit[0]
                self._ahead["taken_by_chunks"] += hit[1]
            else:
                example = [copy_strided(inputs[n]) for n in cexe.signature.inputs]
                with collector.held():  # as at_length's: a collection among the walk's views costs more than the walk
                    problems = _hazards(shared.checked, cexe, example, dims, lengths)
                with self._checks_lock:
                    self._checked[shared.checked] = (problems, False)
            if problems:
                raise VariantRefused(f"{key.label()} at {dims}: the arena's state is overwritten before it is read: "
                                     f"{problems[0]}")
        program = at_stream(shared.gm, dims, lengths, variant_entry(self.plan, key), meta.arena_inputs(shared.gm),
                            nxt, program_kind(cexe.rules))
        return program, shared.nbytes, f"the capacity's shared graph ({shared.how})"

    def work_ahead(self, seconds: "float | None") -> int:
        """Idle time (``Variants.work_ahead``): this stream's hazard check of each shared graph
        held that serves its length and that it has not checked, so that the first chunk of
        its shape runs without it (the walk alone: where only a run can tell, the chunk
        checks); then, for each shape held whose shared graph does not serve this length
        (another branch class of the model's code here), this stream's own program of it, built
        at the steady entry's state (``Variants.build_ahead``, the chunk's own builder) where
        the time left is at least what such a build last took (or the shared graph's build):
        its chunk then builds nothing.  ``seconds`` (None: no bound) looked at between items.
        Returns the items done (checks and builds)."""
        t0, done, scratch = time.perf_counter(), 0, {}
        with self.cexe._lock:
            held = [(shape, g) for shape, g in self.cexe.shared.items() if isinstance(g, SharedGraph)]
        for shape, shared in held if self.check_hazards else ():
            if seconds is not None and time.perf_counter() - t0 >= seconds:
                break
            with self._checks_lock:
                if shared.checked in self._checked:
                    continue
            problems = None
            try:
                self.serves(VariantKey(shape[0], (), shape[1], shape[2]), shared)
            except VariantRefused:  # another branch class at this length: its own program, below
                if shared.inputs is not None:
                    self._others[shape] = (shared.inputs, shared.build_s)
            else:
                lengths = [self.device_lengths[d] for d in shared.sym.dims]
                with collector.held():
                    problems = _hazards(shared.checked, self.cexe, None, self.dims, lengths, scratch, full_run=False)
                done += problems is not None
                self._ahead["left_to_chunks"] += problems is None
            with self._checks_lock:
                self._checked[shared.checked] = None if problems is None else (problems, True)
        self._ahead["checked"] += done
        done += self._build_others(seconds, t0)
        self._ahead["s"] += time.perf_counter() - t0
        return done

    def _build_others(self, seconds: "float | None", t0: float) -> int:
        """``work_ahead``'s builds: this stream's own program of each shape of another branch
        class, each where the time left holds one (else left for a later idle, or its chunk)."""
        built = 0
        for shape, (inputs, shared_s) in list(self._others.items()) if self.variants is not None else ():
            left = None if seconds is None else seconds - (time.perf_counter() - t0)
            if left is not None and left < max(self.cexe.own_build_s, shared_s):
                continue
            with self._checks_lock:  # (two sessions of this length may be idle at once)
                if self._others.pop(shape, None) is None:
                    continue
            regions, carried = self.plan.catalog[shape[0]].regions, self.cexe.signature.regions
            extents = extents_in_slots({r: tuple(regions[r].shape) for r in carried if r in regions}, self.plan)
            key = VariantKey(shape[0], tuple((r, extents.get(r)) for r in carried), shape[1], shape[2])
            self._idle.on = True
            try:
                took = self.variants.build_ahead(key, inputs)
            finally:
                self._idle.on = False
            built += took is not None
            if took is None and not self.variants.settled(key):  # another build was running: a later idle's
                with self._checks_lock:
                    self._others.setdefault(shape, (inputs, shared_s))
                break
        self._ahead["built"] += built
        return built

    def ahead_stats(self) -> dict:
        """Shared graphs checked ahead (``work_ahead``), left to their chunks (only a run can
        check them), seconds, chunks' builds that took a check made ahead; ``built``: this
        stream's own programs of shapes of another branch class built ahead, ``own_waiting``:
        such shapes found and not built yet (no idle time long enough so far)."""
        return {**self._ahead, "s": round(self._ahead["s"], 3), "own_waiting": len(self._others)}

    def serves(self, key: VariantKey, shared: SharedGraph) -> dict:
        """The next state's extents of ``shared`` at this stream's length; ``VariantRefused``
        where it does not serve that length."""
        try:
            check_dims(shared.plan, shared.sym, self.dims)
            return extents_at(shared.sym, self.plan, self.dims)
        except SpecializationRefused as e:
            raise VariantRefused(f"the shared graph of {_label(_shape(key))} does not serve {self.dims}: {e}") from e

    def quick(self, key: VariantKey) -> bool:
        """Whether ``key``'s build is only a check of a shared graph held that serves this
        length (made on the stream's thread even while builds go to the background)."""
        if key.entry is None:
            return False
        with self.cexe._lock:
            shared = self.cexe.shared.get(_shape(key))
        if not isinstance(shared, SharedGraph):
            return False
        try:
            self.serves(key, shared)
        except VariantRefused:
            return False  # this stream's own program: a build like any other
        return True


def _shape(key: VariantKey) -> tuple:
    """What an off-catalog graph is shared by: the key's entry, inputs and flags (not its
    extents, which are the entry's at each stream's length)."""
    return key.entry, key.inputs, key.flags


class _OutOfMemory(str):
    """A build's refusal that out of memory caused: remembered ``OOM_RETRY_S`` only (memory comes back)."""


def _refused(hit) -> bool:  # a refusal held (one of out of memory, until its time is up)
    return isinstance(hit, str) and not (isinstance(hit, _OutOfMemory) and time.monotonic() - hit.at >= OOM_RETRY_S)


def _refusal(hit: str) -> VariantRefused:
    return (RefusedForNow if isinstance(hit, _OutOfMemory) else VariantRefused)(hit)


def _label(shape: tuple) -> str:
    return VariantKey(shape[0], (), shape[1], shape[2]).label()


def shared_variant(cexe: CapacityExecutable, key: VariantKey, inputs: Mapping[str, torch.Tensor]) -> SharedGraph:
    """The capacity graph of ``key``'s shape (an off-catalog chunk at catalog entry
    ``key.entry``'s state), built now if none is held; ``VariantRefused`` (remembered) where
    none can be (``RefusedForNow``, remembered ``OOM_RETRY_S``, where out of memory was why).
    One build at a time: a stream that needs a shape while another shape is
    building gets ``VariantBusy`` (its chunk runs eagerly, nothing is remembered); a shape
    held is never waited for.  A build that needs the foreground (``NeedsForeground``, on a
    background build's thread) is not remembered either."""
    shape = _shape(key)
    with cexe._lock:
        hit = cexe.shared.get(shape)
        if hit is not None:
            cexe.shared.move_to_end(shape)
    if _refused(hit):
        raise _refusal(hit)
    if isinstance(hit, SharedGraph):
        return hit
    if not cexe._building.acquire(blocking=False):
        raise VariantBusy(f"another stream is building a capacity graph ({_label(shape)} waits for its turn)")
    try:
        with cexe._lock:  # built while this one waited?
            hit = cexe.shared.get(shape)
        if _refused(hit):
            raise _refusal(hit)
        if isinstance(hit, SharedGraph):
            return hit
        t0 = time.perf_counter()
        try:
            built = _build_shared(cexe, key, inputs)
        except (VariantRefused, SpecializationRefused, PassError, TraceError) as e:  # CapacityRefused: a TraceError
            if caused_by(e, NeedsForeground):
                raise NeedsForeground(str(e)) from e
            why = f"no capacity graph for {_label(shape)}: {type(e).__name__}: {e}"
            if caused_by(e, torch.OutOfMemoryError):  # tried again once OOM_RETRY_S have passed
                why = _OutOfMemory(f"{why} (out of memory: tried again {OOM_RETRY_S:g} s after)")
                why.at = time.monotonic()
            with cexe._lock:
                cexe.shared[shape] = why
            raise _refusal(why) from e
        built.build_s = round(time.perf_counter() - t0, 3)
        with cexe._lock:
            cexe.shared[shape] = built
            cexe.built += 1
            cexe.loaded += built.loaded
            while sum(isinstance(v, SharedGraph) for v in cexe.shared.values()) > cexe.max_shared:
                old = next(k for k, v in cexe.shared.items() if isinstance(v, SharedGraph))
                del cexe.shared[old]
                cexe.evicted += 1
        return built
    finally:
        cexe._building.release()


def _build_shared(cexe: CapacityExecutable, key: VariantKey, inputs: Mapping[str, torch.Tensor]) -> SharedGraph:
    if cexe.programs is None or cexe.adapter is None:
        raise VariantRefused("the capacity executable has no program store (capacity_executable(programs=...))")
    adapter, sig = cexe.adapter, cexe.signature
    entry = cexe.plan.catalog[key.entry]
    example = {n: copy_strided(inputs[n]) for n in sig.inputs}
    setup: dict = {}
    at_c = dataclasses.replace(key, extents=())  # the entry's own state at the capacity, the key's inputs
    label = _label(_shape(key))

    def use(sym: SymbolicStep, at: dict):  # built, or loaded from the disk cache (capacity_build)
        chunk = {d: v for d, v in at.items() if d not in cexe.dims}  # the chunk's own lengths: bound
        return capacity_graph(adapter, sym, cexe.dims, chunk, cexe.by_region, cexe.masked_attention, cexe.device,
                              [example[n] for n in sig.inputs], lambda g: region_bindings(
                                  cexe.plan, variant_entry(cexe.plan, at_c), traced_extents(g, cexe.plan)),
                              cexe.programs, label, cexe.say, run=not cexe.rules.replays)
    got = symbolic_entry(adapter, lambda d: build_plan(adapter, d), cexe.plan, entry, cexe.by_region, cexe.programs,
                         setup, cexe.say, use, example, key.flag_values)
    if got is None:
        raise VariantRefused(f"no symbolic step serves it at the capacity {cexe.dims} ({setup.get('reason')})")
    gm, cplan, bound, where = got
    how = f"{setup.get('how', '?')} (variant {setup.get('variant')}, program {setup.get('program')}, graph {where})"
    run = lowered_copy(gm, cexe.rules, cexe.device.type, adapter.step_boundary(), length_free=cexe.shared_captures)
    walk_plan(gm)  # each stream's check of this graph walks it: plan that walk here, with the build
    return SharedGraph(run, cplan, bound, own_bytes(gm, adapter), 0.0, how, gm, example,
                       loaded=where == "loaded from disk")


def extents_at(sym: SymbolicStep, plan, dims: Mapping[str, int]) -> dict:
    """The extents of the next state ``sym`` returns at ``dims`` (its recorded sizes, evaluated),
    checked against ``plan``'s arena slots (``SpecializationRefused`` where one does not fit)."""
    import sympy
    binding = {sym.symbols[d]: sympy.Integer(int(v)) for d, v in dims.items()}
    sig = meta.signature(sym.gm)
    (outputs,) = [n.args[0] for n in sym.gm.graph.nodes if n.op == "output"]
    shapes = {}
    for r, node in zip(sig.regions, outputs[len(sig.outputs):]):
        v = node.meta.get(meta.SYM) if isinstance(node, fx.Node) else None
        if not isinstance(v, SymTensor):
            raise SpecializationRefused(f"the step's next {r} has no recorded shape")
        shapes[r] = tuple(_value(x, binding, f"the next {r}'s size") for x in v.shape)
    try:
        return extents_in_slots(shapes, plan)
    except VariantRefused as e:
        raise SpecializationRefused(str(e)) from e


def _hazards(gm: fx.GraphModule, cexe: CapacityExecutable, inputs: "list | None", dims: Mapping[str, int],
             lengths: list, scratch: "dict | None" = None, full_run: bool = True) -> "list | None":
    slots = {n: (cexe.plan.layout.slot(n).shape, getattr(torch, cexe.plan.layout.slot(n).dtype))
             for n in meta.arena_inputs(gm)}
    return hazards_at(gm, slots, cexe.device, inputs, dims, lengths, scratch, full_run)


__all__ = ["CapacityExecutable", "CapacityPlan", "SharedGraph", "at_length", "capacity_executable",
           "at_stream", "extents_at", "hazards_at", "shared_variant"]
