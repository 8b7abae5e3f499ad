"""A tiny synthetic streaming model that does what Token2Wav does, in miniature.

``ToyStream`` is pure torch (no upstream package) and runs in milliseconds on CPU.
Its step has every pattern cadence_fx must handle in the real tail:

* a K|V-like cache ``kv`` [4, 8, T] grown newest first with ``torch.cat([new, old],
  dim=2)`` (as the DiT does) and trimmed to ``cat([cache[..., :P], cache[..., -R:]])``
  once longer than P + R frames (P: prompt frames from ``setup``, R: ``retain``);
* an over-provisioned module buffer ``attn.kv_buffer`` [4, 8, 64] into which the step
  writes the grown cache (``buf[b][:, :L] = cache[b]`` per leading slot, or
  ``buf[:, :, :L] = cache`` with ``write="slice"``) and whose slice ``buf[:, :, :L]``
  it returns as the next state (upstream's ``att_cache_buffer`` aliasing pattern);
* a ``Fixed`` conv carry ``conv`` [1, 4, 2] (the last 2 frames of the conv input);
* a host-built constant moved to the device inside forward
  (``torch.arange(...).to(x.device)``, like ``timestep_embedding``);
* one ``torch.rand`` draw that reaches the output (like HiFT's noise).

One step takes ``x`` [1, 4, 3] (3 new frames on a clock of stride 3) and returns
``y`` [1, 4, 3].  ``ToyAdapter`` is its ``StreamingAdapter``, so
``compile_executable(ToyAdapter(model, P), "S")`` and ``ToyAdapter.open_session``
run it exactly as ``OptimizedToken2Wav`` runs Token2Wav.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from cadence_fx import Clock, Fixed, Region, Window, get_declaration, native_clock
from cadence_fx.adapter import StreamingAdapter
from cadence_fx.compiler import open_session
from cadence_fx.step import StepSignature, scope, scopes
from cadence_fx.plan import ScopeVerdict, TensorSpec
from cadence_fx.runtime.binding import rebind_buffers
from cadence_fx.runtime.session import Executable, Session

FRAMES = 3  # new frames per step: the clock's stride
CHANNELS = 4  # channels of x and y
KV_SHAPE = (4, 8)  # the cache's dims off the growth axis (heads x K|V width)
BUFFER_FRAMES = 64  # the stock buffer's static frame constant (over-provisioned)
CONV_CARRY = 2  # frames of left context the causal conv (kernel 3) carries
DEFAULT_RETAIN = 4
BUFFER_PATH = "attn.kv_buffer"


def toy_declaration(retain: int = DEFAULT_RETAIN) -> dict[str, Any]:
    """``native_clock`` arguments for a ToyStream retaining ``retain`` frames.

    kv: Window(retain=R, prefix="prompt_frames") on a stride-3 clock, so K =
    ceil(R / 3) + 1 and the arena holds P + R + 3 frames instead of 64.
    """
    return dict(
        clocks=[Clock("frame", hz=75, stride=FRAMES)],
        regions=[
            Region("kv", clock="frame", shape=(*KV_SHAPE, "T"), axis=2,
                   retention=Window(retain=retain, prefix="prompt_frames"), buffers=(BUFFER_PATH,),
                   doc="K|V cache, newest first; stock buffer 4 x 8 x 64"),
            Region("conv", clock="frame", shape=(1, CHANNELS, CONV_CARRY), retention=Fixed(),
                   doc="causal conv carry (last 2 input frames)"),
        ],
        step="stream",
        unit="3 frames in -> 3 frames out",
    )


class ToyAttention(nn.Module):
    """Attention over a newest-first cache kept in an over-provisioned buffer.

    ``write="blocks"`` writes the grown cache into the buffer one leading slot at a
    time (``buf[b][:, :L] = cache[b]``), as upstream's DiT does per block;
    ``write="slice"`` writes it in one ``buf[:, :, :L] = cache``.  The two are the
    same in eager; they trace differently once L is the buffer's whole extent (the
    arena's capacity at the steady step): torch elides the full slice and the write
    becomes ``copy_(buf, cache)``, whose result later reads go through.
    """

    def __init__(self, write: str = "blocks") -> None:
        super().__init__()
        if write not in ("blocks", "slice"):
            raise ValueError(f"write={write!r} must be 'blocks' or 'slice'")
        self.write = write
        self.kv = nn.Linear(CHANNELS, KV_SHAPE[0] * KV_SHAPE[1])
        self.q = nn.Linear(CHANNELS, KV_SHAPE[1])
        self.register_buffer("kv_buffer", torch.zeros(*KV_SHAPE, BUFFER_FRAMES), persistent=False)

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """h [1, 4, T] -> new cache frames [4, 8, T] (Linear: works for T = 0)."""
        return self.kv(h[0].transpose(0, 1)).transpose(0, 1).reshape(*KV_SHAPE, h.shape[2])

    def forward_chunk(self, h: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [1, 4, T], cache [4, 8, L0] -> (ctx [1, 8, T], cache [4, 8, L0 + T], a view of the buffer)."""
        cache = torch.cat([self.project(h), cache], dim=2)  # newest first
        length = cache.shape[2]
        if self.write == "blocks":
            # upstream DiT.blocks_forward_chunk: att_cache_buffer[b_idx][:, :, :L, :] = new
            for b in range(KV_SHAPE[0]):
                self.kv_buffer[b][:, :length] = cache[b]
        else:
            self.kv_buffer[:, :, :length] = cache
        cache = self.kv_buffer[:, :, :length]
        keys = cache.mean(0)  # [8, L]
        q = self.q(h[0].transpose(0, 1))  # [T, 8]
        att = torch.softmax(q @ keys / math.sqrt(KV_SHAPE[1]), dim=-1)  # [T, L]
        return (att @ keys.transpose(0, 1)).transpose(0, 1)[None], cache


