"""Property: the admission checks never admit a signature that differs from the one
captured/cataloged (shape, stride, dtype, device, or, for memory bound by address,
the address).  Random signatures thrown at both gates (the session's entry gate and
a captured region's per-replay check)."""

from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cadence_fx.plan import TensorSpec
from cadence_fx.plan.catalog import CatalogEntry
from cadence_fx.plan.layout import ArenaLayout, RegionSlot
from cadence_fx.runtime.arena import Arena
from cadence_fx.runtime.graphs import ArgSpec, CapturedRegion
from cadence_fx.runtime.gate import AdmissionGate

DTYPES = [torch.float32, torch.float16, torch.int32, torch.int64]


def make(shape, dtype, device, layout):
    """A tensor of exactly ``shape`` with the given layout (same shape, other strides)."""
    if layout == "transposed" and len(shape) >= 2:
        return torch.zeros((shape[1], shape[0]) + tuple(shape[2:]), dtype=dtype, device=device).transpose(0, 1)
    if layout == "strided":
        return torch.zeros(tuple(shape[:-1]) + (shape[-1] * 2,), dtype=dtype, device=device)[..., ::2]
    return torch.zeros(shape, dtype=dtype, device=device)


@st.composite
def signature_pairs(draw):
    """(captured, live): live is the same signature or differs in exactly one field."""
    rank = draw(st.integers(2, 3))
    shape = tuple(draw(st.integers(1, 4)) for _ in range(rank))
    dtype = draw(st.sampled_from(DTYPES))
    device = draw(st.sampled_from(["cpu", "meta"]))
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    captured = make(shape, dtype, device, layout)
    change = draw(st.sampled_from(["none", "shape", "stride", "dtype", "device"]))
    if change == "shape":
        shape = shape[:-1] + (shape[-1] + 1,)
    elif change == "stride":
        layout = draw(st.sampled_from([x for x in ("contiguous", "transposed", "strided") if x != layout]))
    elif change == "dtype":
        dtype = draw(st.sampled_from([d for d in DTYPES if d != dtype]))
    elif change == "device":
        device = "meta" if device == "cpu" else "cpu"
    live = make(shape, dtype, device, layout)
    return captured, live


def spec_of(t: torch.Tensor) -> TensorSpec:
    return TensorSpec(tuple(t.shape), str(t.dtype).removeprefix("torch."), tuple(t.stride()), str(t.device))


def element_offsets(t: torch.Tensor) -> list[int]:
    """Where each element lives, relative to the first: what a kernel reads."""
    return [sum(i * s for i, s in zip(idx, t.stride())) for idx in itertools.product(*map(range, t.shape))]


def same_signature(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype, device and the same element offsets (a size-1 dim's stride is
    free: it never moves an address)."""
    return (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
            and element_offsets(a) == element_offsets(b))


def entry_with(input_spec: TensorSpec, region_extent: int) -> CatalogEntry:
    region = TensorSpec.contiguous((2, region_extent), "float32", "cpu")
    return CatalogEntry(0, 0, (0,), {"kv": region}, {"x": input_spec})


ARENA = Arena(ArenaLayout((RegionSlot("kv", 0, (2, 8), "float32", 64, 1, 8),), 512, 512), "cpu")


@settings(max_examples=300, deadline=None)
@given(pair=signature_pairs(), cat_extent=st.integers(0, 8), live_extent=st.integers(0, 8))
def test_entry_gate_admits_exactly_the_cataloged_signature(pair, cat_extent, live_extent):
    catalog, live = pair
    gate = AdmissionGate(ARENA)
    reason = gate.check(entry_with(spec_of(catalog), cat_extent), {"x": live}, {"kv": live_extent})
    admitted = reason is None
    assert admitted == (same_signature(catalog, live) and cat_extent == live_extent), reason


@settings(max_examples=300, deadline=None)
@given(pair=signature_pairs(), bound=st.booleans(), same_memory=st.booleans())
def test_region_replays_only_on_its_captured_signature(pair, bound, same_memory):
    captured, live = pair
    if same_memory:
        live = captured
    region = CapturedRegion(torch.nn.Identity(), [bound], name="r")
    region.graph = object()  # stands in for a captured graph: check() runs before any replay
    region.specs = (ArgSpec.of(captured, bound),)
    reason = region.check((live,))
    admitted = reason is None
    expect = same_signature(captured, live)
    if bound and captured.device.type != "meta":
        expect = expect and live.data_ptr() == captured.data_ptr()
    assert admitted == expect, reason


def test_a_size_one_dims_stride_is_free_and_a_real_stride_is_not():
    spec = TensorSpec.contiguous((1, 28), "int32", "cpu")
    gate = AdmissionGate(ARENA)
    row = torch.zeros(4, 28, dtype=torch.int32)[2:3]
    assert row.stride() == (28, 1) and row.storage_offset() == 56
    column_as_row = torch.zeros(28, 4, dtype=torch.int32)[:, 1:2].t()  # shape (1, 28), stride (1, 4)
    assert gate.check(entry_with(spec, 0), {"x": row}, {"kv": 0}) is None
    assert gate.check(entry_with(spec, 0), {"x": torch.zeros(28, 1, dtype=torch.int32).t()}, {"kv": 0}) is None
    assert gate.check(entry_with(spec, 0), {"x": column_as_row}, {"kv": 0}) == \
        "input 'x' stride (1, 4) != catalog (28, 1)"

