"""The generic path: ``@native_clock`` + ``cadence_fx.optimize(model)``, no adapter, no registration.

Every test streams the optimized model beside the model's own step (same generator state
before each chunk) and requires ``torch.equal`` on every output and carried region, and
the same SHA-256 over every output byte.  A wrong declaration must end in a
``CadenceError`` naming the fault, and the caller must never receive a differing chunk.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import subprocess
import sys

import pytest
import torch

import cadence_fx
from cadence_fx import (CadenceError, Clock, DeclarationError, Fixed, InputError, Region, SessionBroken, Unbounded,
                        Window, native_clock)
from cadence_fx.integrations.generic import OptimizedModule
from cadence_fx.integrations.generic.adapter import resolve_dims
from helpers.marks import cuda
from helpers.generic_models import CHANNELS, FRAMES, CausalDecoder, PromptDecoder, decoder_declaration

ROOT = pathlib.Path(__file__).resolve().parents[2]


def chunks(n: int, seed: int = 1, frames: int = FRAMES, shape=None) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*(shape or (1, CHANNELS, frames)), generator=g) for _ in range(n)]


def model(cls=CausalDecoder, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return cls(**kw).eval()


def as_dict(value, carried):
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in carried}, {r: value[r] for r in carried}
    n = len(carried)
    return {f"out{i}": v for i, v in enumerate(value[:-n])}, dict(zip(carried, value[-n:]))


def lockstep(stock_model, session, xs, state, carried, seed: int = 7, flags=None):
    """Each chunk through the stock step and ``session`` from one generator state; every
    output and region bit-equal.  Returns (the stock state, sha256 stock, sha256 optimized)."""
    sha_s, sha_o = hashlib.sha256(), hashlib.sha256()
    for i, x in enumerate(xs):
        args = x if isinstance(x, tuple) else (x,)
        f = (flags or {}).get(i, {})
        torch.manual_seed(seed * 100 + i)
        with torch.no_grad():
            out_s, state = as_dict(stock_model.stream(*args, *[state[r] for r in carried], **f), carried)
        torch.manual_seed(seed * 100 + i)
        got = session.step(*args, **f)
        out_o = session.last_outputs
        assert out_o.keys() == out_s.keys()
        for k in out_s:
            assert torch.equal(out_o[k], out_s[k]), f"chunk {i}: output {k} differs"
            sha_s.update(out_s[k].numpy().tobytes())
            sha_o.update(out_o[k].numpy().tobytes())
        first = next(iter(out_o.values()))
        assert torch.equal(got if isinstance(got, torch.Tensor) else got[next(iter(got))], first)
        live = session.state()
        for r in carried:
            assert live[r].shape == state[r].shape and torch.equal(live[r], state[r]), f"chunk {i}: region {r} differs"
    assert sha_s.hexdigest() == sha_o.hexdigest()
    return state


def test_a_model_nobody_adapted_runs_exactly_through_optimize():
    stock, mine = model(), model()  # one copy steps stock, the other is optimized: same weights
    opt = cadence_fx.optimize(mine, rules="S")
    assert isinstance(opt, OptimizedModule)
    session = opt.open_session()
    state = stock.initial_state()
    lockstep(stock, session, chunks(24), state, ("ctx", "kv"))
    stats = session.stats()
    assert stats["steps"] == 24 and stats["fallback_total"] == 0
    assert sum(stats["graph_runs"].values()) == 24  # every chunk ran the traced program
    assert stats["shadow"] == {"checked": 18, "left": 0}  # max(8, 2 x 9 catalog entries)
    assert stats["setup_s"]["compiled"] and set(stats["setup_s"]["how"].values()) == {"traced"}


def test_the_default_session_reset_and_a_second_session():
    stock, mine = model(seed=3), model(seed=3)
    opt = cadence_fx.optimize(mine, check_chunks=2)
    xs = chunks(12, seed=4)
    state = lockstep(stock, _Default(opt), xs[:6], stock.initial_state(), ("ctx", "kv"))
    opt.reset()  # back to the initial state, no setup re-run
    lockstep(stock, _Default(opt), xs[6:], stock.initial_state(), ("ctx", "kv"), seed=8)
    other = opt.open_session()  # shares the executable: nothing traced again
    lockstep(stock, other, xs, stock.initial_state(), ("ctx", "kv"), seed=9)
    assert other.stats()["setup_s"]["compiled"] is False
    assert opt.stats()["steps"] == 12 and state is not None  # reset rewinds the state, not the counters
    opt.close()
    with pytest.raises(cadence_fx.SessionClosed):
        opt.session.step(xs[0])


class _Default:
    """The drop-in's own step method (``opt.stream``) seen as a session."""

    def __init__(self, opt):
        self.opt = opt

    def step(self, *args, **flags):
        return self.opt.stream(*args, **flags)

    @property
    def last_outputs(self):
        return self.opt.session.last_outputs

    def state(self):
        return self.opt.state()


