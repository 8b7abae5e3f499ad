"""Runtime: Arena, rebind_buffers, and the toy model end to end (stock vs Session).

The oracle is the stock step itself: with the generator set to the same state before
each stock and each optimized step, every output and every carried state tensor
must be ``torch.equal``, step by step, through warm-up, growth, trim and steady state.
"""

from __future__ import annotations

import math

import pytest
import torch

from cadence_fx.compiler import _compile, build_plan, buffer_bindings, compile_executable
from cadence_fx.errors import CadenceError, InputError, PassError, SessionClosed
from cadence_fx.plan import TensorSpec
from cadence_fx.runtime.arena import Arena, ArenaMoved
from cadence_fx.runtime.binding import rebind_buffers
from cadence_fx.runtime.gate import AdmissionGate
from cadence_fx.runtime.stock_session import StockStateSession

from helpers.toy_models import (BUFFER_FRAMES, BUFFER_PATH, CHANNELS, CONV_CARRY, DEFAULT_RETAIN, FRAMES, KV_SHAPE, ToyAdapter,
                        ToyStream, assert_lockstep_exact, assert_stream_exact, make_toy, toy_inputs, toy_prompt)

#: (prompt frames P, retain R): prefix 0, 2, 7; K = ceil(R / 3) + 1 = 2, 3, 3, 2, 4
CONFIGS = [(0, 3), (2, 4), (7, 6), (2, 1), (7, 7)]
N_STEPS = 12

_executables: dict = {}


def toy(prompt_frames: int, retain: int, write: str = "blocks", rules: str = "S"):
    """(model, adapter, executable), compiled once per configuration for the whole module.

    ``rules=""``: the traced graphs over stock-managed state (what rules R replay),
    run by a ``StockStateSession``.
    """
    key = (prompt_frames, retain, write, rules)
    if key not in _executables:
        model = make_toy(retain, write=write)
        adapter = ToyAdapter(model, prompt_frames)
        _executables[key] = (model, adapter, _compile(adapter, rules))
    return _executables[key]


class Lockstep:
    """The stock model and a Session fed the same inputs from the same generator state."""

    def __init__(self, prompt_frames: int, retain: int, write: str = "blocks", rules: str = "S", compiled=None):
        """``compiled``: an (adapter, executable) of this configuration; default: the module's shared one."""
        self.adapter, self.exe = compiled or toy(prompt_frames, retain, write, rules)[1:]
        # the stock step keeps its state in its own buffer: one stock model per stream
        self.model = make_toy(retain, write=write)
        self.prompt_frames = prompt_frames
        prompt = toy_prompt(prompt_frames)
        with torch.no_grad():
            self.stock_state = self.model.setup(prompt)
        self.session = self.adapter.open_session(self.exe, prompt)

    def step(self, inputs, **flags) -> tuple[dict, dict]:
        rng = torch.random.get_rng_state()
        with torch.no_grad():
            stock_out, self.stock_state = self.model.stream(inputs, self.stock_state, self.prompt_frames, **flags)
        torch.random.set_rng_state(rng)
        with torch.no_grad():
            opt_out = self.session.step(inputs, **flags)
        return stock_out, opt_out

    def assert_exact(self, stock_out, opt_out, where: str) -> None:
        assert_stream_exact(self.session.state(), self.stock_state, stock_out, opt_out, where)


