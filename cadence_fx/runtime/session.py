"""Session: admission gate -> graph (or eager fallback) -> state stays in the arena.

The runtime executes what ``cadence_fx.compiler`` produced (an ``Executable``: one
program per catalog entry) and never reaches back into the passes.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Mapping

import torch

from ..errors import CadenceError, InputError, SessionClosed
from ..plan import CatalogEntry, Plan, TensorSpec, same_layout
from ..step import Rules
from .arena import Arena
from .counters import SessionStats


@dataclasses.dataclass
class EntryProgram:
    """What runs for one catalog entry: ``run(*inputs, *arena_regions) -> outputs``."""

    entry: CatalogEntry
    run: Callable[..., tuple]
    arena_inputs: tuple[str, ...]
    next_extents: Mapping[str, int | None]
    kind: str = "graph"  # "graph" (rewritten aten graph, eager kernels) or "cudagraph" (replay)
    #: rules R/Rc: the carried state as the program takes it (stock-managed state may be
    #: larger than the declared region off its growth axis, e.g. a buffer of 16 step slots)
    state_specs: Mapping[str, TensorSpec] | None = None


@dataclasses.dataclass
class Executable:
    plan: Plan
    programs: dict[int, EntryProgram]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    carried: tuple[str, ...]
    rules: Rules
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)  # timings, pass records
    #: rule S: the arena the entries were traced on, handed (zeroed) to the first session
    spare_arena: Arena | None = dataclasses.field(default=None, repr=False, compare=False)
    _spare_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def stable_state(self) -> bool:
        """Rule S: state in an arena at stable addresses; else stock-managed state."""
        return self.rules.stable_state

    def take_arena(self, device: torch.device | str) -> Arena:
        """An arena for a new session: the trace's own (zero-filled again) the first
        time, a fresh one after.  One session on an executable then holds one arena's
        memory, not two (on CUDA the trace's arena stays allocated after compiling)."""
        with self._spare_lock:  # sessions may be opened from several threads: one taker only
            arena, self.spare_arena = self.spare_arena, None
        if arena is None or arena.device != torch.device(device):
            return Arena(self.plan.layout, device)
        return arena.clear()


def tensor_mismatch(what: str, t: torch.Tensor, spec: TensorSpec) -> str | None:
    """``None`` if ``t`` has ``spec``'s shape, dtype and layout, else the first difference."""
    if tuple(t.shape) != tuple(spec.shape):
        return f"{what} shape {tuple(t.shape)} != catalog {tuple(spec.shape)}"
    if str(t.dtype).removeprefix("torch.") != spec.dtype:
        return f"{what} dtype {t.dtype} != catalog {spec.dtype}"
    if not same_layout(spec.shape, tuple(t.stride()), tuple(spec.stride)):
        return f"{what} stride {tuple(t.stride())} != catalog {tuple(spec.stride)}"
    return None


def input_mismatch(entry: CatalogEntry, inputs: Mapping[str, torch.Tensor]) -> str | None:
    """``None`` if every input has the entry's exact signature, else the first difference."""
    for name, spec in entry.inputs.items():
        t = inputs.get(name)
        if t is None:
            return f"input {name!r} missing"
        why = tensor_mismatch(f"input {name!r}", t, spec)
        if why is not None:
            return why
        if t.device != torch.device(spec.device):
            return f"input {name!r} device {t.device} != catalog {spec.device}"
    return None


class AdmissionGate:
    """Fail closed: a program runs only on the exact signature it was built for."""

    def __init__(self, arena: Arena):
        self.arena = arena

    def check(self, entry: CatalogEntry, inputs: Mapping[str, torch.Tensor],
              extents: Mapping[str, int | None]) -> str | None:
        """``None`` to admit, else the reason (one line) to run eagerly."""
        why = input_mismatch(entry, inputs)
        if why is not None:
            return why
        for name, spec in entry.regions.items():
            slot = self.arena.layout.slot(name)
            if slot.axis is not None and extents.get(name) is not None and extents[name] != spec.shape[slot.axis]:
                return f"region {name!r} extent {extents[name]} != catalog {spec.shape[slot.axis]}"
        ptrs = self.arena.data_ptrs()
        for name, t in self.arena.regions.items():
            if t.data_ptr() != ptrs[name]:
                return f"region {name!r} moved"
        return None


FallbackFn = Callable[..., tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]


class Session:
    """One stream: its arena, its clock position and its counters.

    ``step(inputs, **flags)`` returns the step's outputs (fresh tensors the caller
    owns).  Any flag set (e.g. ``last_chunk=True``), any input outside the entry's
    signature, or state extents outside the catalog run ``fallback`` eagerly on the
    arena state; the reason is counted in ``stats()``.
    """

    def __init__(self, executable: Executable, arena: Arena | None, fallback: FallbackFn,
                 extents: Mapping[str, int | None], device: torch.device | str | None = None):
        self.executable = executable
        self.arena = arena
        self.layout = executable.plan.layout
        self.gate = AdmissionGate(arena) if arena is not None else None
        self.fallback = fallback
        self.extents = dict(extents)
        self._stats = SessionStats()
        self.closed = False
        self._expect_device = arena.device if arena is not None else torch.device(device)
        # set by prepare_replay: this session's own captured programs (graphs bind its arena)
        self._programs: dict[int, EntryProgram] | None = None
        self.capture_failures: dict[int, dict[str, str]] = {}

    # ------------------------------------------------------------------ public
    @torch.no_grad()
    def prepare_replay(self, example_inputs: Mapping[str, torch.Tensor]) -> dict[int, dict[str, str]]:
        """Capture every entry's graphs on this session's memory (before its state is set up).

        Capture runs each entry once for real: the generators are forked so the
        caller's random stream is untouched, and the state is reset afterwards
        (``load_state`` sets it up).  Returns per entry the regions whose capture
        failed (they run eagerly).
        """
        from .graphs import capture_entry, fresh_regions
        failed: dict[int, dict[str, str]] = {}
        if not any(p.kind == "cudagraph" for p in self.executable.programs.values()):
            return failed
        pool = torch.cuda.graph_pool_handle()  # one pool for all this session's graphs
        # and one capture stream: one set of library workspaces (None: a CPU test's fake capture)
        stream = torch.cuda.Stream(self._expect_device) if self._expect_device.type == "cuda" else None
        self._programs = {}
        devices = [self._expect_device] if self._expect_device.type == "cuda" else []  # the CPU generator always forks
        with torch.random.fork_rng(devices=devices):
            for idx, program in sorted(self.executable.programs.items()):
                parent = fresh_regions(program.run)
                args = [example_inputs[n] for n in self.executable.inputs] + self._capture_state_args(program)
                try:
                    failed[idx] = capture_entry(parent, args, pool, self._bound_storage(), stream)
                except torch.OutOfMemoryError as e:  # capture must never crash a stream: the
                    # entry's uncaptured regions run eagerly, each step counted ("not captured")
                    failed[idx] = {"*": f"out of memory while capturing: {e}"}
                self._programs[idx] = dataclasses.replace(program, run=parent)
        self._reset_state()
        self.capture_failures = failed
        return failed

    @torch.no_grad()
    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Set the stream's state (e.g. from the model's prompt setup); it must fit catalog entry 0."""
        missing = [r for r in self.executable.carried if r not in state]
        if missing:
            raise CadenceError(f"setup returned no state for region {missing[0]!r}")
        extents = self._extents_of(state)
        entry0 = self.executable.plan.catalog[0]
        for r, spec in entry0.regions.items():
            axis = self.layout.slot(r).axis
            if r in extents and axis is not None and extents[r] != spec.shape[axis]:
                raise CadenceError(f"setup left {r} at {extents[r]} along axis {axis}; "
                                   f"catalog entry 0 expects {spec.shape[axis]}")
        self._write_state(state, extents)

    @torch.no_grad()  # streaming state never records autograd history; grad mode is restored after
    def step(self, inputs: Mapping[str, torch.Tensor], **flags: Any) -> dict[str, torch.Tensor]:
        if self.closed:
            raise SessionClosed("this session is closed (close() was called); open a new session to stream again")
        self._validate(inputs)
        entry = self._entry()
        if any(flags.values()):
            reason = "flags " + ",".join(k for k, v in flags.items() if v) + " outside the catalog (eager)"
        elif entry is None:
            reason = "state extents outside the catalog"
        else:
            reason = self._admit(entry, inputs)
        if reason is None:
            program = self._program(entry.index)
            args = [inputs[n] for n in self.executable.inputs] + self._state_args(program)
            if program.kind == "cudagraph":
                from .graphs import region_stats
                before = region_stats(program.run)
                result = tuple(t.clone() for t in program.run(*args))  # static outputs: copy before the next replay
                after = region_stats(program.run)
                for why, n in after[1].items():
                    for _ in range(n - before[1].get(why, 0)):
                        self._stats.count_fallback(f"region refused replay: {why}")
                if after[0] > before[0]:
                    self._stats.replays[entry.index] += 1
                else:
                    self._stats.graph_runs[entry.index] += 1
            else:
                result = program.run(*args)
                self._stats.graph_runs[entry.index] += 1
            outputs = self._commit(program, result)
        else:
            self._stats.count_fallback(reason)
            outputs = self._run_fallback(inputs, flags)
        self._stats.steps += 1
        return outputs

    def state(self) -> dict[str, torch.Tensor]:
        """Live views of the carried regions (no copies)."""
        return {r: self.arena.view(r, self.extents.get(r)) for r in self.executable.carried}

    def stats(self) -> dict:
        return self._stats.to_json()

    @property
    def state_bytes(self) -> int:
        """Device memory this session holds for its state."""
        return self.arena.nbytes

    def close(self) -> None:
        self.closed = True

    # ------------------------------------------- where the state lives (arena here)
    def _admit(self, entry: CatalogEntry, inputs: Mapping[str, torch.Tensor]) -> str | None:
        return self.gate.check(entry, inputs, self.extents)

    def _state_args(self, program: EntryProgram) -> list[torch.Tensor]:
        return [self.arena.full(n) for n in program.arena_inputs]

    _capture_state_args = _state_args

    def _bound_storage(self) -> int | None:
        """Address of the storage whose views replays bind by address (the arena)."""
        return self.arena.storage.data_ptr()

    def _reset_state(self) -> None:
        self.arena.storage.zero_()

    def _commit(self, program: EntryProgram, result: tuple) -> dict[str, torch.Tensor]:
        """The program already wrote the next state into the arena."""
        self.extents.update(program.next_extents)
        return dict(zip(self.executable.outputs, result))

    def _write_state(self, state: Mapping[str, torch.Tensor], extents: Mapping[str, int | None]) -> None:
        # Check every region fits before writing any, so a bad step loses no state.
        writes = {}
        for r in self.executable.carried:
            t = state[r]
            full = self.arena.full(r)
            axis = self.layout.slot(r).axis
            want = list(full.shape)
            if axis is not None:
                if t.shape[axis] > full.shape[axis]:
                    raise CadenceError(f"eager step grew region {r!r} to {t.shape[axis]} along axis {axis}, past "
                                       f"its arena capacity {full.shape[axis]}; the declared retention is too small")
                want[axis] = t.shape[axis]
            if list(t.shape) != want:
                raise CadenceError(f"eager step returned region {r!r} of shape {tuple(t.shape)}; "
                                   f"the arena holds {tuple(want)}")
            view = self.arena.view(r, extents[r])
            if view.data_ptr() == t.data_ptr() and view.stride() == t.stride():
                continue  # already written in place (e.g. setup on arena-bound buffers)
            if t.untyped_storage().data_ptr() == full.untyped_storage().data_ptr():
                t = t.clone()  # written from its own memory: read it out first
            writes[r] = t
        for r, t in writes.items():
            self.arena.view(r, extents[r]).copy_(t)
        self.extents.update(extents)

    # ----------------------------------------------------------------- private
    def _program(self, index: int) -> EntryProgram:
        if self._programs is not None:
            return self._programs[index]
        program = self.executable.programs[index]
        if program.kind == "cudagraph":
            raise CadenceError("replay programs need prepare_replay() on the session first")
        return program

    def _entry(self) -> CatalogEntry | None:
        for entry in self.executable.plan.catalog:
            if all(self.extents.get(r) is None or
                   spec.shape[self.layout.slot(r).axis] == self.extents[r]
                   for r, spec in entry.regions.items() if self.layout.slot(r).axis is not None):
                return entry
        return None

    def _validate(self, inputs: Mapping[str, torch.Tensor]) -> None:
        specs = self.executable.plan.inputs
        for name in self.executable.inputs:
            if name not in inputs:
                raise InputError(f"missing input {name!r}; the step takes {list(self.executable.inputs)}")
            t = inputs[name]
            if not isinstance(t, torch.Tensor):
                raise InputError(f"input {name!r} must be a tensor, got {type(t).__name__}")
            if t.device != self._expect_device:
                raise InputError(f"input {name!r} is on {t.device}; this session runs on {self._expect_device}")
            want = specs[name].dtype
            if str(t.dtype).removeprefix("torch.") != want:
                raise InputError(f"input {name!r} has dtype {t.dtype}; the model takes {want}")
            if t.dim() != len(specs[name].shape):
                raise InputError(f"input {name!r} has {t.dim()} dims {tuple(t.shape)}; "
                                 f"the model takes {len(specs[name].shape)} ({tuple(specs[name].shape)})")

    def _run_fallback(self, inputs, flags) -> dict[str, torch.Tensor]:
        outputs, new_state = self.fallback(inputs, self.state(), **flags)
        self._write_state(new_state, self._extents_of(new_state))
        return outputs

    def _extents_of(self, state: Mapping[str, torch.Tensor]) -> dict[str, int | None]:
        """Each carried region's extent along its growth axis (None for fixed-shape regions)."""
        axes = {r: self.layout.slot(r).axis for r in self.executable.carried}
        return {r: None if axis is None else state[r].shape[axis] for r, axis in axes.items()}


