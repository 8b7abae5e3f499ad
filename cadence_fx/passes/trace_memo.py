"""trace_memo: a module call that would record the ops an earlier call recorded is copied, not traced.

A released speech decoder repeats itself: 16 DiT blocks of one class per estimator
call, one estimator call per flow step, conformer layers, vocoder resblocks.  make_fx
pays milliseconds per op to trace each repetition (fake tensors, symbolic sizes),
which is most of a symbolic trace.  ``CallMemo`` records the graph nodes of the first
call of each *call key* and, for every later call with the same key, copies those
nodes with the inputs and the module's tensors remapped, and hands the caller fresh
fake tensors of the recorded output layout, tracked to the copies.

The key holds everything the recorded ops can depend on besides tensor values: the
function called, the module tree's classes, its non-tensor attributes and hooks, every
parameter/buffer/tensor attribute's layout and which of them are one tensor, the
inputs' pytree structure with each tensor's layout (sizes and strides as symbolic
expressions) and each non-tensor's value, and the dispatcher state (grad, inference
mode, autocast, deterministic algorithms, default dtype).  Unknown objects compare by
identity.  A recorded call is refused as a template (and traced every time) when it
changes the module tree (an attribute, a tensor rebound), the dispatcher state, or a
tensor's metadata in place, writes a constant it created, or returns something other
than tensors and plain values.  So a copy is the graph a trace would have recorded:
``tests/passes/test_trace_memo.py`` compares them op for op, tensor for tensor.

Only fake-tensor (symbolic) traces are memoized: a concrete trace computes real
values, which a copy would not.  Methods are patched on the classes of the watched
modules for the length of one trace, in the tracing thread only.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Callable, Iterator, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .. import step as meta
from .base import changes_layout_in_place, copy_node, view_root, written_args

#: methods memoized on every watched module class that defines them
DEFAULT_METHODS = ("forward",)
#: one trace at a time in a process: held while a memoized trace has its methods patched, and
#: by a symbolic trace from its first symbolic size on (trace_symbolic): PyTorch's dispatch
#: modes are process-wide, so a size computed in one thread while another traces is recorded
#: by the other's tracer ("is not tracked with proxy", CI 2026-12-03)
TRACE_TURN = threading.RLock()

aten = torch.ops.aten


class _Id:
    """An object compared by identity (and kept alive while the key is)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _Id) and other.obj is self.obj


class _Spec:
    """A pytree ``TreeSpec`` in a key: equal as the specs are, hashed by its node counts.

    torch 2.5's ``TreeSpec`` is a dataclass with a list of children and no hash of its
    own, so a key holding it could not be hashed and every call was traced."""

    __slots__ = ("spec",)

    def __init__(self, spec):
        self.spec = spec

    def __hash__(self):
        return hash((self.spec.num_nodes, self.spec.num_leaves))

    def __eq__(self, other):
        return isinstance(other, _Spec) and other.spec == self.spec


class _Unkeyable(Exception):
    pass


def _size(v):
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", str(v.node.expr))
    return v


def _value_key(v, depth: int = 0):
    """A hashable stand-in for a non-tensor value: plain values by value, the rest by identity."""
    if v is None or isinstance(v, (bool, int, float, str, complex, bytes, torch.dtype, torch.device,
                                   torch.layout, torch.memory_format)):
        return (type(v), v)
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _size(v)
    if isinstance(v, torch.Size):
        return (torch.Size, tuple(_size(x) for x in v))
    if isinstance(v, (tuple, list, frozenset)) and depth < 4:
        return (type(v), tuple(_value_key(x, depth + 1) for x in v))
    if isinstance(v, dict) and depth < 4:
        return (type(v), tuple((_value_key(k, depth + 1), _value_key(x, depth + 1)) for k, x in v.items()))
    if isinstance(v, torch.Tensor):
        raise _Unkeyable("a tensor inside a non-tensor value")
    return _Id(v)


def _tensor_key(t: torch.Tensor):
    return (type(t), t.dtype, t.device, t.layout, tuple(_size(s) for s in t.shape),
            tuple(_size(s) for s in t.stride()), t.requires_grad, isinstance(t, torch.nn.Parameter))