# ------------------------------------------------------------------------ Arena
def test_arena_is_one_allocation_with_views_at_slot_offsets():
    _, adapter, exe = toy(7, 6)
    layout = exe.plan.layout
    arena = Arena(layout, "cpu")
    assert arena.nbytes == layout.total_bytes == exe.plan.arena_bytes
    base = arena.storage.data_ptr()
    for slot in layout.slots:
        t = arena.full(slot.name)
        assert t.untyped_storage().data_ptr() == base  # the same allocation
        assert t.data_ptr() == base + slot.offset
        assert tuple(t.shape) == slot.shape and t.is_contiguous()
        assert not t.any()  # zero-filled, like the stock buffers
    kv = layout.slot("kv")
    assert kv.shape == (*KV_SHAPE, 7 + 6 + FRAMES) and kv.capacity == 16
    assert arena.view("kv", 0).shape == (*KV_SHAPE, 0)
    narrowed = arena.view("kv", 10)
    assert narrowed.shape == (*KV_SHAPE, 10) and narrowed.data_ptr() == base + kv.offset
    assert narrowed.stride() == arena.full("kv").stride()  # capacity strides at every extent
    assert arena.view("conv", None) is arena.full("conv")


def test_arena_view_outside_capacity_raises():
    _, _, exe = toy(2, 4)
    arena = Arena(exe.plan.layout, "cpu")
    with pytest.raises(CadenceError, match=r"region 'kv': extent 10 is outside its capacity 9 along axis 2"):
        arena.view("kv", 10)
    with pytest.raises(CadenceError, match="extent -1 is outside"):
        arena.view("kv", -1)
    with pytest.raises(CadenceError, match=r"arena has no region 'nope'; regions: \['conv', 'kv'\]"):
        arena.full("nope")


def test_arena_moved_is_detected():
    _, _, exe = toy(2, 4)
    arena = Arena(exe.plan.layout, "cpu")
    arena.assert_stable()
    entry = exe.plan.catalog[0]
    gate = AdmissionGate(arena)
    x = {"x": torch.zeros(1, CHANNELS, FRAMES)}
    assert gate.check(entry, x, {"kv": 2, "conv": None}) is None
    arena.regions["kv"] = arena.full("kv").clone()  # something replaced arena memory
    with pytest.raises(ArenaMoved, match="region 'kv' moved"):
        arena.assert_stable()
    assert gate.check(entry, x, {"kv": 2, "conv": None}) == "region 'kv' moved"


def test_data_pointers_stable_over_a_stream():
    run = Lockstep(2, 4)
    ptrs = run.session.arena.data_ptrs()
    storage = run.session.arena.storage.data_ptr()
    for i, inputs in enumerate(toy_inputs(N_STEPS)):
        run.step(inputs)
        state = run.session.state()
        assert state["kv"].data_ptr() == ptrs["kv"] and state["conv"].data_ptr() == ptrs["conv"], f"step {i}"
        run.session.arena.assert_stable()
    assert run.session.arena.data_ptrs() == ptrs
    assert run.session.arena.storage.data_ptr() == storage


# --------------------------------------------------------------- rebind_buffers
def test_rebind_buffers_shares_parameters_and_replaces_the_buffer():
    model = make_toy()
    attn, stock_buffer = model.attn, model.attn.kv_buffer
    replacement = torch.zeros(*KV_SHAPE, 9)

    twin = rebind_buffers(model, {BUFFER_PATH: replacement})

    assert twin is not model and twin.attn is not model.attn  # modules on the path are copied
    assert twin.attn.kv_buffer is replacement
    assert model.attn is attn and model.attn.kv_buffer is stock_buffer  # the original is untouched
    assert stock_buffer.shape == (*KV_SHAPE, BUFFER_FRAMES)
    assert twin.conv is model.conv and twin.out is model.out  # off the path: shared modules
    stock_params = dict(model.named_parameters())
    twin_params = dict(twin.named_parameters())
    assert twin_params.keys() == stock_params.keys()
    assert all(twin_params[k] is stock_params[k] for k in stock_params)  # by identity: no weight copies

    with torch.no_grad():
        state = twin.setup(toy_prompt(5))  # writes through the twin's buffer only
    assert state["kv"].data_ptr() == replacement.data_ptr()
    assert replacement[:, :, :5].any() and not stock_buffer.any()