@native_clock(**toy_declaration())
class ToyStream(nn.Module):
    """The stock streaming step: ``stream(inputs, state, prompt_frames, last)``.

    ``retain`` (R) is the model's trim constant; ``make_toy(retain=R)`` declares a
    matching Window on the instance when it differs from the class's R = 4.
    """

    def __init__(self, retain: int = DEFAULT_RETAIN, write: str = "blocks") -> None:
        super().__init__()
        if retain < 1:
            raise ValueError("retain must be >= 1 (cache[..., -0:] would keep everything)")
        self.retain = retain
        self.conv = nn.Conv1d(CHANNELS, CHANNELS, CONV_CARRY + 1)
        self.attn = ToyAttention(write)
        self.out = nn.Conv1d(KV_SHAPE[1], CHANNELS, 1)

    def setup(self, prompt: torch.Tensor) -> dict[str, torch.Tensor]:
        """prompt [1, 4, P] -> the state before step 0: kv [4, 8, P] (in the buffer), conv [1, 4, 2]."""
        frames = prompt.shape[2]
        self.attn.kv_buffer[:, :, :frames] = self.attn.project(prompt)
        conv = F.pad(prompt, (CONV_CARRY, 0))[:, :, -CONV_CARRY:].clone()
        return {"kv": self.attn.kv_buffer[:, :, :frames], "conv": conv}

    def stream(self, inputs: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor],
               prompt_frames: int, last: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """inputs: ``x`` [1, 4, T]; state: ``kv`` [4, 8, L], ``conv`` [1, 4, 2].

        Returns ``({"y": [1, 4, T]}, {"kv": [4, 8, min(L + T, P + R) or L + T], "conv": [1, 4, 2]})``.
        """
        x = inputs["x"]
        t = x.shape[2]
        h = torch.cat([state["conv"], x], dim=2)
        new_conv = h[:, :, -CONV_CARRY:]
        h = self.conv(h)  # [1, 4, T]
        pos = torch.exp(-0.5 * torch.arange(t, dtype=torch.float32)).to(x.device)  # host-built
        ctx, cache = self.attn.forward_chunk(h * pos, state["kv"])
        y = self.out(ctx) + 0.01 * torch.rand(1, CHANNELS, t, device=x.device)
        if last:
            y = y + h  # the flush step computes something else: it must never replay a graph
        if cache.shape[2] > prompt_frames + self.retain:
            cache = torch.cat([cache[..., :prompt_frames], cache[..., -self.retain:]], dim=2)
        return {"y": y}, {"kv": cache, "conv": new_conv}


def make_toy(retain: int = DEFAULT_RETAIN, seed: int = 0, write: str = "blocks") -> ToyStream:
    """A seeded ToyStream in eval mode; declared on the instance when R differs from the class's."""
    gen = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = ToyStream(retain, write).eval()
    finally:
        torch.random.set_rng_state(gen)
    if retain != DEFAULT_RETAIN:
        native_clock(**toy_declaration(retain))(model)
    return model


def toy_prompt(frames: int, seed: int = 1) -> torch.Tensor:
    """A seeded prompt [1, 4, frames]."""
    return torch.randn(1, CHANNELS, frames, generator=torch.Generator().manual_seed(seed))


