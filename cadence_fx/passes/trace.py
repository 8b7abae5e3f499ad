"""trace: one streaming step -> a pre-dispatch aten ``GraphModule`` at exact shapes.

``make_fx(..., pre_dispatch=True)`` on real tensors, under ``no_grad``.  Pre-dispatch
keeps composite ops whole (``aten.linear`` stays one op: the default decomposition
into ``t`` + ``addmm`` is exact on CPU but selects other CUDA kernels).  Upstream's
``inference_mode`` decorators, in-place writes into module buffers and host-built
tensors are all recorded as they run; later passes fold or rewrite them.  A
``torch.autocast`` block is recorded as ``_enter_autocast`` / ``_exit_autocast`` calls
(``autocast_recorded``: torch 2.5's make_fx needs help for that).

The traced function is ``step(inputs: dict, state: dict) -> (outputs: dict,
new_state: dict)``.  Placeholders are renamed ``in_<name>`` / ``state_<name>`` and
tagged ``Role.INPUT`` / ``Role.STATE``; ``get_attr`` nodes whose tensor is a module
buffer bound to a region are tagged ``Role.BUFFER``.  The graph returns ``(*outputs,
*new_state)`` in signature order (``step.signature(gm)``).

Speed: make_fx records a fake tensor as every node's ``meta["val"]``, and without a
fake mode in scope it builds a new ``FakeTensorMode`` per value (tens of thousands for
a released model, about a fifth of the trace).  ``one_fake_mode`` hands it one mode
through a ``TracingContext`` (on a torch whose make_fx asks for it: not 2.5); the
recorded values (shape, dtype, stride, device) and the graph are the same.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator, Mapping

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from ..errors import NeedsForeground, TraceError
from .. import step as meta
from ..step import Role, StepSignature
from .trace_memo import TRACE_TURN


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Identity, or the same view of the same memory."""
    if a is b:
        return True
    return (a.device == b.device and a.dtype == b.dtype and a.shape == b.shape
            and a.stride() == b.stride() and a.data_ptr() == b.data_ptr())


_AUTOCAST = threading.local()  # .on: autocast_recorded is in force on this thread


class _Probe:
    """One question about this torch's make_fx, asked of a one-op trace once per process.

    An answer, once had, is kept.  A probe that raises keeps nothing (the next call
    asks again) and answers ``on_failure``, or, where no answer is safe
    (``on_failure=None``), raises ``TraceError`` naming the question: a trace that
    cannot know how this torch records a block must not record it.  ``NeedsForeground``
    (a build's fence refused the probe's run) passes through as it is: a trace that
    raises it is tried again in the foreground, never refused for good.
    """

    def __init__(self, question: str, ask: Callable[[], bool], on_failure: bool | None):
        self.question, self._ask, self._on_failure = question, ask, on_failure
        self._answer: list[bool] = []
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        if self._answer:
            return self._answer[0]
        with self._lock:
            if not self._answer:
                try:
                    answer = bool(self._ask())
                except NeedsForeground:  # a build's fence: not an answer, and not a failure to keep
                    raise
                except Exception as e:
                    if self._on_failure is None:
                        raise TraceError(f"trace: cannot tell {self.question}: the one-op probe "
                                         f"failed ({type(e).__name__}: {e})") from e
                    return self._on_failure
                self._answer.append(answer)
        return self._answer[0]

    def forget(self) -> None:
        """Ask again next time (tests)."""
        with self._lock:
            self._answer.clear()


def _ask_records_autocast() -> bool:
    def probe(x):
        with torch.autocast("cpu", enabled=False):
            return x + 1
    with torch.no_grad():
        gm = make_fx(probe, pre_dispatch=True)(torch.zeros(1))
    return any(n.target is torch.amp.autocast_mode._enter_autocast for n in gm.graph.nodes)


# Whether this torch's pre-dispatch make_fx records ``torch.autocast`` blocks itself.
# No safe guess: yes would drop a block torch 2.5 does not record, no would record one twice.
_records_autocast = _Probe("whether make_fx records torch.autocast blocks", _ask_records_autocast,
                           on_failure=None)


@contextlib.contextmanager
def autocast_recorded() -> Iterator[None]:
    """Pre-dispatch make_fx records each ``torch.autocast`` block in this block as an
    ``_enter_autocast`` / ``_exit_autocast`` pair, as newer torch (2.13) does by itself.

    torch 2.5 runs the block under autocast but records neither call: the graph would
    replay its ops without the autocast (other dtypes than its recorded values).  There
    ``autocast``'s enter and exit also record the pair, with the arguments newer torch
    records, on this thread while in this block (elsewhere they are the originals).
    """
    if _records_autocast():
        yield
        return
    _install_autocast_recording()
    was = getattr(_AUTOCAST, "on", False)
    _AUTOCAST.on = True
    try:
        yield
    finally:
        _AUTOCAST.on = was


_INSTALL = threading.Lock()