def test_rebind_buffers_names_what_is_missing():
    model = make_toy()
    with pytest.raises(CadenceError, match="ToyStream has no buffer 'attn.nope' to rebind"):
        rebind_buffers(model, {"attn.nope": torch.zeros(1)})
    with pytest.raises(CadenceError, match="no submodule 'decoder' in ToyStream"):
        rebind_buffers(model, {"decoder.kv_buffer": torch.zeros(1)})


# ------------------------------------------------------------ the toy, planned
def test_toy_declarations_class_and_instance():
    from cadence_fx import get_declaration
    assert get_declaration(ToyStream).region("kv").retention.retain == DEFAULT_RETAIN
    assert get_declaration(make_toy(DEFAULT_RETAIN)) is get_declaration(ToyStream)  # the class's
    seven = make_toy(7)
    assert get_declaration(seven).region("kv").retention.retain == 7  # the instance's own
    assert get_declaration(ToyStream).region("kv").retention.retain == DEFAULT_RETAIN  # class untouched


@pytest.mark.parametrize("prompt_frames, retain", CONFIGS)
def test_toy_plan(prompt_frames, retain):
    _, adapter, exe = toy(prompt_frames, retain)
    plan = exe.plan
    k = math.ceil(retain / FRAMES) + 1
    assert len(plan.catalog) == k == len(exe.programs)
    extents = [e.regions["kv"].shape[2] for e in plan.catalog]
    assert extents == [prompt_frames + min(FRAMES * i, retain) for i in range(k)]
    assert plan.layout.slot("kv").capacity == prompt_frames + retain + FRAMES
    assert plan.arena_bytes < adapter.stock_state_bytes()
    assert plan == build_plan(adapter)


# --------------------------------------------------------- the toy, end to end
@pytest.mark.parametrize("prompt_frames, retain", CONFIGS)
def test_toy_session_is_bit_exact(prompt_frames, retain):
    _assert_stream_through_every_phase(Lockstep(prompt_frames, retain), prompt_frames, retain)


@pytest.mark.parametrize("prompt_frames,retain", [(2, 4), (7, 6)])
def test_stock_state_session_is_bit_exact(prompt_frames, retain):
    """Rules R/Rc without the capture: the graphs over stock-managed state, state passed
    in and copied out every step (the model's own buffer is the graphs' scratch)."""
    run = Lockstep(prompt_frames, retain, rules="")
    assert isinstance(run.session, StockStateSession) and run.session.arena is None
    assert all(p.arena_inputs == () for p in run.exe.programs.values())
    _assert_stream_through_every_phase(run, prompt_frames, retain)
    # the session owns contiguous copies, never views of the model's buffer
    kv = run.session.state()["kv"]
    buf = run.adapter.model.attn.kv_buffer
    assert kv.is_contiguous() and kv.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr()
    assert run.session.state_bytes == sum(t.nbytes for t in run.session.state().values())


def test_stock_state_session_falls_back_exactly_and_counts():
    run = Lockstep(2, 6, rules="")
    short = toy_inputs(1, seed=7, frames=2)[0]
    for i, x in enumerate(toy_inputs(N_STEPS, seed=5)):
        flags = {"last": True} if i == 6 else {}
        stock_out, opt_out = run.step(short if i == 4 else x, **flags)
        run.assert_exact(stock_out, opt_out, f"step {i} {flags}")
    fallbacks = run.session.stats()["fallbacks"]
    assert fallbacks["flags last outside the catalog (eager)"] == 1
    assert fallbacks["input 'x' shape (1, 4, 2) != catalog (1, 4, 3)"] == 1


