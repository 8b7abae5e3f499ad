"""trace_memo: a copied call is, op for op and tensor for tensor, the call a trace records.

Each test traces one step twice, with ``CallMemo`` and without (``memo_methods=None``),
and compares every op with its arguments (module tensors by identity, other nodes by
position; the symbolic-size bookkeeping nodes are left out, they differ in count only),
then runs both graphs on the same real tensors: outputs and written buffers equal.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx

from cadence_fx.passes.trace_symbolic import trace_symbolic
from cadence_fx.step import StepSignature

CPU = torch.device("cpu")
SIG = StepSignature(inputs=("x",), regions=("kv",), outputs=("y",))
N = 4


class Block(torch.nn.Module):
    def __init__(self, d: int = 8, scale: float = 0.5):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)
        self.out = torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)
        self.scale = scale

    def forward(self, x, cache):
        h = self.out(torch.relu(self.lin(self.norm(x)))) * self.scale
        return x + h, torch.cat([cache, h], dim=1)


class Counting(Block):
    """Changes its own attribute on every call: never a template."""

    calls = 0

    def forward(self, x, cache):
        self.calls += 1
        x, kv = super().forward(x, cache)
        return x * self.calls, kv


class Net(torch.nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)
        self.register_buffer("buf", torch.zeros(len(blocks), 1, 64, 8))

    def step(self, inputs, state, dims):
        x, caches, keep = inputs["x"], state["kv"], dims["p"]
        new = []
        for _ in range(2):  # every block twice: the same instance again, with other inputs
            for i, b in enumerate(self.blocks):
                x, kv = b(x, caches[i])
                self.buf[i, :, :kv.shape[1]].copy_(kv)
                new.append(kv[:, -keep:])
        return {"y": x}, {"kv": torch.stack(new[-len(self.blocks):])}


def _trace(net: Net, memo: bool):
    def bind(buffers, dims):
        return lambda inputs, state: net.step(inputs, state, dims)
    return trace_symbolic(bind, SIG, {"p": 5}, {"x": ((1, 3, 8), torch.float32)},
                          {"kv": ((len(net.blocks), 1, ("p", 1, 0), 8), torch.float32)}, {}, CPU, [net],
                          ("forward",) if memo else None)


def _ops(gm: fx.GraphModule) -> list:
    """Every tensor op with its arguments: module tensors by identity, nodes by op position."""
    order, rows = {}, []

    def arg(a):
        if isinstance(a, fx.Node):
            if a.op == "get_attr":
                return ("tensor", id(getattr(gm, a.target)))
            if a.op == "placeholder":
                return ("input", a.target)
            return ("op", order[a]) if a in order else ("size", str(a.meta.get("cadence_sym")))
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        return a

    for n in gm.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload) or n.target in (
                torch.ops.aten.sym_size.int,):
            continue
        order[n] = len(rows)
        rows.append((str(n.target), arg(n.args), arg(n.kwargs)))
    return rows


def _run(net: Net, gm: fx.GraphModule, p: int):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8)
    kv = torch.randn(len(net.blocks), 1, p, 8)
    net.buf.zero_()
    out = gm(torch.empty(p, dtype=torch.uint8), x, kv)
    return [o.clone() for o in out], net.buf.clone()


def _check(net: Net, want_copied: int, refused: dict | None = None):
    plain, memo = _trace(net, False), _trace(net, True)
    assert plain.memo["copied"] == 0 and memo.memo["copied"] == want_copied, memo.memo
    if refused is not None:
        assert memo.memo["refused"] == refused
    assert _ops(memo.gm) == _ops(plain.gm)
    for p in (5, 9):
        (a, abuf), (b, bbuf) = _run(net, plain.gm, p), _run(net, memo.gm, p)
        assert all(torch.equal(x, y) for x, y in zip(a, b)) and torch.equal(abuf, bbuf)
    return memo


def test_blocks_of_one_class_are_traced_once():
    torch.manual_seed(0)
    net = Net([Block() for _ in range(N)])
    # block 0 is recorded (with its two Linears and its LayerNorm); blocks 1..3 and the
    # second round copy it, and block 0's second Linear copies its first
    _check(net, want_copied=2 * N - 1 + 1, refused={})


def test_a_different_attribute_or_weight_tying_is_another_key():
    torch.manual_seed(0)
    blocks = [Block(), Block(scale=0.25), Block(), Block()]
    blocks[3].out.weight = blocks[3].lin.weight  # tied: one tensor where block 0 has two
    # recorded: block 0 with its first Linear and its LayerNorm, blocks 1 and 3 (their own keys);
    # copied: block 0's second Linear, blocks 1 and 3's three inner calls, block 2, the second round
    memo = _check(Net(blocks), want_copied=1 + 3 + 1 + 3 + N)
    assert memo.memo["recorded"] == 5


def test_a_call_that_changes_its_module_is_traced_every_time():
    torch.manual_seed(0)
    net = Net([Counting() for _ in range(N)])
    traces = []
    for memo in (False, True):
        for b in net.blocks:
            b.calls = 0
        traces.append(_trace(net, memo))
    plain, memo = traces
    assert set(memo.memo["refused"]) == {"changes its module's attributes or tensors"}
    assert _ops(memo.gm) == _ops(plain.gm)


def test_methods_are_restored_after_the_trace():
    before = (Block.forward, torch.nn.Linear.forward, torch.nn.LayerNorm.forward)
    _trace(Net([Block() for _ in range(2)]), True)
    assert (Block.forward, torch.nn.Linear.forward, torch.nn.LayerNorm.forward) == before


def test_concurrent_traces_take_turns_and_leave_the_classes_as_they_were():
    import threading
    before = (Block.forward, torch.nn.Linear.forward, torch.nn.LayerNorm.forward)
    nets = [Net([Block() for _ in range(2)]) for _ in range(2)]
    results: dict = {}

    def run(i):
        results[i] = _trace(nets[i], True)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[i].memo["copied"] > 0 for i in range(2))
    for i in range(2):
        assert _ops(results[i].gm) == _ops(_trace(nets[i], False).gm)
    assert (Block.forward, torch.nn.Linear.forward, torch.nn.LayerNorm.forward) == before


@pytest.mark.parametrize("bad", ["resize"])
def test_metadata_mutation_refuses_the_template(bad):
    class Resizing(Block):
        def forward(self, x, cache):
            y, kv = super().forward(x, cache)
            y = y.clone()
            y.unsqueeze_(0)
            return y.squeeze(0), kv

    net = Net([Resizing() for _ in range(2)])
    memo = _trace(net, True)
    assert any("metadata in place" in r for r in memo.memo["refused"]), memo.memo
    assert _ops(memo.gm) == _ops(_trace(net, False).gm)