def test_a_prompt_size_read_off_the_initial_state_and_a_buffer_bound_cache():
    stock, mine = model(PromptDecoder, seed=5), model(PromptDecoder, seed=5)
    opt = cadence_fx.optimize(mine)
    for frames in (5, 9):
        prompt = torch.randn(CHANNELS, frames, generator=torch.Generator().manual_seed(frames))
        session = opt.open_session(prompt)
        assert session.dims == {"prompt_frames": frames}
        state = dict(zip(("prompt", "cache"), stock.initial_state(prompt)))
        lockstep(stock, session, chunks(10, shape=(CHANNELS, FRAMES)), state, ("prompt", "cache"))
        assert session.stats()["fallback_total"] == 0
    assert len(opt._executables) == 2  # one per prompt size
    assert torch.equal(mine.buf, torch.zeros_like(mine.buf))  # the model's own buffer was never written


def test_executables_past_max_executables_go_least_recently_used_first_and_come_back_exact():
    """A drop-in keeps at most ``max_executables`` stream configurations; the least
    recently used goes first, a session on it keeps it alive, and a configuration seen
    again is compiled again (from the kept symbolic programs) and streams exactly."""
    stock, mine = model(PromptDecoder, seed=5), model(PromptDecoder, seed=5)
    opt = cadence_fx.optimize(mine, max_executables=2)
    held = []
    for frames in (5, 9, 5, 7, 9):  # 5 is used again before 7 arrives, so 9 goes; 9 comes back, so 5 goes
        prompt = torch.randn(CHANNELS, frames, generator=torch.Generator().manual_seed(frames))
        session = opt.open_session(prompt)
        state = dict(zip(("prompt", "cache"), stock.initial_state(prompt)))
        lockstep(stock, session, chunks(6, shape=(CHANNELS, FRAMES)), state, ("prompt", "cache"))
        held.append(sorted(dict(k[0])["prompt_frames"] for k in opt._executables))
    assert held == [[5], [5, 9], [5, 9], [5, 7], [7, 9]]
    assert opt.executables_evicted == 2
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(CadenceError, match=r"max_executables=.* must be an int >= 1"):
            cadence_fx.optimize(model(PromptDecoder, seed=5), max_executables=bad)


def test_flags_and_off_catalog_inputs_run_the_stock_step_counted():
    stock, mine = model(seed=6), model(seed=6)
    opt = cadence_fx.optimize(mine, check_chunks=20)
    session = opt.open_session()
    xs = chunks(8, seed=2)
    xs[3] = torch.randn(1, CHANNELS, 7)  # another chunk length: outside the catalog's input signature
    lockstep(stock, session, xs, stock.initial_state(), ("ctx", "kv"), flags={7: {"last": True}})
    fallbacks = session.stats()["fallbacks"]
    assert sum(fallbacks.values()) >= 2 and any("last" in why for why in fallbacks), fallbacks


