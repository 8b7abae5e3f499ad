"""Off-catalog chunks (other input shapes, flags, the steps after them) with their own
programs (``runtime.variants``): exact against stock at every step, counted by label,
bounded (LRU), refusals remembered and run eagerly, and the policy checked.

The toy (``helpers.toy_models``): 3 frames per step, retain 4, so a prompt of P frames
has catalog extents P, P + 3 and P + 4 (steady) for ``kv``; a 2-frame chunk at P leaves
P + 2, off the catalog, and the next step is keyed by that extent.
"""

from __future__ import annotations

import functools
import threading

import pytest
import torch

from cadence_fx.compiler import compile_executable
from cadence_fx.errors import CadenceError
from cadence_fx.programs import ProgramStore
from cadence_fx.runtime.variants import DEFAULT_MAX_BYTES, FIRST_SIGHT, VariantKey, Variants

from helpers.toy_models import CHANNELS, ToyAdapter, SymbolicToyAdapter, ToyLockstep, make_toy

RETAIN = 4


def _x(frames: int, seed: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(1, CHANNELS, frames, generator=torch.Generator().manual_seed(seed))}


#: a stock toy and a session in lockstep, every step compared (``helpers.toy_models.ToyLockstep``)
Stream = functools.partial(ToyLockstep, retain=RETAIN)


#: (frames, last) per step: a short first chunk (the state is off the catalog after it), steady,
#: a short chunk at steady, a flush of 3 and a flush of 1
TRAFFIC = [(2, False), (3, False), (3, False), (3, False), (3, False), (1, False), (3, False), (3, True),
           (3, False), (1, True)]


def _compile(adapter, **kw):
    return compile_executable(adapter, "S", **kw)


def _toy_executable(symbolic: bool, policy: str):
    """The toy at prompt length 5 (traced concretely, or symbolically into a store of its
    own) compiled under rule S with off-catalog ``policy``: (adapter, executable)."""
    adapter = (SymbolicToyAdapter if symbolic else ToyAdapter)(make_toy(RETAIN), 5)
    return adapter, compile_executable(adapter, "S", programs=ProgramStore() if symbolic else None, off_catalog=policy)


@pytest.mark.parametrize("symbolic", [False, True], ids=["concrete", "symbolic"])
def test_off_catalog_chunks_run_their_own_programs_exactly(symbolic):
    adapter, exe = _toy_executable(symbolic, "specialize")
    for rounds in range(2):  # the second stream finds every specialization built
        s = Stream(adapter, exe, 5)
        for i, (frames, last) in enumerate(TRAFFIC):
            s.step(_x(frames, 100 * rounds + i), f"round {rounds} step {i} ({frames} frames, last={last})",
                   **({"last": True} if last else {}))
        assert s.session.stats()["fallbacks"] == {}, s.session.stats()["fallbacks"]
        assert all(r.startswith("graph") for r in s.routes), s.routes
    spec = s.session.stats()["specializations"]
    labels = list(spec["held"])
    # 2 frames at entry 0 -> kv at P + 2 (off the catalog): the next chunk is keyed by that extent
    assert "entry 0 | x (1, 4, 2)" in labels
    assert any(label.startswith("off-catalog kv=7") for label in labels), labels
    assert "entry 2 | x (1, 4, 1)" in labels and "entry 2 | x (1, 4, 3) | last" in labels
    assert spec["built"] == len(labels) and spec["evicted"] == 0 and spec["refused"] == {}
    hows = {v["how"] for label, v in spec["held"].items() if label.startswith("entry")}
    assert hows == ({"traced symbolic, specialized"} if symbolic else {"traced"})
    # the routes name the specialization they ran
    assert "graph specialization entry 2 | x (1, 4, 3) | last" in s.routes


def test_a_second_prompt_length_specializes_the_off_catalog_chunks_symbolic_steps():
    model, store = make_toy(RETAIN), ProgramStore()
    for p, how in ((5, "traced symbolic, specialized"), (8, "specialized")):
        adapter = SymbolicToyAdapter(model, p)
        exe = compile_executable(adapter, "S", programs=store, off_catalog="specialize")
        s = Stream(adapter, exe, p)
        for i in range(4):
            s.step(_x(3, i), f"P={p} step {i}")
        s.step(_x(2, 9), f"P={p} flush", last=True)
        held = s.session.stats()["specializations"]["held"]
        assert held["entry 2 | x (1, 4, 2) | last"]["how"] == how


