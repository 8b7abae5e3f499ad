"""istft_check: ``aten.istft`` replaced by the ops it dispatches, minus its host read.

Each test runs the rewritten graph against eager ``torch.istft`` on fresh inputs and
requires every bit equal; a case the pass cannot prove keeps the op, with the reason.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from cadence_fx.passes.fold_host_constants import FoldHostConstants
from cadence_fx.passes.istft_check import HOST_READS, IstftWithoutHostRead
from cadence_fx.passes.partition import Partition

WINDOW = torch.hann_window(16)


def trace(fn, *args) -> fx.GraphModule:
    with torch.no_grad():
        return make_fx(fn, pre_dispatch=True)(*args)


def spectrum(frames: int = 20, seed: int = 0, batch: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 9, frames, generator=g), torch.randn(batch, 9, frames, generator=g)


def hift_like(re, im):
    """HiFT's ``_istft``: clip, polar to complex, istft with a constant Hann window."""
    mag = torch.clip(re.abs(), max=1e2)
    return torch.istft(torch.complex(mag * torch.cos(im), mag * torch.sin(im)), 16, 4, 16, window=WINDOW)


def ops(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_istft_becomes_its_own_ops_without_the_host_read_and_stays_exact():
    gm = trace(hift_like, *spectrum())
    result = IstftWithoutHostRead()(gm)
    assert result.modified and str(result.record) == "1 istft without host read"
    names = ops(gm)
    assert "aten.istft.default" not in names and not any(str(t) in names for t in HOST_READS)
    assert "aten._fft_c2r.default" in names
    for seed, frames in ((1, 20), (2, 20)):  # the shapes it was traced at, new values
        x = spectrum(frames, seed)
        with torch.no_grad():
            assert torch.equal(gm(*x), hift_like(*x))
    # no host read left: the whole step is one capturable region
    record = Partition("cpu")(gm).record
    assert str(record) == "1 region (1 capturable, 0 eager); eager nodes: []"


def test_the_rewrite_leaves_every_other_node_as_it_was():
    """Only the istft is replaced (and what it alone used erased): a draw nobody reads, an
    op nobody reads, stay where they were (removing them is ``prune_dead``'s call, by its
    own rule; a dropped draw would shift every later random number)."""
    def step(re, im):
        torch.rand(3)  # a draw nobody reads: the generator still advances
        return hift_like(re, im)

    gm = trace(step, *spectrum())
    dead = gm.graph.call_function(torch.ops.aten.mul.Tensor, (next(iter(gm.graph.nodes)), 2.0))
    others = [n for n in gm.graph.nodes if n.target is not torch.ops.aten.istft.default]
    assert IstftWithoutHostRead()(gm).modified
    assert all(n.graph is gm.graph and not getattr(n, "_erased", False) for n in others)
    assert dead in set(gm.graph.nodes) and "aten.rand.default" in ops(gm)
    assert "aten.istft.default" not in ops(gm)


def test_under_inference_mode_too():
    """The drop-ins compile under ``torch.inference_mode``, where a composite op reaches a
    dispatch mode whole: the recording must still see istft's own ops."""
    gm = trace(hift_like, *spectrum())
    with torch.inference_mode():  # the window constant as a compile in inference mode folds it
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                setattr(gm, node.target, getattr(gm, node.target).clone())
        record = IstftWithoutHostRead()(gm).record
        x = spectrum(seed=4)
        assert torch.equal(gm(*x), hift_like(*x))
    assert record.rewritten == 1 and "aten.istft.default" not in ops(gm), record
    assert str(Partition("cpu")(gm).record) == "1 region (1 capturable, 0 eager); eager nodes: []"


def test_the_pinned_printout_on_this_torch():
    gm = trace(lambda z: torch.istft(z, 16, 4, 16, window=WINDOW), torch.complex(*spectrum()))
    IstftWithoutHostRead()(gm)
    if torch.__version__.startswith("2.13"):
        assert ops(gm) == [
            "aten.view_as_real.default", "aten.transpose.int", "aten.view_as_complex.default",
            "aten._fft_c2r.default", "aten.view.default", "aten.mul.Tensor", "aten.unfold_backward.default",
            "aten.pow.Tensor_Scalar", "aten.expand.default", "aten.unfold_backward.default", "aten.slice.Tensor",
            "aten.slice.Tensor", "aten.div.Tensor"]


def test_what_it_cannot_prove_stays_istft_with_the_reason():
    # a window computed from the input: the envelope could change per call
    gm = trace(lambda z, w: torch.istft(z, 16, 4, 16, window=w * 1.0), torch.complex(*spectrum()), WINDOW)
    record = IstftWithoutHostRead()(gm).record
    assert record.rewritten == 0 and "not a constant" in record.kept[0]
    # a window whose envelope is zero somewhere (NOLA fails): istft raises on every call; keep it
    bad = torch.zeros(16)
    gm = trace(lambda z: torch.istft(z, 16, 4, 16, window=bad), torch.complex(*spectrum()))
    FoldHostConstants()(gm)
    record = IstftWithoutHostRead()(gm).record
    assert record.rewritten == 0 and "istft raised" in record.kept[0], record
    assert "aten.istft.default" in ops(gm)


def test_other_istft_arguments_and_batch_sizes_stay_exact():
    cases = [dict(center=False), dict(length=70), dict(normalized=True), dict(center=True, length=81)]
    window = torch.hann_window(16) * 0.9 + 0.1  # nonzero at the edges: NOLA holds without centering too

    def make(kw):
        return lambda z: torch.istft(z, 16, 4, 16, window=window, **kw)

    for i, kw in enumerate(cases):
        fn = make(kw)
        z = torch.complex(*spectrum(22, seed=i, batch=2))
        gm = trace(fn, z)
        assert IstftWithoutHostRead()(gm).modified, kw
        z2 = torch.complex(*spectrum(22, seed=10 + i, batch=2))
        with torch.no_grad():
            assert torch.equal(gm(z2), fn(z2)), kw


def test_a_recording_is_reused_at_the_same_window_and_shapes_and_made_again_when_the_window_changes(monkeypatch):
    """A new prompt length hands the pass the same istft (the same window constant, signal
    layout and arguments) in a new graph: the checked recording is reused, not recorded
    and checked again; a window written in place is recorded again, so a window whose
    envelope now fails keeps the op (it raises, as stock's does), never a stale recording."""
    import copy

    from cadence_fx.passes import istft_check
    recorded = []
    real = istft_check.record_istft
    monkeypatch.setattr(istft_check, "record_istft", lambda *a: recorded.append(1) or real(*a))
    window = torch.hann_window(16) * 0.8 + 0.2  # this test's own window: no other test's recording

    def fn(z):
        return torch.istft(z, 16, 4, 16, window=window)

    gm = trace(fn, torch.complex(*spectrum(20)))

    def twin() -> fx.GraphModule:  # another graph over the same constants, as specialize makes per length
        return fx.GraphModule(gm, copy.deepcopy(gm.graph))

    first, second = twin(), twin()
    assert IstftWithoutHostRead()(first).modified and len(recorded) == 1
    assert IstftWithoutHostRead()(second).modified and len(recorded) == 1
    assert ops(first) == ops(second)
    z = torch.complex(*spectrum(20, seed=5))
    with torch.no_grad():
        assert torch.equal(second(z), fn(z))
    (const,) = {getattr(gm, n.target) for n in gm.graph.nodes
                if n.op == "get_attr" and any(u.target is torch.ops.aten.istft.default for u in n.users)}
    const.zero_()  # the envelope is zero now: istft raises on every call
    third = twin()
    record = IstftWithoutHostRead()(third).record
    assert len(recorded) == 2 and record.rewritten == 0 and "istft raised" in record.kept[0], record
