"""istft_check: ``aten.istft`` without its per-call host read, when the read cannot change.

``aten.istft`` checks the window envelope (the NOLA condition) on every call with a
host read of a device value (``aten.equal``), so it cannot sit inside a CUDA graph and
splits a replayed chunk in two around an eager island.  The envelope depends only on
the window and the shapes, which are constants of a traced entry, so the read's
answer is the same on every call.

For each ``istft`` whose window is a constant of the graph, the pass records what
``aten.istft`` dispatches on this torch version at the node's shapes, dtypes and
device (the composite's own ops, so the same kernels and bits); requires that every
host read in it depends on the window and the shapes only (never on the signal) and
that the recorded sequence, with those reads removed, equals ``istft`` bit for bit
on two random signals; then replaces the node with that sequence.  Anything else
(a computed window, an op it cannot record, a read that depends on the signal, a
bit that differs, the NOLA condition failing) leaves the node as it is, with the
reason in the record (fail closed: it then stays an eager island).  The checked
recording (or the reason) is kept per window tensor and reused where the window's values,
the signal's layout and the other arguments are the same (``_RECORDED``): a new prompt
length changes none of them, so its build records and checks nothing again.

Graph printout (``tests/passes/test_passes.py`` pins it on torch 2.13, CPU)::

    istft = aten.istft(x, 16, 4, 16, window)          ->   view_as_real, transpose, view_as_complex,
                                                            _fft_c2r, view(window), mul, unfold_backward,
                                                            pow(window, 2), expand, unfold_backward,
                                                            slice, slice, div
"""

from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from .base import CadencePass, PassResult, has_side_effect

aten = torch.ops.aten
#: ops that read a device value on the host (the pass drops them only where the signal cannot reach them)
HOST_READS = {aten.equal.default, aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default,
              aten.allclose.default}


class _Unrecordable(Exception):
    pass


