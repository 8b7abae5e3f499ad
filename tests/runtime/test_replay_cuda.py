"""Rules SRc and SR on a GPU: the toy model replayed from CUDA graphs, bit for bit
against stock eager (skipped cleanly without CUDA).

The oracle is the stock step, as in ``tests/runtime/test_runtime.py``: before each stock and
each optimized step the CPU and CUDA generators are set to the same state, and every
output and every carried state tensor must be ``torch.equal``.  The toy's step draws
``torch.rand`` on the device, so this also checks that a replayed draw is eager's draw
and that a replay advances the generator exactly as eager does.  The deterministic
protocol (``cadence_fx.lockstep.deterministic_protocol``) is on for the whole module.

SRc captures one graph per catalog entry; SR (``ScopedToyAdapter``: the attention
call in ``scope("attn")``) captures three, before, inside and after the attention.
R and Rc cut the same way over stock-managed state (``StockStateSession``: the
state is copied into the graphs' static inputs and out of their outputs).
"""

from __future__ import annotations

import pytest
import torch

from cadence_fx.compiler import compile_executable
from cadence_fx.runtime.graphs import CapturedRegion, region_stats

from helpers.marks import deterministic_protocol_restored
from helpers.toy_models import CHANNELS, FRAMES, ScopedToyAdapter, ToyAdapter, assert_stream_exact, make_toy, toy_inputs, \
    toy_prompt

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="rules SR/SRc replay CUDA graphs: no CUDA")]

DEVICE = torch.device("cuda", 0)
PROMPT, RETAIN = 2, 4  # catalog: kv extents 2, 5, 6 (entries 0, 1, 2 = "k+")
N_STEPS = 12
GRAPHS_PER_ENTRY = {"SRc": 1, "SR": 3, "Rc": 1, "R": 3}
ALL_RULES = ["SRc", "SR", "Rc", "R"]

_executables: dict = {}


@pytest.fixture(scope="module", autouse=True)
def deterministic():
    """The protocol stock eager needs to be bit-reproducible on a GPU; restored after."""
    with deterministic_protocol_restored():
        yield


def toy(rules: str):
    """(adapter, executable) for the toy on DEVICE, compiled once per rules for the module."""
    if rules not in _executables:
        model = make_toy(RETAIN).to(DEVICE)
        adapter = (ScopedToyAdapter if rules in ("SR", "R") else ToyAdapter)(model, PROMPT)
        _executables[rules] = (adapter, compile_executable(adapter, rules))
    return _executables[rules]


def on_device(inputs: dict) -> dict:
    return {k: v.to(DEVICE) for k, v in inputs.items()}


def rng_state() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.random.get_rng_state(), torch.cuda.get_rng_state(DEVICE)


def set_rng_state(state) -> None:
    torch.random.set_rng_state(state[0])
    torch.cuda.set_rng_state(state[1], DEVICE)


class CudaLockstep:
    """A stock toy and a replaying Session, fed the same inputs from the same generator state."""

    def __init__(self, rules: str):
        self.adapter, self.exe = toy(rules)
        self.model = make_toy(RETAIN).to(DEVICE)  # the stock step keeps its state in its own buffer
        prompt = toy_prompt(PROMPT).to(DEVICE)
        before = rng_state()
        with torch.no_grad():
            self.stock_state = self.model.setup(prompt)
            self.session = self.adapter.open_session(self.exe, prompt)  # prepare_replay: capture, zero the arena
        after = rng_state()
        assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1]), "capture moved a generator"

    def step(self, inputs: dict, **flags) -> tuple[dict, dict]:
        state = rng_state()
        with torch.no_grad():
            stock_out, self.stock_state = self.model.stream(inputs, self.stock_state, PROMPT, **flags)
        stock_rng = rng_state()
        set_rng_state(state)
        with torch.no_grad():
            opt_out = self.session.step(inputs, **flags)
        opt_rng = rng_state()
        # a replay advances the Philox offset by what its kernels draw, as eager does
        assert torch.equal(stock_rng[1], opt_rng[1]), "the CUDA generator advanced differently"
        assert torch.equal(stock_rng[0], opt_rng[0])
        return stock_out, opt_out

    def assert_exact(self, stock_out, opt_out, where: str) -> None:
        assert_stream_exact(self.session.state(), self.stock_state, stock_out, opt_out, where)

    def regions(self) -> dict[int, list[CapturedRegion]]:
        """Per entry, this session's regions (``prepare_replay`` made them from the executable's)."""
        return {i: [m for m in p.run.children() if isinstance(m, CapturedRegion)]
                for i, p in sorted(self.session._programs.items())}


