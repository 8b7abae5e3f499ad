"""A ``SymbolicStep`` (or any graph: ``encode_graph``) as plain data (what ``DiskCache``
pickles), and back onto live modules.

What is kept of the graph: every node's op, name, target, args and kwargs (node
references as ``Ref``), and of its meta only ``step.TAG`` (the role as its string),
``step.SCOPE`` and ``step.SYM`` (``encode_graph``'s ``keys``: a capacity graph's add the
capacity modes and ``"val"``, each recorded value as its layout, a fake tensor again on
load); a step's ``step.SIGNATURE`` and ``step.DEVICE``, and its content digest
(``step_digest``: a canonical text, the key of the capacity graphs made from it).  Targets are stored by name, never by pickling the callable:

- an ``OpOverload`` as ``("op", namespace, op, overload)``, resolved through ``torch.ops``;
- a Python callable (``operator.getitem``, ``torch._C._set_grad_enabled``, the autocast
  enter/exit functions...) as ``("py", module, qualname, kind)``, resolved by import and
  checked to be an object of the same kind (type name).

A ``get_attr`` constant that *is* (identity) a parameter, buffer or plain tensor
attribute of the adapter's ``modules()`` is stored as its path and bound, on load, to the live model's tensor at
that path (same shape, dtype and device, else the entry is rejected): weights are never
copied to disk, and a model with other weights of the same shapes replays its own.
Any other tensor constant (e.g. a window the step holds outside its modules) is
stored by value.  ``decode_step`` raises ``Rejected`` (one line: why) on anything it
cannot rebuild exactly; ``encode_step`` raises ``Unserializable``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import io
import operator
import weakref
from typing import Any, Callable, Mapping

import torch
import torch.fx as fx

from ..errors import CadenceError
from .. import step as meta
from ..passes.base import add_node, fake_tensor, lazy_graph_module_class
from ..passes.specialize import module_without_code
from ..passes.trace_symbolic import SymbolicStep
from ..step import Role

_META_KEYS = (meta.TAG, meta.SCOPE, meta.SYM)


class Rejected(CadenceError):
    """A stored entry that cannot serve this model (the message says why, in one line)."""


class ModuleTensorDiffers(Rejected):
    """A constant's module tensor is at its path but at another shape, dtype or device
    (e.g. a table the model moves to its device on first use, not used yet)."""


class Unserializable(CadenceError):
    """A symbolic step holding something the cache does not store (it is simply not cached)."""


@dataclasses.dataclass(frozen=True)
class Ref:
    """An argument that is the graph node named ``name``."""

    name: str


def tensor_paths(modules: Mapping[str, torch.nn.Module]) -> dict[str, torch.Tensor]:
    """``"<module name>.<path>"`` -> tensor, for every parameter, buffer and plain tensor
    attribute (e.g. a positional-encoding table kept as ``self.pe``) of ``modules``."""
    out = {}
    for prefix, module in modules.items():
        for path, t in module.named_parameters(remove_duplicate=False):
            out[f"{prefix}.{path}"] = t
        for path, t in module.named_buffers(remove_duplicate=False):
            out.setdefault(f"{prefix}.{path}", t)
        for path, sub in module.named_modules(remove_duplicate=False):
            for name, t in vars(sub).items():
                if isinstance(t, torch.Tensor):
                    out.setdefault(".".join(p for p in (prefix, path, name) if p), t)
    return out


# ------------------------------------------------------------------ encode
def encode_step(step: SymbolicStep, modules: Mapping[str, torch.nn.Module], digest: bool = True) -> dict[str, Any]:
    """``step`` as plain picklable data; parameters/buffers of ``modules`` by path; ``digest``:
    with its ``step_digest`` (made now if not yet)."""
    record = encode_graph(step.gm, modules)
    gm_meta = step.gm.meta
    record = {**record, "signature": gm_meta[meta.SIGNATURE], "device": gm_meta[meta.DEVICE],
              "dims": dict(step.dims), "symbols": dict(step.symbols), "placeholders": tuple(step.placeholders),
              "guards": tuple(step.guards), "buffer_regions": tuple(step.buffer_regions), "trace_s": step.trace_s,
              "memo": dict(step.memo)}
    if digest:
        hit = _STEP_DIGESTS.get(step.gm)
        record["digest"] = hit if hit is not None else _STEP_DIGESTS.setdefault(step.gm, _digest(record))
    return record


def encode_graph(gm: fx.GraphModule, modules: Mapping[str, torch.nn.Module], keys: tuple = _META_KEYS,
                 by_id: "Mapping[int, str] | None" = None, given: tuple = ()) -> dict[str, Any]:
    """``gm``'s nodes (of their meta, ``keys``; ``"val"``, the recorded value, as sizes,
    strides, offsets, dtypes and devices) and ``get_attr`` constants (module tensors by path)
    as plain picklable data.  ``by_id``: ``id(tensor) -> path`` of ``modules``, where the caller
    has it already; ``given``: constants not stored at all (``decode_graph``'s caller gives them)."""
    if by_id is None:
        by_id = {}
        for path, t in tensor_paths(modules).items():
            by_id.setdefault(id(t), path)
    attrs, nodes = {}, []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            raise Unserializable(f"node {node.name} calls a submodule ({node.target})")
        if node.op == "get_attr":
            attrs[node.target] = ("given",) if node.target in given else _encode_attr(gm, node.target, by_id)
        nodes.append((node.op, node.name, _encode_target(node), _encode_arg(node.args), _encode_arg(node.kwargs),
                      _encode_meta(node, keys)))
    return {"nodes": nodes, "attrs": attrs}


def _encode_attr(gm: fx.GraphModule, target: str, by_id: Mapping[int, str]) -> tuple:
    value = operator.attrgetter(target)(gm)
    if not isinstance(value, torch.Tensor):
        raise Unserializable(f"get_attr {target} is a {type(value).__name__}, not a tensor")
    path = by_id.get(id(value))
    if path is not None:
        return ("param", path, tuple(value.shape), str(value.dtype), str(value.device))
    buf = io.BytesIO()
    torch.save(value.detach().to("cpu"), buf)
    return ("value", buf.getvalue(), str(value.device))


def _encode_target(node: fx.Node) -> tuple:
    t = node.target
    if node.op != "call_function":
        return ("str", t)
    if isinstance(t, torch._ops.OpOverload):
        return ("op", t.namespace, t._opname, t._overloadname)
    module, qualname = getattr(t, "__module__", None), getattr(t, "__qualname__", None)
    if module is None or qualname is None or "<" in qualname:
        raise Unserializable(f"node {node.name} calls {t!r}, which has no importable name")
    try:
        found = _resolve(module, qualname)
    except (ImportError, AttributeError) as e:
        raise Unserializable(f"node {node.name} calls {module}.{qualname}, which does not resolve ({e})") from e
    if found is not t:
        raise Unserializable(f"node {node.name} calls {t!r}; {module}.{qualname} is another object")
    return ("py", module, qualname, type(t).__qualname__)


def _encode_arg(a):
    if isinstance(a, fx.Node):
        return Ref(a.name)
    if isinstance(a, (tuple, list)):
        out = [_encode_arg(x) for x in a]
        return tuple(out) if isinstance(a, tuple) else out
    if isinstance(a, dict):
        return {k: _encode_arg(v) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(_encode_arg(a.start), _encode_arg(a.stop), _encode_arg(a.step))
    if a is None or isinstance(a, (bool, int, float, complex, str, torch.dtype, torch.device, torch.layout,
                                   torch.memory_format)):
        return a
    raise Unserializable(f"an argument of type {type(a).__name__} ({a!r:.60})")


def _encode_meta(node: fx.Node, keys: tuple) -> dict:
    out = {}
    for k in keys:
        if k not in node.meta:
            continue
        v = node.meta[k]
        if k == "val":
            v = _encode_value(v, node)
        elif k == meta.TAG:
            v = dict(v)
            v["role"] = Role(v["role"]).value
        out[k] = v
    return out


def _encode_value(v, node: fx.Node):
    """A recorded value (``meta["val"]``): a tensor as ``("t", shape, stride, offset, dtype,
    device)`` (a fake tensor again on load), a sequence item by item, a plain number as is."""
    if isinstance(v, torch.Tensor):
        return ("t", tuple(v.shape), tuple(v.stride()), int(v.storage_offset()), str(v.dtype), str(v.device))
    if isinstance(v, (list, tuple)):
        return ("seq", type(v) is tuple, [_encode_value(x, node) for x in v])
    if v is None or type(v) in (bool, int, float):
        return ("py", v)
    raise Unserializable(f"node {node.name} recorded a {type(v).__name__} value")


_STEP_DIGESTS: "weakref.WeakKeyDictionary[fx.GraphModule, str]" = weakref.WeakKeyDictionary()


def step_digest(sym: SymbolicStep, modules) -> str:
    """SHA-256 of ``sym``'s content as the program cache stores it (nodes, guards, symbols,
    constants by path or value), without its trace time and memo statistics, in a canonical
    text (``_canonical``: a pickle of the same step differs between processes).  Made once a
    step: kept with it in memory, and on disk with its entry (``encode_step``), so a step
    loaded from disk has it (a capacity graph's key, ``capacity_build``)."""
    hit = _STEP_DIGESTS.get(sym.gm)
    if hit is None:
        hit = _STEP_DIGESTS[sym.gm] = _digest(encode_step(sym, modules, digest=False))
    return hit


def _digest(record: dict) -> str:
    record = {k: v for k, v in record.items() if k not in ("trace_s", "memo", "digest")}
    h = hashlib.sha256()
    _canonical(record, h.update, {})
    return h.hexdigest()


def _canonical(x, write: Callable[[bytes], None], texts: dict) -> None:
    """``x`` written as text that depends on its value only: a sympy expression as ``srepr``
    (its pickle carries the assumptions it happened to cache, and its sharing of
    subexpressions), a dataclass field by field, containers item by item, the rest by ``repr``."""
    import sympy
    if isinstance(x, sympy.Basic):
        key = id(x)
        if key not in texts:
            texts[key] = (x, sympy.srepr(x).encode())  # (x held: its id stays its own)
        write(texts[key][1])
    elif isinstance(x, dict):
        write(b"{")
        for k, v in x.items():
            _canonical(k, write, texts)
            write(b":")
            _canonical(v, write, texts)
            write(b",")
        write(b"}")
    elif isinstance(x, (list, tuple)):
        write(b"(" if isinstance(x, tuple) else b"[")
        for v in x:
            _canonical(v, write, texts)
            write(b",")
        write(b")" if isinstance(x, tuple) else b"]")
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        write(type(x).__qualname__.encode() + b"<")
        for f in dataclasses.fields(x):
            _canonical(getattr(x, f.name), write, texts)
            write(b",")
        write(b">")
    elif isinstance(x, bytes):
        write(b"b" + hashlib.sha256(x).hexdigest().encode())
    else:
        write(repr(x).encode())


# ------------------------------------------------------------------ decode
def decode_step(record: Mapping[str, Any], modules: Mapping[str, torch.nn.Module]) -> SymbolicStep:
    """The ``SymbolicStep`` ``record`` holds, its parameters bound to ``modules``' live tensors."""
    gm = decode_graph(record, modules)  # a symbolic step is only specialized, never run
    gm.meta[meta.SIGNATURE] = record["signature"]
    gm.meta[meta.DEVICE] = record["device"]
    if record.get("digest"):  # (the payload's SHA-256, checked on read, covers it)
        _STEP_DIGESTS[gm] = record["digest"]
    return SymbolicStep(gm, dict(record["dims"]), dict(record["symbols"]), tuple(record["placeholders"]),
                        tuple(record["guards"]), tuple(record["buffer_regions"]), record["trace_s"],
                        memo=dict(record.get("memo", {})))


def decode_graph(record: Mapping[str, Any], modules: Mapping[str, torch.nn.Module],
                 runnable: bool = False, given: "Mapping[str, torch.Tensor] | None" = None,
                 live: "Mapping[str, torch.Tensor] | None" = None) -> fx.GraphModule:
    """The graph ``record`` (``encode_graph``'s) holds, its constants bound to ``modules``' live
    tensors, each recorded value a fake tensor again (one ``FakeTensorMode`` for the graph).
    ``runnable``: a module that can run, its Python code generated when it first runs
    (``lazy_graph_module_class``; else, as a symbolic step needs, none:
    ``module_without_code``); ``given``: the constants ``encode_graph`` was told not to store;
    ``live``: ``tensor_paths(modules)``, where the caller has it already."""
    live, given = tensor_paths(modules) if live is None else live, dict(given or {})
    root = torch.nn.Module()
    for attr, spec in record["attrs"].items():
        if spec[0] == "given" and attr not in given:
            raise Rejected(f"constant {attr} is not stored and was not given")
        setattr(root, attr, given[attr] if spec[0] == "given" else _decode_attr(attr, spec, live))
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    fakes = _Fakes()
    for op, name, target, args, kwargs, node_meta in record["nodes"]:
        node = add_node(graph, op, _decode_target(target, name), _decode_arg(args, env),
                        _decode_arg(kwargs, env), name=name)
        if node.name != name:
            raise Rejected(f"node {name} came back as {node.name}")
        node.meta.update(node_meta)
        if meta.TAG in node_meta:
            node.meta[meta.TAG] = {**node_meta[meta.TAG], "role": Role(node_meta[meta.TAG]["role"])}
        if "val" in node_meta:
            node.meta["val"] = fakes.value(node_meta["val"])
        env[name] = node
    graph.lint()
    return lazy_graph_module_class()(root, graph) if runnable else module_without_code(root, graph)


class _Fakes:
    """Recorded values made again: fake tensors of one ``FakeTensorMode``, each over a meta
    tensor of its size, stride and offset (``passes.base.fake_tensor``), one per distinct
    layout (what reads them reads sizes, strides, dtypes and devices, never their identity)."""

    def __init__(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        self.mode = None
        self._new = FakeTensorMode
        self._made: dict = {}

    def value(self, v):
        kind = v[0]
        if kind == "t":
            hit = self._made.get(v)
            if hit is None:
                hit = self._made[v] = self._tensor(v)
            return hit
        if kind == "py":
            return v[1]
        if kind == "seq":
            items = [self.value(x) for x in v[2]]
            return tuple(items) if v[1] else items
        raise Rejected(f"a recorded value of unknown kind {kind!r}")

    def _tensor(self, v):
        _, shape, stride, offset, dtype, device = v
        if self.mode is None:
            self.mode = self._new(allow_non_fake_inputs=True)
        return fake_tensor(self.mode, shape, stride, getattr(torch, dtype.removeprefix("torch.")), device, offset)


def _decode_attr(attr: str, spec: tuple, live: Mapping[str, torch.Tensor]) -> torch.Tensor:
    if spec[0] == "param":
        _, path, shape, dtype, device = spec
        t = live.get(path)
        if t is None:
            raise Rejected(f"constant {attr} is the model's {path}, which this model does not have")
        if tuple(t.shape) != tuple(shape) or str(t.dtype) != dtype or str(t.device) != device:
            raise ModuleTensorDiffers(f"constant {attr} is the model's {path}, stored as {tuple(shape)} {dtype} on "
                                      f"{device}; this model's is {tuple(t.shape)} {t.dtype} on {t.device}")
        return t
    _, data, device = spec
    return torch.load(io.BytesIO(data), weights_only=True).to(device)


def _decode_target(target: tuple, name: str):
    kind = target[0]
    if kind == "str":
        return target[1]
    if kind == "op":
        _, ns, op, overload = target
        try:
            found = getattr(getattr(getattr(torch.ops, ns), op), overload)
        except (AttributeError, RuntimeError) as e:
            raise Rejected(f"node {name}: no operator {ns}::{op}.{overload} in this torch") from e
        if not isinstance(found, torch._ops.OpOverload):
            raise Rejected(f"node {name}: torch.ops.{ns}.{op}.{overload} is a {type(found).__name__}")
        return found
    if kind == "py":
        _, module, qualname, type_name = target
        try:
            found = _resolve(module, qualname)
        except (ImportError, AttributeError) as e:
            raise Rejected(f"node {name}: {module}.{qualname} does not resolve ({e})") from e
        if type(found).__qualname__ != type_name or not callable(found):
            raise Rejected(f"node {name}: {module}.{qualname} is a {type(found).__qualname__}, stored as a {type_name}")
        return found
    raise Rejected(f"node {name}: unknown target kind {kind!r}")


def _decode_arg(a, env: Mapping[str, fx.Node]):
    if isinstance(a, Ref):
        if a.name not in env:
            raise Rejected(f"an argument refers to node {a.name}, not defined before its use")
        return env[a.name]
    if isinstance(a, (tuple, list)):
        out = [_decode_arg(x, env) for x in a]
        return tuple(out) if isinstance(a, tuple) else out
    if isinstance(a, dict):
        return {k: _decode_arg(v, env) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(_decode_arg(a.start, env), _decode_arg(a.stop, env), _decode_arg(a.step, env))
    return a


def _resolve(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