class WholeBufferConvToy(ToyStream):
    """Stock keeps its conv carry in a 4-frame buffer and returns all of it as the next
    state (reading back the 2 frames it needs), as upstream Token2Wav returns its whole
    16-slot conv-cache buffer: stock-managed state larger than its declaration."""

    def __init__(self, retain: int = DEFAULT_RETAIN):
        super().__init__(retain)
        self.register_buffer("conv_buffer", torch.zeros(1, CHANNELS, 2 * CONV_CARRY), persistent=False)

    def stream(self, inputs, state, prompt_frames, last=False):
        carry = {**state, "conv": state["conv"][:, :, :CONV_CARRY]}
        out, new = super().stream(inputs, carry, prompt_frames, last)
        self.conv_buffer[:, :, :CONV_CARRY] = new["conv"]
        return out, {**new, "conv": self.conv_buffer}


def test_stock_state_larger_than_declared_is_traced_at_the_stock_shape():
    def model():
        torch.manual_seed(0)
        return WholeBufferConvToy().eval()

    adapter = ToyAdapter(model(), 2)
    exe = _compile(adapter, "")
    assert {p.state_specs["conv"].shape for p in exe.programs.values()} == {(1, CHANNELS, 2 * CONV_CARRY)}
    assert {p.state_specs["kv"].shape for p in exe.programs.values()} == {(*KV_SHAPE, 2), (*KV_SHAPE, 5),
                                                                          (*KV_SHAPE, 6)}
    stock, prompt = model(), toy_prompt(2)
    with torch.no_grad():
        stock_state = stock.setup(prompt)
    session = adapter.open_session(exe, prompt)
    assert_lockstep_exact(stock, stock_state, session, toy_inputs(N_STEPS), 2)
    # setup hands over the 2-frame carry it makes: that one step runs eagerly, counted
    assert session.stats()["fallbacks"] == {"state 'conv' shape (1, 4, 2) != catalog (1, 4, 4)": 1}
    assert sum(session.stats()["graph_runs"].values()) == N_STEPS - 1


def _assert_stream_through_every_phase(run: "Lockstep", prompt_frames: int, retain: int) -> None:
    run.assert_exact({}, {}, "after setup")
    k = len(run.exe.plan.catalog)
    lengths = []
    for i, inputs in enumerate(toy_inputs(N_STEPS)):
        stock_out, opt_out = run.step(inputs)
        run.assert_exact(stock_out, opt_out, f"P={prompt_frames} R={retain} step {i}")
        lengths.append(run.stock_state["kv"].shape[2])
    # warm-up, growth, trim, steady: the stock cache really went through all of them
    assert lengths[-1] == prompt_frames + retain
    assert lengths[0] == min(prompt_frames + FRAMES, prompt_frames + retain)
    stats = run.session.stats()
    assert stats["steps"] == N_STEPS
    assert stats["fallback_total"] == 0
    assert stats["graph_runs"] == {**{str(e): 1 for e in range(k - 1)}, str(k - 1): N_STEPS - (k - 1)}


# Regression: writing the whole rebound buffer (L == capacity at the steady step)
# traces as copy_(buf, x) with no slice; reads through copy_'s result must keep the
# buffer's origin, or the hazard check refuses a sound graph.
def test_whole_buffer_write_at_capacity_is_exact():
    run = Lockstep(2, 4, write="slice")
    for i, x in enumerate(toy_inputs(N_STEPS)):
        run.assert_exact(*run.step(x), f"step {i}")


def test_flagged_step_runs_the_fallback_and_is_counted():
    run = Lockstep(2, 4)
    inputs = toy_inputs(N_STEPS, seed=5)
    for i, x in enumerate(inputs):
        flags = {"last": True} if i in (1, 6) else {}
        stock_out, opt_out = run.step(x, **flags)
        run.assert_exact(stock_out, opt_out, f"step {i} {flags}")
    stats = run.session.stats()
    assert stats["fallbacks"] == {"flags last outside the catalog (eager)": 2}
    assert stats["fallback_total"] == 2
    assert sum(stats["graph_runs"].values()) == N_STEPS - 2
    # the flag changes the result: a replay of the unflagged graph would have been wrong
    model = make_toy(4)
    with torch.no_grad():
        state = model.setup(toy_prompt(2))
        torch.manual_seed(0)
        plain = model.stream(inputs[1], state, 2)[0]["y"]
        state = model.setup(toy_prompt(2))
        torch.manual_seed(0)
        flagged = model.stream(inputs[1], state, 2, last=True)[0]["y"]
    assert not torch.equal(plain, flagged)