def test_the_eager_policy_is_the_default_and_builds_nothing():
    adapter = ToyAdapter(make_toy(RETAIN), 5)
    exe = _compile(adapter)
    s = Stream(adapter, exe, 5)
    for i, (frames, last) in enumerate(TRAFFIC):
        s.step(_x(frames, i), f"step {i}", **({"last": True} if last else {}))
    stats = s.session.stats()
    assert stats["specializations"]["policy"] == "eager" and stats["specializations"]["built"] == 0
    assert stats["fallbacks"]["flags last outside the catalog (eager)"] == 2
    assert stats["fallbacks"]["state extents outside the catalog"] == 1
    assert sum(stats["fallbacks"].values()) == 5  # the two short chunks too


def test_a_chunk_past_the_arena_is_refused_once_and_runs_eagerly():
    """5 frames at steady grow kv to P + 4 + 5, past the slot's P + 4 + 3: no program can
    hold it.  The refusal is kept (not built again) and the chunk runs the eager path."""
    adapter = ToyAdapter(make_toy(RETAIN), 5)
    exe = _compile(adapter, off_catalog="specialize")
    s = Stream(adapter, exe, 5)
    for i in range(3):
        s.step(_x(3, i), f"step {i}")
    for i in range(2):
        s.step(_x(5, 10 + i), f"long chunk {i}")
        s.step(_x(3, 20 + i), f"after long chunk {i}")
    stats = s.session.stats()
    refused = stats["specializations"]["refused"]
    assert list(refused) == ["entry 2 | x (1, 4, 5)"], refused
    assert stats["specializations"]["built"] == 0
    (reason,) = [r for r in stats["fallbacks"] if "not specialized" in r]
    assert stats["fallbacks"][reason] == 2 and reason.startswith("input 'x' shape (1, 4, 5) != catalog (1, 4, 3)")


def test_specializations_are_least_recently_used_out_past_the_bound():
    adapter = ToyAdapter(make_toy(RETAIN), 5)
    exe = _compile(adapter, off_catalog="specialize", max_specializations=1)
    s = Stream(adapter, exe, 5)
    for i in range(3):
        s.step(_x(3, i), f"step {i}")
    for i, frames in enumerate((1, 2, 1)):  # 1 frame, then 2 (evicts 1), then 1 again (rebuilt)
        s.step(_x(frames, 30 + i), f"short chunk {i} ({frames} frames)")
    spec = s.session.stats()["specializations"]
    assert spec["built"] == 3 and spec["evicted"] == 2 and list(spec["held"]) == ["entry 2 | x (1, 4, 1)"]
    assert s.session.stats()["fallbacks"] == {}


def test_a_program_over_the_byte_bound_is_refused_once():
    """The toy's program folds a host-built table: over a 1-byte bound it is never held,
    and the refusal is kept (the next chunk of that shape is not built again)."""
    adapter = ToyAdapter(make_toy(RETAIN), 5)
    exe = _compile(adapter, off_catalog="specialize", max_specialization_bytes=1)
    s = Stream(adapter, exe, 5)
    for i in range(3):
        s.step(_x(3, i), f"step {i}")
    for i in range(2):
        s.step(_x(2, 40 + i), f"short chunk {i}")
    spec = s.session.stats()["specializations"]
    assert spec["built"] == 1 and spec["held"] == {}
    assert "over max_bytes=1" in spec["refused"]["entry 2 | x (1, 4, 2)"]
    assert sum(n for r, n in s.session.stats()["fallbacks"].items() if "over max_bytes=1" in r) == 2


def test_a_flag_value_that_cannot_key_a_program_runs_eagerly_with_the_reason():
    adapter = ToyAdapter(make_toy(RETAIN), 5)
    exe = _compile(adapter, off_catalog="specialize")
    s = Stream(adapter, exe, 5)
    s.step(_x(3, 0), "plain")
    s.step(_x(3, 1), "flag as a list", last=[1])
    (reason,) = s.session.stats()["fallbacks"]
    assert "flag last=[1] (list) cannot key a program" in reason


