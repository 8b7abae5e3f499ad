"""Each session's graphs draw from a generator state of their own (``GraphRng``).

PyTorch before 2.13 writes a graph's Philox seed and offset, at replay, into one pair
of device tensors per generator state; every graph captured with that state reads
them when its kernels run.  Two sessions' graphs replayed on two streams at once
could then read each other's offset.  These tests make the race certain: the first
graph spins for 50 ms before it draws, and the second one's replay writes its seed
meanwhile.  With a state per session each graph reads its own, and draws what eager
draws at that call.
"""

from __future__ import annotations

import pytest
import torch

from cadence_fx.runtime.graphs import CapturedRegion, GraphRng
from helpers.marks import cuda

N = 1 << 16
SPIN = 50_000_000  # cycles: ~25-50 ms on a current GPU, far longer than launching the other graph


class Draw(torch.nn.Module):
    """Spin (so that another stream's replay runs first), then add uniform noise."""

    def __init__(self, spin: int):
        super().__init__()
        self.spin = spin

    def forward(self, x):
        if self.spin:
            torch.cuda._sleep(self.spin)
        return x + torch.rand(N, device=x.device)


def eager(seed: int, x: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, int]:
    """What stock draws from ``seed`` at ``offset``, and the offset after."""
    gen = torch.cuda.default_generators[x.device.index or 0]
    torch.manual_seed(seed)
    gen.set_offset(offset)
    out = x + torch.rand(N, device=x.device)
    return out, gen.get_offset()


def captured(spin: int, x: torch.Tensor, rng: GraphRng | None) -> CapturedRegion:
    region = CapturedRegion(Draw(spin), [False], name="draw", rng=rng)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.random.fork_rng(devices=[x.device]):
        with torch.cuda.stream(stream):
            Draw(0)(x)  # warm-up outside capture
        torch.cuda.synchronize()
        region.capture([x], torch.cuda.graph_pool_handle(), stream)
    torch.cuda.synchronize()
    return region


def overlapped(a: CapturedRegion, b: CapturedRegion, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Seed 1 and replay ``a`` on one stream; seed 2 and replay ``b`` on another while
    ``a`` still spins."""
    sa, sb = torch.cuda.Stream(), torch.cuda.Stream()
    for s in (sa, sb):
        s.wait_stream(torch.cuda.current_stream())
    torch.manual_seed(1)
    with torch.cuda.stream(sa):
        out_a = a(x).clone()
    torch.manual_seed(2)
    with torch.cuda.stream(sb):
        out_b = b(x).clone()
    torch.cuda.synchronize()
    return out_a, out_b


@cuda
def test_overlapped_replays_of_two_sessions_draw_what_eager_draws():
    device = torch.device("cuda")
    x = torch.zeros(N, device=device)
    want_a, _ = eager(1, x)
    want_b, after_b = eager(2, x)
    rng_a, rng_b = GraphRng.for_device(device), GraphRng.for_device(device)
    if rng_a is None:
        pytest.skip("this PyTorch has no graph-safe generator API")
    a, b = captured(SPIN, x, rng_a), captured(0, x, rng_b)
    out_a, out_b = overlapped(a, b, x)
    assert torch.equal(out_b, want_b)
    assert torch.equal(out_a, want_a), "the spinning graph read the other session's seed"
    # the default generator is where eager leaves it after the last call (seed 2's draw)
    assert torch.cuda.default_generators[0].get_offset() == after_b
    assert rng_a.replays == rng_b.replays == 1


@cuda
def test_a_graph_continues_the_default_generator_as_eager_does():
    """No reseeding between calls: each replay draws from where the last one (or an
    eager draw in between) left the default generator."""
    device = torch.device("cuda")
    x = torch.zeros(N, device=device)
    rng = GraphRng.for_device(device)
    if rng is None:
        pytest.skip("this PyTorch has no graph-safe generator API")
    region = captured(0, x, rng)
    torch.manual_seed(7)
    got = [region(x).clone(), torch.rand(N, device=device), region(x).clone()]
    got_offset = torch.cuda.default_generators[0].get_offset()
    torch.manual_seed(7)
    want = [x + torch.rand(N, device=device), torch.rand(N, device=device), x + torch.rand(N, device=device)]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert got_offset == torch.cuda.default_generators[0].get_offset()


@cuda
@pytest.mark.skipif(tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13),
                    reason="torch >= 2.13 keeps the seed and offset tensors per capture (pytorch/pytorch#176752)")
def test_without_a_state_per_session_this_torch_mixes_overlapped_draws():
    """The control: the same two graphs on the one default state read one pair of
    tensors, so the spinning graph draws with the other's seed.  Fails if this torch
    no longer shares them (then the per-session state is belt and braces)."""
    device = torch.device("cuda")
    x = torch.zeros(N, device=device)
    want_a, _ = eager(1, x)
    want_b, _ = eager(2, x)
    a, b = captured(SPIN, x, None), captured(0, x, None)
    out_a, out_b = overlapped(a, b, x)
    # which replay's seed both read depends on when each stream's seed write runs (other
    # work on the GPU can delay either): the control is that they do not both draw their own
    assert not (torch.equal(out_a, want_a) and torch.equal(out_b, want_b)), \
        "both overlapped graphs drew what eager draws: this torch no longer shares the seed tensors"
    assert torch.equal(out_a, out_b), "the two graphs read one pair of seed and offset tensors"