@pytest.mark.parametrize("when", ["warm-up", "steady"])
def test_input_outside_the_catalog_runs_eagerly(when):
    """A 2-frame or non-contiguous input is valid, just not catalogued: the gate sends it
    to the fallback, and the stream stays exact (no replay of the wrong graph)."""
    run = Lockstep(2, 6)
    inputs = toy_inputs(N_STEPS, seed=6)
    odd_step = 0 if when == "warm-up" else 5
    short = toy_inputs(1, seed=7, frames=2)[0]
    strided = {"x": torch.randn(1, FRAMES, CHANNELS, generator=torch.Generator().manual_seed(8)).transpose(1, 2)}
    for i, x in enumerate(inputs):
        if i == odd_step:
            x = short
        elif i == odd_step + 1 and when == "steady":
            x = strided
        runs_before = sum(run.session.stats()["graph_runs"].values())
        stock_out, opt_out = run.step(x)
        run.assert_exact(stock_out, opt_out, f"step {i}")
        if i == odd_step:
            assert sum(run.session.stats()["graph_runs"].values()) == runs_before  # not a replay
    fallbacks = run.session.stats()["fallbacks"]
    assert fallbacks["input 'x' shape (1, 4, 2) != catalog (1, 4, 3)"] == 1
    if when == "steady":
        assert fallbacks["input 'x' stride (12, 1, 4) != catalog (12, 3, 1)"] == 1
        assert run.session.stats()["fallback_total"] == 2
    else:
        # kv went 2 -> 4 (off the catalog's 2, 5, 8) -> 7 -> 10, trimmed to 8 (steady):
        # the two steps off the catalog ran eagerly, each counted
        assert fallbacks["state extents outside the catalog"] == 2
        assert run.session.stats()["fallback_total"] == 3
    assert run.session.extents["kv"] == 2 + 6
    assert sum(run.session.stats()["graph_runs"].values()) == N_STEPS - run.session.stats()["fallback_total"]


def _snapshot(session) -> tuple:
    return (session.arena.storage.clone(), dict(session.extents), session.stats())


@pytest.mark.parametrize("bad, message", [
    ({"x": torch.zeros(1, CHANNELS, FRAMES, dtype=torch.float64)}, r"input 'x' has dtype torch.float64; the model "
                                                                   r"takes float32"),
    ({"x": torch.zeros(1, CHANNELS, FRAMES, device="meta")}, r"input 'x' is on meta; this session runs on cpu"),
    ({"x": torch.zeros(CHANNELS, FRAMES)}, r"input 'x' has 2 dims \(4, 3\); the model takes 3 \(\(1, 4, 3\)\)"),
    ({"x": [[0.0] * FRAMES] * CHANNELS}, r"input 'x' must be a tensor, got list"),
    ({"y": torch.zeros(1, CHANNELS, FRAMES)}, r"missing input 'x'; the step takes \['x'\]"),
])
def test_malformed_input_is_rejected_and_state_is_unchanged(bad, message):
    run = Lockstep(7, 6)
    inputs = toy_inputs(4, seed=8)
    for x in inputs[:2]:
        run.step(x)
    arena, extents, stats = _snapshot(run.session)
    with pytest.raises(InputError, match=message):
        run.session.step(bad)
    after = _snapshot(run.session)
    assert torch.equal(after[0], arena) and after[1] == extents and after[2] == stats
    for i, x in enumerate(inputs[2:]):  # the stream goes on, exact
        stock_out, opt_out = run.step(x)
        run.assert_exact(stock_out, opt_out, f"step {i + 2} after a rejected input")