@pytest.mark.parametrize("kw, message", [
    ({"off_catalog": "fast"}, r"off_catalog='fast': use one of \['specialize', 'repeat', 'eager'\]"),
    ({"max_specializations": -1}, r"max_specializations=-1 must be an int >= 0"),
    ({"max_specialization_bytes": 1.5}, r"max_specialization_bytes=1.5 must be an int >= 0"),
])
def test_bad_policies_are_clear_errors(kw, message):
    with pytest.raises(CadenceError, match=message):
        _compile(ToyAdapter(make_toy(RETAIN), 5), **kw)


def test_chunk_lengths_are_symbolic_and_a_guard_sends_another_branch_to_its_own_trace():
    """``symbolic_inputs()`` (the toy: ``x``'s frames): a 2-frame flush is traced once with
    the prompt length and the chunk length symbolic, and specialized for another prompt
    length.  A 3-frame flush fills the arena slot exactly (a branch of the model's code:
    the trace's guard ``chunk_frames != 3``), so it is traced as its own variant; a 1-frame
    flush is keyed on its own (the tracer specializes sizes 0 and 1)."""
    model, store = make_toy(RETAIN), ProgramStore()
    for p, hows in ((5, ("traced symbolic, specialized",) * 3), (8, ("specialized",) * 3)):
        adapter = SymbolicToyAdapter(model, p)
        exe = compile_executable(adapter, "S", programs=store, off_catalog="specialize")
        s = Stream(adapter, exe, p)
        for i in range(3):
            s.step(_x(3, i), f"P={p} step {i}")
        for i, frames in enumerate((2, 3, 1)):
            s.step(_x(frames, 50 + i), f"P={p} flush of {frames}", last=True)
            s.step(_x(3, 60 + i), f"P={p} after flush {i}")
        held = s.session.stats()["specializations"]["held"]
        assert tuple(held[f"entry 2 | x (1, 4, {n}) | last"]["how"] for n in (2, 3, 1)) == hows
        assert s.session.stats()["fallbacks"] == {}
    flush_keys = sorted((k[2][0][1] + k[-1] for k, _ in store.items() if k[-2][0] == "flags"), key=repr)
    # lengths >= 2: one key, variants 0 (traced at 2) and 1 (at 3); length 1: its own key
    assert flush_keys == [(1, 4, ("chunk_frames", 1, 0), "variant", 0),
                          (1, 4, ("chunk_frames", 1, 0), "variant", 1), (1, 4, 1, "variant", 0)], flush_keys


# ----------------------------------------------------------- Variants on its own
def _key(n: int) -> VariantKey:
    return VariantKey(2, (("kv", 9),), (("x", (1, 4, n), "float32", (4 * n, n, 1)),), ())


def test_one_build_at_a_time_and_a_second_session_runs_eagerly_meanwhile():
    """While one session builds a key, another that needs it runs that chunk eagerly
    (it never waits); once built, both get the program."""
    started, release = threading.Event(), threading.Event()

    def build(key, inputs):
        started.set()
        release.wait(10)
        return f"program {key.label()}", 10, "traced"

    v = Variants(build, "specialize")
    first = {}
    t = threading.Thread(target=lambda: first.setdefault("got", v.get(_key(2), {})))
    t.start()
    assert started.wait(10)
    assert v.get(_key(2), {}) == (None, "another session is building a specialization")
    release.set()
    t.join(10)
    assert first["got"] == ("program entry 2 | x (1, 4, 2)", None)
    assert v.get(_key(2), {}) == ("program entry 2 | x (1, 4, 2)", None)
    assert v.stats()["built"] == 1