def toy_inputs(n_steps: int, seed: int = 2, frames: int = FRAMES) -> list[dict[str, torch.Tensor]]:
    """``n_steps`` seeded step inputs ``{"x": [1, 4, frames]}``."""
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(1, CHANNELS, frames, generator=g)} for _ in range(n_steps)]


class ToyAdapter(StreamingAdapter):
    """ToyStream for one stream configuration (prompt length P)."""

    signature = StepSignature(inputs=("x",), regions=("kv", "conv"), outputs=("y",))

    def __init__(self, model: ToyStream, prompt_frames: int):
        self.model = model
        self.prompt_frames = prompt_frames
        self.declaration = get_declaration(model)

    def dims(self) -> dict[str, int]:
        return {"prompt_frames": self.prompt_frames}

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def input_specs(self) -> dict[str, TensorSpec]:
        return {"x": TensorSpec.contiguous((1, CHANNELS, FRAMES), str(self.dtype).removeprefix("torch."),
                                           str(self.device))}

    def example_inputs(self) -> dict[str, torch.Tensor]:
        x = torch.randn(1, CHANNELS, FRAMES, generator=torch.Generator().manual_seed(0))
        return {"x": x.to(device=self.device, dtype=self.dtype)}

    def bind(self, buffers: Mapping[str, torch.Tensor]):
        twin = rebind_buffers(self.model, buffers)

        def step(inputs, state, last: bool = False):
            return twin.stream(inputs, state, self.prompt_frames, last)
        return step

    def setup(self, buffers: Mapping[str, torch.Tensor], prompt: torch.Tensor) -> dict[str, torch.Tensor]:
        return rebind_buffers(self.model, buffers).setup(prompt)

    def fallback(self, inputs, state, last: bool = False):
        """Any step, eagerly, on a private buffer sized for this call."""
        kv = state["kv"]
        frames = kv.shape[2] + inputs["x"].shape[2]
        private = torch.zeros(*KV_SHAPE, frames, dtype=kv.dtype, device=kv.device)
        return self.bind({BUFFER_PATH: private})(inputs, state, last)

    def callable_verdicts(self) -> tuple:
        return (ScopeVerdict("stream", "callable", "in", "3 frames per step: traced per catalog entry"),
                ScopeVerdict("stream(last=True)", "callable", "out", "flush step: runs eagerly, counted"))

    def stock_state_bytes(self) -> int:
        """The stock buffer plus the conv carry and the trimmed cache outside the buffer."""
        item = torch.empty((), dtype=self.dtype).element_size()
        trimmed = KV_SHAPE[0] * KV_SHAPE[1] * (self.prompt_frames + self.model.retain)
        return self.model.attn.kv_buffer.nbytes + (CHANNELS * CONV_CARRY + trimmed) * item

    def stock_buffers(self) -> dict[str, torch.Tensor]:
        return {BUFFER_PATH: self.model.attn.kv_buffer}

    def open_session(self, executable: Executable, prompt: torch.Tensor) -> Session:
        """A session set up from ``prompt`` [1, 4, P], as ``OptimizedToken2Wav.set_stream_cache`` does."""
        if prompt.shape[2] != self.prompt_frames:
            raise ValueError(f"prompt has {prompt.shape[2]} frames; this adapter plans for {self.prompt_frames}")
        return open_session(executable, self, prompt)


class ScopedToyAdapter(ToyAdapter):
    """The toy with its attention call traced inside ``scope("attn")``: the per-step
    cut rules SR make for Token2Wav's DiT estimator calls (``step_boundary``)."""

    def bind(self, buffers):
        twin = rebind_buffers(self.model, buffers)  # twin.attn is a copy: patching it leaves the model alone
        forward_chunk = twin.attn.forward_chunk

        def scoped_forward_chunk(h, cache):
            with scope("attn"):
                return forward_chunk(h, cache)

        twin.attn.forward_chunk = scoped_forward_chunk

        def step(inputs, state, last: bool = False):
            return twin.stream(inputs, state, self.prompt_frames, last)
        return step

    def step_boundary(self):
        return lambda node: "attn" in scopes(node)


