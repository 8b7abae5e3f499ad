"""A ``SymbolicStep`` as plain data (what ``DiskCache`` pickles), and back onto live modules.

What is kept of the graph: every node's op, name, target, args and kwargs (node
references as ``Ref``), and of its meta only ``step.TAG`` (the role as its string),
``step.SCOPE`` and ``step.SYM``; the graph module's ``step.SIGNATURE`` and
``step.DEVICE``.  Targets are stored by name, never by pickling the callable:

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
import importlib
import io
import operator
from typing import Any, Mapping

import torch
import torch.fx as fx

from ..errors import CadenceError
from .. import step as meta
from ..passes.base import add_node
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
def encode_step(step: SymbolicStep, modules: Mapping[str, torch.nn.Module]) -> dict[str, Any]:
    """``step`` as plain picklable data; parameters/buffers of ``modules`` by path."""
    by_id: dict[int, str] = {}
    for path, t in tensor_paths(modules).items():
        by_id.setdefault(id(t), path)
    attrs, nodes = {}, []
    for node in step.gm.graph.nodes:
        if node.op == "call_module":
            raise Unserializable(f"node {node.name} calls a submodule ({node.target})")
        if node.op == "get_attr":
            attrs[node.target] = _encode_attr(step.gm, node.target, by_id)
        nodes.append((node.op, node.name, _encode_target(node), _encode_arg(node.args), _encode_arg(node.kwargs),
                      _encode_meta(node)))
    gm_meta = step.gm.meta
    return {"nodes": nodes, "attrs": attrs, "signature": gm_meta[meta.SIGNATURE], "device": gm_meta[meta.DEVICE],
            "dims": dict(step.dims), "symbols": dict(step.symbols), "placeholders": tuple(step.placeholders),
            "guards": tuple(step.guards), "buffer_regions": tuple(step.buffer_regions), "trace_s": step.trace_s,
            "memo": dict(step.memo)}


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


def _encode_meta(node: fx.Node) -> dict:
    out = {k: node.meta[k] for k in _META_KEYS if k in node.meta}
    if meta.TAG in out:
        tag = dict(out[meta.TAG])
        tag["role"] = Role(tag["role"]).value
        out[meta.TAG] = tag
    return out


# ------------------------------------------------------------------ decode
def decode_step(record: Mapping[str, Any], modules: Mapping[str, torch.nn.Module]) -> SymbolicStep:
    """The ``SymbolicStep`` ``record`` holds, its parameters bound to ``modules``' live tensors."""
    live = tensor_paths(modules)
    root = torch.nn.Module()
    for attr, spec in record["attrs"].items():
        setattr(root, attr, _decode_attr(attr, spec, live))
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    for op, name, target, args, kwargs, node_meta in record["nodes"]:
        node = add_node(graph, op, _decode_target(target, name), _decode_arg(args, env),
                        _decode_arg(kwargs, env), name=name)
        if node.name != name:
            raise Rejected(f"node {name} came back as {node.name}")
        node.meta.update(node_meta)
        if meta.TAG in node_meta:
            node.meta[meta.TAG] = {**node_meta[meta.TAG], "role": Role(node_meta[meta.TAG]["role"])}
        env[name] = node
    graph.lint()
    gm = module_without_code(root, graph)  # a symbolic step is only specialized, never run
    gm.meta[meta.SIGNATURE] = record["signature"]
    gm.meta[meta.DEVICE] = record["device"]
    return SymbolicStep(gm, dict(record["dims"]), dict(record["symbols"]), tuple(record["placeholders"]),
                        tuple(record["guards"]), tuple(record["buffer_regions"]), record["trace_s"],
                        memo=dict(record.get("memo", {})))


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