def test_in_the_background_a_build_runs_on_the_worker_and_a_later_chunk_takes_it():
    """``background`` set: a new key's chunk runs eagerly (``BUILDING``) while the worker
    builds it on its own copy of the inputs; a later chunk of that key takes the program.
    A build that needs the foreground (a trace) is never made on a chunk while ``background``
    is set (that key runs eagerly, with its reason), and is built on the calling thread at
    its next chunk once ``background`` is unset; any other failure is kept as the reason."""
    import concurrent.futures

    from cadence_fx.errors import NeedsForeground
    from cadence_fx.runtime.pending import Build
    from cadence_fx.runtime.variants import BUILDING, NEEDS_FOREGROUND

    threads, seen, release = [], [], threading.Event()

    def build(key, inputs):
        threads.append(threading.current_thread().name)
        seen.append(inputs["x"].clone())
        if key == _key(2):
            assert release.wait(10), "the test never let the first build finish"
        if key == _key(3) and threading.current_thread().name.startswith("worker"):
            raise NeedsForeground("a symbolic trace runs the step for real")
        if key == _key(4):
            raise RuntimeError("no kernel for this shape")
        return f"program {key.label()}", 10, "specialized"

    worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="worker")
    v = Variants(build, "specialize")
    v.background = lambda label, run: Build(label, run, worker)
    x = torch.zeros(3)
    assert v.get(_key(2), {"x": x}) == (None, BUILDING)
    x.fill_(7.0)  # the caller reuses its tensor: the build has its own copy
    assert v.get(_key(2), {"x": x}) == (None, BUILDING)  # still building: not submitted again
    assert len(v.pending()) == 1
    release.set()
    assert all(h.wait(10) for h in v.pending())
    assert v.get(_key(2), {"x": x}) == ("program entry 2 | x (1, 4, 2)", None)
    assert torch.equal(seen[0], torch.zeros(3)) and threads == ["worker_0"]
    assert v.stats()["held"][_key(2).label()]["how"] == "specialized, in the background"

    assert v.get(_key(3), {"x": x}) == (None, BUILDING)
    assert all(h.wait(10) for h in v.pending())
    builds = len(threads)
    assert v.get(_key(3), {"x": x}) == (None, NEEDS_FOREGROUND)  # no chunk waits for a trace
    assert v.get(_key(3), {"x": x}) == (None, NEEDS_FOREGROUND) and len(threads) == builds  # not tried again
    assert _key(3).label() in v.stats()["foreground_only"] and not v.pending()
    background, v.background = v.background, None  # background off: the next chunk builds it, here
    assert v.get(_key(3), {"x": x}) == ("program entry 2 | x (1, 4, 3)", None)
    assert threads[-1] == threading.current_thread().name
    v.background = background

    assert v.get(_key(4), {"x": x}) == (None, BUILDING)
    assert all(h.wait(10) for h in v.pending())
    assert v.get(_key(4), {"x": x}) == (None, "RuntimeError: no kernel for this shape")
    assert v.get(_key(4), {"x": x}) == (None, "RuntimeError: no kernel for this shape")  # not built again
    worker.shutdown()


def test_the_repeat_policy_builds_a_shape_the_second_time_it_comes_and_remembers_a_bounded_few(monkeypatch):
    """``"repeat"``: a key's first chunk runs eagerly (``FIRST_SIGHT``, counted) and nothing
    is built; its second builds (on the calling thread, or on the worker in the background);
    a key never seen twice is never built.  Only the last ``SEEN_MAX`` keys are remembered."""
    import concurrent.futures

    from cadence_fx.runtime import variants as variants_module
    from cadence_fx.runtime.pending import Build
    from cadence_fx.runtime.variants import BUILDING
    built = []

    def build(key, inputs):
        built.append(key)
        return f"program {key.label()}", 10, "specialized"

    v = Variants(build, "repeat")
    assert v.get(_key(2), {}) == (None, FIRST_SIGHT) and built == []
    assert v.get(_key(3), {}) == (None, FIRST_SIGHT) and built == []
    assert v.get(_key(2), {}) == ("program entry 2 | x (1, 4, 2)", None) and built == [_key(2)]
    assert v.get(_key(2), {}) == ("program entry 2 | x (1, 4, 2)", None) and built == [_key(2)]
    stats = v.stats()
    assert stats["first_sights"] == 2 and stats["built"] == 1 and list(stats["held"]) == [_key(2).label()]

    worker = concurrent.futures.ThreadPoolExecutor(1)
    v.background = lambda label, run: Build(label, run, worker)
    assert v.get(_key(4), {"x": torch.zeros(1)}) == (None, FIRST_SIGHT) and not v.pending()
    assert v.get(_key(4), {"x": torch.zeros(1)}) == (None, BUILDING)  # the second: to the worker
    assert all(h.wait(10) for h in v.pending())
    assert v.get(_key(4), {"x": torch.zeros(1)}) == ("program entry 2 | x (1, 4, 4)", None)
    worker.shutdown()

    monkeypatch.setattr(variants_module, "SEEN_MAX", 2)
    v = Variants(build, "repeat")
    for n in (5, 6, 7):  # 5 is forgotten once 7 is seen
        assert v.get(_key(n), {}) == (None, FIRST_SIGHT)
    assert v.get(_key(5), {}) == (None, FIRST_SIGHT)
    assert v.get(_key(7), {}) == ("program entry 2 | x (1, 4, 7)", None)