def _dispatcher_state():
    autocast = []
    for dev in ("cpu", "cuda"):
        try:
            autocast.append((torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev)))
        except (AttributeError, TypeError, RuntimeError):  # pragma: no cover - older torch
            autocast.append(None)
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), tuple(autocast),
            torch.are_deterministic_algorithms_enabled(), torch.get_default_dtype(),
            len(torch.nn.modules.module._global_forward_hooks),
            len(torch.nn.modules.module._global_forward_pre_hooks))


def _module_view(module: torch.nn.Module, skip: frozenset):
    """(key rows, tensors): the tree's structure and attributes, and its tensors in a fixed order."""
    rows, tensors = [], []
    for path, sub in module.named_modules():
        attrs, hooks = [], []
        for name, v in vars(sub).items():
            if name.startswith("_") or name in skip:
                continue
            if isinstance(v, torch.Tensor):
                tensors.append(v)
                attrs.append((name, "tensor"))
            else:
                attrs.append((name, _value_key(v)))
        for kind in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_state_dict_hooks"):
            hooks.append(tuple(_Id(h) for h in getattr(sub, kind, {}).values()))
        params = []
        for kind in ("_parameters", "_buffers"):
            for name, v in getattr(sub, kind).items():
                params.append((kind, name, v is None))
                if v is not None:
                    tensors.append(v)
        rows.append((path, type(sub), tuple(attrs), tuple(hooks), tuple(params)))
    return tuple(rows), tensors


class _Template:
    __slots__ = ("nodes", "slot_of", "scopes", "out_spec", "outs")

    def __init__(self, nodes, slot_of, scopes, out_spec, outs):
        self.nodes, self.slot_of, self.scopes, self.out_spec, self.outs = nodes, slot_of, scopes, out_spec, outs