class StockStateGate:
    """The gate for ``StockStateSession``: inputs and state exactly as the entry was traced."""

    def check(self, entry: CatalogEntry, inputs: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor],
              specs: Mapping[str, TensorSpec]) -> str | None:
        why = input_mismatch(entry, inputs)
        if why is not None:
            return why
        for name, spec in specs.items():
            why = tensor_mismatch(f"state {name!r}", state[name], spec)
            if why is not None:
                return why
        return None


class StockStateSession(Session):
    """Rules R / Rc: replay over stock-managed state, without the arena (no rule S).

    The step's graphs were traced over the model's own (stock-sized) buffers, as
    the stock runtime runs, with the carried state as plain inputs and outputs.
    Each step passes the state in (a replay copies it into the graph's static
    inputs), takes the next state out of the graph's outputs and keeps a private
    contiguous copy: the copy-in/copy-out traffic and the stock buffers are what
    rule S removes.  The model's buffers are scratch shared by every session of it:
    its sessions must not run concurrently.
    """

    def __init__(self, executable: Executable, fallback: FallbackFn, device: torch.device | str):
        super().__init__(executable, None, fallback, {}, device=device)
        self.stock_gate = StockStateGate()
        self._state: dict[str, torch.Tensor] = {}

    def state(self) -> dict[str, torch.Tensor]:
        """The carried state (this session's own tensors)."""
        return dict(self._state)

    @property
    def state_bytes(self) -> int:
        return sum(t.nbytes for t in self._state.values())

    def _admit(self, entry: CatalogEntry, inputs: Mapping[str, torch.Tensor]) -> str | None:
        return self.stock_gate.check(entry, inputs, self._state, self.executable.programs[entry.index].state_specs)

    def _state_args(self, program: EntryProgram) -> list[torch.Tensor]:
        return [self._state[r] for r in self.executable.carried]

    def _capture_state_args(self, program: EntryProgram) -> list[torch.Tensor]:
        specs = program.state_specs
        return [torch.zeros(specs[r].shape, dtype=getattr(torch, specs[r].dtype), device=self._expect_device)
                for r in self.executable.carried]

    def _bound_storage(self) -> int | None:
        return None  # nothing is bound by address but what the graphs write in place

    def _reset_state(self) -> None:
        self._state = {}

    def _commit(self, program: EntryProgram, result: tuple) -> dict[str, torch.Tensor]:
        n = len(self.executable.outputs)
        new = dict(zip(self.executable.carried, result[n:]))
        self._write_state(new, self._extents_of(new))
        return dict(zip(self.executable.outputs, result[:n]))

    def _write_state(self, state: Mapping[str, torch.Tensor], extents: Mapping[str, int | None]) -> None:
        # the next state may be a view of the model's scratch buffers: keep a private copy
        self._state = {r: state[r].clone(memory_format=torch.contiguous_format) for r in self.executable.carried}
        self.extents.update(extents)
