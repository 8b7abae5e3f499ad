"""The functions a capacity-form graph calls (``passes.capacity``), kept apart from the rewrite.

Each is plain torch: sizes from an expression's Python text (on host ints, or device
scalars, so a CUDA graph of the callers reads no host size), and the three ops whose
capacity form differs from the step's own: a ``cat`` after a padded part, a write into a
padded destination, and attention over padded keys.
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import functools
import operator
from typing import List, Mapping, Optional, Sequence  # List: torch 2.5's custom_op schemas

import torch


#: the builtins an evaluation's frame sees: the real ones (an op that imports lazily, as a fake
#: tensor's dispatch does, finds ``__import__`` through the calling frame's builtins)
_GLOBALS = {"__builtins__": builtins}


@functools.lru_cache(maxsize=None)
def _code(text: str):
    return compile(text, "<size>", "eval")


#: the dims a capacity-form graph runs at, set by its caller around a call (``at_dims``): one
#: graph serves streams at several lengths, each call reading its own (per thread, per task)
_DIMS: contextvars.ContextVar = contextvars.ContextVar("cadence_fx_capacity_dims", default=None)


@contextlib.contextmanager
def at_dims(dims: Mapping[str, int]):
    """Run capacity-form graphs inside this block at ``dims`` (dim name -> value).  A
    generator must not hold it across a ``yield``: its caller's context would carry it
    (``capacity_executable.at_stream``'s programs set it around each call)."""
    token = _DIMS.set({d: operator.index(v) for d, v in dims.items()})
    try:
        yield
    finally:
        _DIMS.reset(token)


def _current(dims: tuple) -> tuple:
    now = _DIMS.get()
    if now is None or any(d not in now for d in dims):
        raise RuntimeError(f"a capacity-form graph runs inside capacity_ops.at_dims naming {list(dims)} "
                           f"(it has {now})")
    return tuple(now[d] for d in dims)


def size_at(text: str, names: tuple, *values: int) -> int:
    """The size ``text`` (a Python expression over ``names``) at host ints ``values``."""
    v = eval(_code(text), _GLOBALS, dict(zip(names, values)))
    if type(v) is not int:
        raise ValueError(f"size {text} at {dict(zip(names, values))} is {v!r}, not an int")
    return v


@functools.lru_cache(maxsize=1024)
def sizes_function(texts: tuple, names: tuple):
    """One Python function of the values of ``names`` returning the tuple of sizes ``texts``
    (Python expressions over ``names``, as ``size_at`` evaluates each, with its globals):
    compiled once, then microseconds a call where ``size_at`` builds a namespace and evals
    per size (a prepare's reports ask for every extent at every prompt length of its range).
    A value that is not an int is the caller's to refuse, as ``size_at`` does."""
    if not all(n.isidentifier() for n in names):
        raise ValueError(f"size symbols {names} are not Python names")
    body = "".join(f"({t}), " for t in texts)
    return eval(compile(f"lambda {', '.join(names)}: ({body})", "<sizes>", "eval"), _GLOBALS)


@torch.fx.node.has_side_effect  # reads its caller's dims: never folded into a constant, never dropped
def host_size(text: str, names: tuple, dims: tuple) -> int:
    """The size ``text`` over symbols ``names`` at the dims ``dims`` the caller runs at (``at_dims``)."""
    return size_at(text, names, *_current(dims))


def host_sizes(gm: torch.fx.GraphModule) -> dict:
    """Each ``host_size`` node of a capacity graph -> its value at the dims its caller runs at
    (``at_dims``): what a walk of the graph's region views takes (``aliasing.record_region_accesses``)."""
    return {n: n.target(*n.args) for n in gm.graph.nodes if n.op == "call_function" and n.target is host_size}


@torch.fx.node.has_side_effect
def within(dims: tuple, capacities: tuple, names: tuple, guards: tuple, extents: tuple,
           lengths: List[torch.Tensor]) -> None:
    """The graph's first node: refuse dims outside ``[0, capacity]``, outside the step's
    ``guards`` (sympy texts over the symbols ``names``), or at which a padded size
    (``extents``, Python texts) would pass its size at the capacity; and device lengths on
    the host that disagree with the dims (on a device they are not read back: no sync)."""
    values = _current(dims)
    for d, v, c in zip(dims, values, capacities):
        if not 0 <= v <= c:
            raise ValueError(f"{d} = {v} is outside the capacity form's 0..{c}")
    why = _refusal(names, guards, extents, values, capacities)
    if why:
        raise ValueError(f"{dict(zip(dims, values))}: {why}")
    from torch._subclasses.fake_tensor import FakeTensor
    for d, v, t in zip(dims, values, lengths):
        if t.device.type == "cpu" and not isinstance(t, FakeTensor) and int(t) != v:
            raise ValueError(f"the device length len_{d} is {int(t)}, the dims say {v}")


@functools.lru_cache(maxsize=256)
def _guards(names: tuple, guards: tuple) -> tuple:
    """The guards' texts read once (sympy's parser takes milliseconds a text; a new length
    only substitutes its values)."""
    import sympy
    symbols = tuple(sympy.Symbol(n, integer=True) for n in names)
    return symbols, tuple(sympy.sympify(g, locals=dict(zip(names, symbols))) for g in guards)


@functools.lru_cache(maxsize=4096)
def _refusal(names: tuple, guards: tuple, extents: tuple, values: tuple, capacities: tuple) -> str:
    """Why ``values`` is not a length the graph serves ("" if it is); memoized per length."""
    import sympy
    symbols, exprs = _guards(names, guards)
    binding = {s: sympy.Integer(v) for s, v in zip(symbols, values)}
    for g, expr in zip(guards, exprs):
        if bool(expr.xreplace(binding)) is not True:
            return f"guard {g} does not hold"
    for text in extents:
        if not 0 <= size_at(text, names, *values) <= size_at(text, names, *capacities):
            return f"size {text} would pass its size at the capacity"
    return ""


# The ops below are torch custom ops (``torch.ops.cadence_fx.*``): their schemas say what each
# reads and writes, so the compiler's analyses (aliasing, write-backs, constant folding) see them
# as they see aten's, and each has a fake implementation for shape propagation.

@torch.library.custom_op("cadence_fx::capacity_faithful", mutates_args=())
def faithful(x: torch.Tensor, shape: List[int], stride: List[int], offset: int) -> torch.Tensor:
    """``x``'s values in a tensor of ``shape``, ``stride`` and storage ``offset`` (the layout
    the step gives the value: what a stride-sensitive kernel reads the same way)."""
    span = 0 if 0 in shape else 1 + sum((n - 1) * st for n, st in zip(shape, stride))
    unique = [1 if st == 0 else n for n, st in zip(shape, stride)]  # an expanded dim: one element, expanded
    out = x.new_empty(offset + span).as_strided(unique, stride, offset)
    out.copy_(x[tuple(slice(0, 1) if st == 0 else slice(None) for st in stride)])
    return out.expand(shape) if unique != list(shape) else out


@faithful.register_fake
def _(x, shape, stride, offset):
    span = 0 if 0 in shape else 1 + sum((n - 1) * st for n, st in zip(shape, stride))
    return x.new_empty(offset + span).as_strided(shape, stride, offset)


@torch.library.custom_op("cadence_fx::capacity_device_size", mutates_args=())
def device_size(text: str, names: str, values: List[torch.Tensor]) -> torch.Tensor:
    """The size ``text`` at device int64 scalars ``values`` of the symbols ``names`` (comma
    separated; ``//``, ``+``, ``*``, ``-``: device ops), a device int64 scalar (a constant text:
    filled on the device, no host copy)."""
    v = eval(_code(text), _GLOBALS, dict(zip(names.split(","), values)))
    return v.clone() if isinstance(v, torch.Tensor) else values[0].new_full((), int(v))


@device_size.register_fake
def _(text, names, values):
    return values[0].new_empty(())


def _live_mask(shape: Sequence[int], dims: Mapping[int, torch.Tensor], device) -> torch.Tensor:
    """A bool tensor broadcastable to ``shape``: true inside the live prefix on each of ``dims``."""
    mask = None
    for d, n in dims.items():
        size = [1] * len(shape)
        size[d] = shape[d]
        m = (torch.arange(shape[d], device=device) < n).view(size)
        mask = m if mask is None else mask & m
    return mask


def _cat_shape(parts, dim):
    shape = list(parts[0].shape)
    shape[dim] = sum(p.shape[dim] for p in parts)
    return shape, functools.reduce(torch.promote_types, (p.dtype for p in parts))  # as cat promotes


@torch.library.custom_op("cadence_fx::capacity_offset_cat", mutates_args=())
def offset_cat(parts: List[torch.Tensor], dim: int, offsets: List[torch.Tensor]) -> torch.Tensor:
    """``cat`` along a padded ``dim``: part ``i`` (whole, at capacity) written from device
    offset ``offsets[i]`` (the live sizes before it), in order, so each part's live prefix
    follows the one before it (past the last one: the last part's padding, then zeros)."""
    shape, dtype = _cat_shape(parts, dim)
    out = parts[0].new_zeros(shape, dtype=dtype)
    for p, off in zip(parts, offsets):
        index = torch.arange(p.shape[dim], device=p.device) + off
        out.index_copy_(dim, index, p.to(dtype))
    return out


@offset_cat.register_fake
def _(parts, dim, offsets):
    shape, dtype = _cat_shape(parts, dim)
    return parts[0].new_empty(shape, dtype=dtype)


@torch.library.custom_op("cadence_fx::capacity_masked_copy", mutates_args=("dst",))
def masked_copy(dst: torch.Tensor, src: torch.Tensor, dims: List[int], lengths: List[torch.Tensor]) -> None:
    """``dst.copy_(src)`` inside ``dst``'s live prefix on ``dims`` (device lengths); past it
    ``dst`` keeps its own values (a select, bit for bit)."""
    mask = _live_mask(dst.shape, dict(zip(dims, lengths)), dst.device)
    dst.copy_(torch.where(mask, src.to(dst.dtype), dst))  # src converted as copy_ converts; dst's own kept


@masked_copy.register_fake
def _(dst, src, dims, lengths):
    return None


@torch.library.custom_op("cadence_fx::capacity_masked_attention", mutates_args=())
def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: torch.Tensor,
                     scale: Optional[float] = None) -> torch.Tensor:
    """``scaled_dot_product_attention`` over keys padded on dim -2, live below ``length``:
    the padding is zeroed (it may hold anything) and masked out."""
    live = torch.arange(k.shape[-2], device=k.device) < length
    keep = live.view(-1, 1)
    k, v = torch.where(keep, k, torch.zeros((), dtype=k.dtype, device=k.device)), \
        torch.where(keep, v, torch.zeros((), dtype=v.dtype, device=v.device))
    # the mask as benchmarks/length_free_attention.py measured it exact: [batch, 1, queries, keys]
    mask = live.view(1, 1, 1, -1).expand(q.shape[0], 1, q.shape[-2], -1).contiguous()
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, mask, scale=scale)