def test_closed_session_refuses_steps():
    run = Lockstep(0, 3)
    x = toy_inputs(1)[0]
    run.step(x)
    run.session.close()
    with pytest.raises(SessionClosed, match="this session is closed"):
        run.session.step(x)
    assert run.session.stats()["steps"] == 1


def test_sessions_of_one_executable_are_independent():
    _, adapter, exe = toy(2, 4)
    a, b = Lockstep(2, 4), Lockstep(2, 4)
    assert a.exe is b.exe and a.session.arena.storage.data_ptr() != b.session.arena.storage.data_ptr()
    xs = toy_inputs(6, seed=9)
    for x in xs[:3]:
        a.assert_exact(*a.step(x), "a")
    for x in xs:
        b.assert_exact(*b.step(x), "b")
    for x in xs[3:]:
        a.assert_exact(*a.step(x), "a after b")


def test_first_session_takes_the_arena_the_entries_were_traced_on_zeroed():
    model = make_toy(4)
    adapter = ToyAdapter(model, 2)
    exe = _compile(adapter, "S")
    traced_on = exe.spare_arena
    assert traced_on is not None and traced_on.storage.any(), "tracing ran the step for real on its arena"
    first = exe.take_arena("cpu")
    assert first is traced_on and exe.spare_arena is None and not first.storage.any()
    second = exe.take_arena("cpu")
    assert second is not first and second.storage.data_ptr() != first.storage.data_ptr()
    # a session on the trace's arena is exact (its dirty bytes were cleared)
    exe = _compile(adapter, "S")
    traced_on = exe.spare_arena
    lock = Lockstep(2, 4, compiled=(adapter, exe))
    assert lock.session.arena is traced_on
    for k, x in enumerate(toy_inputs(6, seed=3)):
        lock.assert_exact(*lock.step(x), f"step {k}")


def test_wrong_retention_declaration_fails_at_compile():
    """The model trims to R = 4 but the instance declares R = 7: caught while rewriting."""
    from cadence_fx import native_clock
    from helpers.toy_models import toy_declaration
    model = native_clock(**toy_declaration(7))(make_toy(4))
    with pytest.raises(PassError, match=r"next 'kv' has shape \(4, 8, 6\), but the catalog's next entry holds "
                                        r"\(4, 8, 8\); the declared retention does not match the model"):
        compile_executable(ToyAdapter(model, 2), "S")


def test_input_specs_match_the_catalog():
    _, adapter, exe = toy(2, 4)
    spec = TensorSpec.contiguous((1, CHANNELS, FRAMES), "float32", "cpu")
    assert all(e.inputs == {"x": spec} for e in exe.plan.catalog)
    assert exe.inputs == ("x",) and exe.outputs == ("y",) and exe.carried == ("kv", "conv")
    assert buffer_bindings(adapter.declaration, Arena(exe.plan.layout, "cpu")).keys() == {BUFFER_PATH}


def test_traced_extents_read_a_state_returned_as_a_constant_without_a_recorded_value():
    # torch 2.5.1's make_fx records no value on a constant's get_attr: a step returning its
    # next state straight from one is read through the constant, not refused as shapeless
    import torch.fx as fx
    from cadence_fx import step as meta
    from cadence_fx.compiler import traced_extents
    from helpers.toy_models import toy_entry_graph
    gm, _, plan = toy_entry_graph(ToyAdapter(make_toy(), 2), 1)
    sig = meta.signature(gm)
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    outs = list(output.args[0])
    where = len(sig.outputs) + sig.regions.index("kv")
    want = traced_extents(gm, plan)
    gm.register_buffer("_next_kv", torch.zeros(outs[where].meta["val"].shape))
    with gm.graph.inserting_before(output):
        const = gm.graph.get_attr("_next_kv")  # no meta["val"], as torch 2.5.1 records it
    outs[where] = const
    output.args = (tuple(outs),)
    assert "val" not in const.meta
    assert traced_extents(gm, plan) == want