class _Recorder(TorchDispatchMode):
    """Records each dispatched op into ``graph`` (tensors mapped to nodes by identity)."""

    def __init__(self, graph: fx.Graph, nodes: dict[int, fx.Node], signal: set[fx.Node]):
        super().__init__()
        self.graph, self.nodes, self.signal = graph, nodes, signal
        self.keep: list[torch.Tensor] = []  # every recorded tensor stays alive (ids stay unique)
        self.reads: list[tuple[fx.Node, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)

        def arg(a):
            if isinstance(a, torch.Tensor):
                if id(a) not in self.nodes:
                    raise _Unrecordable(f"{func} reads a tensor the recording did not produce")
                return self.nodes[id(a)]
            if isinstance(a, (list, tuple)):
                return type(a)(arg(x) for x in a)
            return a

        node = self.graph.call_function(func, arg(tuple(args)), {k: arg(v) for k, v in kwargs.items()})
        from_signal = any(i in self.signal for i in node.all_input_nodes)
        if from_signal:
            self.signal.add(node)
        if func in HOST_READS:
            self.reads.append((node, from_signal))
            return out
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for i, t in enumerate(outs):
            if isinstance(t, torch.Tensor):
                n = node if not isinstance(out, (tuple, list)) else self.graph.call_function(
                    operator.getitem, (node, i))
                if from_signal:
                    self.signal.add(n)
                self.nodes[id(t)] = n
                self.keep.append(t)
            elif t is not None and isinstance(out, (tuple, list)):
                raise _Unrecordable(f"{func} returns a {type(t).__name__}")
        return out


def record_istft(x: torch.Tensor, window: torch.Tensor, call) -> tuple[fx.Graph, str | None]:
    """(the graph ``call(x, window)`` (an ``aten.istft``) dispatches, with its host reads
    removed; placeholders ``x`` and ``window``), or (None, why not)."""
    graph = fx.Graph()
    px, pw = graph.placeholder("x"), graph.placeholder("window")
    # outside inference mode, on tensors made there: a tensor made in inference mode has no
    # autograd keys, and without them a composite op reaches the mode whole (it decomposes at
    # those keys), its host read hidden inside it.  The drop-ins compile in inference mode.
    with torch.inference_mode(False):
        x, window = x.clone(), window.clone()
        rec = _Recorder(graph, {id(x): px, id(window): pw}, {px})
        try:
            with torch.no_grad(), rec:
                out = call(x, window)
        except _Unrecordable as e:
            return None, str(e)
        except RuntimeError as e:  # e.g. the NOLA condition fails: the op raises on every call
            return None, f"istft raised at these shapes: {str(e).splitlines()[0]}"
    if not isinstance(out, torch.Tensor) or id(out) not in rec.nodes:
        return None, "istft's output is not one recorded tensor"
    bad = [n.target for n, from_signal in rec.reads if from_signal]
    if bad:
        return None, f"a host read depends on the signal: {bad}"
    graph.output(rec.nodes[id(out)])
    for n, _ in rec.reads:  # their answers only decided whether istft raises: it did not
        if not n.users:
            graph.erase_node(n)
    graph.eliminate_dead_code()
    if any(n.target in HOST_READS or n.target is aten.istft.default for n in graph.nodes):
        return None, "istft did not decompose into ops without a host read"
    return graph, None


@dataclasses.dataclass(frozen=True)
class IstftRecord:
    rewritten: int
    kept: tuple[str, ...]  # why each istft left as it was

    def __str__(self) -> str:
        return f"{self.rewritten} istft without host read" + (f"; kept: {list(self.kept)}" if self.kept else "")


class IstftWithoutHostRead(CadencePass):
    """requires: a lint-clean graph.  ensures: lint only; each replacement is checked where
    it is made (no host read left in it, and equal to istft bit for bit on two signals)."""

    name = "istft_check"

    def call(self, gm: fx.GraphModule) -> PassResult:
        kept, done = [], 0
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target is not aten.istft.default:
                continue
            why = self._rewrite(gm, node)
            if why is None:
                done += 1
            else:
                kept.append(f"{node.name}: {why}")
        return PassResult(gm, bool(done), IstftRecord(done, tuple(kept)))

    @staticmethod
    def _rewrite(gm: fx.GraphModule, node: fx.Node) -> str | None:
        x_node, rest = node.args[0], list(node.args[1:])
        kwargs = dict(node.kwargs)
        where = 3 if len(rest) >= 4 else None  # (n_fft, hop, win_length, window, ...) or window=
        window_node = rest[3] if where is not None else kwargs.get("window")
        if not isinstance(window_node, fx.Node) or window_node.op != "get_attr":
            return "the window is not a constant of the graph"
        window = getattr(gm, window_node.target)
        fake = x_node.meta.get("val") if isinstance(x_node, fx.Node) else None
        if not isinstance(fake, torch.Tensor) or not isinstance(window, torch.Tensor):
            return "no tensor metadata for the signal"
        others = [a for i, a in enumerate(rest) if i != where] + [v for k, v in kwargs.items() if k != "window"]
        if any(isinstance(a, fx.Node) for a in others):
            return "a size argument is computed in the graph"

        key = (tuple(fake.shape), tuple(fake.stride()), fake.dtype, str(fake.device),
               tuple(window.shape), tuple(window.stride()), window.dtype, str(window.device),
               tuple(a for i, a in enumerate(rest) if i != where), tuple(sorted(
                   (k, v) for k, v in kwargs.items() if k != "window")),
               torch.are_deterministic_algorithms_enabled())
        try:
            hash(key)
        except TypeError:  # an argument that cannot be a key: recorded and checked each time
            graph, why = _recorded(fake, window, rest, kwargs, where)
        else:
            memo = _RECORDED.setdefault(window, {})
            hit = memo.get(key)
            if hit is None or not torch.equal(hit[0], window):  # its values as recorded (one host read)
                hit = memo[key] = (window.clone(), *_recorded(fake, window, rest, kwargs, where))
            _, graph, why = hit
        if why is not None:
            return why
        before = set(gm.graph.nodes)
        with gm.graph.inserting_before(node):
            out = gm.graph.graph_copy(graph, {p: a for p, a in zip(
                [n for n in graph.nodes if n.op == "placeholder"], (x_node, window_node))})
        mode = getattr(fake, "fake_mode", None)
        for n in [n for n in gm.graph.nodes if n not in before]:  # the copies, in graph order
            n.meta.update({k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")})
            if mode is not None and "val" not in n.meta:
                n.meta["val"] = _fake_of(n, gm, mode)
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        _erase_if_dead((x_node, window_node), gm.graph)
        return None


#: window tensor -> {the signal's layout, the window's layout, the other arguments, the
#: deterministic flag: (the window's values then, the checked recording, None) or (the
#: values, None, why not)}.  What ``_recorded`` makes from these is the same every time
#: (its signals are seeded), so a new prompt length, which changes none of them, reuses
#: it; another window, or this one written in place since (its values compared: an
#: inference tensor has no version counter), is recorded and checked again.
_RECORDED: "WeakIdKeyDictionary" = WeakIdKeyDictionary()


def _recorded(fake, window: torch.Tensor, rest: list, kwargs: dict, where) -> tuple:
    """(the recording of ``aten.istft`` at these arguments, checked bit for bit against it
    on two seeded random signals, None), or (None, why it cannot replace the op)."""
    def call(x, w):
        a, k = list(rest), dict(kwargs)
        if where is not None:
            a[where] = w
        else:
            k["window"] = w
        return aten.istft.default(x, *a, **k)

    gen = torch.Generator(device="cpu").manual_seed(0)

    def signal():
        real = torch.randn(fake.shape, generator=gen, dtype=torch.float64)
        imag = torch.randn(fake.shape, generator=gen, dtype=torch.float64)
        z = torch.complex(real, imag) if fake.is_complex() else real
        return z.to(dtype=fake.dtype, device=fake.device)

    x = signal()
    graph, why = record_istft(x, window, call)
    if why is not None:
        return None, why
    sub = fx.GraphModule(torch.nn.Module(), graph)
    for _ in range(2):  # same kernels, so the same bits: check it on fresh signals
        s = signal()
        with torch.no_grad():
            want = call(s, window)
            got = sub(s, window)
        if not (got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)):
            return None, "the recorded ops differ from istft in some bit"
    return graph, None


def _erase_if_dead(nodes, graph: fx.Graph) -> None:
    """Erase what the replaced istft alone used (by ``prune_dead``'s rule: never a node
    with an effect), and what that alone used: the rest of the graph is as the earlier
    passes left it, so nothing else becomes dead (a whole-graph dead-code elimination
    costs a second per length and follows each torch release's notion of impure)."""
    todo, erased = [n for n in nodes if isinstance(n, fx.Node)], set()
    while todo:
        n = todo.pop()
        if n not in erased and not n.users and not has_side_effect(n):
            todo.extend(n.all_input_nodes)
            graph.erase_node(n)
            erased.add(n)


def _fake_of(node: fx.Node, gm: fx.GraphModule, mode):
    """The node's value under the graph's fake mode (metadata for the later passes)."""
    def val(a):
        if isinstance(a, fx.Node):
            if a.op == "get_attr":
                return mode.from_tensor(getattr(gm, a.target))
            return a.meta["val"]
        return a
    with mode:
        return node.target(*fx.node.map_arg(node.args, val), **fx.node.map_arg(node.kwargs, val))
