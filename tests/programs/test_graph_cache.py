"""Capacity graphs on disk (``cadence_fx.capacity_build``), on a toy step.

The toy keeps its state in the arena (the read of the old state's last four frames comes
before the buffer's write) and multiplies its output by a constant made of a module buffer
(``table.cos().sum()``), which ``FoldHostConstants`` folds into the graph.  A graph stored by
one model is loaded by another of other buffer values: its folded constant is that model's
own (computed again from the recipe, never stored), and the loaded graph runs bit-equal to
that model's own build.  A damaged file is rejected with its reason and built again; another
capacity, another thread count, another attention setting are other keys.
"""

from __future__ import annotations

import pickle
import types

import pytest
import torch

from cadence_fx import capacity_build as cb
from cadence_fx import step as meta
from cadence_fx.passes import capacity as cap
from cadence_fx.passes.state_rewrite import RegionBinding
from cadence_fx.passes.trace_symbolic import trace_symbolic
from cadence_fx.programs.disk import MAGIC, DiskCache
from cadence_fx.step import StepSignature

CPU = torch.device("cpu")
F32 = torch.float32
DIMS = {"p": 40}
SLOT = (1, 48)


class Owner:
    """What the cache's key and binding read of an adapter: its modules, identity, declaration."""

    device = "cpu"
    declaration = types.SimpleNamespace(to_json=lambda: {"regions": ["c"]})

    def __init__(self, seed: int):
        self.m = torch.nn.Module()
        self.m.register_buffer("table", torch.randn(16, generator=torch.Generator().manual_seed(seed)))

    def modules(self) -> dict:
        return {"toy": self.m}

    def cache_identity(self) -> str:
        return "toy 1"


def symbolic(owner: Owner):
    def bind(buffers, dims=None):
        buf = buffers["buf"]

        def step(inputs, state):
            y = state["c"][:, -4:] * owner.m.table.cos().sum()  # the old state's tail, read first
            buf[:, 4:8].copy_(inputs["x"])
            return {"y": y}, {"c": buf[:, :state["c"].shape[1]]}
        return step
    return trace_symbolic(bind, StepSignature(("x",), ("c",), ("y",)), {"p": 12}, {"x": ((1, 4), F32)},
                          {"c": ((1, ("p", 1, 0)), F32)}, {"c": ((1, ("p", 1, 8)), F32, ("buf",))}, CPU)


def graph(owner: Owner, disk=None, dims=DIMS, masked=False, run=True):
    arena = torch.zeros(SLOT)
    programs = types.SimpleNamespace(disk=disk)
    bindings = lambda g: [RegionBinding("c", SLOT, "float32", 1, dims["p"], dims["p"], True)]  # noqa: E731
    return cb.capacity_graph(owner, symbolic(owner), dims, {}, {"c": arena}, masked, CPU, [torch.ones(1, 4)],
                             bindings, programs, "toy", run=run)


def run(gm, p: int = 40) -> torch.Tensor:
    arena = torch.arange(SLOT[1], dtype=F32).reshape(SLOT)
    with cap.at_dims({"p": p}):
        (y,) = gm(torch.ones(1, 4), torch.tensor(p), arena)
    return y


def test_a_graph_stored_by_one_model_is_loaded_by_another_with_its_own_folded_constants(tmp_path):
    disk = DiskCache(tmp_path)
    a, b = Owner(1), Owner(2)
    gm_a, plan_a, _, how = graph(a, disk)
    assert how == "built" and disk.counts["writes"] == 1
    assert any(meta.role(n) is meta.Role.FOLDED for n in gm_a.graph.nodes)  # the table's constant: folded
    gm_b, plan_b, bound, how = graph(b, disk)
    assert how == "loaded from disk" and disk.counts["hits"] == 1 and disk.counts["writes"] == 1
    own, _, _, how = graph(b)  # b's own build, no disk
    assert how == "built"
    assert torch.equal(run(gm_b), run(own)) and not torch.equal(run(gm_b), run(gm_a))  # b's table, not a's
    assert plan_b == plan_a and set(bound.dims) == {"p"}
    assert gm_b.meta[meta.ARENA_INPUTS] == own.meta[meta.ARENA_INPUTS]
    # for a replay (run=False) no code is generated: calling it raises, a lowered copy runs as b's own
    from cadence_fx.compiler import lowered_copy
    lazy = graph(b, disk, run=False)[0]
    with pytest.raises(RuntimeError, match="recompile"):
        run(lazy)
    assert torch.equal(run(lowered_copy(lazy, "SRc", "cpu")), run(lowered_copy(own, "SRc", "cpu")))
    # no folded value is on disk: the graph names it, the recipe makes it
    (path,) = tmp_path.glob("*.cfx")
    record = pickle.loads(path.read_bytes()[len(MAGIC):].partition(b"\n")[2])
    kinds = {a: spec[0] for a, spec in record["graph"]["attrs"].items()}
    assert "given" in kinds.values() and "value" not in kinds.values(), kinds
    assert [spec[:2] for spec in record["folds"][0]["attrs"].values()] == [("param", "toy.table")]


def test_a_damaged_file_is_rejected_with_its_reason_and_built_again(tmp_path):
    disk = DiskCache(tmp_path)
    said = []
    disk.progress = said.append
    graph(Owner(1), disk)
    (path,) = tmp_path.glob("*.cfx")
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    gm, _, _, how = graph(Owner(1), disk)
    assert how == "built" and disk.counts["rejected"] == 1 and "SHA-256 mismatch" in disk.last_rejection
    assert any("rejected" in s and s.endswith("building it again") for s in said), said
    assert torch.equal(run(gm), run(graph(Owner(1))[0]))
    assert graph(Owner(1), disk)[3] == "loaded from disk"  # written again, whole


def test_another_capacity_thread_count_or_attention_setting_is_another_key(tmp_path):
    owner = Owner(1)
    sym = symbolic(owner)
    arena = {"c": torch.zeros(SLOT)}

    def parts(dims=DIMS, masked=False):
        return cb.graph_parts(owner, sym, dims, {}, arena, masked, CPU, [torch.ones(1, 4)], "toy")
    base = parts()
    assert parts() == base
    assert parts({"p": 36}) != base and parts(masked=True) != base and parts(masked="probe") != base
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)  # the CPU's bits depend on it: another key
        assert parts() != base
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(cb.Unserializable, match="probe of the caller's own"):
        parts(masked=lambda *a: True)