class CallMemo:
    """Record-once, copy-after for module calls in one fake-tensor make_fx trace.

    ``stats``: calls ``recorded`` as templates, ``copied`` from one, ``traced`` (no
    template applies) and ``refused`` templates with their reasons.
    """

    def __init__(self, modules: Sequence[torch.nn.Module], methods: Sequence[str] = DEFAULT_METHODS):
        self.modules = tuple(modules)
        self.methods = tuple(methods)
        self.templates: dict = {}
        self.stats = {"recorded": 0, "copied": 0, "traced": 0, "refused": {}}
        self._thread = None
        self._skip = frozenset(self.methods)
        self._names: dict[int, str] = {}  # id(constant) -> its attribute on the trace's root

    # ------------------------------------------------------------------ install
    @contextlib.contextmanager
    def installed(self) -> Iterator["CallMemo"]:
        """Patch the memoized methods on the watched modules' classes for this block.

        One memoized trace per process at a time (another thread's waits): two would patch
        the same classes (``torch.nn.Linear``...) and could restore each other's patches.
        Other threads running these classes meanwhile call the originals."""
        with TRACE_TURN:
            with self._patched():
                yield self

    @contextlib.contextmanager
    def _patched(self) -> Iterator["CallMemo"]:
        classes = []
        for root in self.modules:
            for m in root.modules():
                for cls in type(m).__mro__:
                    if cls is torch.nn.Module or not issubclass(cls, torch.nn.Module) or cls in classes:
                        continue
                    classes.append(cls)
        patched = []
        try:
            for cls in classes:
                for name in self.methods:
                    fn = cls.__dict__.get(name)
                    if fn is None or not callable(fn) or isinstance(fn, (staticmethod, classmethod)):
                        continue
                    setattr(cls, name, self._wrap(fn))
                    patched.append((cls, name, fn))
            self._thread = threading.get_ident()
            yield self
        finally:
            self._thread = None
            for cls, name, fn in reversed(patched):
                setattr(cls, name, fn)

    def _wrap(self, fn: Callable) -> Callable:
        memo = self

        @functools.wraps(fn)
        def wrapper(module, *args, **kwargs):
            if memo._thread != threading.get_ident():
                return fn(module, *args, **kwargs)
            from torch.fx.experimental.proxy_tensor import get_proxy_mode
            mode = get_proxy_mode()
            if mode is None:
                return fn(module, *args, **kwargs)
            return memo._call(mode.tracer, fn, module, args, kwargs)
        wrapper.__cadence_memo__ = fn
        return wrapper

    # -------------------------------------------------------------------- calls
    def _key(self, fn, module, args, kwargs):
        rows, tensors = _module_view(module, self._skip)
        own = list(tensors)  # the module tree's tensors (the inputs' follow): _record compares after the call
        leaves, spec = pytree.tree_flatten((args, kwargs))
        inputs = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                inputs.append(("tensor", len(tensors)))
                tensors.append(leaf)
            else:
                inputs.append(_value_key(leaf))
        first = {}
        same = tuple(first.setdefault(id(t), i) for i, t in enumerate(tensors))
        key = (_Id(fn), rows, _Spec(spec), tuple(inputs), tuple(_tensor_key(t) for t in tensors), same,
               _dispatcher_state())
        return key, tensors, (rows, own)

    def _call(self, tracer, fn, module, args, kwargs):
        try:
            key, tensors, view = self._key(fn, module, args, kwargs)
            hash(key)
        except (_Unkeyable, TypeError):
            self.stats["traced"] += 1
            return fn(module, *args, **kwargs)
        template = self.templates.get(key)
        if isinstance(template, _Template):
            self.stats["copied"] += 1
            return self._copy(tracer, template, tensors)
        if template is not None:  # refused
            self.stats["traced"] += 1
            return fn(module, *args, **kwargs)
        return self._record(tracer, key, fn, module, args, kwargs, tensors, view)

    def _record(self, tracer, key, fn, module, args, kwargs, tensors, view):
        """``view``: the module tree's ``(rows, tensors)`` that ``_key`` read just before."""
        from torch.fx.experimental.proxy_tensor import get_proxy_slot
        graph = tracer.graph
        start = graph._root.prev
        state = _dispatcher_state()
        rows_before, tensors_before = view
        tracked = {}
        for i, t in enumerate(tensors):
            slot = get_proxy_slot(t, tracer, None)
            if slot is not None:
                tracked.setdefault(slot.proxy.node, i)
        out = fn(module, *args, **kwargs)
        self.stats["recorded"] += 1
        nodes = []
        n = start.next
        while n is not graph._root:
            nodes.append(n)
            n = n.next
        reason = self._refusal(module, nodes, state, rows_before, tensors_before)
        template = None
        if reason is None:
            template, reason = self._template(tracer, nodes, tensors, tracked, out)
        if reason is not None:
            self.templates[key] = reason
            self.stats["refused"][reason] = self.stats["refused"].get(reason, 0) + 1
        else:
            self.templates[key] = template
        return out

    def _refusal(self, module, nodes, state, rows_before, tensors_before) -> str | None:
        if _dispatcher_state() != state:
            return "changes the dispatcher state"
        try:
            rows_after, tensors_after = _module_view(module, self._skip)
        except _Unkeyable:
            return "module attributes hold tensors in containers"
        if rows_after != rows_before or len(tensors_after) != len(tensors_before) or any(
                a is not b for a, b in zip(tensors_after, tensors_before)):
            return "changes its module's attributes or tensors"
        for n in nodes:
            if n.op == "placeholder":
                return "adds a graph input"
            t = n.target
            if changes_layout_in_place(t):
                return f"changes a tensor's metadata in place ({t})"
        return None

    def _template(self, tracer, nodes, tensors, tracked, out):
        from torch.fx.experimental.proxy_tensor import get_proxy_slot
        by_id = {}
        for i, t in enumerate(tensors):
            by_id.setdefault(id(t), i)
        inside = set(nodes)
        slot_of = dict()

        def note(node):
            if node in slot_of:
                return
            if node in tracked:
                slot_of[node] = tracked[node]
            elif node.op == "get_attr":
                value = getattr(tracer.root, node.target, None)
                if isinstance(value, torch.Tensor) and id(value) in by_id:
                    slot_of[node] = by_id[id(value)]

        for n in nodes:
            note(n)
            for a in n.all_input_nodes:
                if a not in inside:
                    note(a)
        for n in nodes:
            for w in written_args(n):
                root = view_root(w)
                if root.op == "get_attr" and root not in slot_of:
                    return None, "writes a constant it did not take"
        leaves, spec = pytree.tree_flatten(out)
        outs, fresh = [], {}
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                if id(leaf) in by_id:
                    outs.append(("slot", by_id[id(leaf)]))
                    continue
                proxy = get_proxy_slot(leaf, tracer, None)
                if proxy is None:
                    return None, "returns an untracked tensor"
                node = proxy.proxy.node
                if node not in inside and node not in slot_of:
                    outs.append(("object", leaf))
                    continue
                layout = (tuple(leaf.shape), tuple(leaf.stride()), leaf.storage_offset(), leaf.dtype,
                          leaf.device, leaf.requires_grad, leaf)
                outs.append(("fresh", node, fresh.setdefault(id(leaf), len(fresh)), layout))
            elif leaf is None or isinstance(leaf, (bool, int, float, str, torch.SymInt, torch.SymFloat,
                                                   torch.SymBool, torch.dtype, torch.device)):
                outs.append(("value", leaf))
            else:
                return None, f"returns a {type(leaf).__name__}"
        scopes = {n: meta.scopes(n) for n in nodes}
        return _Template(nodes, slot_of, scopes, spec, outs), None

    def _constant(self, tracer, t: torch.Tensor) -> fx.Node:
        """A ``get_attr`` of a constant, as ``tracer.create_arg`` makes it, without its search
        of every parameter the root holds (milliseconds per call late in a large trace)."""
        name = self._names.get(id(t))
        if name is not None and getattr(tracer.root, name, None) is t:
            return tracer.create_node("get_attr", name, (), {})
        node = tracer.create_arg(t)
        if node.op == "get_attr" and getattr(tracer.root, node.target, None) is t:
            self._names[id(t)] = node.target
        return node

    def _copy(self, tracer, template: _Template, tensors):
        from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, get_proxy_slot, track_tensor_tree
        graph = tracer.graph
        mapping: dict[fx.Node, fx.Node] = {}

        def node_for(node, slot):
            new = tensors[slot]
            proxy = get_proxy_slot(new, tracer, None)
            if proxy is not None:
                return proxy.proxy.node
            if node.op == "get_attr" and getattr(tracer.root, node.target, None) is new:
                return node
            return self._constant(tracer, new)

        for node, slot in template.slot_of.items():
            if node not in template.scopes:  # outside the recorded range
                mapping[node] = node_for(node, slot)
        for n in template.nodes:
            if n in template.slot_of:
                mapping[n] = node_for(n, template.slot_of[n])
                continue
            new = copy_node(graph, n, lambda a: mapping.get(a, a))
            new.meta.pop(meta.SCOPE, None)
            if template.scopes[n]:
                new.meta[meta.SCOPE] = template.scopes[n]
            mapping[n] = new
        made: dict[int, torch.Tensor] = {}
        leaves = []
        for entry in template.outs:
            kind = entry[0]
            if kind == "slot":
                leaves.append(tensors[entry[1]])
            elif kind in ("object", "value"):
                leaves.append(entry[1])
            else:
                _, node, index, (shape, stride, offset, dtype, device, requires_grad, like) = entry
                if index not in made:
                    with disable_proxy_modes_tracing():
                        mode = getattr(like, "fake_mode", None)
                        with (mode if mode is not None else contextlib.nullcontext()):
                            t = _fresh(shape, stride, offset, dtype, device)
                        t.requires_grad_(requires_grad)
                    track_tensor_tree(t, fx.Proxy(mapping.get(node, node), tracer), constant=None, tracer=tracer)
                    made[index] = t
                leaves.append(made[index])
        return pytree.tree_unflatten(leaves, template.out_spec)


def _fresh(shape, stride, offset, dtype, device) -> torch.Tensor:
    """A new tensor of this layout (sizes may be symbolic; no guard is added on them)."""
    if isinstance(offset, int) and offset == 0:
        return torch.empty_strided(shape, stride, dtype=dtype, device=device)
    span = offset + 1
    for size, st in zip(shape, stride):
        span = span + (size - 1) * st
    return torch.empty((span,), dtype=dtype, device=device).as_strided(shape, stride, offset)
