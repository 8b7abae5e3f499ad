"""A symbolic trace on a background build's thread (``programs.entry._trace``): it runs the
step's Python beside the stream's chunks, on the same modules, so it is made only once a
trace of this model rebound no module tensor (``ProgramStore.traced_clean``).  Before
that, ``NeedsForeground``, and nothing is refused: the foreground then traces
symbolically as ever."""

from __future__ import annotations

import pytest

from cadence_fx import foreground
from cadence_fx.compiler import compile_executable
from cadence_fx.errors import NeedsForeground
from cadence_fx.programs import ProgramStore

from helpers.toy_models import SymbolicToyAdapter, make_toy


def _hows(exe) -> list[str]:
    return [e["how"] for e in exe.notes["setup"].values()]


def test_a_build_traces_only_after_a_clean_trace_of_the_model_and_refuses_nothing_before():
    model, store = make_toy(4), ProgramStore()
    with foreground.background():
        with pytest.raises(NeedsForeground, match="rebound no module tensor"):
            compile_executable(SymbolicToyAdapter(model, 5), "S", programs=store)
    assert not store.traced_clean and len(store) == 0
    exe = compile_executable(SymbolicToyAdapter(model, 5), "S", programs=store)  # the foreground
    assert _hows(exe) == ["traced symbolic, specialized"] * len(exe.programs)  # not refused by the attempt
    assert store.traced_clean

    fresh = ProgramStore()
    fresh.traced_clean = True  # as after a clean trace here, or a disk entry loaded
    with foreground.background():  # on the worker: traced on fake tensors, the fence on
        exe = compile_executable(SymbolicToyAdapter(model, 7), "S", programs=fresh)
    assert _hows(exe) == ["traced symbolic, specialized"] * len(exe.programs) and len(fresh) == len(exe.programs)


def test_a_builds_symbolic_trace_lets_a_streams_capture_take_the_device_lock(monkeypatch):
    """A build holds ``device_work.LOCK`` (no capture beside its device work) but lets go of
    it while it traces symbolically (fake tensors: ``device_work.host_only``): a capture
    tried then gets the lock; around the trace the build holds it."""
    import threading

    from cadence_fx.passes import trace_symbolic as ts
    from cadence_fx.programs import entry
    from cadence_fx.runtime import device_work

    seen, real = [], entry.trace_symbolic

    def traced(*args, **kwargs):
        def capture():
            with device_work.try_held() as free:
                seen.append(free)
        other = threading.Thread(target=capture)
        other.start(), other.join(10)
        return real(*args, **kwargs)

    model = make_toy(4)
    compile_executable(SymbolicToyAdapter(model, 5), "S", programs=ProgramStore())  # its first uses, for real
    monkeypatch.setattr(entry, "trace_symbolic", traced)
    store = ProgramStore()
    store.traced_clean = True
    with device_work.LOCK, foreground.background():  # as runtime.pending.Build._run
        exe = compile_executable(SymbolicToyAdapter(model, 7), "S", programs=store)
        assert device_work.LOCK._is_owned()
    assert _hows(exe) == ["traced symbolic, specialized"] * len(exe.programs)
    assert seen == [True] * len(exe.programs)  # one capture let in during each entry's trace
    assert ts.trace_symbolic is real  # (the pass itself untouched)
