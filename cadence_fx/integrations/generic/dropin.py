"""``OptimizedModule``: what ``cadence_fx.optimize`` returns for a model in the generic step form.

    opt = cadence_fx.optimize(model, rules="S")
    session = opt.open_session()            # initial_state() runs here
    y = session.step(x)                     # the outputs; the state stays in the arena
    y = opt.stream(x)                       # the step's own name drives a default session

A session compiles (or reuses) the executable of its stream configuration at its first
step: the declaration's symbols (``dims``: given, a model attribute, or read off the
initial state) and the first step's input shapes.  Before tracing, ``probe`` runs the
stock step through every catalog phase and refuses a declaration that does not fit.
For its first ``check_chunks`` steps a session also runs the stock step beside the
optimized one (the *shadow check*) and raises ``DeclarationError`` on any difference,
before the caller sees the output.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Mapping

import torch

from ...annotations import get_declaration
from ...compiler import open_session
from ...lockstep import rng_state, set_rng_state
from ...errors import CadenceError, DeclarationError, InputError, SessionBroken, SessionClosed
from ...plan import TensorSpec, make_plan
from ...runtime.binding import rebind_buffers
from ...runtime.variants import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_POLICY
from ..dropin import DEFAULT_MAX_EXECUTABLES, DropIn
from .adapter import GenericAdapter, check_state, module_device_dtype, private_buffers, resolve_dims
from .form import StepForm, render
from .probe import differences, probe

#: the shadow check's length when ``optimize`` is not told (``check_chunks=None``): at
#: least this many steps, and every catalog entry twice
DEFAULT_CHECK_CHUNKS = 8


class OptimizedModule(DropIn):
    """A model in the generic step form, optimized.  ``open_session(*args)`` opens a
    stream (``args`` go to the model's ``initial_state``); ``step(*inputs)``, also under the
    model's step method name (e.g. ``opt.stream(x)``, unless that name is one of this
    class's own), drives a default session, which ``reset()`` rewinds to its initial
    state and ``state()``/``stats()``/``close()`` report on or end."""

    def __init__(self, model: torch.nn.Module, rules: str = "S", progress: Callable[[str], None] | None = None,
                 cache: "bool | str | os.PathLike" = True, dims: Mapping[str, int] | None = None,
                 check_chunks: int | None = None, off_catalog: str = DEFAULT_POLICY,
                 max_specializations: int = DEFAULT_MAX_ENTRIES, max_specialization_bytes: int = DEFAULT_MAX_BYTES,
                 max_executables: int = DEFAULT_MAX_EXECUTABLES):
        self.declaration = get_declaration(model)
        self.form = StepForm.of(model, self.declaration)
        device, self.dtype = module_device_dtype(model)
        super().__init__(rules, device, progress, cache, off_catalog, max_specializations, max_specialization_bytes,
                         max_executables)
        self._require_stable_state("the generic path", "its sessions keep the carried state in an arena")
        if check_chunks is not None and (isinstance(check_chunks, bool) or not isinstance(check_chunks, int)
                                         or check_chunks < 0):
            raise CadenceError(f"check_chunks={check_chunks!r} must be an int >= 0 (0: no shadow check) or None")
        self.model, self.device = model, device
        self.given_dims = dict(dims or {})
        self.check_chunks = check_chunks
        self._configs: dict[tuple, tuple[GenericAdapter, str]] = {}
        self._lock = threading.Lock()  # one compile at a time
        if not hasattr(OptimizedModule, self.form.method):  # e.g. opt.stream(x); opt.step(x) always works
            setattr(self, self.form.method, self.step)

    def open_session(self, *args: Any) -> "GenericSession":
        """A new stream; ``args`` go to the model's ``initial_state``."""
        return GenericSession(self, args)

    def step(self, *inputs: torch.Tensor, **flags: Any) -> Any:
        """One step of the default session (opened with no ``initial_state`` arguments on
        first use); also bound under the model's step method name (``opt.stream(x)``)."""
        if self.session is None or self.session.closed:
            self.session = self.open_session()
        return self.session.step(*inputs, **flags)

    def __call__(self, *inputs: torch.Tensor, **flags: Any) -> Any:
        """``opt(*inputs)``: one step of the default session, for a model whose declared step
        is ``forward`` (as ``model(x, *state)`` is its stock call)."""
        if self.form.method != "forward":
            raise TypeError(f"the optimized {self.form.owner} steps with opt.step(...) or opt.{self.form.method}(...); "
                            f"calling it is for a model whose declared step is forward")
        return self.step(*inputs, **flags)

    def reset(self) -> None:
        """Rewind the default session to its initial state (a fresh one if none is open)."""
        if self.session is None or self.session.closed:
            self.session = self.open_session()
        else:
            self.session.reset()

    def shadow_length(self, entries: int) -> int:
        if self.check_chunks is not None:
            return self.check_chunks
        return max(DEFAULT_CHECK_CHUNKS, 2 * entries)

    def _config(self, dims: Mapping[str, int], inputs: Mapping[str, torch.Tensor],
                state0: Mapping[str, torch.Tensor]) -> tuple[GenericAdapter, Any, str]:
        """(adapter, executable, output form) of one stream configuration, probed and
        compiled the first time it is seen."""
        key = (tuple(sorted(dims.items())), tuple((k, TensorSpec.of(v)) for k, v in inputs.items()))
        with self._lock:
            if key not in self._configs:
                twin = rebind_buffers(self.model, private_buffers(self.declaration, self.model))
                names, how = probe(self.model, twin, self.form, self.declaration, dims, inputs, state0, self.dtype,
                                   self.device)
                self._configs[key] = (GenericAdapter(self.model, self.form, self.declaration, dims, inputs, names),
                                      how)
            adapter, how = self._configs[key]
            return adapter, self._executable(key, adapter), how


class GenericSession:
    """One stream of an ``OptimizedModule`` (see the module docstring)."""

    def __init__(self, owner: OptimizedModule, args: tuple):
        self.owner, self.form = owner, owner.form
        twin = rebind_buffers(owner.model, private_buffers(owner.declaration, owner.model))
        with torch.no_grad():
            state0 = self.form.state_of(getattr(twin, self.form.initial)(*args), "open_session")
        self.dims = resolve_dims(owner.model, owner.declaration, owner.given_dims, state0)
        plan = make_plan(owner.declaration, self.dims, {}, dtype=str(owner.dtype).removeprefix("torch."),
                         device=str(owner.device))
        entry0 = plan.catalog[0]
        check_state(f"{type(owner.model).__name__}.{self.form.initial}() (the state before the first step)", state0,
                    {r: entry0.regions[r] for r in self.form.carried}, owner.declaration, self.dims)
        bad = [r for r, t in state0.items() if t.device != owner.device]
        if bad:
            raise DeclarationError(f"{self.form.owner}.{self.form.initial}() put {bad} on "
                                   f"{state0[bad[0]].device}; the model is on {owner.device}")
        self._state0 = {r: t.clone() for r, t in state0.items()}
        self._shadow_twin, self._shadow_state = twin, state0  # the stock stream the shadow check steps
        self._shadow_left = owner.shadow_length(len(plan.catalog))
        self._checked = 0
        self.core = None  # the runtime Session, opened at the first step
        self._snapshot = None
        self._how = ""
        self.last_outputs: dict[str, torch.Tensor] = {}  # the last step's outputs by name (out0, ... for a tuple)
        self.closed = False
        self._broken: BaseException | None = None

    # ------------------------------------------------------------------ steps
    def step(self, *inputs: torch.Tensor, **flags: Any) -> Any:
        """The step's outputs for ``inputs`` (the state stays in the session)."""
        if self.closed:
            raise SessionClosed("this session is closed (close() was called)")
        if self._broken is not None:
            raise SessionBroken(f"this session stopped at a failed check: {self._broken}") from self._broken
        named = self.form.call_args(inputs)
        self.form.check_flags(flags)
        if self.core is None:
            self._open(named)
        if self._shadow_left <= 0:
            self.last_outputs = self.core.step(named, **flags)
            return render(self.last_outputs, self._how)
        device = self.owner.device
        rng = rng_state(device)
        outputs = self.core.step(named, **flags)  # an InputError here leaves both streams as they were
        after = rng_state(device)
        set_rng_state(rng, device)
        try:
            with torch.no_grad():
                value = getattr(self._shadow_twin, self.form.method)(
                    *[named[n] for n in self.form.inputs], *[self._shadow_state[r] for r in self.form.carried], **flags)
            stock_outputs, stock_state, _ = self.form.split(value)
        except BaseException as e:
            self._broken = e
            raise
        finally:
            set_rng_state(after, device)
        diff = differences(outputs, stock_outputs, self.core.state(), stock_state)
        if diff:
            self._broken = DeclarationError(
                f"{self.form.where()}: the optimized step differs from the stock step at chunk {self._checked} "
                f"in {', '.join(diff)}, so the declaration does not describe what the model carries (a retention, "
                f"an extent, or state kept outside the declared regions); nothing was returned. Fix the declaration "
                f"(cadence_fx.verify(model, inputs) shows chunk by chunk what differs)"
                + ("; on CUDA run under torch.use_deterministic_algorithms(True)" if self.owner.device.type == "cuda"
                   else ""))
            raise self._broken
        self._checked += 1
        self._shadow_left -= 1
        self._shadow_state = stock_state
        if self._shadow_left <= 0:
            self._shadow_twin = self._shadow_state = None
        self.last_outputs = outputs
        return render(outputs, self._how)

    def _open(self, named: Mapping[str, torch.Tensor]) -> None:
        adapter, executable, self._how = self.owner._config(self.dims, named, self._state0)
        self.core = open_session(executable, adapter, self._state0)
        self._snapshot = self.core.snapshot()

    # ------------------------------------------------------------- the rest
    def reset(self) -> None:
        """Back to the state right after ``open_session`` (no setup re-run); the shadow
        check, if still running, restarts from there too."""
        if self.closed:
            raise SessionClosed("this session is closed (close() was called); reset() needs an open session")
        if self.core is not None:
            self.core.restore(self._snapshot)
        if self._shadow_left > 0:
            self._shadow_state = {r: t.clone() for r, t in self._state0.items()}
        if not isinstance(self._broken, DeclarationError):  # a wrong declaration stays wrong
            self._broken = None

    def state(self) -> dict[str, torch.Tensor]:
        """The carried state: live arena views after the first step, the initial state before."""
        return self.core.state() if self.core is not None else {r: t.clone() for r, t in self._state0.items()}

    def snapshot(self):
        return self._need_core("snapshot").snapshot()

    def restore(self, snapshot) -> None:
        self._need_core("restore").restore(snapshot)

    def stats(self) -> dict:
        """The runtime session's counters (steps, graph runs, fallbacks by reason, setup_s)
        and ``shadow``: how many chunks were checked against stock and how many remain."""
        base = self.core.stats() if self.core is not None else {"steps": 0}
        return {**base, "shadow": {"checked": self._checked, "left": max(self._shadow_left, 0)}}

    @property
    def arena(self):
        return self.core.arena if self.core is not None else None

    @property
    def state_bytes(self) -> int:
        return self.core.state_bytes if self.core is not None else 0

    def adopt_setup(self, unused: "GenericSession") -> None:
        if self.core is not None and unused.core is not None:
            self.core.adopt_setup(unused.core)

    def close(self) -> None:
        self.closed = True
        if self.core is not None:
            self.core.close()
        self._shadow_twin = self._shadow_state = None

    def _need_core(self, what: str):
        if self.core is None:
            raise InputError(f"{what}() needs a stream that has stepped: the session compiles at its first step")
        return self.core