class SymbolicToyAdapter(ToyAdapter):
    """The toy whose prompt length is a symbolic dim (as Token2Wav's is): with a
    ``ProgramStore`` each catalog entry is traced once and specialized per prompt length;
    ``modules()``/``cache_identity()`` let the program cache on disk store it."""

    def symbolic_dims(self) -> tuple[str, ...]:
        return ("prompt_frames",)

    def symbolic_inputs(self) -> dict[str, dict[int, str]]:
        return {"x": {2: "chunk_frames"}}

    def bind(self, buffers: Mapping[str, torch.Tensor], dims: Mapping[str, Any] | None = None):
        twin = rebind_buffers(self.model, buffers)
        prompt_frames = dims["prompt_frames"] if dims else self.prompt_frames

        def step(inputs, state, last: bool = False):
            return twin.stream(inputs, state, prompt_frames, last)
        return step

    def modules(self) -> dict[str, nn.Module]:
        return {"toy": self.model}

    def cache_identity(self) -> dict:
        return {"upstream": "toy", "version": "1"}


def assert_stream_exact(opt_state: dict, stock_state: dict, stock_out: dict, opt_out: dict, where: str) -> None:
    """Every output and every carried state tensor bit-equal (``torch.equal``)."""
    assert opt_out.keys() == stock_out.keys()
    for name, t in stock_out.items():
        assert torch.equal(opt_out[name], t), f"{where}: output {name!r} differs from stock"
    assert opt_state.keys() == stock_state.keys()
    for name, t in stock_state.items():
        assert opt_state[name].shape == t.shape, f"{where}: state {name!r} {opt_state[name].shape} != {t.shape}"
        assert torch.equal(opt_state[name], t), f"{where}: state {name!r} differs from stock"


def assert_lockstep_exact(stock: ToyStream, stock_state: dict, session, inputs: list[dict], prompt_frames: int) -> dict:
    """Stream ``inputs`` through the stock step and ``session`` from the same generator
    state (CPU, and CUDA for CUDA inputs) each step; every output and state tensor bit-equal.  Returns the
    stock state after the last step."""
    for i, x in enumerate(inputs):
        cuda = any(t.is_cuda for t in x.values())
        rng = torch.random.get_rng_state(), torch.cuda.get_rng_state() if cuda else None
        with torch.no_grad():
            stock_out, stock_state = stock.stream(x, stock_state, prompt_frames)
        torch.random.set_rng_state(rng[0])
        if cuda:
            torch.cuda.set_rng_state(rng[1])
        opt_out = session.step(x)
        assert_stream_exact(session.state(), stock_state, stock_out, opt_out, f"step {i}")
    return stock_state



class ToyLockstep:
    """A stock toy (retaining ``retain`` frames) and a session of ``exe`` opened on the same
    prompt, stepped in lockstep (the same generator state each step): every output and state
    tensor bit-equal at every step; each step's route (``lockstep.chunk_route``) kept in ``routes``."""

    def __init__(self, adapter, exe, prompt_frames: int, retain: int = DEFAULT_RETAIN):
        self.model, self.p = make_toy(retain), prompt_frames
        with torch.no_grad():
            self.stock_state = self.model.setup(toy_prompt(prompt_frames))
        self.session = adapter.open_session(exe, toy_prompt(prompt_frames))
        self.routes: list[str] = []

    def step(self, x, where: str | None = None, **flags) -> str:
        """One step of both (``where`` names it in a mismatch); returns its route."""
        from cadence_fx.lockstep import chunk_route
        rng = torch.random.get_rng_state()
        with torch.no_grad():
            stock_out, self.stock_state = self.model.stream(x, self.stock_state, self.p, **flags)
        torch.random.set_rng_state(rng)
        before = self.session.stats()
        opt_out = self.session.step(x, **flags)
        self.routes.append(chunk_route(before, self.session.stats()))
        assert_stream_exact(self.session.state(), self.stock_state, stock_out, opt_out,
                            where or f"step {len(self.routes) - 1}")
        return self.routes[-1]


def toy_entry_graph(adapter, entry_index: int):
    """(the traced step of one catalog entry, its RegionBindings, the plan), as compile_executable makes them."""
    from cadence_fx.compiler import build_plan, buffer_bindings, region_bindings
    from cadence_fx.passes.trace import trace_step
    from cadence_fx.runtime.arena import Arena
    plan = build_plan(adapter)
    entry = plan.catalog[entry_index]
    scratch = Arena(plan.layout, "cpu")
    step = adapter.bind(buffer_bindings(adapter.declaration, scratch))
    state = {r: torch.zeros(entry.regions[r].shape) for r in adapter.signature.regions}
    with torch.random.fork_rng():
        gm = trace_step(step, adapter.signature, adapter.example_inputs(), state, {"kv": scratch.full("kv")})
    return gm, region_bindings(plan, entry), plan