def test_bad_calls_are_refused_and_lose_no_state():
    opt = cadence_fx.optimize(model(), check_chunks=0)
    session = opt.open_session()
    session.step(chunks(1)[0])
    before = {r: t.clone() for r, t in session.state().items()}
    with pytest.raises(InputError, match="takes 1 input"):
        session.step(chunks(1)[0], chunks(1)[0])
    with pytest.raises(InputError, match="not tensors"):
        session.step([1.0])
    with pytest.raises(InputError, match="keyword"):
        session.step(chunks(1)[0], bogus=True)
    with pytest.raises(InputError, match="dtype"):
        session.step(chunks(1)[0].double())
    assert all(torch.equal(session.state()[r], t) for r, t in before.items())
    with pytest.raises(CadenceError, match="check_chunks"):
        cadence_fx.optimize(model(), check_chunks=-1)
    with pytest.raises(CadenceError, match="does not take"):
        cadence_fx.optimize(model(), bogus=1)


# ------------------------------------------------------------------ wrong declarations
def _declared(regions_kv=None, cls=CausalDecoder, **kw):
    m = model(cls)
    decl = decoder_declaration(**kw)
    if regions_kv is not None:
        decl["regions"] = [decl["regions"][0], regions_kv]
    native_clock(**decl)(m)
    return m