@masked_attention.register_fake
def _(q, k, v, length, scale=None):
    return q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],))


@torch.library.custom_op("cadence_fx::capacity_to_capacity", mutates_args=())
def to_capacity(x: torch.Tensor, shape: List[int]) -> torch.Tensor:
    """``x`` (exact sizes) as a padded value of ``shape``: its values in the prefix, zeros past it."""
    out = x.new_zeros(shape)
    out[tuple(slice(0, n) for n in x.shape)].copy_(x)
    return out


@to_capacity.register_fake
def _(x, shape):
    return x.new_empty(shape)


def probe_masked_attention(q: Sequence, k: Sequence, v: Sequence, dtype: torch.dtype, device,
                           cases: Sequence, seed: int = 0, scale: "float | None" = None) -> bool:
    """Whether ``masked_attention`` over padded keys gives the bits of the step's own call,
    on this device and dtype, under the caller's settings (deterministic algorithms: the
    protocol exactness is defined under).  ``q``, ``k``, ``v``: each operand's layout
    ``(shape, stride, offset)`` as the capacity form holds it (keys and values padded on
    dim -2, NaN past the live ones); ``cases``: ``(live, q, k, v)`` per length to check, the
    live key count and each operand's layout in the step's own call there.  One set of
    values (``seed``) is laid out each way."""
    g = torch.Generator().manual_seed(seed)

    def laid_out(values: torch.Tensor, layout) -> torch.Tensor:
        shape, stride, offset = layout
        extent = offset + sum((n - 1) * st for n, st in zip(shape, stride) if n) + 1 if all(shape) else offset
        t = torch.full((extent,), float("nan"), dtype=dtype, device=device).as_strided(shape, stride, offset)
        t.copy_(values[tuple(slice(0, n) for n in shape)])
        return t
    q0, k0, v0 = ((torch.randn(tuple(t[0]), generator=g) * 0.5).to(device=device, dtype=dtype) for t in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with torch.no_grad():
        for n, q_s, k_s, v_s in cases:
            kp, vp = k0.clone(), v0.clone()
            kp[..., n:, :] = float("nan")
            vp[..., n:, :] = float("nan")
            want = sdpa(laid_out(q0, q_s), laid_out(k0, k_s), laid_out(v0, v_s), scale=scale)
            got = masked_attention(laid_out(q0, q), laid_out(kp, k), laid_out(vp, v), torch.tensor(n, device=device),
                                   scale)
            if not torch.equal(want, got):
                return False
    return True


#: the overloads a capacity-form graph calls (what its nodes' targets are)
FAITHFUL = torch.ops.cadence_fx.capacity_faithful.default
DEVICE_SIZE = torch.ops.cadence_fx.capacity_device_size.default
OFFSET_CAT = torch.ops.cadence_fx.capacity_offset_cat.default
MASKED_COPY = torch.ops.cadence_fx.capacity_masked_copy.default
MASKED_ATTENTION = torch.ops.cadence_fx.capacity_masked_attention.default
TO_CAPACITY = torch.ops.cadence_fx.capacity_to_capacity.default