@pytest.mark.parametrize("rules", ALL_RULES)
def test_replay_is_bit_exact_and_counted(rules):
    run = CudaLockstep(rules)
    k = len(run.exe.plan.catalog)
    assert k == 3 and all(p.kind == "cudagraph" for p in run.exe.programs.values())
    assert run.session.capture_failures == {i: {} for i in range(k)}
    regions = run.regions()
    for i, rs in regions.items():
        assert len(rs) == GRAPHS_PER_ENTRY[rules], f"entry {i}: {[r.name for r in rs]}"
        assert all(r.graph is not None for r in rs), f"entry {i}: a region was left uncaptured"
        # the executable's own regions stay uncaptured: every session captures its own
        assert all(r.graph is None for r in run.exe.programs[i].run.children() if isinstance(r, CapturedRegion))

    run.assert_exact({}, {}, "after setup")
    lengths = []
    for i, inputs in enumerate(toy_inputs(N_STEPS)):
        stock_out, opt_out = run.step(on_device(inputs))
        run.assert_exact(stock_out, opt_out, f"{rules} step {i}")
        lengths.append(run.stock_state["kv"].shape[2])
    assert lengths[0] == PROMPT + FRAMES and lengths[-1] == PROMPT + RETAIN  # growth, trim, steady

    stats = run.session.stats()
    assert stats["steps"] == N_STEPS and stats["fallback_total"] == 0
    assert stats["replays"] == {"0": 1, "1": 1, "2": N_STEPS - 2}
    assert stats["graph_runs"] == {}
    for i, rs in regions.items():  # every region of an entry replayed once per step on that entry
        assert {r.replays for r in rs} == {stats["replays"][str(i)]} and all(not r.refusals for r in rs)


@pytest.mark.parametrize("rules", ALL_RULES)
def test_flagged_step_falls_back_and_is_counted(rules):
    run = CudaLockstep(rules)
    for i, x in enumerate(toy_inputs(N_STEPS, seed=5)):
        flags = {"last": True} if i in (1, 6) else {}
        stock_out, opt_out = run.step(on_device(x), **flags)
        run.assert_exact(stock_out, opt_out, f"{rules} step {i} {flags}")
    stats = run.session.stats()
    assert stats["fallbacks"] == {"flags last outside the catalog (eager)": 2}
    # step 1 fell back from entry 1 (kv 5 -> 8, trimmed to 6): entry 1 never replays
    assert stats["replays"] == {"0": 1, "2": N_STEPS - 3}
    assert stats["graph_runs"] == {}


@pytest.mark.parametrize("rules", ALL_RULES)
def test_non_contiguous_input_is_refused_by_the_gate(rules):
    run = CudaLockstep(rules)
    strided = {"x": torch.randn(1, FRAMES, CHANNELS, generator=torch.Generator().manual_seed(8))
               .to(DEVICE).transpose(1, 2)}
    assert strided["x"].shape == (1, CHANNELS, FRAMES) and not strided["x"].is_contiguous()
    for i, x in enumerate(toy_inputs(N_STEPS, seed=6)):
        x = strided if i == 5 else on_device(x)
        replays_before = sum(run.session.stats()["replays"].values())
        stock_out, opt_out = run.step(x)
        run.assert_exact(stock_out, opt_out, f"{rules} step {i}")
        if i == 5:
            assert sum(run.session.stats()["replays"].values()) == replays_before  # not a replay
    stats = run.session.stats()
    assert stats["fallbacks"] == {"input 'x' stride (12, 1, 4) != catalog (12, 3, 1)": 1}
    assert stats["replays"] == {"0": 1, "1": 1, "2": N_STEPS - 3}
    # the gate refused it: no region saw it, so none refused or replayed it
    assert all(not r.refusals for rs in run.regions().values() for r in rs)


@pytest.mark.parametrize("rules", ["SRc", "SR"])
def test_arena_never_moves_and_graphs_bind_it_by_address(rules):
    run = CudaLockstep(rules)
    arena = run.session.arena
    ptrs, base = dict(arena.data_ptrs()), arena.storage.data_ptr()
    for i, rs in run.regions().items():
        bound = [s.data_ptr for r in rs for s, b in zip(r.specs, r.bound) if s is not None and b]
        assert bound, f"entry {i}: no argument bound by address"
        assert all(base <= p < base + arena.nbytes for p in bound), f"entry {i}: a bound argument is off the arena"
    for i, x in enumerate(toy_inputs(N_STEPS)):
        run.assert_exact(*run.step(on_device(x)), f"{rules} step {i}")
        arena.assert_stable()
        assert arena.data_ptrs() == ptrs and arena.storage.data_ptr() == base, f"step {i}"
        assert {r: t.data_ptr() for r, t in run.session.state().items()} == {r: ptrs[r] for r in ("kv", "conv")}


def test_region_refuses_a_moved_arena_and_runs_the_same_piece_eagerly():
    run = CudaLockstep("SRc")
    for x in toy_inputs(4):
        run.step(on_device(x))  # steady state: entry 2 next
    program = run.session._programs[2]
    (region,) = run.regions()[2]
    x = on_device(toy_inputs(1, seed=11)[0])["x"]
    moved = [run.session.arena.full(r).clone() for r in program.arena_inputs]  # same bits, other memory
    live = [run.session.arena.full(r) for r in program.arena_inputs]
    replays = region.replays

    state = rng_state()
    with torch.no_grad():
        replayed = [t.clone() for t in program.run(x, *live)]
    set_rng_state(state)
    with torch.no_grad():
        eager = program.run(x, *moved)

    assert region.replays == replays + 1
    (why,) = region.refusals
    assert why.startswith("submod_0: arg ") and "(bound by address) moved from" in why
    assert region.refusals[why] == 1
    assert all(torch.equal(a, b) for a, b in zip(replayed, eager))
    assert all(torch.equal(a, b) for a, b in zip(live, moved))  # the same state update, applied once each
    assert region_stats(program.run) == (replays + 1, {why: 1})