WRONG = {
    # the case: the K|V cache declared Fixed with 32 frames while the model starts it empty
    "fixed_but_grows": (lambda: _declared(Region("kv", clock="frame", shape=(2, 32, 32), retention=Fixed())),
                        "open", r"initial_state\(\).*'kv' is \(2, 32, 0\).*\(2, 32, 32\)"),
    "retains_less_than_the_model": (lambda: _declared(kv_retain=16), "step",
                                    r"step 4 .*'kv' is \(2, 32, 20\).*\(2, 32, 16\)"),
    "retains_more_than_the_model": (lambda: _declared(ctx_retain=12), "step", r"'ctx' is \(1, 16, 8\)"),
    "unbounded": (lambda: _declared(Region("kv", clock="frame", shape=(2, 32, "T"), axis=2, retention=Unbounded())),
                  "optimize", "Unbounded"),
    "regions_out_of_order": (lambda: _declared(regions=list(reversed(decoder_declaration()["regions"]))),
                             "optimize", r"\(<inputs>, kv, ctx\)"),
    "no_initial_state": (lambda: _declared(initial_state=None), "optimize", "initial_state"),
    "no_such_step": (lambda: _declared(step="decode"), "optimize", "no method 'decode'"),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_wrong_declaration_is_a_clear_error_never_a_wrong_chunk(case):
    build, where, pattern = WRONG[case]
    m = build()
    got = []
    with pytest.raises(DeclarationError, match=pattern) as info:
        opt = cadence_fx.optimize(m)
        assert where != "optimize"
        session = opt.open_session()
        assert where != "open"
        for x in chunks(12):
            got.append(session.step(x))
    assert not got  # the caller received nothing
    assert "KeyError" not in repr(info.value)


def test_a_symbol_is_read_off_the_initial_state_and_given_dims_must_agree_with_it():
    def build():
        return _declared(Region("kv", clock="frame", shape=(2, "width", "T"), axis=2, retention=Window(retain=32)))
    stock = model()
    session = cadence_fx.optimize(build()).open_session()
    assert session.dims == {"width": 32}
    lockstep(stock, session, chunks(10), stock.initial_state(), ("ctx", "kv"))
    with pytest.raises(DeclarationError, match=r"'kv' is \(2, 32, 0\).*says \(2, 16, 0\)"):
        cadence_fx.optimize(build(), dims={"width": 16}).open_session()


class Counting(CausalDecoder):
    """State kept outside the declaration, in a Python attribute: traced as a constant."""

    calls = 0

    def stream(self, x, ctx, kv, last: bool = False):
        self.calls += 1
        y, ctx, kv = super().stream(x, ctx, kv, last)
        return y * self.calls, ctx, kv


class Accumulating(CausalDecoder):
    """State kept in an undeclared module buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(1))

    def stream(self, x, ctx, kv, last: bool = False):
        self.acc += 1
        y, ctx, kv = super().stream(x, ctx, kv, last)
        return y * self.acc, ctx, kv


def test_undeclared_state_in_an_attribute_is_caught_by_the_shadow_check():
    session = cadence_fx.optimize(model(Counting)).open_session()
    with pytest.raises(DeclarationError, match=r"differs from the stock step at chunk 0 in output 'out0'"):
        session.step(chunks(1)[0])
    with pytest.raises(SessionBroken):
        session.step(chunks(1)[0])


def test_undeclared_state_in_a_buffer_is_refused_and_the_buffer_put_back():
    m = model(Accumulating)
    with pytest.raises(DeclarationError, match=r"writes module buffer\(s\) \['acc'\]"):
        cadence_fx.optimize(m).stream(chunks(1)[0])
    assert m.acc.item() == 0.0


def test_without_the_shadow_check_verify_shows_what_differs():
    """``verify`` runs no shadow check: its report is the comparison itself, and it can fail."""
    report = cadence_fx.verify(model(Counting), chunks(4))
    assert report["exact"] is False and report["mismatches"][0]["chunk"] == 0
    good = cadence_fx.verify(model(), chunks(12), seed=3)
    assert good["exact"] is True and good["chunks"] == 12
    assert good["pcm_sha256_stock"] == good["pcm_sha256_optimized"]
    assert all(r["route"].startswith("graph entry") for r in good["per_chunk"])


def test_other_chunk_lengths_run_their_own_programs_with_off_catalog_specialize():
    """The generic path takes ``off_catalog``: chunks of 2 and 3 frames (the catalog's are 4)
    get programs of their own, at the catalog's states and at the states off it they lead to,
    every step exact against the stock step; the default runs them eagerly."""
    frames = [4, 2, 4, 4, 3, 4, 4, 4, 4, 4, 2, 4, 3, 4]
    inputs = [chunks(1, seed=10 + i, frames=f)[0] for i, f in enumerate(frames)]
    report = cadence_fx.verify(model(), inputs, seed=5, off_catalog="specialize")
    assert report["exact"] is True, report["mismatches"]
    routes = [r["route"] for r in report["per_chunk"]]
    assert all(r.startswith("graph") for r in routes), routes
    assert any(r.startswith("graph specialization off-catalog") for r in routes), routes
    eager = cadence_fx.verify(model(), inputs, seed=5)
    assert eager["exact"] is True and eager["pcm_sha256_optimized"] == report["pcm_sha256_optimized"]
    assert sum(r["route"].startswith("fallback") for r in eager["per_chunk"]) >= 4


def test_resolve_dims_reads_a_window_prefix_and_off_axis_sizes():
    decl = cadence_fx.get_declaration(native_clock(
        clocks=[Clock("f", 50, 2)],
        regions=[Region("kv", "f", ("heads", "T"), axis=1, retention=Window(retain=4, prefix="prompt"))],
        step="stream", initial_state="initial_state")(torch.nn.Module()))
    assert resolve_dims(object(), decl, None, {"kv": torch.zeros(3, 11)}) == {"heads": 3, "prompt": 11}
    assert resolve_dims(object(), decl, {"prompt": 5}, {"kv": torch.zeros(3, 11)}) == {"prompt": 5, "heads": 3}


@cuda
@pytest.mark.parametrize("rules", ["S", "SR", "SRc"])
def test_the_generic_path_replays_exactly_on_cuda(rules):
    from cadence_fx.lockstep import deterministic_protocol
    deterministic_protocol()
    stock, mine = model().cuda(), model().cuda()
    opt = cadence_fx.optimize(mine, rules=rules)
    xs = [x.cuda() for x in chunks(20)]
    session = opt.open_session()
    state = stock.initial_state()
    for i, x in enumerate(xs):
        torch.manual_seed(i)
        with torch.no_grad():
            want, *carried = stock.stream(x, state["ctx"], state["kv"])
        state = dict(zip(("ctx", "kv"), carried))
        torch.manual_seed(i)
        got = session.step(x)
        assert torch.equal(got, want), f"chunk {i}"
        assert all(torch.equal(session.state()[r], state[r]) for r in state), f"chunk {i}"
    stats = session.stats()
    assert stats["fallback_total"] == 0 and stats["shadow"]["checked"] == 18
    kind = "graph_runs" if rules == "S" else "replays"
    assert sum(stats[kind].values()) >= 20 - (0 if rules == "S" else 1), stats


# ------------------------------------------------------------------ registration and the CLI
def test_register_is_by_class_object_and_a_same_named_class_is_not_hijacked():
    class MimiDecoder(CausalDecoder):  # the name of a built-in family, in another module
        pass

    assert isinstance(cadence_fx.optimize(model(MimiDecoder)), OptimizedModule)
    made = []

    def factory_(m, rules, progress, cache):
        made.append(m)
        return "mine"

    cadence_fx.register(MimiDecoder, factory_)
    try:
        assert cadence_fx.optimize(model(MimiDecoder)) == "mine" and len(made) == 1
        with pytest.raises(CadenceError, match=r"does not take"):
            cadence_fx.optimize(model(MimiDecoder), check_chunks=3)
    finally:
        from cadence_fx.integrations import unregister
        unregister(MimiDecoder)
    with pytest.raises(CadenceError, match="takes a class"):
        cadence_fx.register(model(), factory_)


def test_cli_verify_takes_a_module_factory():
    proc = subprocess.run([sys.executable, "-m", "cadence_fx", "verify", "--module",
                           "tests.helpers.generic_models:factory", "--json", "--quiet"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["exact"] is True and report["chunks"] == 24 and report["model"] == "CausalDecoder"
    bad = subprocess.run([sys.executable, "-m", "cadence_fx", "verify", "--module", "tests.helpers.generic_models"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert bad.returncode == 2 and "pkg.mod:factory" in bad.stderr


def test_an_adapter_carrying_an_undeclared_or_unbounded_region_is_a_declaration_error():
    """The adapter path's compile names the region too (it raised a bare KeyError)."""
    from cadence_fx.compiler import compile_executable
    from cadence_fx.step import StepSignature
    from helpers.toy_models import ToyAdapter, make_toy, toy_declaration

    class Ghost(ToyAdapter):
        signature = StepSignature(inputs=("x",), regions=("kv", "conv", "ghost"), outputs=("y",))

    with pytest.raises(DeclarationError, match="'ghost', which the declaration lacks"):
        compile_executable(Ghost(make_toy(), 2), "S")
    toy = make_toy()
    decl = toy_declaration()
    kv = decl["regions"][0]
    decl["regions"][0] = Region("kv", clock=kv.clock, shape=kv.shape, axis=kv.axis, retention=Unbounded(),
                                buffers=kv.buffers)
    native_clock(**decl)(toy)
    with pytest.raises(DeclarationError, match="'kv' is Unbounded"):
        compile_executable(ToyAdapter(toy, 2), "S")


@native_clock(clocks=[Clock("frame", hz=50, stride=4)],
              regions=[Region("phase", clock="frame", shape=(1, 4), doc="an oscillator's phase")],
              step="stream", initial_state="initial_state")
class Oscillator(torch.nn.Module):
    """A step with no input at all: each call advances the phase and emits 4 samples."""

    def __init__(self):
        super().__init__()
        self.freq = torch.nn.Parameter(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))

    def initial_state(self):
        return (torch.zeros(1, 4),)

    def stream(self, phase):
        phase = phase + self.freq
        return torch.sin(phase) + 0.01 * torch.randn(1, 4), phase


def test_a_step_with_no_inputs_runs_too():
    report = cadence_fx.verify(model(Oscillator), [()] * 12)
    assert report["exact"] is True and report["chunks"] == 12
    assert all(r["route"].startswith("graph") for r in report["per_chunk"])


def test_a_forward_step_is_called_like_the_module():
    class Forwarded(CausalDecoder):
        def forward(self, x, ctx, kv):
            return self.stream(x, ctx, kv)

    m = model(Forwarded)
    native_clock(**decoder_declaration(step="forward"))(m)
    stock = model()
    opt = cadence_fx.optimize(m)
    state = stock.initial_state()
    for i, x in enumerate(chunks(10)):
        torch.manual_seed(i)
        with torch.no_grad():
            want, *carried = stock.stream(x, state["ctx"], state["kv"])
        state = dict(zip(("ctx", "kv"), carried))
        torch.manual_seed(i)
        assert torch.equal(opt(x), want), i
    with pytest.raises(TypeError, match=r"opt.step\(...\) or opt.stream"):
        cadence_fx.optimize(model())(chunks(1)[0])