@pytest.mark.parametrize("symbolic", [False, True], ids=["concrete", "symbolic"])
def test_under_the_repeat_policy_a_stream_is_exact_and_runs_a_shape_the_third_time(symbolic):
    adapter, exe = _toy_executable(symbolic, "repeat")
    for rounds in range(3):
        s = Stream(adapter, exe, 5)  # compared with stock at every step
        for i, (frames, last) in enumerate(TRAFFIC):
            s.step(_x(frames, 100 * rounds + i), f"round {rounds} step {i} ({frames} frames, last={last})",
                   **({"last": True} if last else {}))
        off = [r for r in s.routes if not r.startswith("graph entry")]
        if rounds == 0:  # every off-catalog shape is seen for the first time
            assert off and all(FIRST_SIGHT in r for r in off), off
        if rounds == 2:  # built at the second round: run by their programs at the third
            assert off and all(r.startswith("graph specialization") for r in off), off
    spec = s.session.stats()["specializations"]
    assert spec["policy"] == "repeat" and spec["built"] == len(spec["held"]) > 0 and spec["refused"] == {}


@pytest.mark.parametrize("how", ["raised", "wrapped", "for now"])
def test_a_build_out_of_memory_is_kept_for_a_while_then_built_again(how, monkeypatch):
    """Out of memory (raised by the build, in its chain, or a ``RefusedForNow`` the capacity
    executable answers with) keeps the key's chunks eager for ``OOM_RETRY_S``, then the key is
    built again; any other failure is kept for good (above)."""
    from cadence_fx.runtime import variants as variants_module
    from cadence_fx.runtime.variants import OOM_RETRY_S, RefusedForNow
    now, calls = [50.0], []
    monkeypatch.setattr(variants_module.time, "monotonic", lambda: now[0])

    def build(key, inputs):
        calls.append(now[0])
        if len(calls) == 1:
            oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            if how == "raised":
                raise oom
            if how == "for now":
                raise RefusedForNow("no capacity graph: out of memory")
            try:
                raise oom
            except torch.OutOfMemoryError as e:
                raise RuntimeError("a pass failed") from e
        return "p", 100, "specialized"

    v = Variants(build, "specialize")
    program, why = v.get(_key(1), {})
    assert program is None and why and v.stats()["refused"] == {_key(1).label(): why}
    now[0] += OOM_RETRY_S - 0.5
    assert v.get(_key(1), {}) == (None, why) and calls == [50.0]  # kept: not built again yet
    now[0] += 0.5
    assert v.get(_key(1), {})[0] == "p" and calls == [50.0, 50.0 + OOM_RETRY_S] and v.stats()["refused"] == {}


def test_a_failed_build_is_kept_as_the_reason_and_configure_bounds_evict():
    calls = []

    def build(key, inputs):
        calls.append(key)
        if key == _key(1):
            raise RuntimeError("no kernel for this shape")
        return "p", 100, "specialized"

    v = Variants(build, "specialize", max_entries=3)
    assert v.get(_key(1), {}) == (None, "RuntimeError: no kernel for this shape")
    assert v.get(_key(1), {}) == (None, "RuntimeError: no kernel for this shape") and len(calls) == 1
    for n in (2, 3, 4):
        assert v.get(_key(n), {})[0] == "p"
    assert list(v.stats()["held"]) == [_key(n).label() for n in (2, 3, 4)]
    v.get(_key(2), {})  # most recently used now
    v.configure("specialize", 3, 250)  # two programs fit in 250 bytes: the least recently used goes
    assert list(v.stats()["held"]) == [_key(4).label(), _key(2).label()] and v.evicted == 1
    v.configure("eager", 3, 250)
    assert v.get(_key(2), {}) == (None, "off-catalog chunks run eagerly (policy 'eager')")  # held, not used
    assert "policy 'eager'" in v.describe()[0] and "2/3 specializations held" in v.describe()[0]