def _install_autocast_recording() -> None:
    cls = torch.amp.autocast
    with _INSTALL:
        if getattr(cls, "_cadence_records", False):
            return
        enter, exit_ = cls.__enter__, cls.__exit__

        def recording_mode():
            if not (getattr(_AUTOCAST, "on", False) and torch._C._is_torch_function_mode_enabled()):
                return None
            from torch.fx.experimental.proxy_tensor import PreDispatchTorchFunctionMode
            modes = torch.overrides._get_current_function_mode_stack()
            return next((m for m in modes if isinstance(m, PreDispatchTorchFunctionMode)), None)

        def record(mode, fn, args) -> fx.Node:
            node = mode.__torch_function__(fn, (), args)
            node.meta["val"] = None  # as newer torch records it
            return node

        def __enter__(self):
            out = enter(self)
            mode = recording_mode()
            if mode is not None:
                args = (self.device, self.fast_dtype, self._enabled, self._cache_enabled)
                mode.__dict__.setdefault("_cadence_autocasts", []).append(
                    record(mode, torch.amp.autocast_mode._enter_autocast, args))
            return out

        def __exit__(self, *exc):
            out = exit_(self, *exc)
            mode = recording_mode()
            if mode is not None and mode.__dict__.get("_cadence_autocasts"):
                record(mode, torch.amp.autocast_mode._exit_autocast, (mode._cadence_autocasts.pop(),))
            return out

        cls.__enter__, cls.__exit__, cls._cadence_records = __enter__, __exit__, True


@contextlib.contextmanager
def one_fake_mode() -> Iterator[None]:
    """One ``FakeTensorMode`` for every ``meta["val"]`` make_fx records in this block.

    make_fx asks ``torch._guards.detect_fake_mode``, which prefers the fake mode of
    the active ``TracingContext``.  A context the caller already has is left alone,
    and a torch without this API, or whose make_fx does not ask
    (``make_fx_asks_the_context``), traces as before (a mode per value).
    """
    guards = getattr(torch, "_guards", None)
    context = getattr(guards, "TracingContext", None)
    if (context is None or not hasattr(guards, "tracing") or not hasattr(context, "try_get")
            or context.try_get() is not None or not make_fx_asks_the_context()):
        yield
        return
    from torch._subclasses.fake_tensor import FakeTensorMode
    with guards.tracing(context(FakeTensorMode(allow_fallback_kernels=True))):
        yield


def _ask_make_fx_asks_the_context() -> bool:
    guards = torch._guards
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(allow_fallback_kernels=True)
    with torch.no_grad(), guards.tracing(guards.TracingContext(mode)):
        gm = make_fx(lambda x: x + 1)(torch.zeros(1))
    return any(getattr(n.meta.get("val"), "fake_mode", None) is mode for n in gm.graph.nodes)


# Whether make_fx records its values in the active ``TracingContext``'s fake mode.  torch
# 2.5's does not: its ``extract_val`` builds a ``FakeTensorMode`` per value without
# ``torch._guards.detect_fake_mode`` (added by pytorch/pytorch#144168), so a context would
# change nothing there.  A probe that fails answers no (a mode per value: slower, the same graph).
make_fx_asks_the_context = _Probe("whether make_fx asks the tracing context for its fake mode",
                                  _ask_make_fx_asks_the_context, on_failure=False)


def trace_step(fn: Callable, signature: StepSignature, inputs: Mapping[str, torch.Tensor],
               state: Mapping[str, torch.Tensor],
               bound_buffers: Mapping[str, torch.Tensor] | None = None) -> fx.GraphModule:
    """Trace ``fn`` at the shapes of ``inputs``/``state`` (executes it once for real).

    ``bound_buffers`` maps region name -> the module buffer tensor bound to it in the
    module instance ``fn`` runs on; matching ``get_attr`` nodes get tagged.
    """
    missing = [n for n in signature.inputs if n not in inputs] + [n for n in signature.regions if n not in state]
    if missing:
        raise TraceError(f"trace: no example tensor for {missing}")
    ni = len(signature.inputs)

    def flat(*args):
        out, new = fn(dict(zip(signature.inputs, args[:ni])), dict(zip(signature.regions, args[ni:])))
        unknown = set(new) - set(signature.regions)
        if unknown:
            raise TraceError(f"step returned undeclared state {sorted(unknown)}; declare a Region for each")
        return tuple(out[k] for k in signature.outputs) + tuple(new[k] for k in signature.regions)

    args = [inputs[n] for n in signature.inputs] + [state[n] for n in signature.regions]
    try:
        with torch.no_grad(), TRACE_TURN:  # one trace at a time in a process (trace_memo.TRACE_TURN)
            with autocast_recorded(), one_fake_mode():
                gm = make_fx(flat, pre_dispatch=True)(*args)
    except TraceError:
        raise
    except Exception as e:  # pragma: no cover - message carries the upstream failure
        raise TraceError(f"make_fx(pre_dispatch=True) failed on the step at shapes "
                         f"{[tuple(a.shape) for a in args]}: {type(e).__name__}: {e}") from e

    names = [f"in_{n}" for n in signature.inputs] + [f"state_{n}" for n in signature.regions]
    roles = [(Role.INPUT, n) for n in signature.inputs] + [(Role.STATE, n) for n in signature.regions]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, name, (role, rname) in zip(placeholders, names, roles):
        node.name = node.target = name
        meta.tag(node, role, name=rname)

    bound = dict(bound_buffers or {})
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        value = getattr(gm, node.target)
        for region, buf in bound.items():
            if isinstance(value, torch.Tensor) and same_tensor(value, buf):
                meta.tag(node, Role.BUFFER, region=region)
    gm.meta[meta.SIGNATURE] = signature
    # small non-state inputs, kept so later passes can check themselves by running
    gm.meta[meta.EXAMPLE_INPUTS] = [inputs[n].clone() for n in signature.inputs]
    gm.meta[meta.DEVICE] = args[0].device if args else torch.device("cpu")
    gm.graph.lint()
    gm.recompile()
    return gm