def test_set_off_catalog_switches_a_compiled_model(tmp_path):
    """``DropIn.set_off_catalog``: a model compiled under the default 'eager' policy
    specializes from then on, and back; every step exact (``cadence_fx.verify``)."""
    import cadence_fx
    from helpers.generic_models import CausalDecoder
    torch.manual_seed(0)
    model = CausalDecoder().eval()
    opt = cadence_fx.optimize(model, check_chunks=0, cache=False)
    g = torch.Generator().manual_seed(3)
    inputs = [torch.randn(1, 16, f, generator=g) for f in (4, 4, 4, 2, 4, 2)]
    eager = cadence_fx.verify(model, inputs, optimized=opt)
    assert eager["exact"] and sum(r["route"].startswith("fallback") for r in eager["per_chunk"]) >= 2
    opt.set_off_catalog("specialize", max_specializations=4)
    special = cadence_fx.verify(model, inputs, optimized=opt)
    assert special["exact"] and all(r["route"].startswith("graph") for r in special["per_chunk"])
    assert opt.off_catalog == ("specialize", 4, DEFAULT_MAX_BYTES)
    with pytest.raises(CadenceError, match="off_catalog='later'"):
        opt.set_off_catalog("later")
    assert opt.off_catalog[0] == "specialize"  # a bad call changes nothing


def _fake_capture(monkeypatch, fail_frames: int | None = None) -> tuple[object, list[int], list[bool]]:
    """Rules SRc on the CPU: ``capture_entry`` faked as tests/serving/test_multi_session.py
    fakes it (it scribbles on the arena and draws from the generator; it raises for
    chunks of ``fail_frames`` frames).  Returns the compiled toy executable, the list
    each capture appends its chunk's frame count to, and the list of its ``warm_up`` flags."""
    from cadence_fx import compiler
    from cadence_fx.runtime import graphs

    monkeypatch.setattr(compiler, "check_rules", lambda rules, device: rules)  # lower for replay on the CPU
    calls: list[int] = []
    warm: list[bool] = []

    def capture_entry(parent, args, pool, arena_ptr, stream, warm_up=True):
        calls.append(args[0].shape[2])
        warm.append(warm_up)
        for a in args:
            if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == arena_ptr:
                a.fill_(3.0)  # the warm-up run writes into the arena
        torch.rand(5)  # and draws
        if calls[-1] == fail_frames:
            raise RuntimeError(f"capture of a {fail_frames}-frame chunk failed")
        return {}

    monkeypatch.setattr(graphs, "capture_entry", capture_entry)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    return compiler.compile_executable(ToyAdapter(make_toy(RETAIN), 5), "SRc", off_catalog="specialize"), calls, warm


def test_a_mid_stream_capture_leaves_the_state_and_the_generators_as_they_were(monkeypatch):
    """Each session captures an off-catalog program the first time it runs it,
    mid-stream (``_fake_capture``); its live state is written back and the generators
    are forked, so every step stays exact."""
    exe, calls, warm = _fake_capture(monkeypatch)
    adapter = ToyAdapter(make_toy(RETAIN), 5)
    for session_no in range(2):
        before = len(calls)
        s = Stream(adapter, exe, 5)
        for i, (frames, last) in enumerate(TRAFFIC):
            s.step(_x(frames, 200 + i), f"session {session_no} step {i}", **({"last": True} if last else {}))
        # the 3 catalog entries at opening, then each off-catalog key once, in stream order
        assert calls[before:] == [3] * 3 + [2, 3, 1, 3, 1], calls[before:]
        # each session's first capture warms up, the rest (mid-stream ones too) do not: one rule
        # for both capture paths (``Session._must_warm_up``; on the CPU no stream to ask)
        assert warm[before:] == [True] + [False] * 7, warm[before:]
        assert set(s.session.stats()["specializations"]["captured_here_s"]) == {
            "entry 0 | x (1, 4, 2)", "off-catalog kv=7 | x (1, 4, 3)", "entry 2 | x (1, 4, 1)",
            "entry 2 | x (1, 4, 3) | last", "entry 2 | x (1, 4, 1) | last"}


def test_a_failed_mid_stream_capture_runs_that_key_eagerly_and_is_not_tried_again(monkeypatch):
    """A mid-stream capture that raises (not out of memory; ``_fake_capture`` fails every
    1-frame chunk) sends that chunk, and that key's later chunks in the session, to the
    eager path with the reason; it is not tried again, and every step stays exact."""
    exe, calls, _ = _fake_capture(monkeypatch, fail_frames=1)
    adapter = ToyAdapter(make_toy(RETAIN), 5)
    for session_no in range(2):
        before = len(calls)
        s = Stream(adapter, exe, 5)
        for i, (frames, last) in enumerate(TRAFFIC + [(1, False), (3, False)]):
            s.step(_x(frames, 200 + i), f"session {session_no} step {i}", **({"last": True} if last else {}))
        captured = calls[before:]
        # the 3 catalog entries at opening, then each off-catalog key once, in stream order (the
        # two 1-frame keys fail; the second 1-frame chunk that is not last is not captured again)
        assert captured == [3] * 3 + [2, 3, 1, 3, 1], captured
        for label in ("entry 2 | x (1, 4, 1)", "entry 2 | x (1, 4, 1) | last"):
            assert s.session.capture_failures[label] == {
                "*": "capture failed: RuntimeError: capture of a 1-frame chunk failed"}
        eager = {r.split(" (not specialized")[0]: n for r, n in s.session.stats()["fallbacks"].items()
                 if "capture failed" in r}
        assert eager == {"input 'x' shape (1, 4, 1) != catalog (1, 4, 3)": 2,
                         "flags last outside the catalog (eager)": 1}, eager
        assert set(s.session.stats()["specializations"]["captured_here_s"]) == {
            "entry 0 | x (1, 4, 2)", "off-catalog kv=7 | x (1, 4, 3)", "entry 2 | x (1, 4, 3) | last"}


def test_build_ahead_holds_what_a_chunk_would_build_and_keeps_only_a_chunks_reasons():
    """``Variants.build_ahead`` (idle time's builds): under ``"specialize"`` only; the program
    held as a chunk's build would be (the chunk's ``get`` then builds nothing); a build that
    fails is refused as on a chunk, but another build running, or one needing the foreground,
    leaves nothing kept (a later idle, or the chunk, builds it)."""
    from cadence_fx.errors import NeedsForeground
    calls = []

    def build(key, inputs):
        calls.append(key.entry)
        if key.entry == 1:
            raise ValueError("no program (the test's)")
        if key.entry == 2:
            raise NeedsForeground("the test's")
        return object(), 8, "built"
    x = _x(3, 0)
    keys = [VariantKey(i, (), (("x", (1, CHANNELS, 3), "float32", (3 * CHANNELS, 3, 1)),), ()) for i in range(3)]
    for policy in ("eager", "repeat"):
        assert Variants(build, policy=policy).build_ahead(keys[0], x) is None and calls == []
    v = Variants(build, policy="specialize")
    assert v.build_ahead(keys[0], x) is not None and calls == [0] and v.settled(keys[0])
    assert v.stats()["held"][keys[0].label()]["how"] == "built, ahead in idle time"
    program, why = v.get(keys[0], x)
    assert why is None and program is not None and calls == [0]  # the chunk takes it: no build
    assert v.build_ahead(keys[0], x) is None and calls == [0]  # held: nothing to do
    assert v.build_ahead(keys[1], x) is None and v.settled(keys[1]) and "the test's" in v.get(keys[1], x)[1]
    assert v.build_ahead(keys[2], x) is None and not v.settled(keys[2])  # the foreground's, never kept
    with v._building:  # another build running
        assert v.build_ahead(keys[2], x) is None and calls == [0, 1, 2]
